"""progress=True: every long operation reports its bytes to a bar, reaching the total,
and tqdm stays optional (a clear error when it is missing)."""

from __future__ import annotations

import io
import json
import re
import sys
import threading
import types
from typing import ClassVar

import numpy as np
import pytest
from conftest import run_python

import kvikpy
from kvikpy import _progress


class FakeBar:
    made: ClassVar[list[FakeBar]] = []

    def __init__(self, total, desc):
        self.total, self.desc, self.n, self.closed = total, desc, 0, False
        self.start_t = 1e18  # tqdm's clock; follow_call sets it back to when the call began
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
    # read_many's total comes from the engine once it has looked up the sizes: the bar is
    # made with it (a percentage and a time left from the first draw).
    assert (many.total, many.n, many.closed) == (2 * len(blob), 2 * len(blob), True)
    assert (rng.total, rng.n) == (100 + (1 << 20), 100 + (1 << 20))
    assert many.start_t < 1e18 and rng.start_t < 1e18  # clocks set back to the call's start


def test_read_many_skipping_failures_totals_what_it_reads(data, bars, tmp_path):
    p, blob = data
    batch = kvikpy.read_many(
        [p, tmp_path / "missing", p], device="cpu", errors="skip", progress=True
    )
    assert list(batch.failures) == [1]
    (b,) = bars
    assert (b.total, b.n, b.closed) == (2 * len(blob), 2 * len(blob), True)


def test_batch_errors_reach_the_caller(data, bars, tmp_path):
    p, _ = data
    with pytest.raises(FileNotFoundError):
        kvikpy.read_many([p, tmp_path / "missing"], device="cpu", progress=True)
    # The sizes are looked up first, and a missing file fails the batch right there,
    # before a total is known: no bar is drawn for it (a bar always has a total).
    assert bars == []
    with pytest.raises(ValueError, match="range 0"):
        kvikpy.read_ranges(p, [(0, 1 << 40)], device="cpu", progress=True)
    assert bars == []


def test_the_engine_reports_the_batch_total():
    progress = kvikpy._lib.Progress()
    assert progress.total is None and progress.bytes == 0


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


def test_without_tqdm_the_text_bar_still_draws(data, monkeypatch, capsys):
    """The text bar is kvikpy's own: no tqdm needed, in a terminal or in a notebook."""
    p, blob = data
    monkeypatch.setattr(_progress, "_classes", {})
    for name in ("tqdm", "tqdm.std", "tqdm.auto", "tqdm.notebook"):
        monkeypatch.setitem(sys.modules, name, None)
    assert bytes(kvikpy.read(p, device="cpu", progress=True)) == blob
    monkeypatch.setattr(_progress, "in_notebook", lambda: True)  # a widget would need tqdm
    assert (
        b"".join(bytes(c) for c in kvikpy.iter_chunks(p, 1 << 20, device="cpu", progress=True))
        == blob
    )
    err = capsys.readouterr().err
    assert "read p.bin" in err and "iter_chunks p.bin" in err and err.count("100%") >= 2


def test_the_real_bar_draws_to_stderr(data, capsys):
    p, _ = data
    kvikpy.read(p, device="cpu", progress=True)
    assert "read p.bin" in capsys.readouterr().err


def test_a_notebook_whose_widget_cannot_be_drawn_gets_the_text_bar(data, monkeypatch, capsys):
    # tqdm's widget bar raises ImportError when it is made if the front end cannot show it:
    # the read must still run, with the text bar.

    def widget_bar(**options):
        raise ImportError("IProgress not found. Please update jupyter and ipywidgets.")

    monkeypatch.setattr(_progress, "in_notebook", lambda: True)
    monkeypatch.setitem(_progress._classes, "notebook", widget_bar)
    p, blob = data
    buf = kvikpy.read(p, device="cpu", progress=True)
    assert np.from_dlpack(buf).tobytes() == blob
    err = capsys.readouterr().err
    assert "read p.bin" in err and "100%" in err


@pytest.fixture
def kernel(monkeypatch):
    """This process as Jupyter's kernel looks to ``in_notebook``: IPython's shell with a
    kernel attribute, and ipykernel imported."""
    shell = types.SimpleNamespace(kernel=object())
    ipython = types.ModuleType("IPython")
    ipython.get_ipython = lambda: shell  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    return shell


