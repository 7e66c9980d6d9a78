"""kvikpy.defaults: get/set, context-manager restore, validation, and the older
per-setting functions."""

from __future__ import annotations

import pytest
from conftest import random_bytes

import kvikpy
from kvikpy import CompatMode, _lib, defaults

NAMES = [
    "compat_mode",
    "num_threads",
    "gpu_threads",
    "task_size",
    "gds_threshold",
    "bounce_buffer_size",
    "auto_direct_io_read",
    "auto_direct_io_write",
    "page_cache_dma",
    "write_sync",
    "http_max_attempts",
    "http_status_codes",
    "http_timeout",
    "http_ca_bundle",
    "checkpoint_staging",
]

# A valid value for each setting that differs from the usual default.
OTHER = {
    "compat_mode": CompatMode.ON,
    "num_threads": 7,
    "gpu_threads": 3,
    "task_size": 123457,
    "gds_threshold": 4097,
    "bounce_buffer_size": 12289,
    "auto_direct_io_read": True,
    "auto_direct_io_write": False,
    "page_cache_dma": False,
    "write_sync": True,
    "http_max_attempts": 5,
    "http_status_codes": [500, 429],
    "http_timeout": 7,
    "http_ca_bundle": __file__,  # set-time checks only that the path exists
    "checkpoint_staging": 3 << 20,
}


def snapshot() -> dict[str, object]:
    return {name: defaults.get(name) for name in NAMES}


def test_setting_names():
    assert sorted(_lib.setting_names()) == sorted(NAMES)


def test_every_table_of_variables_is_the_engines():
    """The engine's table of settings and their environment variables is the one the
    parser reads (a Rust test checks that); the table in ``kvikpy.defaults``' docstring,
    the one in docs/settings.md and the notebook table show exactly it, in its order."""
    import re
    from pathlib import Path

    engine = [tuple(pair) for pair in _lib.setting_variables()]
    assert [name for name, _ in engine] == _lib.setting_names()
    assert defaults.__doc__ is not None
    docstring = re.findall(r"^``(\w+)``\s+``([A-Z_]+)``", defaults.__doc__, re.MULTILINE)
    assert docstring == engine
    page = (Path(__file__).parent.parent / "docs" / "settings.md").read_text()
    documented = re.findall(r"^\| `(\w+)` \| `([A-Z_]+)` \|", page, re.MULTILINE)
    assert documented == engine
    table = defaults._repr_html_()
    for name, variable in engine:
        assert f">{name}<" in table and f">{variable}<" in table


def test_get_types():
    assert isinstance(defaults.get("compat_mode"), CompatMode)
    for name in ("num_threads", "task_size", "gds_threshold", "bounce_buffer_size"):
        value = defaults.get(name)
        assert type(value) is int, name
        assert value >= 0
    for name in ("num_threads", "task_size", "bounce_buffer_size"):
        assert defaults.get(name) > 0
    for name in ("auto_direct_io_write", "page_cache_dma"):
        assert type(defaults.get(name)) is bool, name
    # True, False, or "auto" (reads by residency, the default).
    assert defaults.get("auto_direct_io_read") in (True, False, "auto")


def test_compat_mode_members():
    assert {m.name for m in CompatMode} == {"OFF", "ON", "AUTO"}
    assert CompatMode.OFF != CompatMode.ON != CompatMode.AUTO
    assert kvikpy.CompatMode is defaults.CompatMode


@pytest.mark.parametrize("name", NAMES)
def test_set_name_value_applies_at_once(name):
    original = defaults.get(name)
    defaults.set(name, OTHER[name])
    assert defaults.get(name) == OTHER[name]
    defaults.set(name, original)
    assert defaults.get(name) == original


