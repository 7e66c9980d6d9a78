"""Execute every notebook in this folder in place, saving its outputs (`make notebooks`);
names given on the command line (``08-arrow-tables.ipynb``) execute only those."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import nbclient
import nbformat


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
        # Each kernel starts in an empty folder, so that the repository's source `kvikpy/`
        # (no compiled module in it) cannot shadow the installed package.
        with tempfile.TemporaryDirectory(prefix="kvikpy-nb-") as cwd:
            resources = {"metadata": {"path": cwd}}
            nbclient.NotebookClient(
                nb, timeout=600, kernel_name="python3", resources=resources
            ).execute()
        nbformat.write(nb, path)
        print("executed", path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
