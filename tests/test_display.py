"""How kvikpy objects show themselves: reprs with human units, HTML tables for notebooks."""

from __future__ import annotations

import pytest

import kvikpy
from kvikpy._display import human_bytes


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (1536, "1.5 KiB"), (5 << 30, "5.0 GiB")],
)
def test_human_bytes(n, text):
    assert human_bytes(n) == text


def test_buffer_repr_and_html(tmp_path):
    p = tmp_path / "b.bin"
    p.write_bytes(bytes(range(256)) * 24)
    buf = kvikpy.read(p, device="cpu", dtype="float32", shape=(32, 48))
    assert repr(buf) == "<kvikpy.Buffer 6.0 KiB on cpu, dtype=float32, shape=(32, 48)>"
    table = buf._repr_html_()
    assert table.startswith("<table>") and "6,144 bytes" in table and "float32" in table


def test_cufile_repr_and_html(tmp_path):
    p = tmp_path / "<odd>&name.bin"
    p.write_bytes(b"x" * 3000)
    with kvikpy.CuFile(p) as f:
        assert repr(f) == f"<kvikpy.CuFile {str(p)!r} mode='r' 2.9 KiB open>"
        assert f.path == str(p) and f.mode == "r"
        table = f._repr_html_()
        assert "&lt;odd&gt;&amp;name.bin" in table  # escaped
        assert "GPU I/O" in table
    assert repr(f).endswith("closed>")
    assert "closed" in f._repr_html_()


def test_batch_repr_and_html(tmp_path):
    (tmp_path / "a").write_bytes(b"a" * 2048)
    batch = kvikpy.read_many([tmp_path / "a", tmp_path / "missing"], device="cpu", errors="skip")
    assert repr(batch) == "<kvikpy.Batch of 2 elements, 2.0 KiB on cpu, 1 failed>"
    table = batch._repr_html_()
    assert "first: element 1" in table and "0 B to 2.0 KiB" in table
    empty = kvikpy.read_many([], device="cpu")
    assert repr(empty) == "<kvikpy.Batch of 0 elements, 0 B on cpu>"
    assert "elements" in empty._repr_html_()


def test_iofuture_html_pending_done_and_failed(tmp_path, slow_read):
    from conftest import aligned_array

    path, data = slow_read
    with kvikpy.CuFile(path) as f:
        fut = f.pread(aligned_array(len(data), 1))
        pending = fut._repr_html_()
        assert fut.get() == len(data)
        done = fut._repr_html_()
    assert pending.startswith("<table>") and "kvikpy.IOFuture" in pending
    assert "pending" in pending and "bytes so far" in pending
    assert "done" in done and f"{len(data):,} bytes" in done
    with kvikpy.CuFile(tmp_path / "w.bin", "w") as f:
        failed = f.pwrite(b"x" * 8192, file_offset=2**63 - 4096, task_size=4096)
        html_text = failed._repr_html_()  # shown, not raised
    assert "failed" in html_text and "Error" in html_text
    with pytest.raises(OSError):
        failed.get()


def test_defaults_html_lists_every_setting_with_value_and_variable():
    formatters = pytest.importorskip("IPython.core.formatters")  # make test installs it
    HTMLFormatter = formatters.HTMLFormatter

    with kvikpy.defaults.set({"task_size": 1 << 20, "num_threads": 3}):
        table = HTMLFormatter()(kvikpy.defaults)  # what a notebook shows for the module
    assert table is not None and table.startswith("<table>")
    for name in kvikpy._lib.setting_names():
        assert f">{name}<" in table
    assert "1,048,576 (1.0 MiB)" in table and ">3<" in table
    assert "KVIKIO_TASK_SIZE" in table and "KVIKPY_PAGE_CACHE_DMA" in table
    assert "CompatMode." in table
