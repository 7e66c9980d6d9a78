"""A column of an Arrow IPC table over several record batches as one GPU tensor:
``torch.from_dlpack(table.column(name))`` over a file of many record batches read onto the
GPU, every decode route (uncompressed, compressed decoded on the host, and by nvCOMP
where it is installed), against pyarrow's reading of the same file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import kvikpy.arrow
from kvikpy import _nvcomp

torch = pytest.importorskip("torch")
pa = pytest.importorskip("pyarrow")
ipc = pytest.importorskip("pyarrow.ipc")

from test_arrow_columns import expected, table, write  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    ("compression", "decode"),
    [(None, "auto"), ("zstd", "host"), ("lz4", "host"), ("zstd", "gpu"), ("lz4", "gpu")],
)
def test_a_column_of_many_record_batches_is_one_gpu_tensor(
    tmp_path: Path, compression: str | None, decode: str
) -> None:
    if decode == "gpu" and not _nvcomp.available():
        pytest.skip("nvCOMP (nvidia.nvcomp) is not importable")
    t = table(5000)
    path = tmp_path / "t.arrow"
    write(path, t, 640, compression, False)  # 8 record batches
    got = kvikpy.arrow.read_ipc(path, device="cuda", decode=decode)
    assert len(got.column("input_ids")) == 8
    for name in ("input_ids", "score", "small", "emb"):
        tensor = torch.from_dlpack(got.column(name))
        assert tensor.is_cuda
        np.testing.assert_array_equal(tensor.cpu().numpy(), expected(t, name), err_msg=name)
    # The chunks are views of the same memory, the first at the tensor's start.
    whole = torch.from_dlpack(got.column("input_ids"))
    first = torch.from_dlpack(got.column("input_ids")[0])
    assert first.data_ptr() == whole.data_ptr()


def test_a_column_of_many_record_batches_is_one_device_array(tmp_path: Path) -> None:
    """Where its values lie end to end, a column over several record batches is one Arrow
    device array over the table's GPU memory; a column with nulls or offsets says what to
    do (its chunks, or the host)."""
    nd = pytest.importorskip("nanoarrow.device")
    t = table(5000)
    path = tmp_path / "t.arrow"
    write(path, t, 640, None, False)  # 8 record batches
    got = kvikpy.arrow.read_ipc(path, device="cuda")
    for name in ("input_ids", "emb"):
        array = nd.c_device_array(got.column(name))
        assert array.device_type == nd.DeviceType.CUDA
        assert array.array.length == 5000, name
    # The ids' values are the DLPack tensor's memory: the table's, no copy.
    ids = nd.c_device_array(got.column("input_ids"))
    assert ids.array.buffers[1] == torch.from_dlpack(got.column("input_ids")).data_ptr()
    for name in ("maybe", "text"):
        with pytest.raises(ValueError, match=r"spans 8 record batches.*column\[i\]"):
            got.column(name).__arrow_c_device_array__()
    host = got.to_host()
    assert pa.array(host.column("maybe")).equals(t.column("maybe").combine_chunks())
