"""Write every notebook in this folder (or those named: `build.py 02-frameworks-dlpack.ipynb`)
from the cells kept as code beside it (`make notebooks` runs this, then executes the
notebooks to refresh their outputs)."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_notebook

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import make_arrow_batches  # noqa: E402
import make_arrow_tables  # noqa: E402
import make_frameworks_formats  # noqa: E402
import make_measure  # noqa: E402
import make_quickstart  # noqa: E402
import make_scale  # noqa: E402
import make_zarr  # noqa: E402

NOTEBOOKS = {
    "01-quickstart.ipynb": make_quickstart.CELLS,
    "02-frameworks-dlpack.ipynb": make_frameworks_formats.FRAMEWORKS,
    "03-file-formats.ipynb": make_frameworks_formats.FORMATS,
    "04-arrow-and-batches.ipynb": make_arrow_batches.CELLS,
    "05-measure-your-machine.ipynb": make_measure.CELLS,
    "06-zarr-on-the-gpu.ipynb": make_zarr.CELLS,
    "07-scale-out.ipynb": make_scale.CELLS,
    "08-arrow-tables.ipynb": make_arrow_tables.CELLS,
}


def write_notebook(cells: list, name: str, folder: Path = HERE) -> Path:
    """Write ``cells`` as the notebook ``name`` in ``folder`` (default: this one), for a
    plain Python 3 kernel."""
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    out = folder / name
    nbformat.write(nb, out)
    return out


def main(names: list[str]) -> None:
    """Write the notebooks named (all of them when none are), dropping their outputs."""
    unknown = set(names) - set(NOTEBOOKS)
    if unknown:
        raise SystemExit(f"unknown notebooks {sorted(unknown)}; known: {sorted(NOTEBOOKS)}")
    for name, cells in NOTEBOOKS.items():
        if not names or name in names:
            print("wrote", write_notebook(cells, name))


if __name__ == "__main__":
    main(sys.argv[1:])
