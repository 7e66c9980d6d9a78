"""kvikpy.safetensors over HTTP: headers read and checked by the engine with ranged
requests (one for a header in the first 64 KiB), files loaded from a URL, and malformed
remote headers refused naming the URL with its credentials hidden."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from remote_servers import Counter, CountingRangeHandler, serve
from test_safetensors import write_safetensors

import kvikpy.safetensors as kst

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def counter() -> Counter:
    return Counter()


@pytest.fixture
def server(tmp_path: Path, counter: Counter):
    with serve(CountingRangeHandler, directory=str(tmp_path), counter=counter) as url:
        yield url


def tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "w": rng.standard_normal((4, 5)).astype(np.float32),
        "b": np.arange(7, dtype=np.int64),
        "m": rng.integers(0, 2, (3, 3)).astype(bool),
    }


def header_gets(counter: Counter) -> list[str | None]:
    """The ranges of the GET requests that asked for the file's start."""
    return [r for r in counter.ranges if r is not None and r.startswith("bytes=0-")]


def test_a_header_is_read_with_one_ranged_request(tmp_path, server, counter):
    want = tensors()
    write_safetensors(tmp_path / "m.safetensors", want)
    url = f"{server}/m.safetensors"
    assert kst.read_header(url) == kst.read_header(tmp_path / "m.safetensors")
    gets = [r for r in counter.ranges if r is not None]
    assert len(gets) == 1 and gets[0].startswith("bytes=0-"), counter.ranges
    got = kst.load_file(url, device="cpu", framework="numpy")
    assert set(got) == set(want)
    for name, array in want.items():
        np.testing.assert_array_equal(got[name], array)
        assert got[name].dtype == array.dtype


def test_a_long_header_takes_a_second_request(tmp_path, server, counter):
    data = np.arange(3, dtype=np.float32).tobytes()
    header = {
        "__metadata__": {"pad": "x" * 100_000},
        "t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
    }
    text = json.dumps(header).encode()
    (tmp_path / "long.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + data)
    start, found, metadata = kst.read_header(f"{server}/long.safetensors")
    assert start == 8 + len(text) and metadata == header["__metadata__"]
    assert found == {"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}}
    ranges = [r for r in counter.ranges if r is not None]
    assert len(ranges) == 2 and len(header_gets(counter)) == 1, ranges
    got = kst.load_file(f"{server}/long.safetensors", device="cpu", framework="numpy")
    np.testing.assert_array_equal(got["t"], np.arange(3, dtype=np.float32))


def test_a_malformed_remote_header_names_the_url_without_its_password(tmp_path, server):
    text = json.dumps({"t": {"dtype": "F32", "shape": None, "data_offsets": [0, 8]}}).encode()
    (tmp_path / "bad.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + b"\x01" * 8)
    url = server.replace("http://", "http://user:secret@") + "/bad.safetensors"
    for call in (
        lambda: kst.read_header(url),
        lambda: kst.load_file(url, device="cpu", framework="numpy"),
    ):
        with pytest.raises(ValueError, match="invalid shape None") as info:
            call()
        assert "user:***@127.0.0.1" in str(info.value) and "secret" not in str(info.value)
    (tmp_path / "cut.safetensors").write_bytes(struct.pack("<Q", 10_000) + b"{}")
    with pytest.raises(ValueError, match="header claims 10000 bytes, but the file has 10"):
        kst.read_header(f"{server}/cut.safetensors")
    with pytest.raises(FileNotFoundError):
        kst.read_header(f"{server}/missing.safetensors")


def test_the_torch_loader_reads_a_url(tmp_path, server):
    torch = pytest.importorskip("torch")
    want = tensors()
    write_safetensors(tmp_path / "m.safetensors", want)
    got = kst.load_file(f"{server}/m.safetensors", device="cpu")
    for name, array in want.items():
        assert torch.equal(got[name], torch.from_numpy(array))


def test_shards_named_twice_are_refused_without_the_password(tmp_path, server):
    """The shards' headers (what every torch load reads first) name URLs redacted."""
    write_safetensors(tmp_path / "a.safetensors", {"w": np.zeros(2, np.float32)})
    url = server.replace("http://", "http://user:secret@") + "/a.safetensors"
    with pytest.raises(ValueError, match="is in both") as info:
        kst._spans([url, f"{url}?again"])
    assert "user:***@" in str(info.value) and "secret" not in str(info.value)
