"""Execute every notebook in this folder in place, saving its outputs (`make notebooks`)."""

from __future__ import annotations

import sys
from pathlib import Path

import nbclient
import nbformat


def main() -> int:
    here = Path(__file__).parent
    for path in sorted(here.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3").execute()
        nbformat.write(nb, path)
        print("executed", path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