def test_the_widget_bar_needs_a_kernel_and_ipywidgets(kernel, monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        if name == "ipywidgets":
            return found[0]
        return real_find_spec(name, *args)

    found = [None]
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert not _progress.in_notebook()  # a kernel, but no ipywidgets
    found[0] = object()
    assert _progress.in_notebook()
    kernel.kernel = None  # IPython in a terminal: no kernel
    assert not _progress.in_notebook()
    monkeypatch.delitem(sys.modules, "ipykernel")
    kernel.kernel = object()
    assert not _progress.in_notebook()


def test_a_plain_interpreter_is_not_a_notebook():
    assert _progress.in_notebook() is False


def test_the_widget_bar_avoids_what_makes_tqdm_slow_to_start():
    tqdm_notebook = pytest.importorskip("tqdm.notebook")
    cls = _progress._widget_class()
    assert issubclass(cls, tqdm_notebook.tqdm) and cls is _progress._widget_class()
    assert cls.monitor_interval == 0  # no monitor thread
    # its own thread lock: tqdm's default makes a multiprocessing lock on first use
    assert type(cls.get_lock()) is type(threading.RLock())


def test_the_text_bar_imports_no_third_party_module():
    r = run_python(
        "import sys, kvikpy._progress as p\n"
        "b = p.bar(10, 'x'); b.update(10); b.close()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tqdm', 'ipywidgets')))"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
    assert "100%" in r.stderr and "10 B/10 B" in r.stderr


def test_the_text_bar_line(monkeypatch):
    from kvikpy._textbar import TextBar

    out = io.StringIO()
    b = TextBar(4 << 20, "read f.bin", file=out)
    b.start_t -= 2.0  # two seconds in
    b.update(1 << 20)
    line = b.format(now=b.start_t + 2.0)
    assert line.startswith("read f.bin:  25%|██████ ")
    assert "1.00 MiB/4.00 MiB [00:02<00:06, 524.29 kB/s]" in line  # rates in 10^3 units
    b.update(3 << 20)
    b.close()
    b.close()  # idempotent
    assert re.search(
        r"100%\|█{24}\| 4\.00 MiB/4\.00 MiB \[00:02<00:00, 2\.10 MB/s\]\n$", out.getvalue()
    )
    assert out.getvalue().count("\n") == 1
    unknown = TextBar(None, "x", file=io.StringIO())
    unknown.update(5)
    assert unknown.format().startswith("x: 5 B [")


def test_the_bar_always_shows_a_total_and_the_average_rate(data, capsys):
    p, blob = data
    batch = kvikpy.read_many([p, p], device="cpu", progress=True)
    assert batch.buffer.nbytes == 2 * len(blob)
    err = capsys.readouterr().err
    assert "read_many (2 files)" in err and "100%" in err
    assert "?/s" not in err.split("\r")[-1]  # the final line has a rate


FIRST_CALL = r"""
import json, sys, threading
import kvikpy
path = sys.argv[1]
kvikpy.read(path, device="cpu")
kvikpy.read(path, device="cpu", progress=True)
kvikpy.read(path, device="cpu", progress=True)
print(json.dumps({"multiprocessing": "multiprocessing" in sys.modules,
                  "tqdm": "tqdm" in sys.modules,
                  "threads": sorted(t.name for t in threading.enumerate())}))
"""


def test_the_first_bar_of_a_process_makes_none_of_what_made_it_slow(tmp_path):
    """The first progress=True call in a fresh process draws its bar without what once made
    it cost ~320 ms (tqdm.auto's multiprocessing lock and monitor thread) or 25-30 ms
    (tqdm's import): no multiprocessing module, no tqdm, no thread left behind. What the
    first bar costs is measured by ``python -m benchmarks progress`` (docs/benchmarks.md),
    not here."""
    p = tmp_path / "first.bin"
    p.write_bytes(np.random.default_rng(5).bytes(1 << 20))
    r = run_python(FIRST_CALL, str(p))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("100%") >= 2  # both bars were drawn, to the end
    run = json.loads(r.stdout)
    assert not run["multiprocessing"], "tqdm's multiprocessing lock was made"
    assert not run["tqdm"], "the text bar imported tqdm"
    assert run["threads"] == ["MainThread"], run["threads"]  # no monitor thread left


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
