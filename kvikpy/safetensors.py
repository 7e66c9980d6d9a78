"""Load a safetensors checkpoint into GPU memory in one pass, alone or read once for a
whole ``torch.distributed`` process group.

``kvikpy.safetensors.load_file(path, device="cuda")`` returns the same dict of torch
tensors as ``safetensors.torch.load_file(path, device="cuda")``, but reads every tensor's
bytes with a single parallel kvikpy read into one GPU allocation; each tensor is a view into
it (the allocation lives as long as any of the tensors).

``load_into(model, files)`` writes each tensor's bytes straight into the tensors a model
(or a mapping of names to tensors or numpy arrays) already has, with no checkpoint-sized
allocation; ``load_pretrained(model, directory)`` does the same for a checkpoint directory
as transformers writes it.

``save_file(tensors, path)`` writes a safetensors file from tensors where they lie (host
or GPU memory), every tensor at once, whole or not at all; ``save_pretrained(model,
directory)`` writes a checkpoint directory as transformers does, in shards, every shard
at once, whole or not at all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal, cast, overload

import kvikpy._lib as _lib
from kvikpy import _devices, _paths
from kvikpy._load_into import LoadIntoError, LoadResult, Source
from kvikpy._load_into import load as _load
from kvikpy._read_once import Needs
from kvikpy._save_async import SaveFuture
from kvikpy._spans import Files, TensorSpan, read_spans

__all__ = [
    "LoadIntoError",
    "LoadResult",
    "SaveFuture",
    "load_file",
    "load_files",
    "load_into",
    "load_pretrained",
    "read_header",
    "save_file",
    "save_pretrained",
]

# safetensors dtype -> (torch dtype name, numpy dtype name or None, item size in bytes)
_DTYPES: dict[str, tuple[str, str | None, int]] = {
    "F64": ("float64", "float64", 8),
    "F32": ("float32", "float32", 4),
    "F16": ("float16", "float16", 2),
    "BF16": ("bfloat16", None, 2),
    "I64": ("int64", "int64", 8),
    "I32": ("int32", "int32", 4),
    "I16": ("int16", "int16", 2),
    "I8": ("int8", "int8", 1),
    "U64": ("uint64", "uint64", 8),
    "U32": ("uint32", "uint32", 4),
    "U16": ("uint16", "uint16", 2),
    "U8": ("uint8", "uint8", 1),
    "BOOL": ("bool", "bool", 1),
    "F8_E4M3": ("float8_e4m3fn", None, 1),
    "F8_E5M2": ("float8_e5m2", None, 1),
    "F8_E8M0": ("float8_e8m0fnu", None, 1),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", None, 1),
    "F8_E5M2FNUZ": ("float8_e5m2fnuz", None, 1),
    "C64": ("complex64", "complex64", 8),
}

# dtype name as torch and numpy spell it -> safetensors dtype, for the writers
_SAVED_DTYPES = {names[0]: code for code, names in _DTYPES.items()}


@overload
def save_file(
    tensors: Mapping[str, Any],
    filename: _paths.StrPath,
    metadata: Mapping[str, str] | None = None,
    *,
    sync: bool = True,
    blocking: Literal[True] = True,
) -> None: ...
@overload
def save_file(
    tensors: Mapping[str, Any],
    filename: _paths.StrPath,
    metadata: Mapping[str, str] | None = None,
    *,
    sync: bool = True,
    blocking: Literal[False],
) -> SaveFuture: ...
def save_file(
    tensors: Mapping[str, Any],
    filename: _paths.StrPath,
    metadata: Mapping[str, str] | None = None,
    *,
    sync: bool = True,
    blocking: bool = True,
) -> SaveFuture | None:
    """Write tensors to a safetensors file, each straight from the memory it lies in.

    The arguments are those of ``safetensors.torch.save_file``, and the file is one that
    safetensors (and :func:`load_file`) reads. GPU tensors are written from GPU memory,
    with no copy of the tensors in host memory; the header is written in one write and
    every tensor's bytes at their offset, all started at once on kvikpy's thread pool.

    The file is written whole or not at all: under a temporary name beside ``filename``,
    renamed over it once every byte is written. If anything fails on the way (a full
    disk, Ctrl-C), no file is left under the temporary name and ``filename`` is as it
    was, or still absent. With ``sync`` (the default) the file's bytes reach the disk
    (``fsync``) before the rename, and the rename (``fsync`` of the directory) before
    this returns.
    Everything is checked before the file is created, so refused input changes nothing
    on disk.

    The header lists the tensors in the order their bytes follow each other: by item
    size, largest first (8-byte dtypes, then 4, 2 and 1), within one size by dtype as
    safetensors orders them, then by name. Each tensor therefore starts at a multiple of
    its item size, and readers take it as a view, without a copy. It is the order
    safetensors 0.8 writes in: for the same tensors and at most one metadata entry, the
    file is byte for byte the one ``safetensors.torch.save_file`` writes (metadata
    entries are written sorted by key, where safetensors writes them in no fixed order).

    Parameters
    ----------
    tensors
        Names to tensors: torch tensors (on the CPU or any GPU), numpy arrays, CuPy
        arrays, or any array with ``__dlpack__`` or ``__cuda_array_interface__`` and a
        ``dtype`` and ``shape``. Each must be contiguous, of a dtype safetensors holds
        (bool, the integers, float16/32/64, complex64, bfloat16 and the float8 types),
        and share no memory with another. Names are any strings but ``"__metadata__"``.
    filename
        The file to write (a ``str`` or ``os.PathLike``), replaced if it exists.
    metadata
        Strings to keep in the header's ``__metadata__`` (``{"format": "pt"}``), or
        ``None`` to write none.
    sync
        Whether the file and its rename are synced to the disk before this returns: on
        by default, as a checkpoint is worth the wait; ``False`` returns sooner and
        leaves the writing back to the operating system (a power failure soon after may
        then lose the new file, though never leave a partial one under ``filename``).
        The ``write_sync`` setting does not apply here.
    blocking
        ``True`` (the default): return once the file is written. ``False``: copy every
        tensor, start writing the copies on a thread of its own, and return a
        :class:`SaveFuture` at once; the caller may change its tensors as soon as the
        call returns. GPU tensors are copied on their GPU (queued on its current stream)
        within the ``checkpoint_staging`` setting per device, the rest into pinned host
        memory, with torch; host arrays in host memory. Refused input is refused by the
        call itself; errors of the writing (a full disk, a missing directory) are raised
        by :meth:`SaveFuture.get`. An interpreter that exits waits for the save.

    Returns
    -------
    SaveFuture or None
        With ``blocking=False``, the save's future (``get()`` returns the file's size in
        bytes; awaitable); otherwise ``None``.

    Raises
    ------
    TypeError
        For ``tensors`` that is not a mapping, a name or a metadata key or value that is
        not a string, or a tensor that is not an array.
    ValueError
        For a tensor that is not contiguous, on the meta device, of a dtype safetensors
        lacks, or sharing memory with another (tied weights: keep one of them); a name
        ``"__metadata__"``; a header past the format's 100 MB limit.
    OSError
        If the file cannot be written; ``filename`` is then as it was.

    Examples
    --------
    >>> from kvikpy.safetensors import save_file                   # doctest: +SKIP
    >>> save_file(model.state_dict(), "model.safetensors", {"format": "pt"})  # doctest: +SKIP
    >>> saving = save_file(model.state_dict(), "s100.safetensors", blocking=False)  # doctest: +SKIP
    >>> saving.get()  # the size of the file, once written                   # doctest: +SKIP
    """
    from kvikpy._save import save

    return save(tensors, filename, metadata, _SAVED_DTYPES, sync, blocking)


@overload
def save_pretrained(
    tensors: Any,
    directory: _paths.StrPath,
    *,
    max_shard_size: int | str = "5GB",
    metadata: Mapping[str, str] | None = None,
    sync: bool = True,
    blocking: Literal[True] = True,
) -> None: ...
@overload
def save_pretrained(
    tensors: Any,
    directory: _paths.StrPath,
    *,
    max_shard_size: int | str = "5GB",
    metadata: Mapping[str, str] | None = None,
    sync: bool = True,
    blocking: Literal[False],
) -> SaveFuture: ...
def save_pretrained(
    tensors: Any,
    directory: _paths.StrPath,
    *,
    max_shard_size: int | str = "5GB",
    metadata: Mapping[str, str] | None = None,
    sync: bool = True,
    blocking: bool = True,
) -> SaveFuture | None:
    """Write a checkpoint directory as transformers' ``save_pretrained`` writes its
    weights: ``model.safetensors``, or shards and their index.

    The tensors are packed, in the order given (a module's state-dict order), into
    shards of at most ``max_shard_size`` bytes of tensor data: a shard is closed when the
    next tensor would take it past the limit, and a tensor larger than the limit has a
    shard of its own. One shard is written as ``model.safetensors``, with no index.
    Several are written as ``model-00001-of-0000N.safetensors`` (numbers of five
    digits), with ``model.safetensors.index.json``: ``{"metadata": {"total_size": ...},
    "weight_map": {name: shard}}``, where ``total_size`` is the sum of the tensors'
    bytes and the names are sorted. transformers' ``from_pretrained`` and
    :func:`load_pretrained` read the directory.

    Each shard is written as :func:`save_file` writes a file (every tensor straight from
    the memory it lies in, the same header order), and all shards in one pass: every
    shard's header and tensor writes are started at once on kvikpy's thread pool, then
    waited for together; a failed write is raised once all have finished.

    The checkpoint is written whole or not at all. Everything is checked before any
    file is created (the directory is created if missing, once the checks pass). Every
    shard and the index are written under temporary names in ``directory``; only when
    all are complete are they renamed into place, the index last. If anything fails
    before (a full disk, Ctrl-C), every temporary file is removed and the directory is
    as it was, an earlier checkpoint in it included (a directory made for the save is
    removed again). The renames follow each other: a crash between two of them can
    leave some new shards beside the earlier index. Once the new files are in place,
    what an earlier save left that they do not replace is removed: shards named
    ``model-NNNNN-of-NNNNN.safetensors`` that the new index does not name, and
    ``model.safetensors.index.json`` when the new checkpoint is one file (or
    ``model.safetensors`` when it is sharded), which loaders would otherwise read
    instead of the new files. No other file of the directory is touched.

    Parameters
    ----------
    tensors
        A ``torch.nn.Module`` (its ``state_dict()`` is saved), or a mapping of names to
        tensors as :func:`save_file` takes it. In a module, tied tensors (one tensor under
        several names, as a language model's output layer tied to its embedding) are
        saved once: under the first of their names, in state-dict order, that the module
        does not declare as tied (transformers models declare the names to drop in
        ``_tied_weights_keys``, as names or regular expressions, on the model or on any
        submodule), or under the first name if it declares them all. Loading re-ties them
        (:func:`load_pretrained` calls the model's ``tie_weights()``, as transformers
        does). In a mapping, tensors that share memory are refused as :func:`save_file`
        refuses them.
    directory
        The checkpoint directory (a ``str`` or ``os.PathLike``), created if missing.
    max_shard_size
        The most bytes of tensor data per shard (the header adds a little): an ``int``,
        or a string of a number and a unit, case-insensitive, as transformers takes it:
        ``"5GB"``, ``"500MB"``, ``"100KB"`` (powers of 1000) or ``"10GiB"``,
        ``"512MiB"`` (powers of 1024).
    metadata
        Strings for every shard's ``__metadata__``. By default ``{"format": "pt"}`` when
        ``tensors`` is a module or holds a torch tensor, ``{"format": "np"}`` otherwise.
        transformers' ``from_pretrained`` needs ``"format": "pt"`` among them.
    sync
        Whether every file is synced to the disk (``fsync``) before the renames, and the
        directory after them, before this returns (see :func:`save_file`).
    blocking
        ``True`` (the default): return once the checkpoint is in place. ``False``: copy
        every tensor as :func:`save_file` does with ``blocking=False``, write the copies
        in the background and return a :class:`SaveFuture` at once (``get()`` returns the
        bytes of every file written, the index included). Refused input is refused by
        the call; errors of the writing are raised by ``get()``, the directory as it was.

    Returns
    -------
    SaveFuture or None
        With ``blocking=False``, the save's future; otherwise ``None``.

    Raises
    ------
    TypeError
        For ``tensors`` that is neither a module nor a mapping, a ``max_shard_size``
        that is neither an ``int`` nor a string, or what :func:`save_file` refuses.
    ValueError
        For a ``max_shard_size`` that is not a positive size, a URL for ``directory``,
        or what :func:`save_file` refuses (for a module, two names of one tensor are
        not refused: they are tied).
    NotADirectoryError
        If ``directory`` names something other than a directory.
    OSError
        If a file cannot be written; the directory is then as it was.

    Examples
    --------
    >>> from kvikpy.safetensors import save_pretrained               # doctest: +SKIP
    >>> save_pretrained(model, "checkpoint", max_shard_size="2GB")   # doctest: +SKIP
    >>> model.config.save_pretrained("checkpoint")                   # doctest: +SKIP
    """
    from kvikpy._save_pretrained import save_pretrained as save

    return save(tensors, directory, max_shard_size, metadata, sync, _SAVED_DTYPES, blocking)


def read_header(path: _paths.StrPath) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Parse and validate a safetensors header.

    Everything in the header is checked here, once, before any of it is used (the numpy
    and torch loaders both go through this function), by kvikpy's engine with the GIL
    released:

    * the 8-byte length is at most 100 MB (the format's limit) and fits in the file,
      checked before the header is read;
    * the header is UTF-8 JSON starting with ``{``, an object, with arrays and objects
      nested at most 64 deep (checked before parsing: deeper nesting is a ``ValueError``,
      never a ``RecursionError`` or a crash), with no key given twice in any object and
      no lone UTF-16 surrogate escape (``"\\ud800"``: the reference implementation
      refuses them too);
    * ``__metadata__``, if present and not ``null``, is an object of string values;
    * every other key is a tensor: an object with ``dtype`` (a string naming a known
      dtype), ``shape`` (a list of at most 64 integers from 0 to 2**63 - 1) and
      ``data_offsets`` (a list of two integers ``[begin, end]``); JSON ``true`` and
      ``false`` and floats such as ``4.0`` are not integers; other keys are ignored, as
      the reference implementation does;
    * ``0 <= begin <= end <= data size`` and ``end - begin`` is the shape's element count
      times the dtype's size (computed with bounded arithmetic);
    * as the reference implementation requires, the tensors cover the data section
      exactly: sorted by offset, each starts where the previous one ends (no overlap, no
      hole), the first at 0 and the last at the end of the file.

    Parameters
    ----------
    path
        The ``.safetensors`` file: a local path, or an ``http(s)://``, ``s3://`` or
        ``webhdfs://`` URL. The header comes in one read of the file's first 64 KiB (one
        ranged request for a URL), and a second read only for a longer header.

    Returns
    -------
    tuple[int, dict, dict]
        ``(data_start, tensors, metadata)``: the byte offset where tensor data begins,
        ``{name: {"dtype", "shape", "data_offsets"}}`` and the ``__metadata__`` strings.

    Raises
    ------
    ValueError
        Naming the file and what is wrong, for anything malformed; never another type
        for a malformed header.
    """
    name = _paths.fspath(path)
    return _header(name, name)


def _header(name: str, file: str | _lib.FileHandle) -> tuple[int, dict[str, Any], dict[str, str]]:
    """:func:`read_header` of file ``name``, read through ``file`` (its path, or a handle
    already open whose reads then see the same file)."""
    data_start, tensors, metadata = _lib.safetensors_header(file, _shown(name))
    header = {
        tensor: {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
        for tensor, dtype, shape, begin, end in tensors
    }
    return data_start, header, dict(metadata)


def _shown(name: str) -> str:
    """File ``name`` as messages show it: a URL with its credentials hidden."""
    return _paths.redact_url(name) if _paths.is_url(name) else name


def _spans(
    paths: Sequence[str], files: Files
) -> tuple[list[TensorSpan], dict[str, dict[str, Any]], dict[str, int]]:
    """Every tensor of the files, in file order, with its absolute byte span, its header
    entry, and where each file's data section starts; names must be unique across the
    files (as in a sharded checkpoint). Each header is read and validated once, here,
    through the handle of ``files`` that the tensors are read through afterwards."""
    spans: list[TensorSpan] = []
    infos: dict[str, dict[str, Any]] = {}
    starts: dict[str, int] = {}
    where: dict[str, str] = {}
    for path in paths:
        data_start, header, _ = _header(path, files.handle(path))
        starts[path] = data_start
        ordered = sorted(header.items(), key=lambda item: item[1]["data_offsets"][0])
        for tensor, info in ordered:
            if tensor in where:
                first, second = (_shown(p) for p in (where[tensor], path))
                raise ValueError(
                    f"tensor {tensor!r} is in both {first!r} and {second!r}; the "
                    "shards of one checkpoint hold each tensor once"
                )
            where[tensor] = path
            begin, end = info["data_offsets"]
            spans.append(TensorSpan(tensor, path, data_start + begin, end - begin))
            infos[tensor] = info
    return spans, infos, starts


def _typed(flat: Any, info: dict[str, Any]) -> Any:
    """A flat ``torch.uint8`` tensor as the tensor its header describes (a view where the
    bytes are item-aligned, else a copy)."""
    import torch  # type: ignore[import-not-found, unused-ignore]

    torch_name, _, itemsize = _DTYPES[info["dtype"]]
    dtype = _torch_dtype(torch, info["dtype"], torch_name)
    if flat.storage_offset() % itemsize:
        flat = flat.clone()  # views need item-aligned offsets
    return flat.view(dtype).reshape(info["shape"])


def _torch_dtype(torch: Any, name: str, torch_name: str) -> Any:
    """torch's dtype for the safetensors dtype ``name``; ``ValueError`` where this torch
    lacks it (``float8_e8m0fnu`` came with torch 2.7)."""
    dtype = getattr(torch, torch_name, None)
    if dtype is None:
        raise ValueError(
            f"a tensor has dtype {name}, which torch {torch.__version__} lacks "
            f"(torch.{torch_name}); upgrade torch to read it"
        )
    return dtype


def _wanted(names: Sequence[str], tensor_filter: Needs) -> list[str]:
    """The names a single process returns for ``tensor_filter`` (no process group)."""
    if tensor_filter is None:
        return list(names)
    if callable(tensor_filter):
        return [n for n in names if tensor_filter(n)]
    raise TypeError(
        "without a process_group, tensor_filter must be a callable taking a tensor name "
        f"(a rank-to-names mapping needs process_group=), not {type(tensor_filter).__name__}"
    )


def load_file(
    path: _paths.StrPath | Sequence[_paths.StrPath],
    device: str | int | None = None,
    *,
    framework: str = "torch",
    process_group: Any = None,
    tensor_filter: Needs = None,
) -> dict[str, Any]:
    """Load the tensors of a safetensors file (or of a checkpoint's shards), in one
    parallel read, or read once for a whole ``torch.distributed`` process group.

    The tensors are read straight into the memory returned; the reads' bounce buffers
    (pinned host memory for a GPU) stay within half the ``checkpoint_staging`` setting,
    less when the reads would never hold that much (see :mod:`kvikpy.defaults`).

    Parameters
    ----------
    path
        The ``.safetensors`` file, or a list of the files of a sharded checkpoint (each
        tensor name in one file only): local paths, or ``http(s)://``, ``s3://`` or
        ``webhdfs://`` URLs, whose headers and tensors are read with ranged requests.
    device
        ``"cuda"``, ``"cuda:N"``, ``N`` or ``"cpu"`` (host memory), as for
        :func:`kvikpy.read`; by default ``"cuda"`` for torch and ``"cpu"`` for numpy.
        With an NCCL ``process_group``, this rank's GPU (``"cuda"`` is the current
        device, which torchrun scripts set with ``torch.cuda.set_device(local_rank)``).
    framework
        ``"torch"`` (default) returns torch tensors; ``"numpy"`` returns numpy arrays
        (host memory, one file, no process group; no bfloat16 or float8), and needs no
        torch.
    process_group
        A ``torch.distributed`` process group (``torch.distributed.group.WORLD`` for
        the default one), or ``None`` to read alone. With a group, every rank calls this
        function with the same files; each byte is read from storage by one rank only, and
        the group's all-gather (NCCL over NVLink between GPUs, gloo for ``device="cpu"``)
        gives every rank the tensors it needs. Each rank gets a dict of its own tensors.
    tensor_filter
        Which tensors to return. ``None``: all of them. A callable taking a tensor name
        (on each rank, for that rank: ``lambda name: name.startswith(f"layers.{rank}.")``).
        With a process group, also a mapping from rank to the tensor names that rank needs
        (the same mapping on every rank). A tensor needed by one rank only is read by that
        rank alone; one needed by several is read once and shared.

    Returns
    -------
    dict
        Tensor name to tensor. Read alone, tensors are views into one allocation that
        holds every file's data section (freed when the last of them is); a tensor whose
        offset is not a multiple of its item size (possible in files that mix dtypes
        without padding) is copied to an aligned allocation instead.

    Raises
    ------
    ValueError
        For a malformed file (see :func:`read_header`), a tensor name in two shards, a
        ``framework`` that cannot do what is asked, or a ``process_group`` without an
        initialised ``torch.distributed``.
    KeyError
        For a ``tensor_filter`` mapping that names a tensor no file holds.

    Examples
    --------
    >>> from kvikpy.safetensors import load_file              # doctest: +SKIP
    >>> state = load_file("model.safetensors", device="cuda")  # doctest: +SKIP
    >>> model.load_state_dict(state)                          # doctest: +SKIP

    Under ``torchrun --nproc-per-node 8``, each GPU gets the whole checkpoint while storage
    is read once:

    >>> dist.init_process_group("nccl")                       # doctest: +SKIP
    >>> torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))  # doctest: +SKIP
    >>> state = load_file(shards, process_group=dist.group.WORLD)  # doctest: +SKIP
    """
    many = not isinstance(path, (str, bytes, os.PathLike))
    if isinstance(path, (str, bytes, os.PathLike)):
        paths = [_paths.fspath(path)]
    else:
        paths = [_paths.fspath(p) for p in path]
        if not paths:
            raise ValueError("load_file needs at least one file; got an empty list")
    if framework in ("numpy", "np"):
        if many or process_group is not None or tensor_filter is not None:
            raise ValueError(
                "framework='numpy' loads one file alone; use framework='torch' for shards, "
                "process_group= or tensor_filter="
            )
        return _load_numpy(paths[0], "cpu" if device is None else device)
    if framework not in ("torch", "pt"):
        raise ValueError(f"framework must be 'torch' or 'numpy', got {framework!r}")
    if device is None:
        device = "cuda"
    try:
        import torch  # type: ignore[import-not-found, unused-ignore]  # noqa: F401
    except ImportError as e:
        raise ModuleNotFoundError(
            "kvikpy.safetensors.load_file returns torch tensors, and torch is not "
            "installed: install torch, or pass framework='numpy' to read the tensors "
            "into numpy arrays in host memory",
            name="torch",
        ) from e

    with Files() as files:
        spans, infos, starts = _spans(paths, files)
        on_gpu = _devices.resolve(device) is not None
        files.stage(gpu=on_gpu, host=not on_gpu)  # one staging budget for the load
        if process_group is not None:
            from kvikpy._read_once import load_shared

            flat = load_shared(spans, tensor_filter, device, process_group, files)
            return {name: _typed(t, infos[name]) for name, t in flat.items()}
        wanted = _wanted([s.name for s in spans], tensor_filter)
        if len(wanted) < len(spans):
            keep = set(wanted)
            pieces = [(s, 0, s.size) for s in spans if s.name in keep]
            got = read_spans(pieces, device, files)
            return {
                s.name: _typed(whole[start : start + s.size], infos[s.name])
                for (s, _, _), (whole, start) in zip(pieces, got, strict=True)
            }
        # Every tensor: each file's data section in one parallel read, tensors as views.
        # The validated size, not "to the end": a file cut since its header was read is an
        # error here, not a tensor of the wrong shape.
        ends = dict(starts)
        for s in spans:
            ends[s.path] = max(ends[s.path], s.offset + s.size)
        sections = [
            (TensorSpan("", name, start, ends[name] - start), 0, ends[name] - start)
            for name, start in starts.items()
        ]
        got = read_spans(sections, device, files)
        placed = {t.path: where for (t, _, _), where in zip(sections, got, strict=True)}
    out: dict[str, Any] = {}
    for s in spans:
        whole, at = placed[s.path]
        begin = at + s.offset - starts[s.path]
        out[s.name] = _typed(whole[begin : begin + s.size], infos[s.name])
    return out


def load_files(
    paths: Sequence[_paths.StrPath],
    device: str | int = "cuda",
    *,
    process_group: Any = None,
    tensor_filter: Needs = None,
) -> dict[str, Any]:
    """Load the shards of one checkpoint as one dict of torch tensors.

    The same as :func:`load_file` with a list of paths.

    Parameters
    ----------
    paths
        The shard files (each tensor name in one file only).
    device
        Where the tensors go, as for :func:`load_file`.
    process_group
        A ``torch.distributed`` process group to read the checkpoint once for, or
        ``None`` to read alone (see :func:`load_file`).
    tensor_filter
        Which tensors to return (see :func:`load_file`).

    Examples
    --------
    >>> shards = sorted(glob.glob("model-*-of-*.safetensors"))  # doctest: +SKIP
    >>> state = kvikpy.safetensors.load_files(shards)          # doctest: +SKIP
    """
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise TypeError("load_files takes a list of paths; use load_file for one file")
    return load_file(list(paths), device, process_group=process_group, tensor_filter=tensor_filter)


def _load_numpy(path: str, device: str | int) -> dict[str, Any]:
    import numpy as np

    if _devices.parse(device) != "cpu":
        raise ValueError(
            f"framework='numpy' loads into host memory, not device={device!r}; pass "
            "device='cpu' (or framework='torch' for the GPU)"
        )
    with Files() as files:
        data_start, header, _ = _header(path, files.handle(path))
        files.stage(gpu=False, host=True)  # one staging budget for the load
        data_size = max((info["data_offsets"][1] for info in header.values()), default=0)
        whole_np = np.empty(data_size, dtype=np.uint8)
        # Exactly the validated data section: a file cut since is an error, not a
        # tensor of the wrong shape.
        got = files.open(path).read(whole_np, data_size, data_start)
    if got != data_size:
        raise ValueError(
            f"{_shown(path)}: {data_size} bytes of tensor data at offset {data_start} "
            f"were asked for and only {got} read; the file is shorter than its header says"
        )
    result: dict[str, Any] = {}
    for tensor, info in header.items():
        _, np_name, _ = _DTYPES[info["dtype"]]
        if np_name is None:
            raise ValueError(
                f"tensor {tensor!r} has dtype {info['dtype']}, which numpy lacks; "
                "use framework='torch'"
            )
        begin, end = info["data_offsets"]
        result[tensor] = whole_np[begin:end].view(np_name).reshape(info["shape"])
    return result


def _paths_of(files: _paths.StrPath | Sequence[_paths.StrPath], what: str) -> list[str]:
    if isinstance(files, (str, bytes, os.PathLike)):
        return [_paths.fspath(files)]
    if not isinstance(files, Sequence):
        raise TypeError(f"{what} takes a path or a list of paths, not {type(files).__name__}")
    paths = [_paths.fspath(p) for p in cast("Sequence[_paths.StrPath]", files)]
    if not paths:
        raise ValueError(f"{what} needs at least one file; got an empty list")
    return paths


def _sources(paths: Sequence[str], files: Files) -> list[Source]:
    spans, infos, _ = _spans(paths, files)
    return [
        Source(
            s,
            infos[s.name]["dtype"],
            tuple(infos[s.name]["shape"]),
            _DTYPES[infos[s.name]["dtype"]][2],
        )
        for s in spans
    ]


def load_into(
    target: Any,
    files: _paths.StrPath | Sequence[_paths.StrPath],
    *,
    strict: bool = True,
    process_group: Any = None,
    convert_dtype: bool = False,
    device: Any = None,
) -> LoadResult:
    """Load a safetensors checkpoint straight into the tensors of ``target``.

    Each tensor's bytes go from the file into the target tensor's own memory. GPU
    targets are filled in windows: contiguous stretches of a file of at most half the
    GPU part of the ``checkpoint_staging`` setting (512 MiB by default; see
    :mod:`kvikpy.defaults`), each read in one parallel read into a staging buffer on the
    target's GPU and copied into its tensors there while the next window is read into a
    second buffer (a tensor larger than a window is read straight into its target). Host
    targets take one parallel read plan over all the files (reads that follow each other
    both in a file and in memory merged into one). Nothing the size of the checkpoint is
    allocated: peak memory is the target itself plus ``checkpoint_staging`` bytes at
    most, split in two. The reads' pinned bounce buffers hold at most half of it, less
    when the reads would never hold that much at the other settings (about 64 MiB with
    16 threads and the defaults). The rest is the GPU part, per GPU: two staging
    buffers of half of it (allocated through torch and freed before returning; about
    224 MiB each by default); then, with ``convert_dtype``, a conversion buffer of at
    most 64 MiB per device; with a ``process_group``, at most half of it (and at most
    256 MiB) of the shared read's rounds, four in flight at once.

    Parameters
    ----------
    target
        A ``torch.nn.Module`` (its ``state_dict()`` names: parameters and persistent
        buffers), or a mapping of names to torch tensors (CPU or any GPU of the host) or
        numpy arrays. A module whose tensors are on the meta device (built under
        ``torch.device("meta")`` or ``accelerate.init_empty_weights()``) is first
        materialised on ``device``, tied tensors kept tied. Target tensors must be
        contiguous; two names of one memory (tied weights) are read once, and a tied
        name the checkpoint lacks is filled through the other.
    files
        The ``.safetensors`` file, or the list of a sharded checkpoint's files: local
        paths, or ``http(s)://``, ``s3://`` or ``webhdfs://`` URLs (see
        :func:`load_file`).
    strict
        As in ``torch.nn.Module.load_state_dict``: whether names missing from the
        checkpoint or not in the target are an error. Shape and dtype mismatches are
        errors either way.
    process_group
        A ``torch.distributed`` process group: every rank calls ``load_into`` with the
        same files and its own target; each byte is read from storage once for the group
        and every rank gets its own tensors (in rounds of up to 64 MiB through the group's
        all-gather, each round's exchange running while the next rounds are read; at
        most four rounds, half the GPU part of the ``checkpoint_staging`` setting and at
        most 256 MiB, at once).
    convert_dtype
        If true, a tensor whose dtype in the file differs from its target's (a bfloat16
        checkpoint into float32 parameters) is read through a 64 MiB staging buffer on
        the target's device and converted into place. If false such a tensor is an error.
    device
        Where a meta-device module is materialised (default: the current CUDA device).

    Returns
    -------
    LoadResult
        ``(missing_keys, unexpected_keys)``, as torch's ``load_state_dict`` returns them
        (both empty when ``strict`` passed).

    Raises
    ------
    LoadIntoError
        (a ``ValueError`` and a ``RuntimeError``) for names, shapes or dtypes that do not
        match, or a target that is not contiguous, in torch's message layout and before
        any byte is written; or for a read that failed part way, naming the tensors
        written (``error.written``).
    ValueError
        For a malformed file (see :func:`read_header`).
    TypeError
        For a target that is neither a module nor a mapping of tensors or arrays.

    Examples
    --------
    >>> with torch.device("meta"):                                # doctest: +SKIP
    ...     model = MyModel()
    >>> kvikpy.safetensors.load_into(model, "model.safetensors", device="cuda")  # doctest: +SKIP
    """
    paths = _paths_of(files, "load_into")
    _load_target_check(target)
    with Files() as opened:
        return _load(
            target,
            _sources(paths, opened),
            _DTYPES,
            opened,
            strict=strict,
            convert=convert_dtype,
            device=device,
            process_group=process_group,
        )


def _load_target_check(target: Any) -> None:
    """Refuse a target of the wrong kind before any header is read."""
    import sys
    from collections.abc import Mapping

    torch = sys.modules.get("torch")
    if isinstance(target, Mapping) or (torch is not None and isinstance(target, torch.nn.Module)):
        return
    raise TypeError(
        "load_into's target must be a torch.nn.Module or a mapping of names to torch "
        f"tensors or numpy arrays, not {type(target).__name__}"
    )


def load_pretrained(
    model: Any,
    directory: _paths.StrPath,
    *,
    strict: bool = True,
    process_group: Any = None,
    convert_dtype: bool = False,
    device: Any = None,
) -> LoadResult:
    """Load a checkpoint directory written by transformers' ``save_pretrained`` straight
    into ``model`` (see :func:`load_into`).

    Reads ``model.safetensors``, or ``model.safetensors.index.json`` and the shards it
    names (each a file of the directory). Checkpoint names are renamed as transformers
    renames them: the model's ``base_model_prefix`` added or stripped (a base checkpoint
    into a model with a head, or the reverse), the regular expressions of a model class's
    ``_checkpoint_conversion_mapping``, and legacy ``gamma``/``beta`` layer-norm names.
    Not handled: ``pytorch_model.bin`` checkpoints, weight conversions that merge or split
    tensors, quantized checkpoints, and the weight initialisation of tensors the
    checkpoint lacks (``strict=False`` leaves them as they are, uninitialised if the model
    was on the meta device: see ``missing_keys``).

    Parameters
    ----------
    model
        A ``torch.nn.Module`` (a transformers ``PreTrainedModel``, built from its config,
        on a device or the meta device), or a mapping of names to tensors or arrays.
    directory
        The checkpoint directory: a local path, or the URL of one (``https://host/llm/``,
        ``s3://bucket/models/llm``), whose ``model.safetensors.index.json`` and shards
        (or ``model.safetensors``) are read with ranged requests.
    strict
        Whether missing or unexpected names are an error (see :func:`load_into`).
    process_group
        A ``torch.distributed`` process group to read the checkpoint once for (see
        :func:`load_into`).
    convert_dtype
        Whether tensors whose file dtype differs from the model's are converted (see
        :func:`load_into`).
    device
        Where a meta-device model is materialised (default: the current CUDA device).

    Returns
    -------
    LoadResult
        ``(missing_keys, unexpected_keys)``, in the model's names.

    Examples
    --------
    >>> config = AutoConfig.from_pretrained(directory)             # doctest: +SKIP
    >>> with accelerate.init_empty_weights():                     # doctest: +SKIP
    ...     model = AutoModelForCausalLM.from_config(config)
    >>> kvikpy.safetensors.load_pretrained(model, directory, device="cuda")  # doctest: +SKIP
    """
    from kvikpy._load_into import _targets
    from kvikpy._pretrained import checkpoint_files, renamer

    _load_target_check(model)
    paths = checkpoint_files(_paths.fspath(directory))
    tie = getattr(model, "tie_weights", None)
    if callable(tie):  # a transformers model ties its head to its embedding here
        tie()
    with Files() as files:
        sources = _sources(paths, files)
        names, _ = _targets(model)
        rename = renamer(model, [s.span.name for s in sources], names)
        return _load(
            model,
            sources,
            _DTYPES,
            files,
            strict=strict,
            convert=convert_dtype,
            device=device,
            process_group=process_group,
            rename=rename,
        )
