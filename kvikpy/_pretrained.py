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
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["checkpoint_files", "renamer"]

_SINGLE = "model.safetensors"
_INDEX = "model.safetensors.index.json"
# An index's size cap: the weight map of the largest checkpoints is a few MB.
_MAX_INDEX = 100_000_000


def checkpoint_files(directory: str) -> list[str]:
    """The safetensors files of checkpoint ``directory``, in shard order; every shard
    name is checked to be a plain file name in the directory (an index cannot make the
    load read outside it)."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"checkpoint directory {directory!r} does not exist")
    index = os.path.join(directory, _INDEX)
    if os.path.isfile(index):
        if os.path.getsize(index) > _MAX_INDEX:
            raise ValueError(f"{index!r} is larger than {_MAX_INDEX} bytes; not an index")
        with open(index, "rb") as fh:
            try:
                data = json.loads(fh.read())
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
            raise ValueError(
                f"{index!r} has no weight_map object of tensor names to shard file names"
            )
        shards: list[str] = []
        for shard in weight_map.values():
            if shard not in shards:
                shards.append(shard)
        paths = []
        for shard in sorted(shards):
            if (
                not shard
                or shard in (".", "..")
                or "/" in shard
                or os.sep in shard
                or "\0" in shard
                or not shard.endswith(".safetensors")
            ):
                raise ValueError(
                    f"{index!r} names shard {shard[:200]!r}; a shard is a .safetensors "
                    "file name in the checkpoint's directory"
                )
            path = os.path.join(directory, shard)
            if not os.path.isfile(path):
                raise FileNotFoundError(
                    f"{index!r} names shard {shard!r}, which is not in {directory!r}"
                )
            paths.append(path)
        if not paths:
            raise ValueError(f"{index!r} names no shard")
        return paths
    single = os.path.join(directory, _SINGLE)
    if os.path.isfile(single):
        return [single]
    raise FileNotFoundError(
        f"{directory!r} has neither {_SINGLE} nor {_INDEX}; load_pretrained reads "
        "safetensors checkpoints as save_pretrained writes them (not pytorch_model.bin)"
    )


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
