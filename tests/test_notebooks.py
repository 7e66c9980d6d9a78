"""Every notebook in notebooks/ runs top to bottom without error (on a machine without a GPU)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path) -> None:
    # CI installs nbclient (requirements-dev.txt); the GPU machine may not have it.
    pytest.importorskip("nbclient")
    os.environ.setdefault("JUPYTER_PLATFORM_DIRS", "1")
    with warnings.catch_warnings():
        # Jupyter's own machinery may warn about its internals; the notebook's code is what
        # is under test, and an error in any cell fails the run.
        warnings.simplefilter("ignore")
        import nbclient
        import nbformat

        nb = nbformat.read(path, as_version=4)
        client = nbclient.NotebookClient(
            nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
        )
        client.execute()
    errors = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]
    assert not errors, errors


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS, "notebooks/ holds no notebook"