def test_set_dict_and_kwargs_apply_at_once():
    defaults.set({"task_size": 5000, "num_threads": 3})
    assert (defaults.get("task_size"), defaults.get("num_threads")) == (5000, 3)
    defaults.set(task_size=6000, auto_direct_io_read=True)
    assert defaults.get("task_size") == 6000
    assert defaults.get("auto_direct_io_read") is True
    defaults.set({"task_size": 7000}, num_threads=2)
    assert (defaults.get("task_size"), defaults.get("num_threads")) == (7000, 2)
    defaults.set()  # nothing to change
    assert defaults.get("task_size") == 7000


def test_set_all_at_once_and_restore():
    before = snapshot()
    with defaults.set(OTHER):
        assert snapshot() == OTHER
    assert snapshot() == before


@pytest.mark.parametrize(
    "make",
    [
        lambda: defaults.set("task_size", 777),
        lambda: defaults.set({"task_size": 777}),
        lambda: defaults.set(task_size=777),
    ],
    ids=["name-value", "dict", "kwargs"],
)
def test_set_as_context_manager_restores_on_exit(make):
    before = snapshot()
    with make() as value:
        assert value is None
        assert defaults.get("task_size") == 777
        others = snapshot()
        del others["task_size"]
        assert others == {k: v for k, v in before.items() if k != "task_size"}
    assert snapshot() == before


def test_context_manager_restores_on_exception():
    before = snapshot()
    with pytest.raises(ZeroDivisionError), defaults.set(num_threads=5, compat_mode="on"):
        assert defaults.get("num_threads") == 5
        raise ZeroDivisionError
    assert snapshot() == before


def test_nested_context_managers_restore_in_order():
    before = snapshot()
    with defaults.set("task_size", 1000):
        with defaults.set({"task_size": 2000, "num_threads": 5}):
            assert defaults.get("task_size") == 2000
            with defaults.set(task_size=3000, compat_mode=CompatMode.OFF):
                assert defaults.get("task_size") == 3000
                assert defaults.get("compat_mode") is CompatMode.OFF
            assert defaults.get("task_size") == 2000
            assert defaults.get("num_threads") == 5
            assert defaults.get("compat_mode") == before["compat_mode"]
        assert defaults.get("task_size") == 1000
        assert defaults.get("num_threads") == before["num_threads"]
    assert snapshot() == before


def test_restore_only_touches_the_settings_it_set():
    with defaults.set("task_size", 1000):
        defaults.set("num_threads", 6)  # changed inside the block, not by the block
    assert defaults.get("num_threads") == 6
    assert defaults.get("task_size") != 1000


def test_settings_apply_to_io(tmp_path):
    """A changed num_threads is used by the next pooled operation."""
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 8192)
    buf = bytearray(2 << 20)
    with defaults.set({"num_threads": 3, "gds_threshold": 0}), kvikpy.CuFile(path) as f:
        assert f.pread(buf, task_size=1 << 16).get() == len(buf)
        assert _lib.thread_pool_size() == 3
    assert bytes(buf) == path.read_bytes()


INVALID = [
    ("num_threads", 0),
    ("num_threads", -1),
    ("gpu_threads", -1),
    ("gpu_threads", 1025),
    ("task_size", 0),
    ("task_size", -1),
    ("task_size", -(2**70)),
    ("task_size", 2**64),
    ("task_size", 2**63),
    ("gds_threshold", 2**63),
    ("gds_threshold", -1),
    ("bounce_buffer_size", 0),
    ("bounce_buffer_size", -4096),
    ("compat_mode", "maybe"),
    ("compat_mode", ""),
    ("compat_mode", 1.0),
    ("compat_mode", None),
    ("auto_direct_io_read", 5),
    ("auto_direct_io_read", 2.5),
    ("auto_direct_io_read", "maybe"),
    ("auto_direct_io_read", None),
    ("auto_direct_io_write", None),
    ("page_cache_dma", 1),
    ("page_cache_dma", "yes"),
    ("write_sync", 1),
    ("checkpoint_staging", 0),
    ("checkpoint_staging", (2 << 20) - 1),
    ("checkpoint_staging", -1),
]


