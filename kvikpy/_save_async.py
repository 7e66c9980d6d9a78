"""Saving in the background: the snapshot and the future of ``save_file(..., blocking=False)``.

The call copies every tensor before it returns, so the caller may change its tensors at
once: GPU tensors are copied on their own GPU, queued on that device's current stream
after the work that produced them, while the GPU memory the copies take stays within the
``checkpoint_staging`` setting per device; the rest are copied into pinned host memory
(queued on the same stream). Host arrays are copied in host memory. A thread of its own
then waits for the copies and writes them as :func:`kvikpy.safetensors.save_file` does,
whole or not at all, and the :class:`SaveFuture` the call returned reports the outcome.
The thread is not a daemon: an interpreter that exits waits for the save to finish.

GPU copies are made with torch (installed wherever GPU tensors are saved from torch;
CuPy and other arrays are viewed through DLPack): kvikpy itself has no device-to-device
copy.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Generator
from typing import Any

import numpy as np

from kvikpy.cufile import _until_done

__all__ = ["SaveFuture", "snapshot", "start"]


class SaveFuture:
    """A save running in the background (:func:`kvikpy.safetensors.save_file` with
    ``blocking=False``): the file's size in bytes once it is written, or its error.

    The tensors passed to the call were copied before it returned; the file appears
    under its name only once every byte is written (and synced, with ``sync``), and a
    save that fails leaves no file under the name and the one there before unchanged.
    Awaitable, like kvikpy's I/O futures: ``await kvikpy.safetensors.save_file(...,
    blocking=False)``.

    Parameters
    ----------
    filename
        The file being saved, as the save names it in messages: ``save_file`` makes the
        future, not the caller.
    """

    def __init__(self, filename: str) -> None:
        self._filename = filename
        self._finished = threading.Event()
        self._lock = threading.Lock()
        self._size: int | None = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[SaveFuture], object]] = []

    def _finish(self, size: int | None, error: BaseException | None) -> None:
        with self._lock:
            self._size, self._error = size, error
            self._finished.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            _call(fn, self)

    def get(self, timeout: float | None = None) -> int:
        """Wait for the save to finish; return the file's size in bytes, or raise its
        error (``OSError`` for a full disk or a missing directory, say).

        Parameters
        ----------
        timeout
            Seconds to wait at most; ``None`` waits as long as the save takes.

        Raises
        ------
        TimeoutError
            When ``timeout`` passes first (the save goes on).
        """
        if not self._finished.wait(timeout):
            raise TimeoutError(
                f"saving {self._filename!r} did not finish within {timeout} s; it goes on "
                "in the background (call get() again to wait longer)"
            )
        if self._error is not None:
            raise self._error
        assert self._size is not None
        return self._size

    def done(self) -> bool:
        """Whether the save has finished, written or failed."""
        return self._finished.is_set()

    def add_done_callback(self, fn: Callable[[SaveFuture], object]) -> None:
        """Call ``fn(future)`` once the save has finished (at once if it has), in the
        thread that finished it; an exception ``fn`` raises is printed, not raised.

        Parameters
        ----------
        fn
            Called with this future once, when the save is written or has failed.
        """
        with self._lock:
            if not self._finished.is_set():
                self._callbacks.append(fn)
                return
        _call(fn, self)

    def __await__(self) -> Generator[Any, None, int]:
        yield from _until_done(self)
        return self.get()

    def __repr__(self) -> str:
        if not self.done():
            state = "saving"
        elif self._error is not None:
            state = f"failed: {type(self._error).__name__}"
        else:
            state = f"written, {self._size:,} bytes"
        return f"<kvikpy.safetensors.SaveFuture {self._filename!r} {state}>"


def _call(fn: Callable[[SaveFuture], object], future: SaveFuture) -> None:
    try:
        fn(future)
    except Exception:  # a callback's error is the caller's, not the save's
        import traceback

        traceback.print_exc()


def start(filename: str, job: Callable[[], int]) -> SaveFuture:
    """Run ``job`` (the save, returning the file's size) on a thread of its own that the
    interpreter waits for at exit; its outcome goes to the returned future."""
    future = SaveFuture(filename)

    def run() -> None:
        try:
            size = job()
        except BaseException as e:  # the future carries every outcome
            future._finish(None, e)
        else:
            future._finish(size, None)

    threading.Thread(target=run, name="kvikpy-save", daemon=False).start()
    return future


def snapshot(
    tensors: list[tuple[Any, int, int | None, int]], staging: int
) -> tuple[list[Any], Callable[[], None]]:
    """Copies of ``tensors`` (each ``(buf, nbytes, device, address)``: what a write reads,
    its bytes, its GPU or ``None``, its address), and a function that waits until the
    copies are complete. GPU copies stay on their GPU while each device's copies fit in
    ``staging`` bytes; the others share one pinned host allocation (torch's pinned
    memory cache serves the next save of the same size without pinning again), and
    host arrays one host allocation. The copies of zero-byte tensors are the tensors
    themselves."""
    copies: list[Any] = [buf for buf, _, _, _ in tensors]
    on_gpu: dict[int, int] = {}
    to_host: list[int] = []  # host arrays, copied in host memory
    to_pinned: list[tuple[int, Any, int]] = []  # GPU tensors past the staging: (k, src, GPU)
    torch = None
    for k, (buf, nbytes, device, _) in enumerate(tensors):
        if not nbytes:
            continue
        if device is None:
            to_host.append(k)
            continue
        torch = torch or _torch()
        src = _flat_bytes(torch, buf)
        used = on_gpu.setdefault(device, 0)
        if used + nbytes <= staging:
            on_gpu[device] = used + nbytes
            with torch.cuda.device(device):
                copies[k] = src.clone()
        else:
            to_pinned.append((k, src, device))
    if to_host:
        block = np.empty(sum(tensors[k][1] for k in to_host), np.uint8)
        at = 0
        for k in to_host:
            _, nbytes, _, address = tensors[k]
            ctypes.memmove(block.ctypes.data + at, address, nbytes)
            copies[k] = block[at : at + nbytes]
            at += nbytes
    if to_pinned:
        assert torch is not None
        total = sum(tensors[k][1] for k, _, _ in to_pinned)
        pinned = torch.empty(total, dtype=torch.uint8, pin_memory=True)
        at = 0
        for k, src, device in to_pinned:
            part = pinned[at : at + tensors[k][1]]
            with torch.cuda.device(device):
                part.copy_(src, non_blocking=True)
            copies[k] = part
            at += tensors[k][1]
    events = []
    if torch is not None:
        for device in on_gpu:
            with torch.cuda.device(device):
                event = torch.cuda.Event()
                event.record()
                events.append(event)

    def ready() -> None:
        for event in events:
            event.synchronize()

    return copies, ready


def _torch() -> Any:
    """torch, which makes the GPU copies; ``ModuleNotFoundError`` saying so without it."""
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "save_file(..., blocking=False) copies GPU tensors with torch before it "
            "returns, and torch is not installed; install torch, or save with "
            "blocking=True (the default), which needs no copy"
        ) from None
    return torch


def _flat_bytes(torch: Any, buf: Any) -> Any:
    """``buf`` (a GPU array) as a flat ``uint8`` torch tensor over the same memory."""
    module = type(buf).__module__ or ""
    t = buf if module.startswith("torch") else torch.from_dlpack(buf)
    return t.detach().reshape(-1).view(torch.uint8)
