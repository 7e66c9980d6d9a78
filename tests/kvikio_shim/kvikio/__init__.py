"""A stand-in ``kvikio`` package that is kvikpy, for running kvikio's own test files.

Why it exists: kvikpy claims that ``import kvikpy as kvikio`` runs kvikio code unchanged.
kvikio's Python test-suite is the best check of that claim, but its files say
``import kvikio``, ``import kvikio.defaults`` and ``from kvikio.numpy import ...``, and
they may not be edited (they are fetched at run time, never committed). This package
answers those imports with kvikpy's own modules:

* ``import kvikio`` gives the ``kvikpy`` module object itself (this module replaces
  itself in ``sys.modules``), so ``kvikio.CuFile is kvikpy.CuFile``;
* ``import kvikio.X`` gives ``kvikpy.X``, the same module object, for every submodule
  kvikpy has, through a finder placed first on ``sys.meta_path``. A submodule kvikpy
  lacks (``kvikio.cufile_driver`` today) fails with ``ModuleNotFoundError``, as it would
  with ``import kvikpy as kvikio``: the harness reports it as missing API, and it starts
  to resolve as soon as ``kvikpy/X.py`` exists, with no change here. kvikpy's modules are
  never loaded a second time under a ``kvikio.`` name.

It is not installed and not importable by default: only ``make kvikio-tests`` and
``make gpu-kvikio-tests`` put ``tests/kvikio_shim`` first on ``PYTHONPATH``
(``tests/test_kvikio_shim.py`` checks both properties). Where the real kvikio is
installed, it is unaffected outside the harness.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType

import kvikpy

ALIAS = "kvikio"
TARGET = "kvikpy"


class _AliasLoader(importlib.abc.Loader):
    """Loads ``kvikio.X`` by importing ``kvikpy.X`` and handing back that module object."""

    def __init__(self, target: str) -> None:
        self._target = target
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self._target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system has just set module.__spec__ to the alias's spec: give the
        # module its own back, so kvikpy.X stays exactly what it was.
        module.__spec__ = self._spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds ``kvikio.X`` as an alias of ``kvikpy.X`` when kvikpy has ``X``."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(ALIAS + "."):
            return None
        real = TARGET + fullname[len(ALIAS) :]
        if importlib.util.find_spec(real) is None:
            return None  # kvikpy has no such module: the import fails as it should
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real))


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())

sys.modules[ALIAS] = kvikpy
