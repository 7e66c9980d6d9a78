"""A checkpoint read once for a ``torch.distributed`` process group: who reads which
bytes, and the exchange.

One job: given the tensors of one or more safetensors files and, per rank of the group,
the tensors that rank needs, plan the reads so that every byte leaves storage once, read
this rank's part with kvikpy (:mod:`kvikpy._spans`), and let the group's own collective
(NCCL over NVLink for GPUs, gloo for host memory) hand every rank the bytes it needs from
the others, into new tensors (:func:`load_shared`, for ``load_file``) or into a model's
own tensors (:func:`load_shared_into`, for ``load_into``).

The plan, the same on every rank (it is computed from the same inputs everywhere):

- a tensor needed by one rank only is *private*: that rank reads it, nobody else sees it;
- the tensors needed by two ranks or more are *shared*: taken in file order in rounds of
  about :data:`ROUND` bytes, each round's tensors laid end to end in a packed buffer (each
  at a 64-byte boundary), the packed buffer cut into ``world_size`` equal shares; rank
  ``r`` reads the file ranges behind share ``r`` and one all-gather gives every rank the
  whole round. A round's all-gather runs while the next rounds are read
  (:func:`exchange`).

torch.distributed is the transport; nothing here moves bytes between processes itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvikpy._spans import PACK_ALIGN, FileRead, Files, TensorSpan, merged, pack, torch_device

__all__ = [
    "DEPTH",
    "ROUND",
    "Needs",
    "Plan",
    "exchange",
    "exchange_status",
    "load_shared",
    "load_shared_into",
    "needers_of",
    "plan",
    "round_plans",
    "rounds",
    "share_reads",
]

#: What a caller may pass as ``tensor_filter``: a predicate on tensor names, evaluated on
#: each rank for itself, or one map from rank to the names that rank needs.
Needs = Callable[[str], bool] | Mapping[int, Iterable[str]] | None


@dataclass(frozen=True)
class Plan:
    """What this rank does."""

    rank: int
    world_size: int
    share: int  # bytes per rank in the packed buffer (world_size * share in all)
    packed: dict[str, int]  # shared tensor name -> its offset in the packed buffer
    my_share: list[tuple[TensorSpan, int, int]]  # (tensor, offset in it, length) I read
    private: list[TensorSpan]  # tensors only this rank needs
    wanted: list[str]  # every tensor this rank returns, in file order


def plan(
    tensors: Sequence[TensorSpan], needers: Sequence[set[int]], rank: int, world_size: int
) -> Plan:
    """Plan the reads of ``rank``: ``needers[i]`` is the set of ranks needing ``tensors[i]``."""
    packed: dict[str, int] = {}
    order: list[TensorSpan] = []
    end = 0
    for t, who in zip(tensors, needers, strict=True):
        if len(who) >= 2:
            end = -(-end // PACK_ALIGN) * PACK_ALIGN
            packed[t.name] = end
            order.append(t)
            end += t.size
    share = -(-end // world_size) if end else 0
    share = -(-share // PACK_ALIGN) * PACK_ALIGN
    lo, hi = rank * share, (rank + 1) * share
    mine: list[tuple[TensorSpan, int, int]] = []
    for t in order:
        start = packed[t.name]
        a, b = max(lo, start), min(hi, start + t.size)
        if a < b:
            mine.append((t, a - start, b - a))
    private = [t for t, who in zip(tensors, needers, strict=True) if len(who) == 1 and rank in who]
    wanted = [t.name for t, who in zip(tensors, needers, strict=True) if rank in who]
    return Plan(rank, world_size, share, packed, mine, private, wanted)


def share_reads(p: Plan) -> list[FileRead]:
    """The reads that fill this rank's share of the packed buffer straight from the
    files, pieces that follow each other both in a file and in the share merged into one
    read (in a checkpoint of large tensors that is about one read per file)."""
    base = p.rank * p.share
    return merged(
        [
            FileRead(t.path, t.offset + within, p.packed[t.name] + within - base, length)
            for t, within, length in p.my_share
        ]
    )


def needers_of(
    names: Sequence[str], needs: Needs, rank: int, world_size: int, group: Any
) -> list[set[int]]:
    """For each tensor name, the ranks that need it.

    A predicate runs on each rank for that rank; the answers are exchanged with one small
    ``all_gather_object``. A map is taken as the same on every rank.
    """
    everyone = set(range(world_size))
    if needs is None:
        return [set(everyone) for _ in names]
    if callable(needs):
        mine = [i for i, name in enumerate(names) if needs(name)]
        import torch.distributed as dist  # type: ignore[import-not-found, unused-ignore]

        gathered: list[Any] = [None] * world_size
        dist.all_gather_object(gathered, mine, group=group)
        who: list[set[int]] = [set() for _ in names]
        for r, indices in enumerate(gathered):
            for i in indices:
                who[i].add(r)
        return who
    if not isinstance(needs, Mapping):
        raise TypeError(
            "tensor_filter must be a callable taking a tensor name, or a mapping from rank "
            f"to tensor names, not {type(needs).__name__}"
        )
    index = {name: i for i, name in enumerate(names)}
    who = [set() for _ in names]
    for r, wanted in needs.items():
        if not isinstance(r, int) or not 0 <= r < world_size:
            raise ValueError(
                f"tensor_filter maps rank {r!r}, but the process group has ranks 0 to "
                f"{world_size - 1}"
            )
        for name in wanted:
            if name not in index:
                raise KeyError(f"tensor_filter asks rank {r} for {name!r}, which no file holds")
            who[index[name]].add(r)
    return who


#: Bytes of shared tensors in one round of the exchange (or one tensor, if larger): the
#: all-gather of a round runs while the reads of the next ones do.
ROUND = 128 << 20


def rounds(sizes: Sequence[int], limit: int) -> list[list[int]]:
    """Indices of ``sizes`` cut, in order, into runs of at most ``limit`` bytes in all
    (a single larger one alone); each tensor is padded to 64 bytes in a packed buffer,
    which the bound counts."""
    out: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i, size in enumerate(sizes):
        padded = -(-size // PACK_ALIGN) * PACK_ALIGN
        if current and total + padded > limit:
            out.append(current)
            current, total = [], 0
        current.append(i)
        total += padded
    if current:
        out.append(current)
    return out


def round_plans(
    shared: Sequence[TensorSpan],
    needers: Sequence[set[int]],
    rank: int,
    world_size: int,
    limit: int,
) -> list[Plan]:
    """The plans of the rounds the ``shared`` tensors (``needers[i]``: the ranks needing
    ``shared[i]``) are exchanged in: :func:`rounds` of at most ``limit`` bytes, each
    planned for ``rank`` of ``world_size``."""
    return [
        plan([shared[i] for i in idx], [needers[i] for i in idx], rank, world_size)
        for idx in rounds([t.size for t in shared], limit)
    ]


def exchange(
    plans: Sequence[Plan],
    group: Any,
    files: Files,
    buffer: Callable[[int, int], Any],
    landed: Callable[[Plan, Any], None],
    depth: int | None = None,
) -> None:
    """Every rank gets the packed bytes of each round of ``plans`` (:func:`round_plans`),
    each byte read from storage once across the group.

    In each round every rank reads its share of the round's packed buffer
    (``buffer(round, nbytes)``, a flat uint8 tensor) and one all-gather fills the rest. A
    round's all-gather runs while the reads of the next rounds do: at most ``depth``
    rounds (``None``: all) have buffers at once. ``landed(plan, packed)`` is called for
    each round, in order, once its bytes are in ``packed`` (in stream order for NCCL); a
    round's buffer may be handed out again after it returns.
    """
    import torch.distributed as dist  # type: ignore[import-not-found, unused-ignore]

    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    reading: deque[tuple[Plan, Any, Any, list[tuple[FileRead, Any]]]] = deque()
    queued = 0

    def submit() -> None:
        nonlocal queued
        p = plans[queued]
        packed = buffer(queued, p.share * world_size)
        queued += 1
        if not p.share:  # tensors of no bytes: nothing to read or exchange
            landed(p, packed)
            if queued < len(plans):
                submit()
            return
        mine = packed[rank * p.share : (rank + 1) * p.share]
        reading.append((p, packed, mine, files.start(mine, share_reads(p))))

    def finish(p: Plan, packed: Any, work: Any) -> None:
        work.wait()
        landed(p, packed)
        if queued < len(plans):
            submit()

    ahead = len(plans) if depth is None else max(depth, 1)
    while queued < len(plans) and len(reading) < ahead:
        submit()
    gathering: tuple[Plan, Any, Any] | None = None
    while reading:
        p, packed, mine, started = reading.popleft()
        files.wait(started)
        work = _all_gather(packed, mine, world_size, group, async_op=True)
        if gathering is not None:
            finish(*gathering)
        gathering = (p, packed, work)
        if not reading and queued < len(plans):
            finish(*gathering)
            gathering = None
    if gathering is not None:
        finish(*gathering)


#: Rounds in flight at once: the reads of three rounds run while one is exchanged, each
#: round a quarter of the memory bound.
DEPTH = 4


def load_shared(
    tensors: Sequence[TensorSpan],
    needs: Needs,
    device: str | int,
    group: Any,
    files: Files,
) -> dict[str, Any]:
    """This rank's tensors as flat ``torch.uint8`` tensors, each read from storage once
    across the group.

    The shared tensors are exchanged in rounds (:func:`exchange`), every round's reads
    started at once, so the all-gather of one round overlaps the reads of the next; the
    tensors only this rank needs are read meanwhile.

    Parameters
    ----------
    tensors
        Every tensor of the checkpoint, in file order (the same list on every rank).
    needs
        ``tensor_filter`` (see :func:`kvikpy.safetensors.load_file`).
    device
        Where this rank's tensors go; for NCCL this rank's GPU.
    group
        A ``torch.distributed`` process group (``None``: the default one).
    files
        The checkpoint's files, open (their headers were read through them).
    """
    import torch  # type: ignore[import-not-found, unused-ignore]
    import torch.distributed as dist  # type: ignore[import-not-found, unused-ignore]

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            "process_group needs an initialised torch.distributed (call "
            "torch.distributed.init_process_group first, e.g. under torchrun)"
        )
    rank = dist.get_rank(group)
    world_size = dist.get_world_size(group)
    if rank < 0:
        raise ValueError("this process is not a member of the process_group it passed")
    names = [t.name for t in tensors]
    who = needers_of(names, needs, rank, world_size, group)
    where = torch_device(device)
    shared = [(t, w) for t, w in zip(tensors, who, strict=True) if len(w) >= 2]
    private = [t for t, w in zip(tensors, who, strict=True) if w == {rank}]
    plans = round_plans([t for t, _ in shared], [w for _, w in shared], rank, world_size, ROUND)
    # One allocation for every round's packed buffer, cut in order (the tensors are views).
    starts, total = [], 0
    for p in plans:
        starts.append(total)
        total += p.share * world_size
    places, private_reads, private_total = pack([(t, 0, t.size) for t in private])
    whole = torch.empty(total + private_total, dtype=torch.uint8, device=where)
    if where != "cpu":  # kvikpy writes from its own streams: the memory must be idle
        torch.cuda.current_stream(where).synchronize()
    out: dict[str, Any] = {}
    by_size = {t.name: t.size for t in tensors}

    def buffer(k: int, nbytes: int) -> Any:
        return whole[starts[k] : starts[k] + nbytes]

    def landed(p: Plan, packed: Any) -> None:
        for name, at in p.packed.items():
            out[name] = packed[at : at + by_size[name]]

    alone = whole[total:]
    started = files.start(alone, private_reads)
    exchange(plans, group, files, buffer, landed)
    files.wait(started)
    for t, at in zip(private, places, strict=True):
        out[t.name] = alone[at : at + t.size]
    return {name: out[name] for name, w in zip(names, who, strict=True) if rank in w}


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
    files: Files,
) -> None:
    """Fill this rank's targets ``mine`` (name -> contiguous torch tensor) from the
    checkpoint tensors ``every`` (the same list on every rank); ``needs[r]`` is what rank
    ``r`` loads; ``private(spans)`` reads tensors only this rank needs straight into
    their targets."""
    import torch  # type: ignore[import-not-found, unused-ignore]
    import torch.distributed as dist

    rank, world_size = _group_info(group)
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
    plans = round_plans(
        shared, [who[t.name] for t in shared], rank, world_size, max(limit // DEPTH, 1)
    )
    exchange(plans, group, files, buffer, landed, depth=DEPTH)


def _all_gather(packed: Any, mine: Any, world_size: int, group: Any, async_op: bool = False) -> Any:
    """Every rank's share into ``packed``: NCCL gathers in place into one tensor; other
    backends (gloo) take the list form. With ``async_op``, the collective's handle (its
    ``wait()`` orders what follows after it)."""
    import torch.distributed as dist  # type: ignore[import-not-found, unused-ignore]

    if dist.get_backend(group) == "nccl":
        return dist.all_gather_into_tensor(packed, mine, group=group, async_op=async_op)
    share = mine.numel()
    parts = [packed[r * share : (r + 1) * share] for r in range(world_size)]
    source = mine.clone()  # the list form may not read and write one buffer at once
    work = dist.all_gather(parts, source, group=group, async_op=async_op)
    return _Holding(work, source) if work is not None else None


class _Holding:
    """A collective's handle keeping the tensor it reads alive until it is waited for."""

    def __init__(self, work: Any, keep: Any) -> None:
        self._work, self._keep = work, keep

    def wait(self) -> None:
        self._work.wait()
        self._keep = None
