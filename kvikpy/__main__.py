"""``python -m kvikpy``: the command line; see the package :mod:`kvikpy._cli`."""

from __future__ import annotations

import sys

from kvikpy._cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
