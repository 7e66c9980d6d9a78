"""kvikpy's ``crc32c`` codec (the checksum of shard indexes) on the CPU: selected in zarr's
configuration by ``import kvikpy.zarr``, the same metadata and bytes as zarr's, and a bad
checksum still refused. Its GPU half (no "slow copy" warning under zarr's GPU mode) is in
tests/gpu/test_zarr_gpu.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

zarr = pytest.importorskip("zarr", minversion="3.0.8")

import zarr.storage  # noqa: E402, F811

import kvikpy.zarr  # noqa: E402
from kvikpy.zarr import GDSStore, _codecs  # noqa: E402


def write_sharded(root, store_cls=zarr.storage.LocalStore) -> np.ndarray:
    data = np.arange(60 * 80, dtype="int32").reshape(60, 80)
    a = zarr.create_array(
        store_cls(root), name="a", shape=data.shape, chunks=(10, 20), shards=(30, 40),
        dtype="int32",
    )  # fmt: skip
    a[:] = data
    return data


def test_crc32c_is_kvikpys_and_reads_zarrs_shards(tmp_path):
    assert zarr.config.get("codecs.crc32c") == "kvikpy.zarr._codecs.Crc32cCodec"
    data = write_sharded(tmp_path)  # written by zarr alone
    meta = (tmp_path / "a" / "zarr.json").read_text()
    assert "kvikpy" not in meta
    b = zarr.open_array(GDSStore(tmp_path, read_only=True), path="a", mode="r")
    (sharding,) = b.metadata.codecs
    assert any(type(c) is _codecs.Crc32cCodec for c in sharding.index_codecs)
    np.testing.assert_array_equal(b[:], data)  # whole shards
    np.testing.assert_array_equal(b[5:17, 33:71], data[5:17, 33:71])  # partial shards


def test_shards_written_through_kvikpy_are_zarrs_bytes(tmp_path):
    data = write_sharded(tmp_path / "zarr")
    write_sharded(tmp_path / "kvikpy", GDSStore)
    for shard in sorted((tmp_path / "zarr" / "a" / "c").rglob("*")):
        if shard.is_file():
            theirs = tmp_path / "kvikpy" / shard.relative_to(tmp_path / "zarr")
            assert theirs.read_bytes() == shard.read_bytes(), shard
    c = zarr.open_array(zarr.storage.LocalStore(tmp_path / "kvikpy"), path="a", mode="r")
    np.testing.assert_array_equal(c[:], data)


def test_a_bad_shard_index_checksum_is_refused(tmp_path):
    write_sharded(tmp_path)
    shard = tmp_path / "a" / "c" / "0" / "0"
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0xFF  # the index's checksum (the index is at the end)
    shard.write_bytes(bytes(raw))
    b = zarr.open_array(GDSStore(tmp_path, read_only=True), path="a", mode="r")
    with pytest.raises(ValueError, match="checksum do not match"):
        b[0:5, 0:5]


def test_register_codecs_names_crc32c():
    assert kvikpy.zarr.register_codecs()["crc32c"] == "kvikpy.zarr._codecs.Crc32cCodec"
    assert json.dumps(_codecs.Crc32cCodec().to_dict()) == '{"name": "crc32c"}'
