"""The ``kvikio`` shim of the kvikio-tests harness (tests/kvikio_shim, tests/kvikio_harness.py).

The shim must answer ``import kvikio.X`` with kvikpy's own ``kvikpy.X`` module object for
every module kvikpy has, fail for the ones it lacks, never load a kvikpy module twice, and
never be importable outside the harness. Each check runs in a fresh interpreter, so the
shim's finder never enters this test process.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import kvikio_harness
from conftest import run_python

import kvikpy

SHIM = Path(__file__).resolve().parent / "kvikio_shim"


def importable(name: str) -> bool:
    """Whether ``name`` imports here: the optional extras' modules (``kvikpy.zarr``,
    ``kvikpy.dask``) raise ``ImportError`` where their extra is not installed, as they
    must, and then have nothing for the shim to alias."""
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def kvikpy_modules() -> list[str]:
    """Every module of the kvikpy package that imports here, public and private, as
    ``kvikpy.X``."""
    return sorted(
        f"kvikpy.{m.name}"
        for m in pkgutil.iter_modules(kvikpy.__path__)
        if m.name != "__main__" and importable(f"kvikpy.{m.name}")
    )


def shim_python(code: str) -> dict[str, object]:
    """Run ``code`` with the shim first on the path; it prints one JSON object."""
    proc = run_python(textwrap.dedent(code), env={"PYTHONPATH": SHIM_PATH, "PYTHONSAFEPATH": "1"})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# The shim first, then whatever path this run imports kvikpy from (an installed wheel on
# the GPU machine).
SHIM_PATH = os.pathsep.join(p for p in (str(SHIM), os.environ.get("PYTHONPATH", "")) if p)


def test_every_kvikpy_module_is_kvikio_module() -> None:
    names = kvikpy_modules()
    assert {"kvikpy.cufile", "kvikpy.defaults", "kvikpy.numpy", "kvikpy._lib"} <= set(names)
    out = shim_python(
        f"""
        import importlib, json, sys
        import kvikio, kvikpy
        from kvikio import CuFile
        from kvikio.defaults import CompatMode
        res = {{"top": kvikio is kvikpy and CuFile is kvikpy.CuFile,
                "enum": CompatMode is kvikpy.CompatMode}}
        for real in {names!r}:
            alias = "kvikio" + real[len("kvikpy"):]
            mod = importlib.import_module(alias)
            res[alias] = [mod is importlib.import_module(real), mod.__name__,
                          mod.__spec__.name, sys.modules[alias] is sys.modules[real]]
        print(json.dumps(res))
        """
    )
    assert out.pop("top") is True, "import kvikio must give the kvikpy module itself"
    assert out.pop("enum") is True
    assert out == {"kvikio" + n[len("kvikpy") :]: [True, n, n, True] for n in names}


def test_module_kvikpy_lacks_fails_and_nothing_loads_twice() -> None:
    out = shim_python(
        """
        import json, sys
        import kvikio.defaults, kvikio.numpy
        try:
            import kvikio.no_such_module
            err = None
        except ModuleNotFoundError as e:
            err = e.name
        real = {id(m) for n, m in sys.modules.items() if n.split(".")[0] == "kvikpy"}
        aliases = [n for n in sys.modules if n.split(".")[0] == "kvikio"]
        print(json.dumps({"err": err, "aliases": sorted(aliases),
                          "stray": [n for n in aliases if id(sys.modules[n]) not in real]}))
        """
    )
    assert out["err"] == "kvikio.no_such_module"
    assert out["aliases"] == ["kvikio", "kvikio.defaults", "kvikio.numpy"]
    assert out["stray"] == [], "a kvikio.X module that is not kvikpy's own"


def test_kvikio_shim_not_importable_without_harness_path() -> None:
    proc = run_python(
        """
import importlib.util, json, sys
spec = importlib.util.find_spec("kvikio")
print(json.dumps({"origin": spec and spec.origin, "path": sys.path}))
"""
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    # Absent, or (where the real kvikio is installed) never the shim.
    assert out["origin"] is None or not out["origin"].startswith(str(SHIM))
    assert not any(p and Path(p).resolve() == SHIM for p in out["path"])
    assert not (Path(kvikpy.__file__).parent / "kvikio").exists()


def test_harness_ini_and_junit_summary(tmp_path: Path) -> None:
    ini = kvikio_harness.ini_text(
        '[tool.pytest.ini_options]\nfilterwarnings = ["error", "ignore::X"]\n'
        'asyncio_mode = "auto"\nminversion = "8"\n',
        "pyproject.toml@abc",
    )
    assert "filterwarnings =\n    error\n    ignore::X\n" in ini
    assert "\nminversion = 8\n" in ini
    assert "# asyncio_mode = auto (dropped" in ini
    junit = tmp_path / "j.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="" name="tests.test_numpy"><error message="collection failure">'
        "t\nE   ImportError: no LikeWrapper</error></testcase>"
        '<testcase classname="tests.test_defaults" name="test_a"/>'
        '<testcase classname="tests.test_defaults" name="test_b">'
        '<failure message="KeyError: x">tb</failure></testcase>'
        '<testcase classname="tests.test_mmap" name="tests.test_mmap">'
        '<skipped message="no cupy"/></testcase>'
        "</testsuite></testsuites>"
    )
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    assert [kvikio_harness.file_of(c) for c in cases] == [
        "test_numpy.py",
        "test_defaults.py",
        "test_defaults.py",
        "test_mmap.py",
    ]
    assert kvikio_harness.outcome(cases[0]) == ("error", "ImportError: no LikeWrapper")
    text = kvikio_harness.summary(junit, tmp_path / "missing.txt", 1, "kvikpy")
    assert "| test_defaults.py | 1 | 1 | 0 | 0 |" in text
    assert "| **all** | 1 | 1 | 1 | 1 |" in text
    assert "- `test_defaults.py::test_b` (failed): KeyError: x" in text
