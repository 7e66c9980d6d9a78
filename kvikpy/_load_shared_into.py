"""A checkpoint read once for a ``torch.distributed`` process group, each rank's tensors
written into that rank's own targets (:func:`kvikpy.safetensors.load_into` with
``process_group=``).

The plan of :mod:`kvikpy._shared_load`, in bounded rounds: a tensor only this rank needs
is read straight into its target; the tensors several ranks need are taken in file order,
a round at a time of at most a quarter of :data:`kvikpy._load_into.SHARED_ROUND` bytes (or
one tensor, if larger); in each round every rank reads its share of the round's packed
buffer from storage, one all-gather gives every rank the round, and each rank copies the
tensors it needs from it into its targets. The all-gather of a round runs while the next
rounds are read (:func:`kvikpy._shared_load.exchange`, :data:`DEPTH` rounds at once), so
peak extra memory is ``SHARED_ROUND`` (or four times the largest shared tensor), not the
checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvikpy._shared_load import Plan, TensorSpan, _Files, exchange

__all__ = ["DEPTH", "exchange_status", "load_shared_into"]

#: Rounds in flight at once: the reads of three rounds run while one is exchanged, each
#: round a quarter of the memory bound.
DEPTH = 4


def _group_info(group: Any) -> tuple[int, int]:
    import torch.distributed as dist  # type: ignore[import-not-found, unused-ignore]

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "process_group needs an initialised torch.distributed (call "
            "torch.distributed.init_process_group first, e.g. under torchrun)"
        )
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of the process_group it passed")
    return rank, dist.get_world_size(group)


def exchange_status(group: Any, mine: list[str] | None) -> list[list[str] | None]:
    """Every rank's names to load (``None`` for a rank whose checks failed), so that a
    rank that refuses its checkpoint makes every rank raise instead of leaving the others
    waiting in a collective."""
    import torch.distributed as dist

    _, world_size = _group_info(group)
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, mine, group=group)
    return gathered


def load_shared_into(
    every: Sequence[TensorSpan],
    mine: dict[str, Any],
    needs: list[list[str] | None],
    group: Any,
    device: Any,
    private: Any,
    limit: int,
) -> None:
    """Fill this rank's targets ``mine`` (name -> contiguous torch tensor) from the
    checkpoint tensors ``every`` (the same list on every rank); ``needs[r]`` is what rank
    ``r`` loads; ``private(spans)`` reads tensors only this rank needs straight into
    their targets."""
    import torch  # type: ignore[import-not-found, unused-ignore]
    import torch.distributed as dist

    rank, _ = _group_info(group)
    who: dict[str, set[int]] = {}
    for r, names in enumerate(needs):
        for name in names or ():
            who.setdefault(name, set()).add(r)
    alone = [t for t in every if who.get(t.name) == {rank}]
    if alone:
        private(alone)
    shared = [t for t in every if len(who.get(t.name, ())) >= 2]
    if not shared:
        return
    if dist.get_backend(group) == "nccl":
        where = torch.device("cuda", torch.cuda.current_device()) if device is None else device
    else:
        where = torch.device("cpu")

    def buffer(_: int, nbytes: int) -> Any:
        return torch.empty(nbytes, dtype=torch.uint8, device=where)

    def landed(p: Plan, packed: Any) -> None:
        with torch.no_grad():
            for name, at in p.packed.items():
                target = mine.get(name)
                size = sizes[name]
                if target is not None and size:
                    flat = target.detach().view(-1).view(torch.uint8)
                    flat.copy_(packed[at : at + size])
        if where.type == "cuda":  # its memory may be handed to a later round's reads
            torch.cuda.current_stream(where).synchronize()

    sizes = {t.name: t.size for t in shared}
    with _Files() as files:
        exchange(
            shared,
            [who[t.name] for t in shared],
            group,
            files,
            buffer,
            landed,
            depth=DEPTH,
            limit=max(limit // DEPTH, 1),
        )
