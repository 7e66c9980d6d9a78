"""The event-loop rounds behind kvikpy.zarr (kvikpy.zarr._rounds): what zarr starts
together is dispatched together, each future gets its own share, errors reach every
future of their round, and the decode rounds group by algorithm and GPU (nvCOMP's decoder
is replaced here by one that records its calls: the GPU run is tests/gpu/test_zarr_gpu.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("zarr")

from kvikpy.zarr import _codecs, _rounds


class Doubler(_rounds.Rounds[int, int]):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.rounds: list[list[int]] = []

    def dispatch(self, batch: list[tuple[int, asyncio.Future[int]]]) -> None:
        items = [i for i, _ in batch]
        self.rounds.append(items)

        def work(xs: list[int]) -> list[Any]:
            if 13 in xs:
                raise RuntimeError("unlucky round")
            return [ValueError(f"no {x}") if x < 0 else 2 * x for x in xs]

        _rounds.settle_in_thread(self.loop, [f for _, f in batch], work, items)


async def test_items_started_together_form_one_round() -> None:
    rounds = Doubler(asyncio.get_running_loop())

    async def direct(x: int) -> int:
        return await rounds.submit(x)

    async def nested(x: int) -> int:
        await asyncio.sleep(0)  # starts a turn later, while the round still gathers
        return await rounds.submit(x)

    got = await asyncio.gather(*(direct(x) for x in range(5)), nested(5), nested(6))
    assert got == [0, 2, 4, 6, 8, 10, 12]
    assert rounds.rounds == [[0, 1, 2, 3, 4, 5, 6]]
    assert await rounds.submit(7) == 14  # a later submit starts a new round
    assert rounds.rounds[-1] == [7]


async def test_errors_reach_their_own_future_or_the_whole_round() -> None:
    rounds = Doubler(asyncio.get_running_loop())
    got = await asyncio.gather(rounds.submit(1), rounds.submit(-1), return_exceptions=True)
    assert got[0] == 2 and isinstance(got[1], ValueError)
    got = await asyncio.gather(rounds.submit(13), rounds.submit(2), return_exceptions=True)
    assert all(isinstance(g, RuntimeError) for g in got)


async def test_a_cancelled_awaiter_does_not_break_its_round() -> None:
    rounds = Doubler(asyncio.get_running_loop())
    first, second = rounds.submit(1), rounds.submit(2)
    first.cancel()
    assert await second == 4


async def test_one_instance_per_running_loop() -> None:
    registry: Any = _rounds.weakref.WeakKeyDictionary()
    a = _rounds.for_running_loop(registry, Doubler)
    assert _rounds.for_running_loop(registry, Doubler) is a


class RecordingDecoder:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def decode(self, sources: list[str], header: int) -> list[str]:
        self.calls.append(list(sources))
        return [s.upper()[header:] for s in sources]


async def test_decodes_gather_per_algorithm_and_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    decoders: dict[tuple[str, int], RecordingDecoder] = {}

    def decoder(algorithm: str, ordinal: int) -> RecordingDecoder:
        return decoders.setdefault((algorithm, ordinal), RecordingDecoder())

    monkeypatch.setattr(_codecs, "_decoder", decoder)
    gatherer = _codecs._DecodeGatherer(asyncio.get_running_loop())
    n = _codecs.MIN_GPU_BATCH
    zstd = [[f"z{i}a", f"z{i}b"] for i in range(n)]  # 2n chunks: enough for the GPU
    lz4 = [["l0"]]  # one chunk: too few, decoded on the CPU instead (None)
    got = await asyncio.gather(
        *(gatherer.submit((("zstd", 0, 0), m)) for m in zstd),
        gatherer.submit((("lz4", 0, 1), lz4[0])),
    )
    assert got[:n] == [[s.upper() for s in m] for m in zstd]  # each member its own share
    assert got[n] is None
    assert decoders[("zstd", 0)].calls == [[s for m in zstd for s in m]]  # one call
    assert ("lz4", 0) not in decoders
