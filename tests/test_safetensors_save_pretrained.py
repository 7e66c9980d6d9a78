"""kvikpy.safetensors.save_pretrained with numpy arrays on the host: sharded checkpoints
read back by kvikpy's load_pretrained and by safetensors, the packing rule, the index,
max_shard_size parsing, the tied-weight rule, refusals that change nothing on disk,
failures midway that leave an earlier checkpoint as it was, stale shards, and sync.
torch modules and GPU tensors: tests/gpu/test_safetensors_save_pretrained_gpu.py."""

from __future__ import annotations

import errno
import json
import os
import tempfile
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
from test_safetensors_save import failing_writes, held_writes

import kvikpy
import kvikpy.safetensors as kst
from kvikpy import _lib, _save, _save_pretrained
from kvikpy.cufile import CuFile

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

DTYPES = ["float64", "float32", "float16", "int64", "int32", "int8", "uint16", "uint8", "bool"]
INDEX = "model.safetensors.index.json"


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal dtype, shape and bytes (NaNs included)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def sample(n: int = 7, size: int = 200) -> dict[str, np.ndarray]:
    """``n`` float32 tensors of ``size`` elements each (``4 * size`` bytes), and a few
    small ones of other dtypes."""
    rng = np.random.default_rng(3)
    out: dict[str, np.ndarray] = {
        f"layers.{k}.weight": rng.standard_normal(size).astype(np.float32) for k in range(n)
    }
    out["ids"] = rng.integers(-(2**40), 2**40, 5)
    out["mask"] = rng.integers(0, 2, (2, 3)).astype(bool)
    out["empty"] = np.zeros((0, 3), dtype=np.float16)
    return out


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file of ``directory``, with its bytes."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def shard_files(directory: Path) -> list[str]:
    """The files of the checkpoint in ``directory``, in shard order."""
    if (directory / INDEX).exists():
        index = json.loads((directory / INDEX).read_text())
        return sorted(set(index["weight_map"].values()))
    return ["model.safetensors"]


def check_checkpoint(
    directory: Path, tensors: dict[str, np.ndarray], limit: int, metadata: dict[str, str]
) -> None:
    """Assert that ``directory`` holds ``tensors`` as save_pretrained lays them out."""
    files = shard_files(directory)
    # kvikpy's loader, into zeroed arrays of the same shapes and dtypes.
    target = {name: np.zeros_like(a) for name, a in tensors.items()}
    assert kst.load_pretrained(target, directory) == ([], [])
    for name, a in tensors.items():
        assert same(target[name], a), name
    # safetensors, shard by shard: the tensors, in the order given, packed in order.
    order: list[str] = []
    sizes: list[int] = []
    for file in files:
        loaded = stn.load_file(directory / file)
        with safetensors.safe_open(directory / file, framework="numpy") as f:
            assert f.metadata() == metadata
            names = list(f.keys())
        names.sort(key=list(tensors).index)
        order += names
        for name in names:
            assert same(loaded[name], tensors[name]), name
        size = sum(tensors[name].nbytes for name in names)
        assert size <= limit or len(names) == 1, (file, size, limit)
        sizes.append(size)
    assert order == list(tensors)
    # Each shard but the last was closed because the next tensor would pass the limit.
    first = 0
    for k, file in enumerate(files[:-1]):
        first += len(stn.load_file(directory / file))
        assert sizes[k] + tensors[order[first]].nbytes > limit
    if len(files) == 1:
        assert not (directory / INDEX).exists()
        assert sorted(os.listdir(directory)) == ["model.safetensors"]
        return
    n = len(files)
    assert files == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    index = json.loads((directory / INDEX).read_text())
    assert set(index) == {"metadata", "weight_map"}
    assert index["metadata"] == {"total_size": sum(a.nbytes for a in tensors.values())}
    weight_map = index["weight_map"]
    assert list(weight_map) == sorted(tensors)  # each name once, sorted
    for file in files:
        assert {k for k, v in weight_map.items() if v == file} == set(
            stn.load_file(directory / file)
        )
    assert sorted(os.listdir(directory)) == sorted([*files, INDEX])


