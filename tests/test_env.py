"""KVIKIO_* environment variables, and the default thread count.

The engine reads the environment once per process (on first use), so each case runs in a
fresh interpreter with a controlled environment.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import run_python

PRINT_SETTINGS = """
import json
import kvikpy
from kvikpy import _lib
try:
    out = {n: kvikpy.defaults.get(n) for n in _lib.setting_names()}
except kvikpy.ConfigError as e:
    assert isinstance(e, ValueError) and isinstance(e, kvikpy.KvikpyError)
    out = {"ConfigError": str(e)}
else:
    out["compat_mode"] = out["compat_mode"].name
print(json.dumps(out))
"""

COMPAT_SPELLINGS = [
    ("ON", "ON"),
    ("on", "ON"),
    ("off", "OFF"),
    ("OFF", "OFF"),
    ("Auto", "AUTO"),
    ("AUTO", "AUTO"),
    ("true", "ON"),
    ("yes", "ON"),
    ("1", "ON"),
    ("false", "OFF"),
    ("no", "OFF"),
    ("0", "OFF"),
]

BOOL_SPELLINGS = [
    ("true", True),
    ("false", False),
    ("on", True),
    ("off", False),
    ("yes", True),
    ("no", False),
    ("1", True),
    ("0", False),
    ("TRUE", True),
    ("False", False),
    ("ON", True),
    ("No", False),
]

MALFORMED = [
    ("KVIKIO_TASK_SIZE", "4MiB"),
    ("KVIKIO_TASK_SIZE", "-1"),
    ("KVIKIO_TASK_SIZE", "0"),
    ("KVIKIO_TASK_SIZE", "1.5"),
    ("KVIKIO_TASK_SIZE", "0x1000"),
    ("KVIKIO_NTHREADS", "0"),
    ("KVIKIO_NTHREADS", "four"),
    ("KVIKIO_NTHREADS", "-3"),
    ("KVIKIO_NTHREADS", "1000000"),
    ("KVIKIO_NTHREADS", "1025"),
    ("KVIKIO_GDS_THRESHOLD", "-1"),
    ("KVIKIO_GDS_THRESHOLD", "16KiB"),
    ("KVIKIO_BOUNCE_BUFFER_SIZE", "0"),
    ("KVIKIO_BOUNCE_BUFFER_SIZE", "1e6"),
    ("KVIKIO_COMPAT_MODE", "maybe"),
    ("KVIKIO_COMPAT_MODE", "2"),
    ("KVIKIO_AUTO_DIRECT_IO_READ", "maybe"),
    ("KVIKIO_AUTO_DIRECT_IO_READ", "2"),
    ("KVIKIO_AUTO_DIRECT_IO_WRITE", "enabled"),
    ("KVIKPY_PAGE_CACHE_DMA", "maybe"),
    ("KVIKPY_WRITE_SYNC", "maybe"),
    ("KVIKPY_GPU_THREADS", "-1"),
    ("KVIKPY_GPU_THREADS", "1025"),
    ("KVIKIO_HTTP_MAX_ATTEMPTS", "0"),
    ("KVIKIO_HTTP_TIMEOUT", "-5"),
    ("KVIKIO_HTTP_STATUS_CODES", "503;429"),
    ("KVIKIO_HTTP_STATUS_CODES", "5030"),
]


MALFORMED_ONE_BY_ONE = """
import json, os, sys
import kvikpy
out = {}
for var, value in json.loads(sys.argv[1]):
    os.environ[var] = value
    try:
        kvikpy.defaults.get("task_size")
    except kvikpy.ConfigError as e:
        assert isinstance(e, ValueError) and isinstance(e, kvikpy.KvikpyError)
        out[f"{var}={value}"] = {"ConfigError": str(e)}
    else:
        out[f"{var}={value}"] = {"accepted": True}
        break  # the settings are now loaded and cached: later cases would say nothing
    del os.environ[var]
