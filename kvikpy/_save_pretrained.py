"""The checkpoint directory behind :func:`kvikpy.safetensors.save_pretrained`: tensors
packed into shards, every shard written in one parallel pass, and the shards and their
index put in place only once all of them are complete.

Every tensor is described and checked as :func:`kvikpy.safetensors.save_file` checks it
(:mod:`kvikpy._save`), and every shard's header is laid out, before any file is created.
Each shard and the index are written under a temporary name in the directory
(``_lib.Replacement``); the header and tensor writes of all shards are started at once on
kvikpy's pool, then waited for together. Only when every byte of every shard is written
(and synced, with ``sync``) are the files renamed into place, the index last; a failure
before that removes every temporary file and leaves the directory as it was.

torch is never imported here: a module is recognised through ``sys.modules``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Mapping
from fractions import Fraction
from typing import Any, NamedTuple

import kvikpy._lib as _lib
from kvikpy import _paths
from kvikpy._pretrained import _INDEX, _SINGLE
from kvikpy._save import _describe, _metadata, _refuse_overlaps, _Tensor, copies_of, write_checked
from kvikpy._save_async import SaveFuture, start
from kvikpy.cufile import CuFile

__all__ = ["SHARD_NAME", "pack", "parse_size", "save_pretrained"]

# A shard's name: model-00001-of-00003.safetensors. Files of this exact form that the new
# checkpoint does not name are a former save's shards, removed once the new one is in place.
SHARD_NAME = re.compile(r"model-(\d{5})-of-(\d{5})\.safetensors")
_MAX_SHARDS = 99_999

# Size units, case-insensitive: decimal ones are powers of 1000, "iB" ones of 1024.
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", re.IGNORECASE)


def parse_size(value: Any) -> int:
    """``max_shard_size`` in bytes: a positive ``int``, or a string such as ``"5GB"``,
    ``"500MB"`` or ``"10GiB"`` (see :func:`kvikpy.safetensors.save_pretrained`)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(
            "max_shard_size must be an int (bytes) or a string such as '5GB' or '10GiB', "
            f"not {type(value).__name__}"
        )
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.fullmatch(value)
        unit = _UNITS.get(match.group(2).upper()) if match else None
        if match is None or unit is None:
            raise ValueError(
                f"max_shard_size {value!r} is not a size; pass bytes as an int, or a "
                "number and a unit: '5GB', '500MB', '100KB' (powers of 1000) or '10GiB', "
                "'512MiB' (powers of 1024)"
            )
        size = int(Fraction(match.group(1)) * unit)
    if size < 1:
        raise ValueError(
            f"max_shard_size {value!r} is {size} bytes; a shard holds at least one byte: "
            "pass a positive size such as '5GB'"
        )
    return size


def pack(sizes: list[int], limit: int) -> list[list[int]]:
    """The tensors of ``sizes`` (bytes, in order) packed into shards, in order: a shard is
    closed when the next tensor would take it past ``limit``, so a tensor larger than
    ``limit`` has a shard of its own. One (empty) shard for no tensors."""
    shards: list[list[int]] = [[]]
    filled = 0
    for k, size in enumerate(sizes):
        if shards[-1] and filled + size > limit:
            shards.append([])
            filled = 0
        shards[-1].append(k)
        filled += size
    return shards


def _declared_tied(module: Any) -> list[tuple[str, str]]:
    """``(prefix, pattern)`` for every name the module or one of its submodules declares
    as tied to another (transformers' ``_tied_weights_keys``: a list of names or regular
    expressions, or a dict whose keys are)."""
    declared: list[tuple[str, str]] = []
    for prefix, sub in module.named_modules():
        keys = getattr(sub, "_tied_weights_keys", None)
        if isinstance(keys, str):
            keys = [keys]
        elif isinstance(keys, Mapping):
            keys = list(keys)
        if not keys:
            continue
        for key in keys:
            if isinstance(key, str):
                declared.append((f"{prefix}." if prefix else "", key))
    return declared


