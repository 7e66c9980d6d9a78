"""Untrusted input: malformed safetensors headers are a ValueError naming the file (never
another exception type, a hang or a huge allocation), and a zarr GDSStore refuses keys
that would reach outside its root."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvikpy.safetensors as kst

# --- safetensors -------------------------------------------------------------------------

GOOD = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


def write_raw(path: Path, text: bytes, data: bytes = b"\x01" * 8) -> Path:
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def write_header(path: Path, header: object, data: bytes = b"\x01" * 8) -> Path:
    return write_raw(path, json.dumps(header).encode(), data)


def refused(path: Path, match: str) -> None:
    """Both the header reader and the numpy loader refuse ``path`` with a ValueError that
    names it (and matches ``match``), and the file is left as it was."""
    before = path.read_bytes()
    for call in (
        lambda: kst.read_header(path),
        lambda: kst.load_file(path, device="cpu", framework="numpy"),
    ):
        with pytest.raises(ValueError, match=match) as info:
            call()
        assert str(path) in str(info.value)
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("shape", 2, "invalid shape 2"),
        ("shape", None, "invalid shape None"),
        ("shape", [True, True], "invalid shape"),
        ("shape", [2.0], "invalid shape"),
        ("shape", ["2"], "invalid shape"),
        ("shape", [2**63], "invalid shape"),
        ("shape", [1] * 65, "invalid shape"),
        ("dtype", ["F32"], "unknown dtype"),
        ("dtype", None, "unknown dtype"),
        ("data_offsets", ["0", "8"], "invalid data_offsets"),
        ("data_offsets", [0.0, 8.0], "invalid data_offsets"),
        ("data_offsets", [False, True], "invalid data_offsets"),
        ("data_offsets", [0, 8, 9], "invalid data_offsets"),
        ("data_offsets", 8, "invalid data_offsets"),
        ("data_offsets", {"0": 8}, "invalid data_offsets"),
        ("data_offsets", [8, 0], "claims bytes"),
        ("data_offsets", [-8, 0], "claims bytes"),
    ],
)
def test_each_field_of_the_wrong_type_is_a_value_error(
    tmp_path: Path, field: str, value: object, match: str
) -> None:
    refused(write_header(tmp_path / "f.safetensors", {"t": {**GOOD, field: value}}), match)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        # duplicate tensor names: json would keep the last one
        (
            b'{"t": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},'
            b' "t": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}',
            "key 't' twice",
        ),
        # a duplicate field inside a tensor
        (
            b'{"t": {"dtype": "U8", "dtype": "F32", "shape": [8], "data_offsets": [0, 8]}}',
            "key 'dtype' twice",
        ),
        (b'{"__metadata__": [1, 2]}', "__metadata__ must be an object of strings"),
        (b'{"__metadata__": "x"}', "__metadata__ must be an object of strings"),
        (b'{"__metadata__": {"a": 1}}', "__metadata__ must be an object of strings"),
        (b'{"__metadata__": {"a": {"b": "c"}}}', "__metadata__ must be an object of strings"),
        (b'{"t": [1]}', "must be an object"),
        (b'{"t": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (b"[" * 100_000, "does not start with"),
        (b'{"t": ' + b"[" * 100_000, "nested too deeply"),
        (b'{"t": 1' + b"0" * 5000 + b"}", "not valid JSON"),  # int too long to convert
        (b'{"t": NaN}', "must be an object"),
        (b"{", "not valid JSON"),
        (b" {}", "does not start with"),
    ],
)
def test_malformed_json_is_a_value_error(tmp_path: Path, text: bytes, match: str) -> None:
    refused(write_raw(tmp_path / "j.safetensors", text), match)


@pytest.mark.parametrize(
    ("tensors", "size", "match"),
    [
        # a hole between two tensors
        ({"a": [0, 4], "b": [6, 10]}, 10, "hole"),
        # data that does not start at 0
        ({"a": [2, 10]}, 10, "hole"),
        # overlap, and the same bytes twice
        ({"a": [0, 6], "b": [4, 10]}, 10, "overlap"),
        ({"a": [0, 10], "b": [0, 10]}, 10, "overlap"),
        # bytes after the last tensor
        ({"a": [0, 8]}, 10, "end at byte 8 of a 10-byte"),
        # past the end of the file
        ({"a": [0, 12]}, 10, "claims bytes"),
    ],
)
def test_offsets_cover_the_data_section_exactly(
    tmp_path: Path, tensors: dict[str, list[int]], size: int, match: str
) -> None:
    header = {
        k: {"dtype": "U8", "shape": [end - begin], "data_offsets": [begin, end]}
        for k, (begin, end) in tensors.items()
    }
    refused(write_header(tmp_path / "o.safetensors", header, b"\x02" * size), match)


def test_huge_shapes_are_refused_quickly(tmp_path: Path) -> None:
    """A shape whose product has millions of digits is refused without computing it."""
    header = {"t": {"dtype": "F64", "shape": [2**62] * 64, "data_offsets": [0, 8]}}
    refused(write_header(tmp_path / "h.safetensors", header), "needs more bytes")
    text = (
        b'{"t": {"dtype": "U8", "shape": ['
        + b",".join([b"3"] * 2_000_000)
        + b'], "data_offsets": [0, 8]}}'
    )
    refused(write_raw(tmp_path / "h2.safetensors", text), "invalid shape")


def test_header_lengths_are_checked_before_reading(tmp_path: Path) -> None:
    p = tmp_path / "l.safetensors"
    p.write_bytes(struct.pack("<Q", 2**64 - 1) + b"{}")
    refused(p, "more than the format's limit")
    p.write_bytes(struct.pack("<Q", 100_000_000) + b"{}")
    refused(p, "but the file has 10")
    p.write_bytes(b"\x00" * 7)
    refused(p, "only 7 bytes")


def test_valid_edge_cases_still_load(tmp_path: Path) -> None:
    header = {
        "__metadata__": None,  # null metadata: none, as the reference implementation reads it
        "e": {"dtype": "I32", "shape": [0, 3], "data_offsets": [0, 0]},
        "a": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3], "extra": [1, {"x": 2}]},
        "b": {"dtype": "I16", "shape": [], "data_offsets": [3, 5]},
        "z": {"dtype": "U8", "shape": [0], "data_offsets": [5, 5]},
    }
    p = write_header(tmp_path / "ok.safetensors", header, b"\x01\x02\x03\x04\x00")
    start, tensors, metadata = kst.read_header(p)
    assert start == 8 + len(json.dumps(header)) and metadata == {}
    assert set(tensors) == {"e", "a", "b", "z"}
    got = kst.load_file(p, device="cpu", framework="numpy")
    assert got["a"].tolist() == [1, 2, 3] and int(got["b"]) == 4 and got["e"].shape == (0, 3)
    empty = write_header(tmp_path / "empty.safetensors", {"__metadata__": {"k": "v"}}, b"")
    assert kst.read_header(empty)[1:] == ({}, {"k": "v"})
    assert kst.load_file(empty, device="cpu", framework="numpy") == {}


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.sampled_from(["F32", "U8", "BF16", "BOOL"]),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
small_ints = st.integers(min_value=-2, max_value=12)
# Each field: mostly a plausible value, else any JSON value.
dtypes = st.sampled_from(["F32", "U8", "I16", "BF16", "X"]) | json_values
shapes = st.lists(small_ints, max_size=3) | json_values
offsets = st.lists(small_ints, min_size=2, max_size=2) | json_values
tensor_entries = st.fixed_dictionaries(
    {"dtype": dtypes, "shape": shapes, "data_offsets": offsets}
) | st.fixed_dictionaries({}, optional={"dtype": dtypes, "shape": shapes, "data_offsets": offsets})
headers = (
    st.dictionaries(
        st.text(max_size=3) | st.just("__metadata__"), tensor_entries | json_values, max_size=4
    )
    | json_values
)


def check_file(path: Path) -> None:
    """Reading ``path`` either works or is a ValueError naming it, by both loaders."""
    for call in (
        lambda: kst.read_header(path),
        lambda: kst.load_file(path, device="cpu", framework="numpy"),
    ):
        try:
            call()
        except ValueError as e:
            assert str(path) in str(e), e


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(header=headers, data=st.binary(max_size=24))
def test_random_headers_only_ever_raise_value_errors(header: Any, data: bytes) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        check_file(write_header(Path(d) / "r.safetensors", header, data))


@settings(max_examples=200, deadline=None)
@given(
    cut=st.integers(min_value=0, max_value=400),
    length=st.integers(min_value=0, max_value=2**64 - 1) | st.integers(0, 300),
    noise=st.binary(max_size=300),
)
def test_truncated_and_random_files_only_ever_raise_value_errors(
    cut: int, length: int, noise: bytes
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.safetensors"
        header = {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}}
        text = json.dumps(header).encode()
        whole = struct.pack("<Q", len(text)) + text + np.arange(3, dtype=np.float32).tobytes()
        p.write_bytes(whole[:cut])  # a valid file cut anywhere
        check_file(p)
        p.write_bytes(struct.pack("<Q", length) + noise)  # any length, any bytes
        check_file(p)
        p.write_bytes(struct.pack("<Q", len(noise)) + noise)  # a right length, any bytes
        check_file(p)
