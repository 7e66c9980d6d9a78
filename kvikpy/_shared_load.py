"""A checkpoint read once for many ranks: who reads which bytes, and the exchange.

One job: given the tensors of one or more safetensors files and, per rank of a
``torch.distributed`` process group, the tensors that rank needs, plan the reads so that
every byte leaves storage once, read this rank's part with kvikpy, and let the process
group's own collective (NCCL over NVLink for GPUs, gloo for host memory) hand every rank
the bytes it needs from the others.

The plan, the same on every rank (it is computed from the same inputs everywhere):

- a tensor needed by one rank only is *private*: that rank reads it, nobody else sees it;
- a tensor needed by two ranks or more is *shared*: the shared tensors are laid end to
  end in one packed buffer (each at a 64-byte boundary, so every dtype views it), the
  packed buffer is cut into ``world_size`` equal shares, rank ``r`` reads the file ranges
  behind share ``r``, and one all-gather gives every rank the whole packed buffer.

torch.distributed is the transport; nothing here moves bytes between processes itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvikpy.cufile import CuFile

__all__ = [
    "FileRead",
    "Needs",
    "TensorSpan",
    "load_shared",
    "merged",
    "pack",
    "plan",
    "read_spans",
    "share_reads",
]

# Each shared tensor starts at a multiple of this in the packed buffer: every dtype's item
# size divides it, so every tensor is a view without a copy.
_PACK_ALIGN = 64

#: What a caller may pass as ``tensor_filter``: a predicate on tensor names, evaluated on
#: each rank for itself, or one map from rank to the names that rank needs.
Needs = Callable[[str], bool] | Mapping[int, Iterable[str]] | None


@dataclass(frozen=True)
class TensorSpan:
    """One tensor's bytes in a file."""

    name: str
    path: str
    offset: int
    size: int


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
            end = -(-end // _PACK_ALIGN) * _PACK_ALIGN
            packed[t.name] = end
            order.append(t)
            end += t.size
    share = -(-end // world_size) if end else 0
    share = -(-share // _PACK_ALIGN) * _PACK_ALIGN
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


@dataclass(frozen=True)
class FileRead:
    """One read: ``length`` bytes of ``path`` at ``file_offset`` into a flat destination
    (this rank's share, or the buffer of the tensors it reads alone) at ``at``."""

    path: str
    file_offset: int
    at: int
    length: int


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


def read_into(dest: Any, reads: Sequence[FileRead]) -> None:
    """Run ``reads`` into ``dest`` (a flat uint8 buffer: this rank's share, or the
    buffer of the tensors it reads alone) at once on kvikpy's pool, each straight into its
    place (no staging buffer, no device copy); every read is waited for before the first
    error is raised."""
    with _Files() as files:
        files.wait(files.start(dest, reads))


class _Files:
    """The files of a load, each opened once, and reads started on them; closed at the
    end (a ``with`` block), every read started being waited for first."""

    def __init__(self) -> None:
        self._open: dict[str, CuFile] = {}
        self._started: list[list[tuple[FileRead, Any]]] = []

    def __enter__(self) -> _Files:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for started in self._started:  # no read may outlive its file (or buffer)
                for _, future in started:
                    try:
                        future.get()
                    except Exception:  # the first error is already on its way
                        continue
        finally:
            for f in self._open.values():
                f.close()

    def start(self, dest: Any, reads: Sequence[FileRead]) -> list[tuple[FileRead, Any]]:
        """Start ``reads`` into ``dest`` on kvikpy's pool; wait for them with :meth:`wait`."""
        started: list[tuple[FileRead, Any]] = []
        self._started.append(started)
        for r in reads:
            f = self._open.get(r.path)
            if f is None:
                f = self._open[r.path] = CuFile(r.path, "r")
            started.append((r, f.pread(dest[r.at : r.at + r.length], r.length, r.file_offset)))
        return started

    def wait(self, started: list[tuple[FileRead, Any]]) -> None:
        """Wait for every read of ``started``, then raise the first error, if any."""
        errors: list[BaseException] = []
        for r, future in started:
            try:
                got = future.get()
            except BaseException as e:  # wait for every read before raising
                errors.append(e)
                continue
            if got != r.length:
                errors.append(
                    EOFError(
                        f"{r.path}: {r.length} bytes at offset {r.file_offset} were asked "
                        f"for and only {got} read; the file is shorter than its header says"
                    )
                )
        self._started.remove(started)
        if errors:
            raise errors[0]


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


def pack(pieces: Sequence[tuple[TensorSpan, int, int]]) -> tuple[list[int], list[FileRead], int]:
    """Lay ``(tensor, offset in it, length)`` pieces end to end, each at a 64-byte
    boundary: each piece's place, the merged reads that fill them, and the bytes in all."""
    places: list[int] = []
    reads: list[FileRead] = []
    end = 0
    for t, within, length in pieces:
        end = -(-end // _PACK_ALIGN) * _PACK_ALIGN
        places.append(end)
        if length:
            reads.append(FileRead(t.path, t.offset + within, end, length))
        end += length
    return places, merged(reads), end


def merged(reads: Sequence[FileRead]) -> list[FileRead]:
    """``reads`` with each run of reads that follow each other both in one file and in
    the destination made one read."""
    out: list[FileRead] = []
    for r in reads:
        last = out[-1] if out else None
        if (
            last is not None
            and last.path == r.path
            and last.file_offset + last.length == r.file_offset
            and last.at + last.length == r.at
        ):
            out[-1] = FileRead(r.path, last.file_offset, last.at, last.length + r.length)
        else:
            out.append(r)
    return out


def read_spans(
    spans: Sequence[tuple[TensorSpan, int, int]], device: str | int
) -> list[tuple[Any, int]]:
    """Read ``(tensor, offset in it, length)`` pieces into one new buffer on ``device``,
    with the merged reads of :func:`pack` all at once on the pool (a checkpoint's
    adjacent tensors cost one read per file, as a whole-file read would).

    Returns, per piece in order, ``(torch uint8 tensor of all pieces, start in it)``.
    """
    import torch  # type: ignore[import-not-found, unused-ignore]

    places, reads, total = pack(spans)
    whole = torch.empty(total, dtype=torch.uint8, device=_torch_device(device))
    read_into(whole, reads)
    return [(whole, at) for at in places]


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
        padded = -(-size // _PACK_ALIGN) * _PACK_ALIGN
        if current and total + padded > limit:
            out.append(current)
            current, total = [], 0
        current.append(i)
        total += padded
    if current:
        out.append(current)
    return out


def exchange(
    shared: Sequence[TensorSpan],
    needers: Sequence[set[int]],
    group: Any,
    files: _Files,
    buffer: Callable[[int, int], Any],
    landed: Callable[[Plan, Any], None],
    depth: int | None = None,
    limit: int | None = None,
) -> None:
    """Every rank gets the packed bytes of the ``shared`` tensors (``needers[i]``: the
    ranks needing ``shared[i]``), each byte read from storage once across the group.

    The tensors are taken in rounds of at most ``limit`` bytes (:data:`ROUND`); in each
    round every rank reads its share of the round's packed buffer (``buffer(round,
    nbytes)``, a flat uint8 tensor) and one all-gather fills the rest. A round's
    all-gather runs while the reads of the next rounds do: at most ``depth`` rounds
    (``None``: all) have buffers at once.
    ``landed(plan, packed)`` is called for each round, in order, once its bytes are in
    ``packed`` (in stream order for NCCL); a round's buffer may be handed out again after
    it returns.
    """
    import torch.distributed as dist  # type: ignore[import-not-found, unused-ignore]

    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    plans = [
        plan([shared[i] for i in idx], [needers[i] for i in idx], rank, world_size)
        for idx in rounds([t.size for t in shared], ROUND if limit is None else limit)
    ]
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


def load_shared(
    tensors: Sequence[TensorSpan],
    needs: Needs,
    device: str | int,
    group: Any,
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
    torch_device = _torch_device(device)
    shared = [(t, w) for t, w in zip(tensors, who, strict=True) if len(w) >= 2]
    private = [t for t, w in zip(tensors, who, strict=True) if w == {rank}]
    sizes = [t.size for t, _ in shared]
    # One allocation for every round's packed buffer, cut in order (the tensors are views).
    starts, total = [], 0
    for idx in rounds(sizes, ROUND):
        p = plan([shared[i][0] for i in idx], [shared[i][1] for i in idx], rank, world_size)
        starts.append(total)
        total += p.share * world_size
    places, private_reads, private_total = pack([(t, 0, t.size) for t in private])
    whole = torch.empty(total + private_total, dtype=torch.uint8, device=torch_device)
    if torch_device != "cpu":  # kvikpy writes from its own streams: the memory must be idle
        torch.cuda.current_stream(torch_device).synchronize()
    out: dict[str, Any] = {}
    by_size = {t.name: t.size for t in tensors}

    def buffer(k: int, nbytes: int) -> Any:
        return whole[starts[k] : starts[k] + nbytes]

    def landed(p: Plan, packed: Any) -> None:
        for name, at in p.packed.items():
            out[name] = packed[at : at + by_size[name]]

    alone = whole[total:]
    with _Files() as files:
        started = files.start(alone, private_reads)
        exchange([t for t, _ in shared], [w for _, w in shared], group, files, buffer, landed)
        files.wait(started)
    for t, at in zip(private, places, strict=True):
        out[t.name] = alone[at : at + t.size]
    return {name: out[name] for name, w in zip(names, who, strict=True) if rank in w}


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


def _torch_device(device: str | int) -> Any:
    from kvikpy import _devices

    ordinal = _devices.resolve(device)
    return "cpu" if ordinal is None else f"cuda:{ordinal}"