arrays = st.sampled_from(DTYPES).flatmap(
    lambda dtype: hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=2, max_side=12))
)
tensor_dicts = st.dictionaries(st.text(min_size=1, max_size=6), arrays, max_size=12).filter(
    lambda d: "__metadata__" not in d
)


@SETTINGS
@given(tensors=tensor_dicts, limit=st.integers(1, 1500))
def test_any_tensors_round_trip_in_shards(tensors: dict[str, np.ndarray], limit: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "checkpoint"
        kst.save_pretrained(tensors, directory, max_shard_size=limit)
        check_checkpoint(directory, tensors, limit, {"format": "np"})


@pytest.mark.parametrize("limit", ["1MB", 10**6, "1600B", "1200B", "1KiB", "1kb", 1])
def test_a_checkpoint_in_shards_of_each_size(tmp_path: Path, limit: int | str) -> None:
    tensors = sample()
    kst.save_pretrained(tensors, tmp_path, max_shard_size=limit, metadata={"format": "pt"})
    size = _save_pretrained.parse_size(limit)
    check_checkpoint(tmp_path, tensors, size, {"format": "pt"})


def test_one_shard_is_model_safetensors_alone(tmp_path: Path) -> None:
    tensors = sample()
    kst.save_pretrained(tensors, tmp_path)  # 5GB by default
    assert os.listdir(tmp_path) == ["model.safetensors"]
    loaded = stn.load_file(tmp_path / "model.safetensors")
    assert loaded.keys() == tensors.keys()
    assert kst.read_header(tmp_path / "model.safetensors")[2] == {"format": "np"}


def test_no_tensors_is_one_empty_file(tmp_path: Path) -> None:
    kst.save_pretrained({}, tmp_path, max_shard_size=1)
    assert os.listdir(tmp_path) == ["model.safetensors"]
    assert stn.load_file(tmp_path / "model.safetensors") == {}


def test_shards_are_packed_in_order() -> None:
    pack = _save_pretrained.pack
    assert pack([], 10) == [[]]
    assert pack([4, 4, 4], 8) == [[0, 1], [2]]
    assert pack([4, 5, 3], 8) == [[0], [1, 2]]  # 4 + 5 passes 8; 5 + 3 does not
    assert pack([20, 1, 1], 8) == [[0], [1, 2]]  # larger than the limit: alone
    assert pack([1, 20, 1], 8) == [[0], [1], [2]]
    assert pack([0, 8, 0, 1], 8) == [[0, 1, 2], [3]]


SIZES = [
    ("5GB", 5 * 10**9),
    ("500MB", 500 * 10**6),
    ("100KB", 100 * 10**3),
    ("10GiB", 10 * 2**30),
    ("512MiB", 512 * 2**20),
    ("3KiB", 3 * 2**10),
    ("1TB", 10**12),
    ("2TiB", 2 * 2**40),
    ("5gb", 5 * 10**9),
    ("10gib", 10 * 2**30),
    ("1.5GB", 1_500_000_000),
    ("0.5KiB", 512),
    ("77B", 77),
    ("77", 77),
    (" 4 MB ", 4 * 10**6),
    (1, 1),
    (123456789, 123456789),
]

NOT_SIZES = [
    ("", ValueError),
    ("GB", ValueError),
    ("5 GBs", ValueError),
    ("5XB", ValueError),
    ("five GB", ValueError),
    ("-1GB", ValueError),
    ("1e9", ValueError),
    ("0KB", ValueError),
    ("0.0001B", ValueError),
    (0, ValueError),
    (-5, ValueError),
    (5.0, TypeError),
    (True, TypeError),
    (None, TypeError),
]


@pytest.mark.parametrize(("text", "size"), SIZES, ids=[repr(s[0]) for s in SIZES])
def test_max_shard_size_is_parsed(text: Any, size: int) -> None:
    assert _save_pretrained.parse_size(text) == size


@pytest.mark.parametrize(("value", "error"), NOT_SIZES, ids=[repr(s[0]) for s in NOT_SIZES])
def test_a_bad_max_shard_size_is_refused_before_anything_is_made(
    tmp_path: Path, value: Any, error: type
) -> None:
    directory = tmp_path / "new"
    with pytest.raises(error, match="max_shard_size"):
        kst.save_pretrained(sample(), directory, max_shard_size=value)
    assert not directory.exists()


class FakeModule:
    """What _untie reads of a module: named_modules() and _tied_weights_keys."""

    def __init__(self, keys: Any, sub_keys: Any = None) -> None:
        self._tied_weights_keys = keys
        self.sub = type("Sub", (), {"_tied_weights_keys": sub_keys})()

    def named_modules(self) -> list[tuple[str, Any]]:
        return [("", self), ("model", self.sub)]


TIED = [
    # (declared on the module, declared on submodule "model", names kept)
    (None, None, ["embed.weight", "other"]),
    (["lm_head.weight"], None, ["embed.weight", "other"]),
    (["embed.weight"], None, ["lm_head.weight", "other"]),
    ([r"^embed\..*"], None, ["lm_head.weight", "other"]),
    ({"embed.weight": "lm_head.weight"}, None, ["lm_head.weight", "other"]),
    (["embed.weight", "lm_head.weight", "model.head.weight"], None, ["embed.weight", "other"]),
    (None, ["head.weight"], ["embed.weight", "other"]),
    (["embed.weight"], ["head.weight"], ["lm_head.weight", "other"]),
    (["[unclosed"], None, ["embed.weight", "other"]),
]


@pytest.mark.parametrize(("keys", "sub_keys", "kept"), TIED)
def test_tied_tensors_are_kept_once_under_the_undeclared_name(
    keys: Any, sub_keys: Any, kept: list[str]
) -> None:
    shared = np.arange(12, dtype=np.float32)
    state = {
        "embed.weight": shared,
        "lm_head.weight": shared,
        "other": np.ones(3, dtype=np.float32),
        "model.head.weight": shared,
    }
    described = [_save._describe(k, v, {"float32": "F32"}) for k, v in state.items()]
    got = _save_pretrained._untie(FakeModule(keys, sub_keys), described)
    assert [t.name for t in got] == kept


def test_a_mapping_with_shared_memory_is_refused(tmp_path: Path) -> None:
    shared = np.arange(12, dtype=np.float32)
    with pytest.raises(ValueError, match="share memory"):
        kst.save_pretrained({"a": shared, "b": shared}, tmp_path / "c")
    assert not (tmp_path / "c").exists()


BASE = np.arange(40, dtype=np.float32)
REFUSED = [
    ("not contiguous", {"a": BASE, "b": BASE[::2]}, None, ValueError, "not contiguous"),
    ("overlap", {"a": BASE[:10], "b": BASE[5:15]}, None, ValueError, "share memory"),
    ("a list", [BASE], None, TypeError, "mapping"),
    ("not an array", {"a": BASE, "b": [1, 2]}, None, TypeError, "writes arrays"),
    ("name type", {"a": BASE, 3: BASE[:0].copy()}, None, TypeError, "tensor name"),
    ("complex128", {"a": np.zeros(2, complex)}, None, ValueError, "safetensors cannot hold"),
    ("metadata type", {"a": BASE}, {"k": 1}, TypeError, "metadata values are strings"),
    ("metadata not a dict", {"a": BASE}, ["k"], TypeError, "metadata must be"),
    # In the last shard only: refused before the first shard is written.
    (
        "__metadata__",
        {"a": BASE, "__metadata__": BASE[:1].copy()},
        None,
        ValueError,
        "__metadata__",
    ),
]


@pytest.mark.parametrize("existing", [True, False], ids=["existing", "fresh"])
@pytest.mark.parametrize(
    ("tensors", "metadata", "error", "message"),
    [case[1:] for case in REFUSED],
    ids=[case[0] for case in REFUSED],
)
def test_refused_input_changes_nothing_on_disk(
    tmp_path: Path, existing: bool, tensors: Any, metadata: Any, error: type, message: str
) -> None:
    directory = tmp_path / "checkpoint"
    if existing:
        kst.save_pretrained(sample(), directory, max_shard_size="2KB")
        before = snapshot(directory)
    with pytest.raises(error, match=message):
        kst.save_pretrained(tensors, directory, max_shard_size=100, metadata=metadata)
    if existing:
        assert snapshot(directory) == before
    else:
        assert not directory.exists()


def test_a_url_or_a_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="local directory"):
        kst.save_pretrained({}, "s3://bucket/checkpoint")
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        kst.save_pretrained({"a": BASE}, tmp_path / "file")
    assert os.listdir(tmp_path) == ["file"]


