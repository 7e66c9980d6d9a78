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


def test_notebooks_match_their_cell_modules(tmp_path: Path) -> None:
    # The cells live as code in notebooks/make_*.py (reviewable diffs); the committed
    # notebooks (with outputs from the GPU machine) must hold exactly those cells, as
    # `notebooks/build.py` writes them and `ruff format` formats them.
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed here")
    import nbformat

    folder = Path(__file__).parent.parent / "notebooks"
    spec = importlib.util.spec_from_file_location("nb_build", folder / "build.py")
    assert spec and spec.loader
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    for name, cells in build.NOTEBOOKS.items():
        build.write_notebook(cells, name, tmp_path)
    config = folder.parent / "pyproject.toml"
    subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--config", str(config), str(tmp_path)],
        check=True,
        capture_output=True,
    )
    assert sorted(build.NOTEBOOKS) == [p.name for p in NOTEBOOKS]
    for path in NOTEBOOKS:
        built = [c.source for c in nbformat.read(tmp_path / path.name, as_version=4).cells]
        committed = [c.source for c in nbformat.read(path, as_version=4).cells]
        assert committed == built, f"{path.name} differs from its cells: run make notebooks"