print(json.dumps(out))
"""


def _cases() -> dict[str, dict[str, str]]:
    """Every environment to start a fresh interpreter with, by name."""
    cases: dict[str, dict[str, str]] = {
        "none": {},
        "numeric": {
            "KVIKIO_NTHREADS": "3",
            "KVIKPY_GPU_THREADS": "5",
            "KVIKIO_TASK_SIZE": "1048576",
            "KVIKIO_GDS_THRESHOLD": "12345",
            "KVIKIO_BOUNCE_BUFFER_SIZE": "8192",
            "KVIKIO_HTTP_MAX_ATTEMPTS": "7",
            "KVIKIO_HTTP_TIMEOUT": "9",
            "KVIKIO_HTTP_STATUS_CODES": " 503, 429 ",
        },
        "gds0-read-yes-write-no": {
            "KVIKIO_GDS_THRESHOLD": "0",
            "KVIKIO_AUTO_DIRECT_IO_READ": "yes",
            "KVIKIO_AUTO_DIRECT_IO_WRITE": "no",
            "KVIKPY_PAGE_CACHE_DMA": "off",
            "KVIKPY_WRITE_SYNC": "yes",
        },
    }
    # One interpreter per compat-mode spelling, also testing two boolean spellings.
    n = len(BOOL_SPELLINGS)
    for i, (text, _) in enumerate(COMPAT_SPELLINGS):
        cases[f"spelling-{i}"] = {
            "KVIKIO_COMPAT_MODE": text,
            "KVIKIO_AUTO_DIRECT_IO_READ": BOOL_SPELLINGS[i % n][0],
            "KVIKIO_AUTO_DIRECT_IO_WRITE": BOOL_SPELLINGS[(i + 1) % n][0],
        }
    return cases


@pytest.fixture(scope="module")
def env_results() -> dict[str, dict[str, object]]:
    """Run every case of ``_cases()`` in its own interpreter, several at a time; the
    malformed values are tried one after another in one more interpreter (a malformed
    variable is never cached, so each one is parsed afresh)."""
    cases = _cases()

    def one(env: dict[str, str]) -> dict[str, object]:
        r = run_python(PRINT_SETTINGS, env=env)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def malformed() -> dict[str, dict[str, object]]:
        r = run_python(MALFORMED_ONE_BY_ONE, json.dumps(MALFORMED))
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        bad = pool.submit(malformed)
        results = dict(zip(cases, pool.map(one, cases.values()), strict=True))
        results.update(bad.result())
    return results


def expected_default_threads() -> int:
    return min(len(os.sched_getaffinity(0)), 16)


def test_defaults_without_any_variable(env_results):
    assert env_results["none"] == {
        "compat_mode": "AUTO",
        "num_threads": expected_default_threads(),
        "gpu_threads": 0,
        "task_size": 4 << 20,
        "gds_threshold": 16 << 10,
        "bounce_buffer_size": 16 << 20,
        "auto_direct_io_read": "auto",
        "auto_direct_io_write": True,
        "page_cache_dma": True,
        "write_sync": False,
        "http_max_attempts": 3,
        "http_status_codes": [429, 500, 502, 503, 504],
        "http_timeout": 60,
        "http_ca_bundle": None,
        "checkpoint_staging": 512 << 20,
    }


def test_default_num_threads_function_matches():
    r = run_python(
        "import kvikpy; from kvikpy import _lib;"
        "print(_lib.default_num_threads(), kvikpy.defaults.get('num_threads'))"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(expected_default_threads())] * 2


def test_default_num_threads_follows_cpu_affinity():
    cpu = min(os.sched_getaffinity(0))
    r = run_python(
        f"import os; os.sched_setaffinity(0, {{{cpu}}});"
        "import kvikpy; from kvikpy import _lib;"
        "print(_lib.default_num_threads(), kvikpy.defaults.get('num_threads'))"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "1"]


def test_numeric_variables_win_over_defaults(env_results):
    s = env_results["numeric"]
    assert s["num_threads"] == 3
    assert s["gpu_threads"] == 5
    assert s["task_size"] == 1048576
    assert s["gds_threshold"] == 12345
    assert s["bounce_buffer_size"] == 8192
    assert s["compat_mode"] == "AUTO"
    assert (s["http_max_attempts"], s["http_timeout"]) == (7, 9)
    assert s["http_status_codes"] == [503, 429]


def test_gds_threshold_zero_is_allowed(env_results):
    assert env_results["gds0-read-yes-write-no"]["gds_threshold"] == 0


def test_nthreads_variable_sizes_the_pool(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(1 << 20))
    r = run_python(
        "import sys, kvikpy; from kvikpy import _lib\n"
        "with kvikpy.CuFile(sys.argv[1]) as f:\n"
        "    f.pread(bytearray(1 << 20), task_size=65536).get()\n"
        "print(_lib.thread_pool_size())",
        str(path),
        env={"KVIKIO_NTHREADS": "3", "KVIKIO_GDS_THRESHOLD": "0"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "3"


@pytest.mark.parametrize(
    ("i", "text", "expected"), [(i, t, e) for i, (t, e) in enumerate(COMPAT_SPELLINGS)]
)
def test_compat_mode_variable(env_results, i, text, expected):
    assert env_results[f"spelling-{i}"]["compat_mode"] == expected


@pytest.mark.parametrize(
    ("i", "text", "expected"), [(i, t, e) for i, (t, e) in enumerate(BOOL_SPELLINGS)]
)
def test_auto_direct_io_variables(env_results, i, text, expected):
    n = len(BOOL_SPELLINGS)
    # Spelling i was given to READ in interpreter i and to WRITE in interpreter i - 1.
    assert env_results[f"spelling-{i % n}"]["auto_direct_io_read"] is expected
    assert env_results[f"spelling-{(i - 1) % n}"]["auto_direct_io_write"] is expected


def test_auto_direct_io_variables_are_independent(env_results):
    s = env_results["gds0-read-yes-write-no"]
    assert (s["auto_direct_io_read"], s["auto_direct_io_write"]) == (True, False)
    assert s["page_cache_dma"] is False
    assert s["write_sync"] is True


@pytest.mark.parametrize(("var", "value"), MALFORMED, ids=[f"{v}={x}" for v, x in MALFORMED])
def test_malformed_variables_raise_config_error_naming_them(env_results, var, value):
    """Importing kvikpy never fails on a bad variable; reading a setting raises."""
    result = env_results[f"{var}={value}"]
    assert "ConfigError" in result, f"{var}={value!r} was accepted: {result}"
    message = result["ConfigError"]
    assert var in message
    assert value in message


def test_an_absurd_thread_count_in_the_environment_says_the_limit(env_results):
    message = env_results["KVIKIO_NTHREADS=1000000"]["ConfigError"]
    assert "1 to 1024" in message and "limit" in message


def test_malformed_variable_also_fails_set_and_io(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(100))
    r = run_python(
        "import sys, kvikpy\n"
        "for call in (lambda: kvikpy.defaults.set('num_threads', 2),\n"
        "             lambda: kvikpy.CuFile(sys.argv[1]).read(bytearray(10))):\n"
        "    try:\n"
        "        call()\n"
        "    except kvikpy.ConfigError as e:\n"
        "        print('KVIKIO_NTHREADS' in str(e))\n",
        str(path),
        env={"KVIKIO_NTHREADS": "lots"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True"]


def test_fixing_the_environment_in_process_recovers():
    """The error is not cached: after fixing os.environ, get and set work."""
    r = run_python(
        """
