"""A checkpoint directory as transformers writes it (``save_pretrained``): which files
hold the weights, and how checkpoint names map to a model's names.

What is handled: ``model.safetensors``, or ``model.safetensors.index.json`` and the shards
it names; the ``base_model_prefix`` added or stripped (a base checkpoint into a model with
a head, or the reverse); the key renames a model class declares in
``_checkpoint_conversion_mapping`` (regular expressions); the legacy ``gamma``/``beta``
names of layer norms. Nothing from transformers is imported.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

from kvikpy import _paths

__all__ = ["checkpoint_files", "renamer"]

_SINGLE = "model.safetensors"
_INDEX = "model.safetensors.index.json"
# An index's size cap: the weight map of the largest checkpoints is a few MB.
_MAX_INDEX = 100_000_000


def checkpoint_files(directory: str) -> list[str]:
    """The safetensors files of checkpoint ``directory`` (a local directory, or the URL
    of one: ``https://host/models/llama/``, ``s3://bucket/models/llama``), in shard
    order; every shard name is checked to be a plain file name in the directory (an
    index cannot make the load read outside it)."""
    remote = _paths.is_url(directory)
    shown = _paths.redact_url(directory) if remote else directory
    if not remote and not os.path.isdir(directory):
        raise FileNotFoundError(f"checkpoint directory {directory!r} does not exist")
    index = _join(directory, _INDEX)
    raw = _read_index(index, _shown(index)) if remote else _read_local_index(index)
    if raw is not None:
        shards = _shards(raw, _shown(index))
        paths = [_join(directory, shard) for shard in shards]
        if not remote:
            for shard, path in zip(shards, paths, strict=True):
                if not os.path.isfile(path):
                    raise FileNotFoundError(
                        f"{index!r} names shard {shard!r}, which is not in {directory!r}"
                    )
        return paths
    single = _join(directory, _SINGLE)
    if _exists(single):
        return [single]
    raise FileNotFoundError(
        f"{shown!r} has neither {_SINGLE} nor {_INDEX}; load_pretrained reads "
        "safetensors checkpoints as save_pretrained writes them (not pytorch_model.bin)"
    )


def _shown(name: str) -> str:
    return _paths.redact_url(name) if _paths.is_url(name) else name


def _join(directory: str, name: str) -> str:
    """File ``name`` in ``directory``: a path joined, or a URL's path extended (its query,
    if any, kept after it)."""
    if not _paths.is_url(directory):
        return os.path.join(directory, name)
    parts = urllib.parse.urlsplit(directory)
    return urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/" + name))


def _exists(path: str) -> bool:
    """Whether file ``path`` exists (a URL: the server sizes it)."""
    if not _paths.is_url(path):
        return os.path.isfile(path)
    from kvikpy.cufile import CuFile

    try:
        with CuFile(path, "r"):
            return True
    except FileNotFoundError:
        return False


def _read_local_index(index: str) -> bytes | None:
    if not os.path.isfile(index):
        return None
    if os.path.getsize(index) > _MAX_INDEX:
        raise ValueError(f"{index!r} is larger than {_MAX_INDEX} bytes; not an index")
    with open(index, "rb") as fh:
        return fh.read()


def _read_index(index: str, shown: str) -> bytes | None:
    """The bytes of the index at URL ``index`` (``None`` where the server has none),
    sized before it is read (at most ``_MAX_INDEX`` bytes)."""
    from kvikpy.cufile import CuFile

    try:
        f = CuFile(index, "r")
    except FileNotFoundError:
        return None
    with f:
        size = f.nbytes()
        if size > _MAX_INDEX:
            raise ValueError(f"{shown!r} is larger than {_MAX_INDEX} bytes; not an index")
        buf = bytearray(size)
        got = f.read(buf, size, 0) if size else 0
    if got != size:
        raise ValueError(f"{shown!r} ended after {got} of its {size} bytes while read")
    return bytes(buf)


def _shards(raw: bytes, index: str) -> list[str]:
    """The shard file names index ``raw`` (shown as ``index``) names, sorted, each
    checked to be a plain ``.safetensors`` file name."""
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{index!r} is not valid JSON ({e})") from None
    except RecursionError:
        raise ValueError(
            f"{index!r} nests arrays or objects too deeply; an index is an object "
            "with a weight_map of names to shard file names"
        ) from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise ValueError(f"{index!r} has no weight_map object of tensor names to shard file names")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if (
            not shard
            or shard in (".", "..")
            or "/" in shard
            or os.sep in shard
            or "\0" in shard
            or "?" in shard
            or "#" in shard
            or "%" in shard
            or not shard.endswith(".safetensors")
        ):
            raise ValueError(
                f"{index!r} names shard {shard[:200]!r}; a shard is a .safetensors "
                "file name in the checkpoint's directory"
            )
    if not shards:
        raise ValueError(f"{index!r} names no shard")
    return shards


def renamer(model: Any, checkpoint: Iterable[str], targets: Iterable[str]) -> Callable[[str], str]:
    """How checkpoint names become the target's names, as transformers renames them on
    load."""
    names = list(checkpoint)
    wanted = set(targets)
    mapping = getattr(type(model), "_checkpoint_conversion_mapping", None) or {}
    patterns = [(re.compile(p), r) for p, r in mapping.items()] if isinstance(mapping, dict) else []
    prefix = getattr(model, "base_model_prefix", "") or ""
    lead = f"{prefix}." if isinstance(prefix, str) and prefix else ""

    def converted(key: str) -> str:
        for pattern, replacement in patterns:
            new, n = pattern.subn(replacement, key)
            if n:
                return new
        return key

    renamed = [converted(k) for k in names]
    add = strip = False
    if lead and renamed:
        has = any(k.startswith(lead) for k in renamed)
        expects = any(k.startswith(lead) for k in wanted)
        add = not has and expects
        strip = has and not expects

    def rename(key: str) -> str:
        key = converted(key)
        if add:
            key = lead + key
        elif strip and key.startswith(lead):
            key = key[len(lead) :]
        if key not in wanted:
            for old, new in ((".gamma", ".weight"), (".beta", ".bias")):
                if key.endswith(old) and key[: -len(old)] + new in wanted:
                    return key[: -len(old)] + new
        return key

    return rename
