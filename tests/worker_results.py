"""What the distributed test workers (tests/load_into_worker.py,
tests/distributed_load_worker.py) write to their OUT file: each tensor's device, dtype,
shape and bytes (hex), or a failed load's message, as JSON."""

from __future__ import annotations

import json

import torch


def tensor_record(t: torch.Tensor) -> dict[str, object]:
    """One tensor as the tests compare it."""
    return {
        "device": str(t.device),
        "dtype": str(t.dtype),
        "shape": list(t.shape),
        "hex": t.contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes().hex()
        if t.numel()
        else "",
    }


def write(out: str, tensors: dict[str, torch.Tensor]) -> None:
    """Write every tensor of ``tensors`` to the JSON file ``out``."""
    with open(out, "w") as fh:
        json.dump({name: tensor_record(t) for name, t in tensors.items()}, fh)


def write_error(out: str, message: str) -> None:
    """Write a failed load's message to the JSON file ``out``."""
    with open(out, "w") as fh:
        json.dump({"error": message}, fh)