@pytest.mark.parametrize(("name", "value"), INVALID, ids=[f"{n}={v!r}" for n, v in INVALID])
def test_invalid_values_raise_value_error_and_change_nothing(name, value):
    before = snapshot()
    with pytest.raises(ValueError) as info:
        defaults.set(name, value)
    assert name in str(info.value)
    assert not isinstance(info.value, kvikpy.ConfigError), "ConfigError is for KVIKIO_* vars"
    assert snapshot() == before
    with pytest.raises(ValueError):
        defaults.set({name: value})
    with pytest.raises(ValueError):
        defaults.set(**{name: value})
    assert snapshot() == before


# Integer settings take integers (operator.index's): anything else is a TypeError.
WRONG_TYPE = [
    ("num_threads", 2.0),
    ("num_threads", "4"),
    ("num_threads", None),
    ("num_threads", True),
    ("gpu_threads", 1.5),
    ("task_size", True),
    ("task_size", 1.5),
    ("gds_threshold", False),
    ("http_timeout", 1.5),
]


@pytest.mark.parametrize(("name", "value"), WRONG_TYPE, ids=[f"{n}={v!r}" for n, v in WRONG_TYPE])
def test_values_of_the_wrong_type_raise_type_error_and_change_nothing(name, value):
    before = snapshot()
    with pytest.raises(TypeError) as info:
        defaults.set(name, value)
    assert name in str(info.value)
    with pytest.raises(TypeError):
        defaults.set({"task_size": 5555, name: value})
    assert snapshot() == before


def test_a_bad_value_in_a_dict_changes_nothing():
    before = snapshot()
    with pytest.raises(ValueError):
        defaults.set({"task_size": 5555, "num_threads": 4, "auto_direct_io_read": 5})
    assert snapshot() == before
    with pytest.raises(ValueError):
        defaults.set({"num_threads": 0, "task_size": 5555})
    assert snapshot() == before
    with pytest.raises(ValueError):
        defaults.set({"task_size": 5555}, num_threads=0)
    assert snapshot() == before


def test_an_unknown_name_in_a_dict_changes_nothing():
    before = snapshot()
    with pytest.raises(KeyError):
        defaults.set({"task_size": 5555, "no_such_setting": 1})
    assert snapshot() == before


@pytest.mark.parametrize("name", ["nthreads", "NUM_THREADS", "", "task-size", "compat"])
def test_unknown_names_raise_key_error(name):
    before = snapshot()
    with pytest.raises(KeyError) as info:
        defaults.get(name)
    assert "num_threads" in str(info.value), "the message lists the known settings"
    with pytest.raises(KeyError):
        defaults.set(name, 1)
    with pytest.raises(KeyError):
        defaults.set({name: 1})
    assert snapshot() == before


def test_set_rejects_malformed_calls():
    before = snapshot()
    with pytest.raises(TypeError):
        defaults.set("task_size", 1, 2)
    with pytest.raises(TypeError):
        defaults.set("task_size")
    with pytest.raises(TypeError):
        defaults.set(42)
    assert snapshot() == before


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (CompatMode.ON, CompatMode.ON),
        (CompatMode.OFF, CompatMode.OFF),
        (CompatMode.AUTO, CompatMode.AUTO),
        (True, CompatMode.ON),
        (False, CompatMode.OFF),
        ("on", CompatMode.ON),
        ("ON", CompatMode.ON),
        ("OFF", CompatMode.OFF),
        ("off", CompatMode.OFF),
        ("auto", CompatMode.AUTO),
        ("AUTO", CompatMode.AUTO),
        ("Auto", CompatMode.AUTO),
    ],
)
def test_compat_mode_accepts_members_bools_and_strings(value, expected):
    # Start from a different mode so that the change is visible.
    start = CompatMode.AUTO if expected is not CompatMode.AUTO else CompatMode.ON
    defaults.set("compat_mode", start)
    defaults.set("compat_mode", value)
    assert defaults.get("compat_mode") is expected


