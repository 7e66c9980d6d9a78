"""Checks of the release distributions in dist/, runnable without pytest or a development build.

``make wheels`` runs ``python tests/check_dist.py dist`` in its own small environment
(numpy, maturin, zig and auditwheel only): the wheel's platform tag (auditwheel), the
licence and metadata in the wheel and the sdist, and the wheel installed into a temporary
folder and imported from there, in a fresh interpreter outside the source tree, so that
the check tests the built package and never the checkout's ``kvikpy/`` folder.
tests/test_packaging.py runs the same checks under pytest in ``make test``.
"""

from __future__ import annotations

import email.parser
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_CARGO = tomllib.loads((ROOT / "Cargo.toml").read_text())
VERSION: str = _CARGO["workspace"]["package"]["version"]
REPOSITORY: str = _CARGO["workspace"]["package"]["repository"]
LICENSE_TEXT = (ROOT / "LICENSE").read_text()
WHEEL_COMPAT = os.environ.get("KVIKPY_WHEEL_COMPAT", "manylinux_2_28")


class DistError(AssertionError):
    """A release distribution is not what it should be (the message says what differs)."""


def _require(ok: object, message: str) -> None:
    if not ok:
        raise DistError(message)


def one(dist: Path, pattern: str) -> Path:
    """The single file in ``dist`` matching ``pattern``."""
    found = sorted(dist.glob(pattern))
    _require(len(found) == 1, f"expected one {pattern} in {dist}, found {found}")
    return found[0]


def manylinux_version(tag: str) -> tuple[int, int]:
    """``manylinux_2_28_x86_64`` -> (2, 28); the legacy aliases map to their glibc."""
    legacy = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
    for alias, version in legacy.items():
        if tag.startswith(alias + "_"):
            return version
    m = re.match(r"manylinux_(\d+)_(\d+)_", tag)
    _require(m, f"not a manylinux tag: {tag!r}")
    assert m is not None
    return int(m[1]), int(m[2])


def check_wheel_tag(wheel: Path, compat: str = WHEEL_COMPAT) -> str:
    """The wheel's name and auditwheel's reading of its symbols are ``compat`` or older."""
    limit = manylinux_version(compat + "_x")
    tag = wheel.name.removesuffix(".whl").split("-")[-1]
    _require(manylinux_version(tag) <= limit, f"{wheel.name} is tagged {tag}, newer than {compat}")
    # auditwheel reads the symbols the library really needs, whatever the file is called.
    result = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", str(wheel)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    _require(result.returncode == 0, f"auditwheel show failed:\n{result.stdout}{result.stderr}")
    text = " ".join(result.stdout.split())
    m = re.search(r'consistent with the following platform tag: "([^"]+)"', text)
    _require(m, f"auditwheel gave no platform tag: {text}")
    assert m is not None
    _require(manylinux_version(m[1]) <= limit, f"auditwheel: {text}")
    return m[1]


def check_wheel_metadata(wheel: Path) -> None:
    """The licence, version, licence expression, project URLs and the compiled module."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        licences = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        _require(licences, f"no LICENSE in the wheel: {names}")
        _require(z.read(licences[0]).decode() == LICENSE_TEXT, "the wheel's LICENSE differs")
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(meta_name).decode())
    _require(meta["Version"] == VERSION, f"wheel version {meta['Version']}, Cargo.toml {VERSION}")
    _require(meta["License-Expression"] == "Apache-2.0", "License-Expression is not Apache-2.0")
    _require(meta["License-File"] == "LICENSE", "License-File is not LICENSE")
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    _require(urls.get("Source") == REPOSITORY, f"Source URL {urls.get('Source')!r}")
    _require(urls.get("Changelog", "").endswith("CHANGELOG.md"), "no Changelog URL")
    extras = set(meta.get_all("Provides-Extra") or [])
    _require({"zarr", "dask"} <= extras, f"the wheel offers the extras {sorted(extras)}")
    _require(any(n.endswith("_lib.abi3.so") for n in names), "no compiled kvikpy/_lib in the wheel")


def check_sdist(sdist: Path) -> None:
    """The licence, the changelog, the build backend and Cargo.lock are in the sdist."""
    prefix = f"kvikpy-{VERSION}/"
    with tarfile.open(sdist) as t:
        names = set(t.getnames())
        for needed in ("LICENSE", "CHANGELOG.md", "build_backend/kvikpy_build.py", "Cargo.lock"):
            _require(prefix + needed in names, f"{needed} is not in {sdist.name}")
        licence = t.extractfile(prefix + "LICENSE")
        _require(licence is not None, "LICENSE in the sdist is not a file")
        assert licence is not None
        _require(licence.read().decode() == LICENSE_TEXT, "the sdist's LICENSE differs")


# Run in a fresh interpreter whose only kvikpy is the installed wheel: -I leaves out the
# current folder, PYTHONPATH and the user's site-packages.
_IMPORT_CHECK = """
import os, sys, tempfile
site = sys.argv[1]
sys.path.insert(0, site)
import numpy as np
import kvikpy
assert os.path.realpath(kvikpy.__file__).startswith(os.path.realpath(site)), kvikpy.__file__
data = np.arange(1 << 16, dtype=np.uint8)
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "x.bin")
    data.tofile(path)
    out = np.empty_like(data)
    with kvikpy.CuFile(path, "r") as f:
        assert f.read(out) == data.nbytes
    assert (out == data).all()
print("kvikpy", kvikpy.__version__, "from", os.path.dirname(kvikpy.__file__))
"""


def check_wheel_imports(wheel: Path) -> str:
    """Install the wheel (no dependencies, no index) into a temporary folder, import it
    from there in a fresh interpreter and read a file with it; the interpreter's output."""
    with tempfile.TemporaryDirectory(prefix="kvikpy-wheel-check-") as tmp:
        site = Path(tmp) / "site"
        install = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--target",
                str(site),
                str(wheel),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        _require(install.returncode == 0, f"installing {wheel.name}:\n{install.stderr}")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        result = subprocess.run(
            [sys.executable, "-I", "-c", _IMPORT_CHECK, str(site)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp,
            env=env,
        )
        _require(
            result.returncode == 0,
            f"importing the installed {wheel.name} failed:\n{result.stdout}{result.stderr}",
        )
        return result.stdout.strip()


def main(argv: list[str]) -> int:
    dist = Path(argv[1] if len(argv) > 1 else "dist")
    wheel = one(dist, "kvikpy-*.whl")
    sdist = one(dist, "kvikpy-*.tar.gz")
    try:
        tag = check_wheel_tag(wheel)
        check_wheel_metadata(wheel)
        check_sdist(sdist)
        imported = check_wheel_imports(wheel)
    except DistError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{wheel.name}: auditwheel {tag}; licence and metadata present; {imported}")
    print(f"{sdist.name}: licence, changelog, build backend and Cargo.lock present")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
