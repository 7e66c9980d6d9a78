"""Rounds of work gathered on an event loop: what zarr starts together is done together.

zarr starts many coroutines at once (the gets of a mini-batch of chunks, the decodes of
several mini-batches). Each queues its item on the running loop's :class:`Rounds` and
awaits a future; the first item of a round schedules a flush a loop turn later, which
waits up to :data:`MAX_WAIT_TURNS` more turns while items keep arriving, then hands the
whole round to the subclass's :meth:`Rounds.dispatch` (the store's one batch read, the
codecs' one nvCOMP call), while the next round gathers. :func:`settle_in_thread` runs a
round's work in a worker thread and gives each future its share.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

# How many extra event-loop turns a round waits while items keep arriving: zarr's nested
# gathers start their innermost coroutines a turn or two after the first.
MAX_WAIT_TURNS = 4

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")
RoundsT = TypeVar("RoundsT", bound="Rounds[Any, Any]")


class Rounds(Generic[ItemT, ResultT]):
    """Items queued on one event loop, dispatched a round at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._pending: list[tuple[ItemT, asyncio.Future[ResultT]]] = []
        self._scheduled = False

    def submit(self, item: ItemT) -> asyncio.Future[ResultT]:
        """Queue ``item``; the future gives its result once its round has been done."""
        future: asyncio.Future[ResultT] = self.loop.create_future()
        self._pending.append((item, future))
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._flush, len(self._pending), 0)
        return future

    def _flush(self, seen: int, turns: int) -> None:
        if len(self._pending) > seen and turns < MAX_WAIT_TURNS:
            self.loop.call_soon(self._flush, len(self._pending), turns + 1)
            return
        batch, self._pending, self._scheduled = self._pending, [], False
        self.dispatch(batch)

    def dispatch(self, batch: list[tuple[ItemT, asyncio.Future[ResultT]]]) -> None:
        """Do one round: every future of ``batch`` must get a result or an error."""
        raise NotImplementedError


def settle_in_thread(
    loop: asyncio.AbstractEventLoop,
    futures: Sequence[asyncio.Future[Any]],
    work: Callable[..., Sequence[Any]],
    *args: Any,
) -> None:
    """Run ``work(*args)`` in a worker thread; it returns one result per future (an
    exception instance for a future that failed alone). Its own error fails every future;
    a future already done (its awaiter was cancelled) is left alone."""

    def settle(done: asyncio.Future[Sequence[Any]]) -> None:
        error = done.exception() if not done.cancelled() else asyncio.CancelledError()
        results = done.result() if error is None else [error] * len(futures)
        for future, result in zip(futures, results, strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    loop.run_in_executor(None, work, *args).add_done_callback(settle)


def for_running_loop(
    registry: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, RoundsT],
    make: Callable[[asyncio.AbstractEventLoop], RoundsT],
) -> RoundsT:
    """The running loop's instance in ``registry`` (made on first use; gone with the loop)."""
    loop = asyncio.get_running_loop()
    rounds = registry.get(loop)
    if rounds is None:
        rounds = registry[loop] = make(loop)
    return rounds