def test_is_compat_mode_preferred():
    defaults.set("compat_mode", CompatMode.ON)
    assert defaults.is_compat_mode_preferred() is True
    defaults.set("compat_mode", CompatMode.OFF)
    assert defaults.is_compat_mode_preferred() is False
    assert defaults.is_compat_mode_preferred(CompatMode.ON) is True
    assert defaults.is_compat_mode_preferred(CompatMode.OFF) is False
    assert isinstance(defaults.is_compat_mode_preferred(CompatMode.AUTO), bool)


def test_compat_mode_auto_resolves_to_posix_without_cufile():
    """Without libcufile (this test machine has no CUDA driver), AUTO means POSIX I/O."""
    import ctypes

    for name in ("libcufile.so.0", "libcufile.so.1", "libcufile.so"):
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        pytest.skip("libcufile is installed here")
    defaults.set("compat_mode", "auto")
    assert defaults.is_compat_mode_preferred() is True
    assert defaults.compat_mode() is True


# ---------------------------------------------------------------------------------------
# kvikio's older per-setting functions


def test_compat_mode_and_compat_mode_reset():
    defaults.compat_mode_reset(True)
    assert defaults.get("compat_mode") is CompatMode.ON
    assert defaults.compat_mode() is True
    defaults.compat_mode_reset(False)
    assert defaults.get("compat_mode") is CompatMode.OFF
    assert defaults.compat_mode() is False
    defaults.compat_mode_reset(CompatMode.AUTO)
    assert defaults.get("compat_mode") is CompatMode.AUTO
    assert isinstance(defaults.compat_mode(), bool)


@pytest.mark.parametrize(
    ("getter", "setter", "name", "values"),
    [
        ("get_num_threads", "reset_num_threads", "num_threads", [1, 3, 11]),
        ("get_num_threads", "num_threads_reset", "num_threads", [2, 5]),
        ("task_size", "task_size_reset", "task_size", [1, 4097, 1 << 24]),
        ("gds_threshold", "gds_threshold_reset", "gds_threshold", [0, 1, 65536]),
        ("bounce_buffer_size", "bounce_buffer_size_reset", "bounce_buffer_size", [1, 8192]),
    ],
)
def test_old_style_functions_round_trip(getter, setter, name, values):
    for v in values:
        getattr(defaults, setter)(v)
        assert getattr(defaults, getter)() == v
        assert type(getattr(defaults, getter)()) is int
        assert defaults.get(name) == v


@pytest.mark.parametrize(
    ("setter", "value"),
    [
        ("reset_num_threads", 0),
        ("num_threads_reset", -2),
        ("task_size_reset", 0),
        ("gds_threshold_reset", -1),
        ("bounce_buffer_size_reset", 0),
    ],
)
def test_old_style_setters_validate(setter, value):
    before = snapshot()
    with pytest.raises(ValueError):
        getattr(defaults, setter)(value)
    assert snapshot() == before


@pytest.mark.parametrize("n", [1025, 10**6, 2**63, 10**30])
def test_absurd_thread_counts_are_refused_with_the_limit(n):
    before = kvikpy.defaults.get("num_threads")
    with pytest.raises((ValueError, OverflowError)) as info:
        kvikpy.defaults.set("num_threads", n)
    assert kvikpy.defaults.get("num_threads") == before
    if n < 2**63:
        assert "at most 1024" in str(info.value)
        assert "limit" in str(info.value)


def test_the_largest_thread_count_is_accepted_and_runs(tmp_path):
    path = tmp_path / "f.bin"
    data = random_bytes(1 << 16, seed=3)
    path.write_bytes(data)
    with kvikpy.defaults.set(num_threads=1024):
        buf = bytearray(len(data))
        with kvikpy.CuFile(path) as f:
            assert f.pread(buf, task_size=4096).get() == len(data)
    assert bytes(buf) == data
