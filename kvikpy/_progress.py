"""Progress bars for long operations (``progress=True``): tqdm's widget in a Jupyter
kernel that has ipywidgets, kvikpy's own text bar (:mod:`kvikpy._textbar`, on stderr)
everywhere else. The bars follow the engine's byte counters from the calling thread while
the I/O threads work, so they cost the read nothing but a counter load every tenth of a
second.

The first text bar of a process imports nothing but kvikpy's own small module, so it
costs about a millisecond (tqdm's import alone costs 15-30 ms). The widget bar imports
``tqdm.notebook`` and ipywidgets when first shown, as any widget does, but never
``tqdm.auto``, tqdm's multiprocessing write lock or its monitor thread. Every bar has a
total, so it shows a percentage and an estimated time left, and its rate is the average
over the whole operation."""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
INTERVAL = 0.1  # seconds between bar updates

# The widget bar class, made on first use: kvikpy's subclass of tqdm's notebook bar.
_classes: dict[str, Any] = {}


def in_notebook() -> bool:
    """Whether a Jupyter kernel (ipykernel) runs this code and ipywidgets, which tqdm's
    widget bar needs, can be imported. Nothing is imported to find out."""
    ipython = sys.modules.get("IPython")
    if ipython is None or "ipykernel" not in sys.modules:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # an IPython too old or half torn down: no kernel to draw in
        return False
    if shell is None or getattr(shell, "kernel", None) is None:
        return False
    return importlib.util.find_spec("ipywidgets") is not None


def _widget_class() -> Any:
    """kvikpy's subclass of tqdm's notebook bar (``ImportError`` without tqdm).

    The subclass has its own thread lock, so tqdm never makes its multiprocessing lock
    for it, and no monitor thread (the bars are updated every :data:`INTERVAL` anyway).
    """
    cls = _classes.get("notebook")
    if cls is not None:
        return cls
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tqdm's warnings about its optional parts
        from tqdm.notebook import tqdm as base  # type: ignore[import-untyped]

    class KvikpyWidgetBar(base):  # type: ignore[misc]
        monitor_interval = 0

    KvikpyWidgetBar.set_lock(threading.RLock())
    _classes["notebook"] = KvikpyWidgetBar
    return KvikpyWidgetBar


def bar(total: int | None, desc: str) -> Any:
    """A bar counting bytes: in a Jupyter kernel with ipywidgets and tqdm, tqdm's widget;
    elsewhere, and wherever the widget cannot be drawn (tqdm missing, or tqdm raising
    ImportError when the front end cannot show widgets), kvikpy's text bar on stderr."""
    if in_notebook():
        try:
            return _widget_class()(
                total=total,
                desc=desc,
                unit="B",
                unit_scale=True,
                unit_divisor=1000,  # rates in MB/s and GB/s, as everywhere in kvikpy
                smoothing=0,  # the rate is the average so far, not a moving one
            )
        except ImportError:  # no tqdm, or the widget cannot be drawn here: text instead
            pass
    from kvikpy._textbar import TextBar

    return TextBar(total, desc)


def track(handle: Any, b: Any) -> int:
    """Wait for an engine future (``_lib.Future``), adding its bytes to the bar ``b`` as
    they land; the future's result (its exception if it failed).

    ``handle.wait`` returns as soon as the operation finishes, so a caller timing the
    operation around this call measures it, not the refresh interval.
    """
    shown = 0
    while not handle.wait(INTERVAL):
        now = handle.bytes_so_far
        b.update(now - shown)
        shown = now
    result = handle.get()
    b.update(handle.bytes_so_far - shown)
    return int(result)


def follow_future(start: Callable[[], Any], total: int | None, desc: str) -> int:
    """Draw the bytes of the engine future (``_lib.Future``) that ``start()`` submits;
    its result. The bar is made first, so its clock covers the whole operation."""
    with bar(total, desc) as b:
        return track(start(), b)


def follow_call(call: Callable[[Any], T], desc: str) -> T:
    """Run ``call(progress)`` in a worker thread (it releases the GIL), drawing the bytes
    of its ``_lib.Progress`` counter against the total the call reports there once it
    knows it (batches look up their sizes first); its result, or its exception.

    The bar is made once the total is known, its clock set back to when the call began,
    so it never shows without a total. A call that fails before it knows its total
    draws no bar.
    """
    import kvikpy._lib as _lib

    progress = _lib.Progress()
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = call(progress)
        except BaseException as e:  # handed to the caller below
            outcome["error"] = e

    worker = threading.Thread(target=work, name="kvikpy-progress", daemon=True)
    began = time.time()  # the bars' clock
    worker.start()
    try:
        _follow(worker, progress, began, desc)
    except BaseException:  # Ctrl-C while drawing: stop the call too, not only the bar
        progress.cancel()
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


def _follow(worker: threading.Thread, progress: Any, began: float, desc: str) -> None:
    """Draw ``progress`` until ``worker`` ends (see :func:`follow_call`)."""
    wait = 0.0005
    while progress.total is None and worker.is_alive():
        worker.join(wait)  # the sizes come in milliseconds: look often, then less so
        wait = min(2 * wait, INTERVAL)
    if progress.total is None:  # the call ended (failed) before it knew its total
        worker.join()
    else:
        with bar(progress.total, desc) as b:
            b.start_t = min(b.start_t, began)
            shown = 0
            while True:  # one more update after the worker ends, whenever that was
                worker.join(INTERVAL)
                now = progress.bytes
                b.update(now - shown)
                shown = now
                if not worker.is_alive():
                    break
