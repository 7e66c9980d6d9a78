"""kvikpy.safetensors.save_file with numpy arrays (and kvikpy Buffers) on the host: round
trips read back by safetensors and by kvikpy, files byte for byte safetensors' own,
refusals that change nothing on disk, and failed or interrupted writes that leave no file
under the final name. torch and GPU tensors: tests/gpu/test_safetensors_save_gpu.py."""

from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors
import safetensors.numpy as stn
from conftest import PwriteRecorder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import kvikpy
import kvikpy.safetensors as kst
from kvikpy import _lib, _save
from kvikpy.cufile import CuFile

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# Every dtype numpy has that safetensors holds, with its code and item size.
NUMPY_DTYPES = {
    "float64": ("F64", 8),
    "float32": ("F32", 4),
    "float16": ("F16", 2),
    "complex64": ("C64", 8),
    "int64": ("I64", 8),
    "int32": ("I32", 4),
    "int16": ("I16", 2),
    "int8": ("I8", 1),
    "uint64": ("U64", 8),
    "uint32": ("U32", 4),
    "uint16": ("U16", 2),
    "uint8": ("U8", 1),
    "bool": ("BOOL", 1),
}


def header_of(path: Path) -> tuple[int, dict[str, Any]]:
    """The header length and JSON of a safetensors file, read without kvikpy."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return n, json.loads(raw[8 : 8 + n])


def sample() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "w": rng.standard_normal((16, 9)).astype(np.float32),
        "b": rng.standard_normal(9).astype(np.float16),
        "ids": rng.integers(-(2**40), 2**40, 17),
        "u": rng.integers(0, 2**63, 3, dtype=np.uint64),
        "mask": rng.integers(0, 2, (3, 5)).astype(bool),
        "c": (rng.standard_normal(4) + 1j).astype(np.complex64),
        "scalar": np.array(3.5),
        "empty": np.zeros((0, 4), dtype=np.int32),
        "bytes": rng.integers(0, 256, 1001).astype(np.uint8),
        "i8": rng.integers(-128, 128, 5).astype(np.int8),
    }


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype, shape and bytes (NaNs included)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def read_back(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None):
    """Assert that safetensors and kvikpy both read ``path`` back as ``tensors`` and
    ``metadata``."""
    for loaded in (stn.load_file(path), kst.load_file(path, framework="numpy")):
        assert loaded.keys() == tensors.keys()
        for name, a in tensors.items():
            assert same(loaded[name], a), name
    with safetensors.safe_open(path, framework="numpy") as f:
        assert f.metadata() == metadata
    assert kst.read_header(path)[2] == (metadata or {})


def test_a_checkpoint_round_trips_and_is_safetensors_own_file(tmp_path: Path) -> None:
    tensors = sample()
    path = tmp_path / "model.safetensors"
    assert kst.save_file(tensors, path, {"format": "np"}) is None
    read_back(path, tensors, {"format": "np"})
    stn.save_file(tensors, tmp_path / "reference.safetensors", {"format": "np"})
    assert path.read_bytes() == (tmp_path / "reference.safetensors").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors", "reference.safetensors"]


def test_every_tensor_starts_item_aligned_in_size_order(tmp_path: Path) -> None:
    path = tmp_path / "m.st"
    kst.save_file(sample(), str(path))
    n, header = header_of(path)
    assert (8 + n) % 8 == 0
    # 8-byte items, then 4, 2 and 1; by dtype within a size (U64, I64, F64, C64; F32,
    # I32), then by name.
    assert list(header) == ["u", "ids", "scalar", "c", "w", "empty", "b", "i8", "bytes", "mask"]
    sizes = {code: size for code, size in NUMPY_DTYPES.values()}
    ends = 0
    for info in header.values():
        begin, end = info["data_offsets"]
        assert begin == ends and (8 + n + begin) % sizes[info["dtype"]] == 0
        ends = end
    assert path.stat().st_size == 8 + n + ends


names = st.text(max_size=12).filter(lambda s: s != "__metadata__")
arrays = st.sampled_from(sorted(NUMPY_DTYPES)).flatmap(
    lambda dtype: hnp.arrays(
        np.dtype(dtype), hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)
    )
)


@SETTINGS
@given(
    tensors=st.dictionaries(names, arrays, max_size=8),
    metadata=st.none() | st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
)
def test_any_arrays_round_trip(
    tmp_path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None
) -> None:
    # One path for every example: each replaces the file the one before wrote.
    path = tmp_path / "t.safetensors"
    kst.save_file(tensors, path, metadata)
    assert os.listdir(tmp_path) == ["t.safetensors"]
    read_back(path, tensors, metadata)
    # safetensors writes several metadata entries in no fixed order (kvikpy sorts them),
    # and no valid header at all for empty metadata without tensors.
    if (metadata is None or len(metadata) <= 1) and (tensors or metadata is None):
        assert path.read_bytes() == stn.save(tensors, metadata)


def test_several_metadata_entries_are_sorted_by_key(tmp_path: Path) -> None:
    path = tmp_path / "m.st"
    kst.save_file({}, path, {"z": "1", "a": "2", "": "3"})
    assert header_of(path)[1] == {"__metadata__": {"": "3", "a": "2", "z": "1"}}
    assert path.read_bytes()[8:].startswith(b'{"__metadata__":{"":"3","a":"2","z":"1"}}')


def test_views_of_one_array_that_do_not_overlap_are_saved(tmp_path: Path) -> None:
    base = np.arange(20, dtype=np.int32)
    path = tmp_path / "v.st"
    # Side by side in one array: [0, 5), [5, 10) and [10, 20).
    kst.save_file({"low": base[:5], "high": base[10:], "row": base.reshape(4, 5)[1]}, path)
    read_back(path, {"low": base[:5], "high": base[10:], "row": base[5:10]}, None)


def test_a_kvikpy_buffer_of_bfloat16_is_saved_as_bf16(tmp_path: Path) -> None:
    raw = np.arange(8, dtype=np.uint16) + 0x3F80
    (tmp_path / "raw").write_bytes(raw.tobytes())
    buf = kvikpy.read(tmp_path / "raw", device="cpu", dtype="bfloat16", shape=(2, 4))
    path = tmp_path / "b.st"
    kst.save_file({"h": buf, "f": np.ones(3, np.float32)}, path)
    n, header = header_of(path)
    assert header["h"] == {"dtype": "BF16", "shape": [2, 4], "data_offsets": [12, 28]}
    assert path.read_bytes()[8 + n + 12 :] == raw.tobytes()


def test_an_os_path_and_a_str_path_write_the_same(tmp_path: Path) -> None:
    kst.save_file(sample(), tmp_path / "a.st")
    kst.save_file(sample(), str(tmp_path / "b.st"))
    assert (tmp_path / "a.st").read_bytes() == (tmp_path / "b.st").read_bytes()


def test_a_larger_file_is_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "m.st"
    path.write_bytes(b"x" * 100_000)
    kst.save_file({"a": np.arange(3, dtype=np.uint8)}, path)
    assert stn.load_file(path)["a"].tolist() == [0, 1, 2]
    assert path.stat().st_size == len(stn.save({"a": np.arange(3, dtype=np.uint8)}))


def test_the_engine_lays_out_the_header() -> None:
    header, offsets, total = _lib.safetensors_new_header(
        [("b", "U8", [3], 3), ("a", "F64", [], 8)], [("k", "v")]
    )
    assert header[8:].rstrip(b" ") == (
        b'{"__metadata__":{"k":"v"},"a":{"dtype":"F64","shape":[],"data_offsets":[0,8]},'
        b'"b":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}}'
    )
    assert (offsets, total) == ([8, 0], len(header) + 11)
    with pytest.raises(ValueError, match=r"has 4 bytes; its shape and dtype make 8"):
        _lib.safetensors_new_header([("a", "F64", [1], 4)])


def test_buffer_extent_says_where_an_array_lies() -> None:
    a = np.arange(10, dtype=np.int64)
    assert _lib.buffer_extent(a[2:]) == (a.ctypes.data + 16, 64, None)
    with pytest.raises(ValueError, match="not contiguous"):
        _lib.buffer_extent(a[::2])


class Name(str):
    """A name that is a different key from every other: two equal names in one dict."""

    __slots__ = ()

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:
        return self is other


BASE = np.arange(24, dtype=np.float32)
REFUSED: list[tuple[str, Any, Any, type[Exception], str]] = [
    ("object", {"a": np.array([1, None])}, None, ValueError, "dtype object, which safetensors"),
    ("complex128", {"a": np.ones(2, complex)}, None, ValueError, "dtype complex128"),
    ("longdouble", {"a": np.ones(2, np.longdouble)}, None, ValueError, "dtype float128"),
    ("str", {"a": np.array(["x"])}, None, ValueError, "dtype str32"),
    ("structured", {"a": np.zeros(2, "i4,f4")}, None, ValueError, "safetensors cannot hold"),
    ("big-endian", {"a": np.ones(2, ">f4")}, None, ValueError, r"big-endian \(>f4\).*'<f4'"),
    (
        "strided",
        {"a": BASE.reshape(4, 6)[:, ::2]},
        None,
        ValueError,
        "'a' is not contiguous.*ascontiguousarray",
    ),
    ("fortran", {"ok": BASE, "t": BASE.reshape(4, 6).T}, None, ValueError, "'t' is not contiguous"),
    (
        "overlap",
        {"x": BASE[:10], "y": BASE[5:15]},
        None,
        ValueError,
        "tensors 'x' and 'y' share memory \\(their bytes overlap\\).*keep one",
    ),
    ("twice", {"x": BASE, "tied": BASE}, None, ValueError, "share memory"),
    (
        "inside",
        {"all": BASE, "row": BASE.reshape(4, 6)[2], "z": np.zeros(1)},
        None,
        ValueError,
        "'all' and 'row' share memory",
    ),
    (
        "same name",
        {Name("w"): np.zeros(1), Name("w"): np.ones(1)},
        None,
        ValueError,
        "tensor 'w' is given twice",
    ),
    ("metadata name", {"__metadata__": np.zeros(1)}, None, ValueError, "'__metadata__'"),
    ("int name", {1: np.zeros(1)}, None, TypeError, "a tensor name must be a str, not int"),
    ("surrogate", {"\ud800": np.zeros(1)}, None, ValueError, "lone surrogate"),
    ("not an array", {"a": b"bytes"}, None, TypeError, "'a' is a bytes; save_file writes arrays"),
    ("list", [("a", np.zeros(1))], None, TypeError, "must be a mapping"),
    ("metadata list", {"a": BASE}, [("k", "v")], TypeError, "metadata must be None or a dict"),
    ("metadata int", {"a": BASE}, {"k": 1}, TypeError, r"metadata\['k'\] is int 1"),
    ("metadata key", {"a": BASE}, {1: "v"}, TypeError, "a metadata key must be a str"),
    ("metadata surrogate", {}, {"k": "\udfff"}, ValueError, "lone surrogate"),
]


@pytest.mark.parametrize("existing", [True, False], ids=["existing", "absent"])
@pytest.mark.parametrize(
    ("tensors", "metadata", "error", "message"),
    [case[1:] for case in REFUSED],
    ids=[case[0] for case in REFUSED],
)
def test_refused_input_changes_nothing_on_disk(
    tmp_path: Path, existing: bool, tensors: Any, metadata: Any, error: type, message: str
) -> None:
    path = tmp_path / "model.safetensors"
    if existing:
        path.write_bytes(b"the old checkpoint")
    with pytest.raises(error, match=message):
        kst.save_file(tensors, path, metadata)
    assert os.listdir(tmp_path) == (["model.safetensors"] if existing else [])
    if existing:
        assert path.read_bytes() == b"the old checkpoint"


def test_a_url_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="writes local files"):
        kst.save_file({}, "s3://bucket/model.safetensors")


def test_a_missing_directory_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        kst.save_file({"a": BASE}, tmp_path / "no" / "m.st")
    assert os.listdir(tmp_path) == []


def test_the_header_and_every_tensor_are_started_before_any_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = PwriteRecorder(monkeypatch)
    tensors = sample()
    kst.save_file(tensors, tmp_path / "m.st")
    n, header = header_of(tmp_path / "m.st")
    starts = [e for e in rec.events if e[0] == "start"]
    # One write for the header, one per tensor with bytes; none for "empty".
    assert starts[0][2:] == (8 + n, 0)
    expected = sorted(
        (info["data_offsets"][1] - info["data_offsets"][0], 8 + n + info["data_offsets"][0])
        for name, info in header.items()
        if name != "empty"
    )
    assert sorted(e[2:] for e in starts[1:]) == expected
    assert [e[0] for e in rec.events] == ["start"] * len(starts) + ["wait"] * len(starts)
    read_back(tmp_path / "m.st", tensors, None)


def test_many_pieces_name_the_task_size_few_let_the_engine_spread_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 16 tensors of 64 KiB: at least one 64 KiB task per thread of 4, so each write names
    # the setting's task size (no tensor cut finer); with 64 threads the same pieces are
    # too few, and the engine may spread them.
    tensors = {f"t{k:02d}": np.full(1 << 14, k, dtype=np.float32) for k in range(16)}
    for threads, named in ((4, 1 << 16), (64, None)):
        rec = PwriteRecorder(monkeypatch)
        with kvikpy.defaults.set(task_size=1 << 16, num_threads=threads):
            kst.save_file(tensors, tmp_path / f"m{threads}.st")
        assert rec.task_sizes == [named] * 17, threads  # the header and 16 tensors
        read_back(tmp_path / f"m{threads}.st", tensors, None)


def test_reserve_allocates_a_new_file_for_direct_writes_and_never_shrinks_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "reserved.bin"
    h = _lib.FileHandle(path, "w")
    try:
        h.reserve(1 << 20)
        # Allocated (and so sized) where writes go through O_DIRECT; left alone elsewhere.
        expected = 1 << 20 if h.is_direct_io_supported() else 0
        assert path.stat().st_size == expected
        h.reserve(4096)  # never smaller
        assert path.stat().st_size == expected
        assert path.read_bytes() == bytes(expected)  # no data written
        with kvikpy.defaults.set(auto_direct_io_write=False):
            h.reserve(2 << 20)  # buffered writes: nothing to allocate
        assert path.stat().st_size == expected
    finally:
        h.close()


@pytest.mark.parametrize("failure", [KeyboardInterrupt(), OSError(errno.ENOSPC, "No space")])
@pytest.mark.parametrize("existing", [True, False], ids=["existing", "absent"])
def test_a_write_that_fails_midway_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException, existing: bool
) -> None:
    path = tmp_path / "model.safetensors"
    if existing:
        path.write_bytes(b"the old checkpoint")
    rec = PwriteRecorder(monkeypatch, fail_at=3, raise_=failure)
    with pytest.raises(type(failure)):
        kst.save_file(sample(), path)
    # The writes started before the failure were all waited for.
    assert sorted(e[1:] for e in rec.events if e[0] == "wait") == sorted(
        e[1:] for e in rec.events if e[0] == "start"
    )
    assert len(rec.events) == 6
    assert os.listdir(tmp_path) == (["model.safetensors"] if existing else [])
    if existing:
        assert path.read_bytes() == b"the old checkpoint"


def failing_writes(monkeypatch: pytest.MonkeyPatch, fail_at: int) -> list[int]:
    """Make every ``CuFile.pwrite`` return a future (numbered in the order started) that
    writes nothing, the ``fail_at``-th failing with ENOSPC (a full disk) when waited for;
    returns the numbers of the futures waited for, in order."""
    waited: list[int] = []

    class Failing:
        def __init__(self, k: int) -> None:
            self.k = k

        def get(self) -> int:
            waited.append(self.k)
            if self.k == fail_at:
                raise OSError(errno.ENOSPC, "No space left on device")
            return 0

    count = iter(range(1 << 20))
    monkeypatch.setattr(CuFile, "pwrite", lambda *a, **k: Failing(next(count)))
    return waited


def test_a_failed_write_is_raised_after_all_have_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write whose future fails (a full disk): the others are waited for, then the
    error is raised, and the file is not replaced."""
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"the old checkpoint")
    waited = failing_writes(monkeypatch, 1)
    with pytest.raises(OSError, match="No space left"):
        kst.save_file(sample(), path)
    assert waited == list(range(len(sample())))  # header + 9 tensors with bytes
    assert os.listdir(tmp_path) == ["model.safetensors"]
    assert path.read_bytes() == b"the old checkpoint"


