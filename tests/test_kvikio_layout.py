"""kvikio's module layout resolves on kvikpy (``kvikpy.buffer``, ``kvikpy.stream``,
``kvikpy.utils``, the page-cache functions in ``kvikpy.cufile``), its version constants
are set, and its deprecation helpers behave as kvikio's."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from conftest import run_python

import kvikpy
import kvikpy.utils

ROOT = Path(__file__).resolve().parent.parent

# kvikio 26.10's `kvikio.__all__`, less what other parts of kvikpy provide (Mmap and the
# remote-file names).
KVIKIO_TOP_LEVEL = [
    "__git_commit__",
    "__version__",
    "clear_page_cache",
    "CuFile",
    "drop_file_page_cache",
    "drop_system_page_cache",
    "get_page_cache_info",
    "kvikio_deprecation_notice",
    "stream_register",
    "stream_deregister",
    "memory_register",
    "memory_deregister",
    "bounce_buffer_free",
]


@pytest.mark.parametrize("name", KVIKIO_TOP_LEVEL)
def test_kvikio_s_top_level_names_exist(name):
    assert hasattr(kvikpy, name)
    assert name in kvikpy.__all__


@pytest.mark.parametrize(
    ("module", "names"),
    [
        ("buffer", ["memory_register", "memory_deregister", "bounce_buffer_free"]),
        ("stream", ["stream_register", "stream_deregister"]),
        ("utils", ["call_once", "kvikio_deprecation_notice", "kvikio_deprecate_module"]),
        (
            "cufile",
            [
                "CuFile",
                "get_page_cache_info",
                "drop_file_page_cache",
                "drop_system_page_cache",
                "clear_page_cache",
            ],
        ),
        ("numpy", ["LikeWrapper", "FileLike", "fromfile", "tofile"]),
        ("defaults", ["get", "set", "compat_mode"]),
    ],
)
def test_kvikio_s_modules_import_with_their_names(module, names):
    mod = importlib.import_module(f"kvikpy.{module}")
    for name in names:
        assert hasattr(mod, name), f"kvikpy.{module}.{name}"
        top = getattr(kvikpy, name, None)
        if top is not None and callable(top):
            assert getattr(mod, name) is top, f"kvikpy.{module}.{name} is kvikpy.{name}"


def test_version_constants_are_strings():
    """kvikio's test_version: __git_commit__ a str (empty outside a built distribution),
    __version__ a non-empty str."""
    assert isinstance(kvikpy.__git_commit__, str)
    assert isinstance(kvikpy.__version__, str) and kvikpy.__version__


def test_git_commit_is_a_commit_of_this_repository_when_built_from_it():
    commit = kvikpy.__git_commit__
    if commit:
        assert re.fullmatch(r"[0-9a-f]{40}", commit), commit
    git = shutil.which("git")
    built_here = ROOT in Path(kvikpy._lib.__file__).resolve().parents
    if git is None or not built_here or not (ROOT / ".git").exists():
        pytest.skip("kvikpy is not an editable build of a git checkout here")
    assert commit, "a build from a git checkout records its commit"
    known = subprocess.run(
        [git, "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
    )
    assert known.returncode == 0, f"{commit} is not a commit of {ROOT}"


# --- kvikpy.utils: kvikio's test_utils, and more ----------------------------------------


def test_function_deprecation():
    @kvikpy.utils.kvikio_deprecation_notice("my deprecation notice", since="my_version")
    def func(x, *, y=1):
        """What func does."""
        return x + y

    with pytest.warns(FutureWarning, match="my deprecation notice") as caught:
        assert func(1, y=2) == 3
    assert caught[0].filename == __file__, "the warning points at the caller"
    assert ".. deprecated:: my_version" in (func.__doc__ or "")
    assert "What func does." in (func.__doc__ or "")
    assert func.__name__ == "func"


def test_function_deprecation_default_message():
    @kvikpy.utils.kvikio_deprecation_notice(since="1.0")
    def func():
        pass

    with pytest.warns(FutureWarning, match="This function is deprecated"):
        func()


def test_module_deprecation():
    with pytest.warns(FutureWarning, match="my_version.*my deprecation notice") as caught:
        kvikpy.utils.kvikio_deprecate_module("my deprecation notice", since="my_version")
    assert str(caught[0].message) == (
        "This module is deprecated since my_version. my deprecation notice"
    )


def test_call_once_runs_once_and_returns_the_first_result():
    calls = []

    @kvikpy.utils.call_once
    def setup(x):
        calls.append(x)
        return x * 10

    assert setup(1) == 10
    assert setup(2) == 10, "later calls return the first result, whatever their arguments"
    assert calls == [1]


def test_call_once_runs_once_under_concurrent_first_calls():
    calls = []
    start = threading.Barrier(8)

    @kvikpy.utils.call_once
    def setup():
        calls.append(1)
        return object()

    results = []

    def worker():
        start.wait()
        results.append(setup())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len({id(r) for r in results}) == 1


def test_call_once_tries_again_after_the_first_call_raised():
    attempts = []

    @kvikpy.utils.call_once
    def flaky():
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("first try fails")
        return "ok"

    with pytest.raises(RuntimeError):
        flaky()
    assert flaky() == "ok"
    assert flaky() == "ok"
    assert len(attempts) == 2


def test_kvikio_deprecation_notice_is_exported_at_the_top_level():
    assert kvikpy.kvikio_deprecation_notice is kvikpy.utils.kvikio_deprecation_notice


def test_kvikio_s_modules_import_without_warnings():
    code = (
        "import warnings\n"
        "warnings.simplefilter('error')\n"
        "import kvikpy.buffer, kvikpy.stream, kvikpy.utils, kvikpy.numpy\n"
    )
    r = run_python(code)
    assert r.returncode == 0, r.stderr
