"""Progress bars for long operations (``progress=True``), drawn with tqdm when it is
installed: a widget in Jupyter, text in a terminal. The bars follow the engine's byte
counters from the calling thread while the I/O threads work, so they cost the read
nothing but a counter load every tenth of a second."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
INTERVAL = 0.1  # seconds between bar updates


def bar(total: int | None, desc: str) -> Any:
    """A tqdm bar counting bytes, or a clear error when tqdm is missing.

    In Jupyter, tqdm draws a widget, which needs ipywidgets; without it tqdm raises
    ImportError when the bar is made, so the text bar is drawn instead (it renders in the
    cell's output) rather than failing the read over a missing display package.
    """
    try:
        with warnings.catch_warnings():
            # In Jupyter without ipywidgets tqdm warns on import; the fallback below
            # handles that case, so the warning would only be noise in the cell.
            warnings.simplefilter("ignore")
            from tqdm.auto import tqdm  # type: ignore[import-untyped]
    except ImportError:
        raise ModuleNotFoundError(
            "progress=True draws a tqdm progress bar, and tqdm is not installed; "
            "install it (pip install tqdm) or leave progress off"
        ) from None
    options = {"total": total, "desc": desc, "unit": "B", "unit_scale": True, "unit_divisor": 1024}
    try:
        return tqdm(**options)
    except ImportError:  # a notebook without ipywidgets: tqdm's widget cannot be drawn
        from tqdm.std import tqdm as text_tqdm  # type: ignore[import-untyped]

        return text_tqdm(**options)


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


def follow_call(call: Callable[[Any], T], total: int | None, desc: str) -> T:
    """Run ``call(progress)`` in a worker thread (it releases the GIL), drawing the bytes
    of its ``_lib.Progress`` counter; its result, or its exception."""
    from kvikpy import _lib

    progress = _lib.Progress()
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = call(progress)
        except BaseException as e:  # handed to the caller below
            outcome["error"] = e

    worker = threading.Thread(target=work, name="kvikpy-progress", daemon=True)
    with bar(total, desc) as b:
        worker.start()
        shown = 0
        while worker.is_alive():
            worker.join(INTERVAL)
            now = progress.bytes
            b.update(now - shown)
            shown = now
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]