def test_a_missing_directory_is_made(tmp_path: Path) -> None:
    directory = tmp_path / "a" / "b" / "checkpoint"
    kst.save_pretrained(sample(), directory, max_shard_size="2KB")
    check_checkpoint(directory, sample(), 2000, {"format": "np"})


def test_every_shard_is_started_before_any_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec = PwriteRecorder(monkeypatch)
    tensors = sample()
    kst.save_pretrained(tensors, tmp_path, max_shard_size="2KB")
    files = shard_files(tmp_path)
    assert len(files) == 4
    starts = [e for e in rec.events if e[0] == "start"]
    # A header for every shard and a write for every tensor with bytes, on 4 files.
    assert len(starts) == len(files) + len(tensors) - 1
    assert len({e[1] for e in starts}) == len(files)
    assert [e[0] for e in rec.events] == ["start"] * len(starts) + ["wait"] * len(starts)
    check_checkpoint(tmp_path, tensors, 2000, {"format": "np"})


def earlier_save(directory: Path) -> dict[str, bytes]:
    """A checkpoint of 3 shards in ``directory``, with a file of the user's beside it."""
    kst.save_pretrained(sample(3, 400), directory, max_shard_size="2KB")
    (directory / "config.json").write_text("{}")
    assert len(shard_files(directory)) == 3
    return snapshot(directory)


