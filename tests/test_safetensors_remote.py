"""kvikpy.safetensors over HTTP: headers read and checked by the engine with ranged
requests (one for a header in the first 64 KiB), files loaded from a URL, and malformed
remote headers refused naming the URL with its credentials hidden."""

from __future__ import annotations

import errno
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from remote_servers import Counter, CountingRangeHandler, replace_file, serve
from test_safetensors import write_safetensors

import kvikpy.safetensors as kst
from kvikpy._http_server import entity_tag
from kvikpy._spans import Files
from kvikpy.errors import RemoteError

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
    with pytest.raises(ValueError, match="is in both") as info, Files() as files:
        kst._spans([url, f"{url}?again"], files)
    assert "user:***@" in str(info.value) and "secret" not in str(info.value)


def replaced_after_its_header(monkeypatch: pytest.MonkeyPatch, path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` (a new file renamed over it, as a deployment does)
    right after a load has read its header, before the load reads its tensors."""
    real = kst._header

    def header_then_replace(name: str, file: object) -> object:
        out = real(name, file)  # type: ignore[arg-type]
        replace_file(path, data)
        return out

    monkeypatch.setattr(kst, "_header", header_then_replace)


def changed_values(want: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same tensors (names, dtypes, shapes: the same header) with other values."""
    return {n: (a + 1 if a.dtype != bool else ~a).astype(a.dtype) for n, a in want.items()}


def test_a_checkpoint_replaced_between_header_and_tensors_is_an_error(
    tmp_path, server, counter, monkeypatch
):
    """The header and the tensors are read through one open file, pinned to the ETag it
    was opened at: a checkpoint replaced on the server between the two is one clear
    error, never the tensors of one version cut by the header of another."""
    want = tensors()
    path = tmp_path / "m.safetensors"
    write_safetensors(path, want)
    write_safetensors(tmp_path / "new.safetensors", changed_values(want))
    new = (tmp_path / "new.safetensors").read_bytes()
    assert len(new) == path.stat().st_size
    old_tag = entity_tag(path.stat())
    url = f"{server}/m.safetensors"
    replaced_after_its_header(monkeypatch, path, new)
    with pytest.raises(RemoteError) as info:
        kst.load_file(url, device="cpu", framework="numpy")
    assert info.value.errno == errno.ESTALE and old_tag in str(info.value)
    assert "changed on the server since it was opened" in str(info.value)
    assert set(counter.if_matches) == {old_tag}
    # load_into: the failed read is named, with the server's answer as its cause.
    write_safetensors(path, want)
    old_tag = entity_tag(path.stat())
    target = {n: np.zeros_like(a) for n, a in want.items()}
    with pytest.raises(kst.LoadIntoError) as into:
        kst.load_into(target, url)
    assert isinstance(into.value.__cause__, RemoteError)
    assert into.value.__cause__.errno == errno.ESTALE and old_tag in str(into.value.__cause__)
    # Loaded again, the checkpoint is its new version, whole.
    monkeypatch.undo()
    got = kst.load_file(url, device="cpu", framework="numpy")
    for name, array in changed_values(want).items():
        np.testing.assert_array_equal(got[name], array)


def test_a_local_checkpoint_replaced_after_its_header_loads_whole(tmp_path, monkeypatch):
    """A local checkpoint renamed over after its header was read loads as the file the
    header came from (one open file for both), not a mix."""
    want = tensors()
    path = tmp_path / "m.safetensors"
    write_safetensors(path, want)
    write_safetensors(tmp_path / "new.safetensors", changed_values(want))
    replaced_after_its_header(monkeypatch, path, (tmp_path / "new.safetensors").read_bytes())
    got = kst.load_file(path, device="cpu", framework="numpy")
    target = {n: np.zeros_like(a) for n, a in want.items()}
    assert kst.load_into(target, path) == ([], [])
    for name, array in want.items():
        np.testing.assert_array_equal(got[name], array)
    # The second load read the header of the file replaced by the first: its values.
    for name, array in changed_values(want).items():
        np.testing.assert_array_equal(target[name], array)


def test_load_into_reads_a_url_with_a_header_request_per_file(tmp_path, server, counter):
    want = tensors()
    write_safetensors(tmp_path / "a.safetensors", {"w": want["w"]})
    write_safetensors(tmp_path / "b.safetensors", {"b": want["b"], "m": want["m"]})
    urls = [f"{server}/a.safetensors", f"{server}/b.safetensors"]
    target = {n: np.zeros_like(a) for n, a in want.items()}
    assert kst.load_into(target, urls) == ([], [])
    for name, array in want.items():
        np.testing.assert_array_equal(target[name], array)
    # Each file's header fetched once, and every request pinned to the file's version.
    assert len(header_gets(counter)) == 2, counter.ranges
    tags = {entity_tag((tmp_path / n).stat()) for n in ("a.safetensors", "b.safetensors")}
    assert set(counter.if_matches) == tags


def write_sharded(folder: Path, want: dict[str, np.ndarray], index: bool = True) -> None:
    """``want`` as ``save_pretrained`` writes it into ``folder``: two shards and their
    index (or one ``model.safetensors``)."""
    folder.mkdir()
    if not index:
        write_safetensors(folder / "model.safetensors", want)
        return
    names = list(want)
    weight_map = {}
    for k, part in enumerate((names[:1], names[1:])):
        shard = f"model-0000{k + 1}-of-00002.safetensors"
        write_safetensors(folder / shard, {n: want[n] for n in part})
        weight_map.update(dict.fromkeys(part, shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


@pytest.mark.parametrize("index", [True, False])
def test_load_pretrained_from_a_directory_url(tmp_path, server, index):
    want = tensors()
    write_sharded(tmp_path / "llm", want, index)
    for directory in (f"{server}/llm", f"{server}/llm/"):
        target = {n: np.zeros_like(a) for n, a in want.items()}
        assert kst.load_pretrained(target, directory) == ([], [])
        for name, array in want.items():
            np.testing.assert_array_equal(target[name], array)


@pytest.mark.parametrize(
    "shard",
    [
        "../outside.safetensors",
        "..%2foutside.safetensors",
        "x.safetensors?y=.safetensors",
        "x#.safetensors",
        "sub/x.safetensors",
    ],
)
def test_a_remote_index_cannot_leave_its_directory(tmp_path, server, counter, shard):
    (tmp_path / "llm").mkdir()
    write_safetensors(tmp_path / "outside.safetensors", {"w": np.ones(2, np.float32)})
    (tmp_path / "llm" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": shard}})
    )
    target = {"w": np.zeros(2, np.float32)}
    with pytest.raises(ValueError, match=r"a shard is a \.safetensors file name"):
        kst.load_pretrained(target, f"{server}/llm")
    assert not target["w"].any()
    assert not any("outside" in str(r) for r in counter.ranges)


def test_a_remote_directory_missing_pieces(tmp_path, server):
    url = server.replace("http://", "http://user:secret@")
    with pytest.raises(FileNotFoundError, match=r"neither model\.safetensors") as info:
        kst.load_pretrained({}, f"{url}/nowhere")
    assert "secret" not in str(info.value) and "user:***@" in str(info.value)
    (tmp_path / "llm").mkdir()
    (tmp_path / "llm" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "model-1.safetensors"}})
    )
    with pytest.raises(FileNotFoundError) as missing:
        kst.load_pretrained({"w": np.zeros(2, np.float32)}, f"{url}/llm")
    assert "model-1.safetensors" in str(missing.value) and "secret" not in str(missing.value)
    (tmp_path / "llm" / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON") as bad:
        kst.load_pretrained({}, f"{url}/llm")
    assert "secret" not in str(bad.value)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("body_bytes", [0, 8 + 100])
def test_a_stalled_server_is_a_timeout_naming_the_url(body_bytes):
    """A server that stops sending (before the header's length, or inside the header)
    ends the load with a ``TimeoutError`` naming the URL once its attempt has taken
    ``http_timeout``; pytest-timeout bounds a hang."""
    from stalling_servers import stalling_server

    from kvikpy import defaults
    from kvikpy.errors import RemoteTimeoutError

    with (
        stalling_server(1 << 20, body_bytes) as server,
        defaults.set({"http_timeout": 1, "http_max_attempts": 1}),
    ):
        for load in (
            lambda: kst.load_file(server.url, device="cpu", framework="numpy"),
            lambda: kst.load_into({}, server.url),
            lambda: kst.read_header(server.url),
        ):
            with pytest.raises(RemoteTimeoutError) as info:
                load()
            assert isinstance(info.value, TimeoutError)
            assert info.value.errno == errno.ETIMEDOUT
            assert "stalled.bin" in str(info.value)
        assert server.stalled >= 3  # one stalled request for each of the three loads