def test_a_short_write_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "model.safetensors"

    class Short:
        def get(self) -> int:
            return 1

    monkeypatch.setattr(CuFile, "pwrite", lambda *a, **k: Short())
    with pytest.raises(OSError, match=r"1 of \d+ bytes were written at offset 0"):
        kst.save_file({"a": BASE}, path)
    assert os.listdir(tmp_path) == []


def test_the_module_describes_numpy_arrays_without_torch() -> None:
    t = _save._describe("a", BASE[2:5], {"float32": "F32"})
    assert (t.dtype, t.shape, t.nbytes, t.device, t.storage) == ("F32", (3,), 12, None, None)
    assert t.address == BASE.ctypes.data + 8


# --- saving in the background (blocking=False) ---


def held_writes(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Hold every ``CuFile.pwrite`` until the returned event is set: what a background
    save writes is then surely written after the test has changed the arrays."""
    release = threading.Event()
    real = CuFile.pwrite

    def held(self: CuFile, *args: Any, **kwargs: Any) -> Any:
        assert release.wait(60), "the test never let the write go"
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CuFile, "pwrite", held)
    return release


def test_a_background_save_writes_the_values_of_the_moment_of_the_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.safetensors"
    tensors = sample()
    kept = {k: v.copy() for k, v in tensors.items()}
    release = held_writes(monkeypatch)
    future = kst.save_file(tensors, path, {"step": "7"}, blocking=False)
    assert isinstance(future, kst.SaveFuture)
    for a in tensors.values():  # the caller goes on changing its arrays at once
        a.fill(0)
    release.set()
    size = future.get(timeout=60)
    assert future.done() and size == path.stat().st_size
    read_back(path, kept, {"step": "7"})
    # The same bytes as a blocking save of those values.
    again = tmp_path / "again.safetensors"
    kst.save_file(kept, again, {"step": "7"})
    assert again.read_bytes() == path.read_bytes()
    assert "written" in repr(future) and "m.safetensors" in repr(future)


@SETTINGS
@given(
    arrays=st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda s: s != "__metadata__"),
        hnp.arrays(
            st.sampled_from(sorted(NUMPY_DTYPES)),
            hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
        ),
        max_size=6,
    )
)
def test_background_saves_round_trip(tmp_path: Path, arrays: dict[str, np.ndarray]) -> None:
    path = tmp_path / "h.safetensors"
    kept = {k: v.copy() for k, v in arrays.items()}
    with pytest.MonkeyPatch.context() as patch:
        release = held_writes(patch)
        future = kst.save_file(arrays, path, blocking=False)
        for a in arrays.values():
            a[...] = 0
        release.set()
        assert future.get(timeout=60) == path.stat().st_size
    for loaded in (stn.load_file(path), kst.load_file(path, framework="numpy")):
        assert loaded.keys() == kept.keys()
        for name, a in kept.items():
            assert same(loaded[name], a), name


def test_a_background_save_is_awaitable_and_calls_back_once(tmp_path: Path) -> None:
    import asyncio

    path = tmp_path / "a.safetensors"
    seen: list[kst.SaveFuture] = []

    async def main() -> int:
        future = kst.save_file(sample(), path, blocking=False)
        future.add_done_callback(seen.append)
        return await future

    size = asyncio.run(main())
    assert size == path.stat().st_size
    assert len(seen) == 1 and seen[0].done()
    # A callback added once the save is done is called at once.
    seen[0].add_done_callback(seen.append)
    assert len(seen) == 2


def test_refused_input_raises_at_the_call_and_starts_nothing(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    with pytest.raises(ValueError, match="not contiguous"):
        kst.save_file({"a": np.zeros((4, 4))[:, ::2]}, path, blocking=False)
    with pytest.raises(TypeError, match="metadata"):
        kst.save_file({"a": BASE}, path, {"k": 1}, blocking=False)  # type: ignore[dict-item]
    assert os.listdir(tmp_path) == []
    assert not [t for t in threading.enumerate() if t.name == "kvikpy-save"]


def test_a_background_save_that_fails_raises_from_get_and_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"the old checkpoint")
    failing_writes(monkeypatch, 2)
    future = kst.save_file(sample(), path, blocking=False)
    with pytest.raises(OSError, match="No space left"):
        future.get(timeout=60)
    assert future.done() and "failed: OSError" in repr(future)
    assert os.listdir(tmp_path) == ["model.safetensors"]
    assert path.read_bytes() == b"the old checkpoint"
    # A missing directory is found by the background save, with the path in the error.
    missing = kst.save_file(sample(), tmp_path / "no" / "m.safetensors", blocking=False)
    with pytest.raises(FileNotFoundError):
        missing.get(timeout=60)


def test_get_times_out_while_the_save_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = held_writes(monkeypatch)
    path = tmp_path / "slow.safetensors"
    future = kst.save_file({"a": BASE}, path, blocking=False)
    with pytest.raises(TimeoutError, match="goes on in the background"):
        future.get(timeout=0.05)
    assert not future.done() and "saving" in repr(future)
    assert not path.exists()  # nothing under the name until every byte is written
    release.set()
    assert future.get(timeout=60) == path.stat().st_size


def test_the_interpreter_waits_for_a_background_save_at_exit(tmp_path: Path) -> None:
    """A script that starts a save and exits at once leaves the whole file."""
    path = tmp_path / "exit.safetensors"
    script = (
        "import numpy as np, kvikpy.safetensors as kst\n"
        "a = np.arange(1 << 20, dtype=np.float32)\n"
        f"kst.save_file({{'a': a}}, {str(path)!r}, blocking=False)\n"
        "a[:] = -1\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    loaded = kst.load_file(path, framework="numpy")
    assert same(loaded["a"], np.arange(1 << 20, dtype=np.float32))


def test_a_background_save_of_torch_cpu_tensors_is_the_blocking_saves_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(5)
    tensors = {
        "w": torch.randn(33, 7, generator=g),
        "bf": torch.randn(100, generator=g).bfloat16(),
        "m": torch.randint(0, 2, (9,), generator=g).bool(),
        "scalar": torch.tensor(1.5),
    }
    kst.save_file(tensors, tmp_path / "blocking.st")
    release = held_writes(monkeypatch)
    future = kst.save_file(tensors, tmp_path / "background.st", blocking=False)
    for t in tensors.values():
        t.reshape(-1).view(torch.uint8).fill_(0)
    release.set()
    future.get(timeout=60)
    assert (tmp_path / "background.st").read_bytes() == (tmp_path / "blocking.st").read_bytes()
