"""Every notebook in notebooks/ runs top to bottom without error (on a machine without a GPU)
and leaves nothing in the temporary folder, also when a cell fails."""

from __future__ import annotations

import importlib.util
import os
import tempfile
import warnings
from pathlib import Path
from types import ModuleType

import pytest

FOLDER = Path(__file__).parent.parent / "notebooks"
NOTEBOOKS = sorted(FOLDER.glob("*.ipynb"))


def notebooks_module(name: str) -> ModuleType:
    """Load ``notebooks/<name>.py`` (the folder is no package) as a module."""
    spec = importlib.util.spec_from_file_location(f"nb_{name}", FOLDER / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path) -> None:
    # CI installs nbclient (requirements-dev.txt); the GPU machine may not have it.
    pytest.importorskip("nbclient")
    os.environ.setdefault("JUPYTER_PLATFORM_DIRS", "1")
    with warnings.catch_warnings():
        # Jupyter's own machinery may warn about its internals; the notebook's code is what
        # is under test, and an error in any cell fails the run.
        warnings.simplefilter("ignore")
        import nbformat

        nb = nbformat.read(path, as_version=4)
        # In a kernel of its own, whose working and temporary folders are removed after
        # the run whatever happens; what the notebook left there is returned.
        left = notebooks_module("execute").run(nb, timeout=300)
    errors = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]
    assert not errors, errors
    # Its last cell removes what it wrote, for readers who run it by hand as well.
    assert left == [], f"{path.name} left {left} in its temporary folder"


@pytest.mark.timeout(180)
def test_notebook_runs_leave_nothing_in_the_temp_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The names under tempfile.gettempdir() before and after running a notebook that
    # passes and one whose cell fails halfway, past its work folder and before its
    # clean-up cell. The machine's /tmp is shared with whatever else runs, so a fresh,
    # private temporary folder stands in for it while the test runs: every tempfile call
    # here, in the kernels and in what they start (TMPDIR) lands there; and no notebook
    # names /tmp itself.
    pytest.importorskip("nbclient")
    os.environ.setdefault("JUPYTER_PLATFORM_DIRS", "1")
    import nbformat
    from nbclient.exceptions import CellExecutionError
    from nbformat.v4 import new_code_cell, new_notebook

    for path in NOTEBOOKS:
        sources = [c.source for c in nbformat.read(path, as_version=4).cells]
        assert not any("/tmp" in s for s in sources), f"{path.name} names /tmp"
    execute = notebooks_module("execute")
    failing = new_notebook(
        cells=[
            new_code_cell(
                "import os\nimport tempfile\n\n"
                "folder = tempfile.mkdtemp(prefix='kvikpy-failing-')\n"
                "with open(os.path.join(folder, 'data.bin'), 'wb') as fh:\n"
                "    fh.write(bytes(1 << 20))"
            ),
            new_code_cell("raise RuntimeError('a cell fails halfway')"),
            new_code_cell("import shutil\n\nshutil.rmtree(folder)"),
        ]
    )
    failing.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    with tempfile.TemporaryDirectory(prefix="kvikpy-tmp-check-") as private:
        monkeypatch.setattr(tempfile, "tempdir", private)
        monkeypatch.setenv("TMPDIR", private)
        assert tempfile.gettempdir() == private
        before = sorted(os.listdir(tempfile.gettempdir()))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quickstart = nbformat.read(FOLDER / "01-quickstart.ipynb", as_version=4)
            assert execute.run(quickstart, timeout=120) == []
            assert sorted(os.listdir(tempfile.gettempdir())) == before
            with pytest.raises(CellExecutionError, match="a cell fails halfway"):
                execute.run(failing, timeout=60)
        assert sorted(os.listdir(tempfile.gettempdir())) == before


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS, "notebooks/ holds no notebook"


def test_notebooks_match_their_cell_modules(tmp_path: Path) -> None:
    # The cells live as code in notebooks/make_*.py (reviewable diffs); the committed
    # notebooks (with outputs from the GPU machine) must hold exactly those cells, as
    # `notebooks/build.py` writes them and `ruff format` formats them.
    import subprocess
    import sys

    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed here")
    import nbformat

    build = notebooks_module("build")
    for name, cells in build.NOTEBOOKS.items():
        build.write_notebook(cells, name, tmp_path)
    config = FOLDER.parent / "pyproject.toml"
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
