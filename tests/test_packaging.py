"""The distributions users install: the wheel's platform tag, the licence and metadata in
the wheel and the sdist, what installing the sdist does without Rust, and the conda recipe.

``make test`` builds dist/ with ``make wheels`` first and runs this module with
``KVIKPY_DIST_DIR`` pointing at it; run alone without built files, the tests that need them
skip (building a release wheel takes minutes). The checks themselves are
tests/check_dist.py's, which ``make wheels`` also runs without pytest. The recipe and
build-backend tests need nothing built and always run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import check_dist
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CARGO = tomllib.loads((ROOT / "Cargo.toml").read_text())
VERSION = CARGO["workspace"]["package"]["version"]
REPOSITORY = CARGO["workspace"]["package"]["repository"]
LICENSE_TEXT = (ROOT / "LICENSE").read_text()
BACKEND = ROOT / "build_backend"


def dist_dir() -> Path:
    given = os.environ.get("KVIKPY_DIST_DIR")
    if not given or not any(Path(given).glob("kvikpy-*")):
        pytest.skip("needs the built distributions in dist/: run `make wheels`")
    return Path(given)


@pytest.fixture(scope="module")
def wheel() -> Path:
    wheels = sorted(dist_dir().glob("kvikpy-*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {dist_dir()}, found {wheels}"
    return wheels[0]


@pytest.fixture(scope="module")
def sdist() -> Path:
    sdists = sorted(dist_dir().glob("kvikpy-*.tar.gz"))
    assert len(sdists) == 1, f"expected one sdist in {dist_dir()}, found {sdists}"
    return sdists[0]


manylinux_version = check_dist.manylinux_version


def test_manylinux_version_parsing():
    assert manylinux_version("manylinux_2_28_x86_64") == (2, 28)
    assert manylinux_version("manylinux_2_34_aarch64") == (2, 34)
    assert manylinux_version("manylinux2014_x86_64") == (2, 17)
    with pytest.raises(AssertionError):
        manylinux_version("linux_x86_64")


def test_wheel_is_manylinux_2_28_or_older(wheel):
    # auditwheel reads the symbols the library really needs, whatever the file is called.
    check_dist.check_wheel_tag(wheel, os.environ.get("KVIKPY_WHEEL_COMPAT", "manylinux_2_28"))


def test_wheel_carries_the_licence_and_metadata(wheel):
    check_dist.check_wheel_metadata(wheel)


def test_sdist_carries_the_licence_changelog_and_build_backend(sdist):
    check_dist.check_sdist(sdist)


def test_the_installed_wheel_imports_and_reads_outside_the_source_tree(wheel):
    out = check_dist.check_wheel_imports(wheel)
    assert out.startswith(f"kvikpy {VERSION} from "), out
    assert str(ROOT) not in out, out


def path_without_cargo() -> str:
    """PATH with every folder that holds a ``cargo`` left out."""
    kept = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    kept = [d for d in kept if not (Path(d) / "cargo").exists()]
    assert shutil.which("cargo", path=os.pathsep.join(kept)) is None
    return os.pathsep.join(kept)


def no_rust_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CARGO", "RUSTUP", "PIP_"))}
    env.update(PATH=path_without_cargo(), PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.update(extra)
    return env


@pytest.mark.timeout(300)
def test_installing_the_sdist_without_rust_stops_at_once_with_what_to_do(sdist, tmp_path):
    # Offline (no index) and without cargo: the build backend must not try to download
    # a toolchain (puccinialin, which would fetch one, is never run), and must say what
    # to install. A pip that hung instead fails on the subprocess's timeout; no time is
    # asserted.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-build-isolation",
            "--no-deps",
            "--no-cache-dir",
            "--target",
            str(tmp_path / "site"),
            str(sdist),
        ],
        capture_output=True,
        text=True,
        env=no_rust_env(),
        cwd=tmp_path,
        timeout=240,
    )
    out = result.stdout + result.stderr
    assert result.returncode != 0, out
    assert "building kvikpy from source needs Rust" in out, out
    assert "https://rustup.rs" in out and "KVIKPY_BOOTSTRAP_RUST=1" in out, out
    assert "puccinialin" not in out, out
    assert not (tmp_path / "site").exists()


def run_backend(hook: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Call one hook of kvikpy's build backend in a fresh interpreter, as pip would
    (from the source folder, with the backend folder on sys.path)."""
    pytest.importorskip("maturin")  # the backend wraps maturin's (make test installs it)
    code = f"import kvikpy_build, sys; print(kvikpy_build.{hook}())"
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(BACKEND)},
        cwd=ROOT,
        timeout=60,
    )


