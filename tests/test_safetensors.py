"""kvikpy.safetensors: header validation and loading (numpy on the host; torch on the GPU)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

import kvikpy.safetensors as kst

RNG = np.random.default_rng(0)


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], pad_to: int = 8) -> None:
    """Write ``tensors`` in the safetensors format (independently of kvikpy)."""
    codes = {
        "float64": "F64",
        "float32": "F32",
        "float16": "F16",
        "int64": "I64",
        "int32": "I32",
        "int16": "I16",
        "int8": "I8",
        "uint8": "U8",
        "bool": "BOOL",
    }
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name, a in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {
            "dtype": codes[a.dtype.name],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % pad_to)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def sample() -> dict[str, np.ndarray]:
    return {
        "w": RNG.standard_normal((64, 33)).astype(np.float32),
        "b": RNG.standard_normal(33).astype(np.float16),
        "ids": RNG.integers(-(2**40), 2**40, 17),
        "mask": RNG.integers(0, 2, (3, 5)).astype(bool),
        "scalar": np.array(3.5, dtype=np.float64),
        "empty": np.zeros((0, 4), dtype=np.int32),
        "bytes": RNG.integers(0, 256, 1001).astype(np.uint8),
    }


def test_numpy_load_matches(tmp_path: Path) -> None:
    tensors = sample()
    p = tmp_path / "m.safetensors"
    write_safetensors(p, tensors)
    loaded = kst.load_file(p, device="cpu", framework="numpy")
    assert set(loaded) == set(tensors)
    for name, a in tensors.items():
        assert loaded[name].dtype == a.dtype and loaded[name].shape == a.shape, name
        assert np.array_equal(loaded[name], a), name
    data_start, header, metadata = kst.read_header(p)
    assert metadata == {"format": "pt"} and data_start % 8 == 0 and "w" in header


def test_unaligned_offsets_still_load(tmp_path: Path) -> None:
    tensors = {"odd": RNG.integers(0, 256, 3).astype(np.uint8), "f": np.arange(5.0)}
    p = tmp_path / "u.safetensors"
    write_safetensors(p, tensors)
    loaded = kst.load_file(p, device="cpu", framework="numpy")
    assert np.array_equal(loaded["f"], tensors["f"]) and np.array_equal(
        loaded["odd"], tensors["odd"]
    )


def corrupt(path: Path, header: object, data: bytes = b"\x01" * 64) -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


@pytest.mark.parametrize(
    ("header", "match"),
    [
        ({"t": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}}, "unknown dtype"),
        ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, "needs 8 bytes"),
        ({"t": {"dtype": "F32", "shape": [100], "data_offsets": [0, 400]}}, "64-byte data"),
        ({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, "invalid shape"),
        ({"t": {"shape": [1]}}, "lacks"),
        (
            {
                "a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
                "b": {"dtype": "U8", "shape": [8], "data_offsets": [4, 12]},
            },
            "overlap",
        ),
        ([1, 2], "does not start with"),
        ("x", "does not start with"),
    ],
)
def test_malformed_headers_are_value_errors(tmp_path: Path, header: object, match: str) -> None:
    p = corrupt(tmp_path / "bad.safetensors", header)
    before = p.read_bytes()
    with pytest.raises(ValueError, match=match):
        kst.load_file(p, device="cpu", framework="numpy")
    assert p.read_bytes() == before


def test_truncated_and_non_json_files(tmp_path: Path) -> None:
    p = tmp_path / "t.safetensors"
    p.write_bytes(b"\x05\x00")
    with pytest.raises(ValueError, match="only 2 bytes"):
        kst.read_header(p)
    p.write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(ValueError, match="header claims"):
        kst.read_header(p)
    p.write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{{")
    with pytest.raises(ValueError, match="not UTF-8"):
        kst.read_header(p)


def test_numpy_framework_needs_host_and_known_dtypes(tmp_path: Path) -> None:
    p = corrupt(
        tmp_path / "bf.safetensors",
        {"t": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}},
        b"\x01" * 8,
    )
    with pytest.raises(ValueError, match="numpy lacks"):
        kst.load_file(p, device="cpu", framework="numpy")
    with pytest.raises(ValueError, match="framework"):
        kst.load_file(p, device="cpu", framework="jax")


def test_shards_and_filters_errors_before_reading(tmp_path: Path) -> None:
    one = tmp_path / "one.safetensors"
    write_safetensors(one, {"a": np.arange(3, dtype=np.int32)})
    with pytest.raises(ValueError, match="at least one file"):
        kst.load_file([], "cpu")
    with pytest.raises(ValueError, match="framework='numpy' loads one file alone"):
        kst.load_file([one], "cpu", framework="numpy")
    with pytest.raises(TypeError, match="takes a list of paths"):
        kst.load_files(str(one), "cpu")  # type: ignore[arg-type]


def test_torch_shards_and_filter_on_the_host(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    tensors = sample()
    names = list(tensors)
    shards = [tmp_path / "s1.safetensors", tmp_path / "s2.safetensors"]
    write_safetensors(shards[0], {n: tensors[n] for n in names[:3]})
    write_safetensors(shards[1], {n: tensors[n] for n in names[3:]})
    state = kst.load_files(shards, "cpu")
    assert set(state) == set(tensors)
    for name, a in tensors.items():
        assert state[name].numpy().tobytes() == a.tobytes()
        assert state[name].dtype == getattr(torch, a.dtype.name)
    some = kst.load_file(shards, "cpu", tensor_filter=lambda n: n in ("b", "bytes"))
    assert set(some) == {"b", "bytes"}
    assert some["bytes"].numpy().tobytes() == tensors["bytes"].tobytes()
    with pytest.raises(TypeError, match="rank-to-names mapping needs process_group"):
        kst.load_file(shards, "cpu", tensor_filter={0: ["b"]})
    write_safetensors(tmp_path / "dup.safetensors", {"w": tensors["w"]})
    with pytest.raises(ValueError, match="tensor 'w' is in both"):
        kst.load_files([shards[0], tmp_path / "dup.safetensors"], "cpu")


# Every dtype safetensors 0.8 defines (its `Dtype` enum), and what kvikpy does with it.
# Item sizes in bytes of the dtypes kvikpy reads.
READ = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4}
READ |= {"U32": 4, "F32": 4, "C64": 8, "F64": 8, "I64": 8, "U64": 8, "F8_E5M2": 1}
READ |= {"F8_E4M3": 1, "F8_E8M0": 1, "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1}
SUB_BYTE = ["F4", "F6_E2M3", "F6_E3M2"]


def test_every_dtype_safetensors_writes_is_read_or_refused_by_name(tmp_path: Path) -> None:
    # The engine checks dtypes and sizes, the Python table maps them to torch and numpy:
    # both hold the same dtypes at the same sizes.
    assert {name: size for name, (_, _, size) in kst._DTYPES.items()} == READ
    for dtype, size in READ.items():
        p = corrupt(
            tmp_path / f"{dtype}.safetensors",
            {"t": {"dtype": dtype, "shape": [2], "data_offsets": [0, 2 * size]}},
            b"\x01" * (2 * size),
        )
        _, header, _ = kst.read_header(p)
        assert header["t"]["dtype"] == dtype
    for dtype in SUB_BYTE:
        p = corrupt(
            tmp_path / f"{dtype}.safetensors",
            {"t": {"dtype": dtype, "shape": [2], "data_offsets": [0, 1]}},
            b"\x01",
        )
        with pytest.raises(ValueError, match=f"dtype {dtype}, a float narrower than a byte") as e:
            kst.read_header(p)
        assert "supported: " in str(e.value) and "C64" in str(e.value)


def test_complex64_written_by_safetensors_reads_back(tmp_path: Path) -> None:
    st = pytest.importorskip("safetensors.numpy")
    tensors = {
        "c": (RNG.standard_normal((5, 3)) + 1j * RNG.standard_normal((5, 3))).astype(np.complex64),
        "u16": RNG.integers(0, 2**16, 7).astype(np.uint16),
        "f": RNG.standard_normal(4).astype(np.float32),
    }
    p = tmp_path / "c.safetensors"
    st.save_file(tensors, str(p))
    got = kst.load_file(p, device="cpu", framework="numpy")
    for name, a in tensors.items():
        assert got[name].dtype == a.dtype and np.array_equal(got[name], a), name
    # And the other way: safetensors reads what kvikpy's header check accepts.
    assert np.array_equal(st.load_file(str(p))["c"], tensors["c"])


def test_float8_variants_numpy_lacks_are_named(tmp_path: Path) -> None:
    for dtype in ("F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"):
        p = corrupt(
            tmp_path / f"{dtype}.safetensors",
            {"t": {"dtype": dtype, "shape": [4], "data_offsets": [0, 4]}},
            b"\x01" * 4,
        )
        with pytest.raises(ValueError, match=f"dtype {dtype}, which numpy lacks"):
            kst.load_file(p, device="cpu", framework="numpy")


def test_numpy_framework_reads_into_host_memory_by_default(tmp_path: Path) -> None:
    tensors = sample()
    p = tmp_path / "m.safetensors"
    write_safetensors(p, tensors)
    got = kst.load_file(p, framework="numpy")  # no device=: host memory, no GPU needed
    for name, a in tensors.items():
        assert np.array_equal(got[name], a), name


def test_torch_framework_without_torch_says_numpy_needs_none(tmp_path: Path) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torch is installed here")
    p = tmp_path / "m.safetensors"
    write_safetensors(p, sample())
    with pytest.raises(ModuleNotFoundError, match="framework='numpy'") as e:
        kst.load_file(p, device="cpu")
    assert e.value.name == "torch"
