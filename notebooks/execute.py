"""Execute every notebook in this folder in place, saving its outputs (`make notebooks`);
names given on the command line (``08-arrow-tables.ipynb``) execute only those."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import nbclient
import nbformat


def run(nb: nbformat.NotebookNode, timeout: int = 600) -> list[str]:
    """Execute ``nb`` in place in a fresh Python 3 kernel, with nothing left behind.

    The kernel starts in an empty folder, so that the repository's source ``kvikpy/`` (no
    compiled module in it) cannot shadow the installed package, and its temporary folder
    (``TMPDIR``, which ``tempfile`` and the processes the notebook starts use) is another
    empty one. Both are removed when the run ends, also when a cell fails or times out,
    so a notebook that stops halfway leaves no work folder behind.

    Parameters
    ----------
    nb
        The notebook; its cells receive their outputs.
    timeout
        Seconds any one cell may run.

    Returns
    -------
    list of str
        The names the notebook left in its temporary folder (it should leave none: each
        notebook removes its work folder in its last cell).

    Raises
    ------
    nbclient.exceptions.CellExecutionError
        A cell raised; the folders are removed all the same.
    """
    with tempfile.TemporaryDirectory(prefix="kvikpy-nb-", ignore_cleanup_errors=True) as scratch:
        cwd, tmp = os.path.join(scratch, "cwd"), os.path.join(scratch, "tmp")
        os.mkdir(cwd)
        os.mkdir(tmp)
        env = dict(os.environ, TMPDIR=tmp)
        client = nbclient.NotebookClient(
            nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": cwd}}
        )
        client.execute(env=env)
        return sorted(os.listdir(tmp))


def main() -> int:
    here = Path(__file__).parent
    chosen = set(sys.argv[1:])
    unknown = chosen - {p.name for p in here.glob("*.ipynb")}
    if unknown:
        raise SystemExit(f"no such notebook here: {', '.join(sorted(unknown))}")
    for path in sorted(here.glob("*.ipynb")):
        if chosen and path.name not in chosen:
            continue
        nb = nbformat.read(path, as_version=4)
        left = run(nb)
        if left:
            raise SystemExit(f"{path.name} left {left} in its temporary folder")
        nbformat.write(nb, path)
        print("executed", path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