@pytest.mark.parametrize("failure", [KeyboardInterrupt(), OSError(errno.ENOSPC, "No space")])
@pytest.mark.parametrize("fail_at", [0, 3, 9])
def test_a_save_that_fails_midway_leaves_the_earlier_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException, fail_at: int
) -> None:
    before = earlier_save(tmp_path)
    rec = PwriteRecorder(monkeypatch, fail_at=fail_at, raise_=failure)
    with pytest.raises(type(failure)):
        kst.save_pretrained(sample(), tmp_path, max_shard_size="2KB")  # 4 shards
    started = [e[1:] for e in rec.events if e[0] == "start"]
    assert len(started) == fail_at
    # The writes started before the failure were all waited for.
    assert sorted(e[1:] for e in rec.events if e[0] == "wait") == sorted(started)
    assert snapshot(tmp_path) == before  # no temporary file left, nothing replaced


def test_a_directory_made_for_a_failed_save_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    PwriteRecorder(monkeypatch, fail_at=2, raise_=OSError(errno.ENOSPC, "No space"))
    with pytest.raises(OSError, match="No space"):
        kst.save_pretrained(sample(), tmp_path / "a" / "b", max_shard_size="2KB")
    assert os.listdir(tmp_path) == []


def test_a_failed_write_is_raised_after_all_have_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = earlier_save(tmp_path)
    waited = failing_writes(monkeypatch, 2)
    with pytest.raises(OSError, match="No space left"):
        kst.save_pretrained(sample(), tmp_path, max_shard_size="2KB")
    assert waited == list(range(4 + len(sample()) - 1))
    assert snapshot(tmp_path) == before


def test_a_short_write_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = earlier_save(tmp_path)

    class Short:
        def get(self) -> int:
            return 1

    monkeypatch.setattr(CuFile, "pwrite", lambda *a, **k: Short())
    with pytest.raises(OSError, match=r"model-00001-of-00004.safetensors: 1 of \d+ bytes"):
        kst.save_pretrained(sample(), tmp_path, max_shard_size="2KB")
    assert snapshot(tmp_path) == before


