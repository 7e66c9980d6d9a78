"""Helpers shared by the benchmark scripts."""

from __future__ import annotations

import atexit
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from typing import Any

import numpy as np

PEERS = (
    "kvikpy",
    "kvikio-cu13",
    "libkvikio-cu13",
    "cupy-cuda13x",
    "torch",
    "numpy",
    "safetensors",
    "fastsafetensors",
)


def versions() -> dict[str, str]:
    """Python's and every installed peer library's version, for the result headers."""
    found = {"python": platform.python_version()}
    for name in PEERS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def scratch_dir(prefix: str) -> str:
    """A new folder in /tmp for a benchmark's files, removed with everything in it when
    the process exits, however the run ends (a failed child must not leave gigabytes of
    test files on the GPU machine's disk)."""
    folder = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def write_report(
    table: str,
    raw: dict[str, Any],
    markdown_path: str | None,
    json_path: str | None,
    echo: bool = True,
) -> None:
    """Print a benchmark's markdown ``table`` (unless not ``echo``: a partial report
    written as a run goes, so that one stopped by a time limit keeps what it measured),
    and write it to ``markdown_path`` and the ``raw`` results as JSON to ``json_path``
    where they are given (``--markdown``, ``--out``)."""
    if echo:
        sys.stdout.write(table if table.endswith("\n") else table + "\n")
    if markdown_path:
        with open(markdown_path, "w") as fh:
            fh.write(table)
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(raw, fh, indent=1)


def write_random_file(path: str, nbytes: int, seed: int = 0) -> int:
    """Write ``nbytes`` random bytes to ``path`` (256 MiB at a time); return their sum,
    which the benchmarks use to verify every read."""
    rng = np.random.default_rng(seed)
    total = 0
    with open(path, "wb") as fh:
        left = nbytes
        while left:
            block = rng.integers(0, 256, min(256 << 20, left), dtype=np.uint8)
            total += int(block.sum(dtype=np.int64))
            fh.write(block.tobytes())
            left -= len(block)
    return total


def warm_page_cache(path: str) -> None:
    """Read ``path`` once so that it sits in the page cache."""
    with open(path, "rb") as fh:
        while fh.read(256 << 20):
            pass


def run_child(
    code: str,
    *args: object,
    what: str,
    timeout: int = 900,
    env: dict[str, str | None] | None = None,
) -> Any:
    """Run ``python -c code args`` in a fresh process (its own pools, no shared state) with
    ``KVIKIO_COMPAT_MODE=ON`` (the GPU machine has no GPUDirect Storage) and ``env`` (a
    ``None`` value removes the variable); return the JSON value of its last line of
    output. A failing child raises ``RuntimeError`` naming ``what`` with the end of its
    stderr."""
    child_env = dict(os.environ, KVIKIO_COMPAT_MODE="ON")
    for name, value in (env or {}).items():
        if value is None:
            child_env.pop(name, None)
        else:
            child_env[name] = value
    out = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        env=child_env,
        check=False,
        timeout=timeout,
    )
    if out.returncode:
        raise RuntimeError(f"{what}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