@pytest.mark.parametrize(
    "hook",
    [
        "get_requires_for_build_wheel",
        "get_requires_for_build_sdist",
        "get_requires_for_build_editable",
    ],
)
def test_backend_without_cargo_refuses_before_asking_for_a_toolchain(hook):
    # The first hook pip calls in an isolated build; maturin's own would answer
    # ["puccinialin"], the package that downloads Rust.
    result = run_backend(hook, no_rust_env())
    assert result.returncode == 1, result.stdout + result.stderr
    assert "building kvikpy from source needs Rust" in result.stderr
    assert "puccinialin" not in result.stdout


def test_backend_with_the_opt_in_hands_over_to_maturins_bootstrap():
    result = run_backend("get_requires_for_build_wheel", no_rust_env(KVIKPY_BOOTSTRAP_RUST="1"))
    assert result.returncode == 0, result.stderr
    assert "puccinialin" in result.stdout


@pytest.mark.skipif(shutil.which("cargo") is None, reason="needs cargo on PATH")
def test_backend_with_cargo_is_maturins():
    result = run_backend("get_requires_for_build_wheel", dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_pyproject_uses_the_checking_backend_and_declares_the_licence():
    build = PYPROJECT["build-system"]
    assert build["build-backend"] == "kvikpy_build"
    assert build["backend-path"] == ["build_backend"]
    project = PYPROJECT["project"]
    assert project["license"] == CARGO["workspace"]["package"]["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    assert project["urls"]["Source"] == REPOSITORY
    assert "Version 2.0, January 2004" in LICENSE_TEXT
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in LICENSE_TEXT


def test_changelog_describes_this_version():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[?{re.escape(VERSION)}\]?", changelog, re.M), changelog[:300]


# The conda recipe (rattler-build's recipe.yaml, schema version 1).

RECIPE = ROOT / "conda" / "recipe.yaml"


def requirement_names(reqs: list[str]) -> dict[str, str]:
    """``["numpy >=1.24", ...]`` -> ``{"numpy": ">=1.24"}`` (plain strings only)."""
    out = {}
    for r in reqs:
        name, _, spec = r.partition(" ")
        out[name] = spec.replace(" ", "")
    return out


@pytest.fixture(scope="module")
def recipe() -> dict:
    return yaml.safe_load(RECIPE.read_text())


def test_recipe_has_the_required_sections(recipe):
    assert recipe["schema_version"] == 1
    for key in ("context", "package", "source", "build", "requirements", "tests", "about"):
        assert key in recipe, key
    assert recipe["package"] == {"name": "${{ name }}", "version": "${{ version }}"}
    assert isinstance(recipe["build"]["number"], int)
    assert recipe["build"]["script"], "no build script"
    assert (RECIPE.parent / recipe["source"]["path"] / "pyproject.toml").is_file()


def test_recipe_matches_the_python_and_rust_metadata(recipe):
    context = recipe["context"]
    assert context["name"] == PYPROJECT["project"]["name"]
    assert context["version"] == VERSION
    req = recipe["requirements"]
    assert '${{ compiler("rust") }}' in req["build"]
    host = requirement_names(req["host"])
    assert host["maturin"] == PYPROJECT["build-system"]["requires"][0].removeprefix("maturin")
    run = requirement_names(req["run"])
    assert run["python"] == PYPROJECT["project"]["requires-python"]
    runtime = requirement_names(
        [d.replace(">", " >", 1) for d in PYPROJECT["project"]["dependencies"]]
    )
    for name, spec in runtime.items():
        assert run[name] == spec, name
    about = recipe["about"]
    assert about["license"] == PYPROJECT["project"]["license"]
    assert "LICENSE" in about["license_file"]
    assert about["repository"] == REPOSITORY
    assert about["summary"] == PYPROJECT["project"]["description"]


def test_recipe_expressions_name_only_known_variables(recipe):
    text = RECIPE.read_text()
    known = set(recipe["context"]) | {"PYTHON"}
    functions = {"compiler", "stdlib"}
    expressions = re.findall(r"\$\{\{\s*(.*?)\s*\}\}", text)
    assert expressions
    for expr in expressions:
        word = re.match(r"[A-Za-z_]+", expr)
        assert word, expr
        assert word[0] in known or word[0] in functions, expr
    # Braces must balance: a stray "${{" would be passed through as text.
    assert text.count("${{") == text.count("}}")


def test_recipe_tests_import_the_package(recipe):
    imports = [i for t in recipe["tests"] if "python" in t for i in t["python"]["imports"]]
    assert "kvikpy" in imports


# Quiet builds: `maturin develop` without pip's "Ignoring ...: markers 'extra == ...'"
# lines and without maturin's warning that the build backend is not maturin (kvikpy's
# backend wraps maturin's).

MAKEFILE = (ROOT / "Makefile").read_text()


def test_every_maturin_develop_in_the_makefile_is_quiet():
    assert re.search(r"^export MATURIN_NO_MISSING_BUILD_BACKEND_WARNING := 1$", MAKEFILE, re.M)
    recipe_lines = [ln for ln in MAKEFILE.splitlines() if ln.startswith("\t")]
    assert not [ln for ln in recipe_lines if "maturin develop" in ln], (
        "call $(MATURIN_DEVELOP) instead of maturin develop"
    )
    (macro,) = [ln for ln in MAKEFILE.splitlines() if ln.startswith("MATURIN_DEVELOP =")]
    assert "PIP_QUIET=1" in macro and "--quiet" in macro


def test_make_wheels_needs_only_the_release_environment():
    # A release build on a fresh clone: its own small venv, not the 1.5 GB development one.
    (rule,) = [ln for ln in MAKEFILE.splitlines() if ln.startswith("wheels:")]
    assert "$(STAMP)" not in rule and "$(REL_STAMP)" in rule
    (reqs,) = [ln for ln in MAKEFILE.splitlines() if ln.startswith("REL_REQS")]
    assert "numpy|maturin|ziglang|auditwheel" in reqs
    # ... and its check imports the installed wheel, never the checkout's kvikpy/.
    assert "tests/check_dist.py dist" in MAKEFILE


def _fake_wheel(folder: Path) -> Path:
    """A pure-Python wheel named like kvikpy's whose package has no compiled engine."""
    wheel = folder / f"kvikpy-{VERSION}-py3-none-any.whl"
    info = f"kvikpy-{VERSION}.dist-info"
    files = {
        "kvikpy/__init__.py": "__version__ = 'fake'\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: kvikpy\nVersion: {VERSION}\n",
        f"{info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return wheel


def test_the_wheel_check_imports_the_installed_wheel_not_the_checkout(tmp_path):
    # The checkout's kvikpy/ works here; a wheel without the engine must still fail.
    with pytest.raises(check_dist.DistError, match="importing the installed"):
        check_dist.check_wheel_imports(_fake_wheel(tmp_path))
    with pytest.raises(check_dist.DistError, match="no LICENSE in the wheel"):
        check_dist.check_wheel_metadata(_fake_wheel(tmp_path))