def _is_declared(name: str, declared: list[tuple[str, str]]) -> bool:
    for prefix, pattern in declared:
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix) :]
        if rest == pattern:
            return True
        try:
            if re.search(pattern, rest):
                return True
        except re.error:
            continue
    return False


def _untie(module: Any, described: list[_Tensor]) -> list[_Tensor]:
    """A module's state-dict tensors with each group of tied ones (the same tensor under
    several names: one memory, dtype and shape) kept once. The name kept is the first, in
    state-dict order, that the module does not declare as tied; the group's first name if
    it declares them all."""
    groups: dict[tuple[Any, ...], list[_Tensor]] = {}
    for t in described:
        key = (t.device, t.address, t.nbytes, t.dtype, t.shape) if t.nbytes else (id(t),)
        groups.setdefault(key, []).append(t)
    declared = _declared_tied(module)
    drop: set[str] = set()
    for group in groups.values():
        if len(group) < 2:
            continue
        free = [t for t in group if not _is_declared(t.name, declared)]
        keep = (free or group)[0]
        drop.update(t.name for t in group if t is not keep)
    return [t for t in described if t.name not in drop]


def _directory(directory: _paths.StrPath) -> str:
    """``directory`` as a path, checked; ``ValueError`` for a URL, ``NotADirectoryError``
    for a path that names something else. A missing directory is created later, once
    everything is checked."""
    name = _paths.fspath(directory)
    if _paths.is_url(name):
        raise ValueError(
            f"save_pretrained writes a local directory, not {_paths.redact_url(name)!r}; "
            "save it locally, then upload it"
        )
    if os.path.exists(name) and not os.path.isdir(name):
        raise NotADirectoryError(
            f"save_pretrained writes a checkpoint directory, and {name!r} is not a "
            "directory; pass a directory (it is created if missing)"
        )
    return name