def test_a_failed_sync_leaves_the_earlier_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every file is synced before any is renamed: a sync that fails (an I/O error)
    replaces nothing."""
    before = earlier_save(tmp_path)
    seen = SyncRecorder(monkeypatch, tmp_path, fail_at=3)
    with pytest.raises(OSError, match="Input/output error"):
        kst.save_pretrained(sample(), tmp_path, max_shard_size="2KB")
    assert len(seen.files) == 3 and seen.commits == [] and seen.directories == []
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("first", "second", "left"),
    [
        # 3 shards, then 4: the 3 old shards go.
        ("2KB", "2KB", [f"model-0000{k}-of-00004.safetensors" for k in range(1, 5)] + [INDEX]),
        # 3 shards, then one file: the shards and the index go.
        ("2KB", "1MB", ["model.safetensors"]),
        # One file, then 4 shards: model.safetensors goes.
        ("1MB", "2KB", [f"model-0000{k}-of-00004.safetensors" for k in range(1, 5)] + [INDEX]),
    ],
)
def test_stale_files_are_removed_after_the_new_ones_are_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str, second: str, left: list[str]
) -> None:
    kst.save_pretrained(sample(3, 400), tmp_path, max_shard_size=first)
    # Files that are not a former save's: kept.
    mine = [
        "config.json",
        "model-1-of-2.safetensors",
        "model-00001-of-00002.safetensors.bak",
        "other-00001-of-00002.safetensors",
        "model.safetensors.index.json.orig",
    ]
    for name in mine:
        (tmp_path / name).write_text(name)
    removed: list[tuple[str, list[str]]] = []
    real = os.remove

    def remove(path: Any) -> None:
        removed.append((os.path.basename(path), sorted(os.listdir(tmp_path))))
        real(path)

    monkeypatch.setattr(os, "remove", remove)
    tensors = sample()
    kst.save_pretrained(tensors, tmp_path, max_shard_size=second)
    new = shard_files(tmp_path)
    assert sorted(os.listdir(tmp_path)) == sorted(mine + left)
    assert removed  # something was stale in every case
    for name, listing in removed:
        # At each removal, every new file (the index included) was already in place.
        assert set(left) <= set(listing), name
        assert name not in left
    assert len(new) == (1 if second == "1MB" else 4)
    target = {n: np.zeros_like(a) for n, a in tensors.items()}
    assert kst.load_pretrained(target, tmp_path) == ([], [])
    assert all(same(target[n], a) for n, a in tensors.items())


def test_a_resave_with_the_same_shard_count_replaces_every_shard(tmp_path: Path) -> None:
    kst.save_pretrained(sample(), tmp_path, max_shard_size="2KB")
    tensors = {k: v + 1 if v.dtype != bool else ~v for k, v in sample().items()}
    kst.save_pretrained(tensors, tmp_path, max_shard_size="2KB")
    check_checkpoint(tmp_path, tensors, 2000, {"format": "np"})


class SyncRecorder:
    """``_lib.Replacement`` and ``_lib.sync_directory`` wrapped (the engine's fsyncs of
    a save): each file synced, with the directory's listing at that moment; each commit's
    ``sync``; each directory synced, with its listing. With ``fail_at``, that file sync
    fails with an I/O error instead."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, directory: Path, fail_at: int | None = None
    ) -> None:
        self.files: list[tuple[str, list[str]]] = []
        self.commits: list[bool] = []
        self.directories: list[tuple[str, list[str]]] = []
        real, real_directory, seen = _lib.Replacement, _lib.sync_directory, self

        class Recorded:
            def __init__(self, target: Any, keep: bool) -> None:
                self.inner = real(target, keep)
                self.path = self.inner.path

            def sync(self) -> None:
                seen.files.append((self.path, sorted(os.listdir(directory))))
                if len(seen.files) == fail_at:
                    raise OSError(errno.EIO, "Input/output error")
                self.inner.sync()

            def commit(self, sync: bool) -> None:
                seen.commits.append(sync)
                self.inner.commit(sync)

            def abort(self) -> None:
                self.inner.abort()

        def sync_directory(path: Any) -> None:
            seen.directories.append((str(path), sorted(os.listdir(path))))
            real_directory(path)

        monkeypatch.setattr(_lib, "Replacement", Recorded)
        monkeypatch.setattr(_lib, "sync_directory", sync_directory)


