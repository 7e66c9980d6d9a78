"""progress=True: every long operation reports its bytes to a bar, reaching the total,
and tqdm stays optional (a clear error when it is missing)."""

from __future__ import annotations

import sys
from typing import ClassVar

import numpy as np
import pytest

import kvikpy
from kvikpy import _progress


class FakeBar:
    made: ClassVar[list[FakeBar]] = []

    def __init__(self, total, desc):
        self.total, self.desc, self.n, self.closed = total, desc, 0, False
        FakeBar.made.append(self)

    def update(self, n):
        assert n >= 0
        self.n += n

    def close(self):
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@pytest.fixture
def bars(monkeypatch):
    FakeBar.made = []
    monkeypatch.setattr(_progress, "bar", FakeBar)
    return FakeBar.made


@pytest.fixture
def data(tmp_path):
    blob = np.random.default_rng(7).integers(1, 256, (6 << 20) + 3, dtype=np.uint8).tobytes()
    p = tmp_path / "p.bin"
    p.write_bytes(blob)
    return p, blob


def test_read_and_write_report_every_byte(data, bars, tmp_path):
    p, blob = data
    buf = kvikpy.read(p, device="cpu", progress=True)
    assert np.from_dlpack(buf).tobytes() == blob
    out = tmp_path / "out.bin"
    assert kvikpy.write(out, np.from_dlpack(buf), progress=True) == len(blob)
    assert out.read_bytes() == blob
    (r, w) = bars
    assert (r.total, r.n, r.closed) == (len(blob), len(blob), True)
    assert (w.total, w.n, w.closed) == (len(blob), len(blob), True)
    assert r.desc == "read p.bin" and w.desc == "write out.bin"


def test_batches_report_every_byte(data, bars):
    p, blob = data
    batch = kvikpy.read_many([p, p], device="cpu", progress=True)
    ranges = kvikpy.read_ranges(p, [(0, 100), (5, 1 << 20)], device="cpu", progress=True)
    assert np.from_dlpack(batch[1]).tobytes() == blob
    assert np.from_dlpack(ranges[1]).tobytes() == blob[5 : 5 + (1 << 20)]
    many, rng = bars
    assert many.n == 2 * len(blob) and many.closed
    assert (rng.total, rng.n) == (100 + (1 << 20), 100 + (1 << 20))


def test_batch_errors_reach_the_caller(data, bars, tmp_path):
    p, _ = data
    with pytest.raises(FileNotFoundError):
        kvikpy.read_many([p, tmp_path / "missing"], device="cpu", progress=True)
    assert bars[0].closed


def test_iter_chunks_reports_each_chunk(data, bars):
    p, blob = data
    got = b"".join(
        np.from_dlpack(c).tobytes()
        for c in kvikpy.iter_chunks(p, 1 << 20, device="cpu", progress=True)
    )
    assert got == blob
    (b,) = bars
    assert (b.total, b.n, b.closed) == (len(blob), len(blob), True)


def test_stream_and_progress_do_not_mix(data):
    p, _ = data
    with pytest.raises(ValueError, match="progress=True"):
        kvikpy.read(p, stream=0, progress=True)


def test_without_tqdm_the_error_says_what_to_do(data, monkeypatch):
    p, _ = data
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.raises(ModuleNotFoundError, match="pip install tqdm"):
        kvikpy.read(p, device="cpu", progress=True)
    with pytest.raises(ModuleNotFoundError, match="pip install tqdm"):
        kvikpy.iter_chunks(p, 1 << 20, device="cpu", progress=True)
    assert kvikpy.read(p, device="cpu").nbytes == p.stat().st_size  # off: no tqdm needed


def test_the_real_bar_draws_to_stderr(data, capsys):
    pytest.importorskip("tqdm")
    p, _ = data
    kvikpy.read(p, device="cpu", progress=True)
    assert "read p.bin" in capsys.readouterr().err


def test_a_notebook_without_ipywidgets_gets_the_text_bar(data, monkeypatch, capsys):
    # tqdm.auto picks its widget bar in Jupyter, and that bar raises ImportError when it is
    # made if ipywidgets is missing: the read must still run, with tqdm's text bar.
    tqdm_auto = pytest.importorskip("tqdm.auto")

    def widget_bar(*args, **kwargs):
        raise ImportError("IProgress not found. Please update jupyter and ipywidgets.")

    monkeypatch.setattr(tqdm_auto, "tqdm", widget_bar)
    p, blob = data
    buf = kvikpy.read(p, device="cpu", progress=True)
    assert np.from_dlpack(buf).tobytes() == blob
    err = capsys.readouterr().err
    assert "read p.bin" in err and "100%" in err


def test_bench_progress_covers_every_timed_read(data, bars, capsys):
    from kvikpy import _cli

    p, blob = data
    assert _cli.main(["bench", str(p), "--device", "cpu", "--repeat", "3", "--progress"]) == 0
    (b,) = bars
    assert (b.total, b.n, b.closed) == (4 * len(blob), 4 * len(blob), True)
    assert b.desc == "bench p.bin"
    assert "bytes verified" in capsys.readouterr().out


def test_the_bar_is_made_before_the_operation_starts(bars):
    # A read that finished before its bar existed would show an absurd rate.
    events = []

    class Done:
        bytes_so_far = 10

        def wait(self, timeout):
            return True

        def get(self):
            return 10

    def start():
        events.append(len(bars))
        return Done()

    assert _progress.follow_future(start, 10, "x") == 10
    assert events == [1] and bars[0].n == 10