def save_pretrained(
    tensors: Any,
    directory: _paths.StrPath,
    max_shard_size: Any,
    metadata: Any,
    sync: bool,
    dtypes: Mapping[str, str],
    blocking: bool = True,
) -> SaveFuture | None:
    """Write ``tensors`` to checkpoint ``directory`` (see
    :func:`kvikpy.safetensors.save_pretrained`); ``dtypes`` as :func:`kvikpy._save.save`
    takes them. Without ``blocking``, the tensors are copied and the copies written in the
    background (:mod:`kvikpy._save_async`): returns the save's future."""
    where = _directory(directory)
    limit = parse_size(max_shard_size)
    pairs = _metadata(metadata)
    torch = sys.modules.get("torch")
    module = tensors if torch is not None and isinstance(tensors, torch.nn.Module) else None
    if module is not None:
        tensors = module.state_dict()
    elif not isinstance(tensors, Mapping):
        raise TypeError(
            "save_pretrained's tensors must be a torch.nn.Module or a mapping (a dict) of "
            f"names to tensors, not {type(tensors).__name__}"
        )
    described = [_describe(key, obj, dtypes) for key, obj in tensors.items()]
    if module is not None:
        described = _untie(module, described)
    _refuse_overlaps(described)
    if pairs is None:
        torch_input = module is not None or any(t.storage is not None for t in described)
        pairs = [("format", "pt" if torch_input else "np")]
    shards = pack([t.nbytes for t in described], limit)
    if len(shards) > _MAX_SHARDS:
        raise ValueError(
            f"max_shard_size {max_shard_size!r} makes {len(shards)} shards, more than the "
            f"{_MAX_SHARDS} that shard names can number; pass a larger max_shard_size"
        )
    if len(shards) == 1:
        names = [_SINGLE]
    else:
        n = len(shards)
        names = [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    # Every shard's header, laid out (names and sizes checked) before any file is made.
    layouts = []
    size = 0  # of every file written, the index included
    for members in shards:
        chosen = [described[k] for k in members]
        rows = [(t.name, t.dtype, list(t.shape), t.nbytes) for t in chosen]
        header, offsets, shard_size = _lib.safetensors_new_header(rows, pairs)
        layouts.append((chosen, header, offsets))
        size += shard_size
    index = None
    if len(shards) > 1:
        weight_map = {
            t.name: name
            for name, (chosen, _, _) in zip(names, layouts, strict=True)
            for t in chosen
        }
        total = sum(t.nbytes for t in described)
        body = {"metadata": {"total_size": total}, "weight_map": weight_map}
        index = (json.dumps(body, indent=2, sort_keys=True) + "\n").encode()
        size += len(index)
    # Everything is checked: only now does anything change on disk.
    if blocking:
        _put_in_place(_Files(where, names, layouts, index), sync)
        return None
    copied, ready = copies_of(described)
    copy_of = {id(t): c for t, c in zip(described, copied, strict=True)}
    layouts = [
        ([copy_of[id(t)] for t in chosen], header, offsets) for chosen, header, offsets in layouts
    ]

    def job() -> int:
        ready()
        _put_in_place(_Files(where, names, layouts, index), sync)
        return size

    return start(where, job)


class _Files(NamedTuple):
    """A checkpoint directory's files, laid out: each shard's name, tensors, header and
    tensor offsets, and the index's bytes (``None`` for one shard)."""

    where: str
    names: list[str]
    layouts: list[tuple[list[_Tensor], bytes, list[int]]]
    index_json: bytes | None


def _put_in_place(files: _Files, sync: bool) -> None:
    """Make the directory, write the checkpoint's files (:func:`_write`) and remove what
    a former save left; a directory made for a save that fails is removed again."""
    where, names = files.where, files.names
    made = _make_directory(where)
    try:
        _write(files, sync)
    except BaseException:
        for path in made:  # the directories made for this save, deepest first
            with contextlib.suppress(OSError):
                os.rmdir(path)
        raise
    try:
        _remove_stale(where, set(names))
    finally:
        if sync:  # the renames (and removals) reach the disk
            _lib.sync_directory(where)


def _make_directory(where: str) -> list[str]:
    """Make directory ``where`` and its missing parents; the directories made, deepest
    first (removed again if the save fails)."""
    missing: list[str] = []
    path = os.path.abspath(where)
    while not os.path.exists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    os.makedirs(where, exist_ok=True)
    return missing


def _write(files: _Files, sync: bool) -> None:
    """Every shard (and the index) under a temporary name, in one parallel pass, then
    renamed into place, the index last; on any failure before the renames, every
    temporary file is removed."""
    where, names, layouts, index = files
    with contextlib.ExitStack() as stack:
        replacements: list[_lib.Replacement] = []

        def replacement(name: str) -> _lib.Replacement:
            r = _lib.Replacement(os.path.join(where, name), False)
            stack.callback(r.abort)  # a no-op once committed
            replacements.append(r)
            return r

        with contextlib.ExitStack() as opened:
            jobs: list[tuple[CuFile, Any, int, int]] = []
            shown: list[str] = []  # the shard of each job, for messages
            for name, (chosen, header, offsets) in zip(names, layouts, strict=True):
                f = opened.enter_context(CuFile(replacement(name).path, "r+"))
                jobs.append((f, header, len(header), 0))
                jobs += [
                    (f, t.buf, t.nbytes, len(header) + offset)
                    for t, offset in zip(chosen, offsets, strict=True)
                    if t.nbytes
                ]
                shown += [name] * (len(jobs) - len(shown))
            write_checked(jobs, shown, f"the checkpoint in {where!r}")
        if index is not None:
            with open(replacement(_INDEX).path, "wb") as out:
                out.write(index)
        if sync:  # every file on the disk before the first takes its place
            for r in replacements:
                r.sync()
        for r in replacements:
            r.commit(False)


def _remove_stale(where: str, written: set[str]) -> None:
    """Remove what a former save left that the new checkpoint does not name: shards
    (``model-NNNNN-of-NNNNN.safetensors``), and the other layout's file
    (``model.safetensors`` beside a new index, or an index beside a new
    ``model.safetensors``), which loaders would read instead of the new files."""
    other = _SINGLE if len(written) > 1 else _INDEX
    for entry in sorted(os.listdir(where)):
        stale = entry == other or (SHARD_NAME.fullmatch(entry) and entry not in written)
        path = os.path.join(where, entry)
        if stale and os.path.isfile(path):
            os.remove(path)