def test_sync_syncs_every_file_before_the_renames_and_the_directory_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = SyncRecorder(monkeypatch, tmp_path)
    kst.save_pretrained(sample(), tmp_path, max_shard_size="2KB")
    final = sorted(os.listdir(tmp_path))
    assert len(final) == 5
    assert seen.directories == [(str(tmp_path), final)]
    assert seen.commits == [False] * 5  # the files are synced already
    synced = [os.path.basename(path) for path, _ in seen.files]
    # The four shards and the index, under their temporary names, none renamed yet.
    assert len(synced) == 5
    for name, (_, listing) in zip(synced, seen.files, strict=True):
        assert name.startswith(".") and name.endswith(".tmp")
        assert not set(listing) & set(final)
    assert sorted(n[1:].split(".kvikpy-")[0] for n in synced) == final


def test_sync_false_syncs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = SyncRecorder(monkeypatch, tmp_path)
    with kvikpy.defaults.set("write_sync", True):  # the setting does not apply here
        kst.save_pretrained(sample(), tmp_path, max_shard_size="2KB", sync=False)
        kst.save_pretrained(sample(), tmp_path / "one", sync=False)
    assert seen.files == [] and seen.directories == []
    assert seen.commits == [False] * 6
    check_checkpoint(tmp_path / "one", sample(), 5 * 10**9, {"format": "np"})


def test_save_file_syncs_unless_told_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    commits = SyncRecorder(monkeypatch, tmp_path).commits
    kst.save_file({"a": BASE}, tmp_path / "a.st")
    kst.save_file({"a": BASE}, tmp_path / "b.st", sync=False)
    with kvikpy.defaults.set("write_sync", True):  # save_file's own argument decides
        kst.save_file({"a": BASE}, tmp_path / "c.st", sync=False)
    assert commits == [True, False, False]
    for name in ("a.st", "b.st", "c.st"):
        assert same(stn.load_file(tmp_path / name)["a"], BASE)


def test_a_background_save_writes_the_shards_of_the_moment_of_the_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tensors = sample()
    kst.save_pretrained(
        {k: v.copy() for k, v in tensors.items()}, tmp_path / "blocking", max_shard_size=1000
    )
    release = held_writes(monkeypatch)
    future = kst.save_pretrained(
        tensors, tmp_path / "background", max_shard_size=1000, blocking=False
    )
    assert isinstance(future, kst.SaveFuture)
    for a in tensors.values():  # training goes on at once
        a.fill(0)
    # Nothing under the checkpoint's names until every byte is written.
    assert not [
        n for n in snapshot(tmp_path / "blocking") if (tmp_path / "background" / n).exists()
    ]
    release.set()
    size = future.get(timeout=60)
    written = snapshot(tmp_path / "background")
    assert len(shard_files(tmp_path / "background")) > 1
    assert written == snapshot(tmp_path / "blocking")
    assert size == sum(len(b) for b in written.values())


def test_a_background_save_that_fails_leaves_the_directory_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kst.save_pretrained(sample(), tmp_path, max_shard_size=1000)
    before = snapshot(tmp_path)
    failing_writes(monkeypatch, 3)
    future = kst.save_pretrained(sample(3), tmp_path, max_shard_size=500, blocking=False)
    with pytest.raises(OSError, match="No space left"):
        future.get(timeout=60)
    assert snapshot(tmp_path) == before
    # A refusal comes from the call itself, before anything is copied or started.
    with pytest.raises(ValueError, match="max_shard_size"):
        kst.save_pretrained(sample(), tmp_path, max_shard_size="lots", blocking=False)