import os, kvikpy
os.environ["KVIKIO_TASK_SIZE"] = "4MiB"
try:
    kvikpy.defaults.get("task_size")
except kvikpy.ConfigError as e:
    assert "KVIKIO_TASK_SIZE" in str(e)
else:
    raise SystemExit("expected ConfigError")
try:
    kvikpy.defaults.set("num_threads", 2)
except kvikpy.ConfigError:
    pass
else:
    raise SystemExit("expected ConfigError from set too")
os.environ["KVIKIO_TASK_SIZE"] = "1024"
print(kvikpy.defaults.get("task_size"))
kvikpy.defaults.set("num_threads", 2)
print(kvikpy.defaults.get("num_threads"), kvikpy.defaults.get("task_size"))
"""
    )
    assert r.returncode == 0, r.stderr + r.stdout
    assert r.stdout.split() == ["1024", "2", "1024"]


def test_variables_are_read_once_and_cached():
    r = run_python(
        """
import os, kvikpy
print(kvikpy.defaults.get("num_threads"))
os.environ["KVIKIO_NTHREADS"] = "9"
os.environ["KVIKIO_TASK_SIZE"] = "not a number"
print(kvikpy.defaults.get("num_threads"), kvikpy.defaults.get("task_size"))
""",
        env={"KVIKIO_NTHREADS": "5"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["5", "5", str(4 << 20)]


def test_set_overrides_the_environment():
    r = run_python(
        "import kvikpy; kvikpy.defaults.set('task_size', 4096);"
        "print(kvikpy.defaults.get('task_size'), kvikpy.defaults.get('num_threads'))",
        env={"KVIKIO_TASK_SIZE": "1048576", "KVIKIO_NTHREADS": "2"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["4096", "2"]
