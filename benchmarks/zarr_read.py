"""zarr arrays read into CuPy: kvikpy's GDSStore against kvikio's GDSStore and zarr's
LocalStore under ``zarr.config.enable_gpu()``.

One float32 array in 4 MiB chunks (default 4 GiB: 1,024 chunks), written once by zarr on
the CPU, in two forms: uncompressed, and zstd-compressed (level 3) random-walk data (a
cumulative sum rounded to 0.1, which compresses about 2.5x). Two reads of each: the whole
array, and a random selection of chunks (default 1,000, in random order, each read by
its own ``getitem`` and all awaited together), warm (page cache) and cold (each file's
pages dropped with posix_fadvise before every run).

Peers, each in its own fresh process, one warm-up then ``--runs`` timed runs, median
reported, every run's bytes checked against a checksum computed from the data written:

* ``kvikpy``: ``kvikpy.zarr.GDSStore`` under ``kvikpy.zarr.enable_gpu()`` (batches of 128,
  concurrency 64); zstd decodes on the GPU through nvCOMP where it is installed.
* ``kvikpy-zarr-defaults``: the same store under plain ``zarr.config.enable_gpu()``
  (zarr's batch size 1 and concurrency 10).
* ``kvikpy-cpu-decode`` (zstd only): kvikpy's store and batches, with zarr's own CPU zstd
  codec (decode on the host, copy to the GPU): what nvCOMP is measured against.
* ``kvikio``: ``kvikio.zarr.GDSStore`` (kvikio-cu13 26.10) under ``zarr.config.enable_gpu()``.
* ``zarr``: ``zarr.storage.LocalStore`` under ``zarr.config.enable_gpu()``.

Usage: python -m benchmarks zarr [--size-mib 4096] [--chunks 1000] [--runs 5]
[--modes warm,cold] [--out zarr.json] [--markdown zarr.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import numpy as np

from benchmarks.common import run_child, scratch_dir, versions

CHUNK_BYTES = 4 << 20
CHUNK_ITEMS = CHUNK_BYTES // 4

CHILD = r"""
import asyncio, json, os, sys, time
import cupy, numpy as np
peer, root, mode, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
spec = json.loads(sys.argv[5])
import zarr, zarr.storage
from zarr.core.sync import sync
if peer.startswith("kvikpy"):
    import kvikpy.zarr
    store = kvikpy.zarr.GDSStore(root, read_only=True)
    if peer == "kvikpy":
        gpu_mode = kvikpy.zarr.enable_gpu
    else:
        gpu_mode = zarr.config.enable_gpu
    if peer == "kvikpy-cpu-decode":
        codecs = {**zarr.config.get("codecs"), "zstd": "zarr.codecs.zstd.ZstdCodec"}
        zarr.config.set({"codecs": codecs})
        gpu_mode = kvikpy.zarr.enable_gpu
elif peer == "kvikio":
    import kvikio.zarr
    store = kvikio.zarr.GDSStore(root, read_only=True)
    gpu_mode = zarr.config.enable_gpu
else:
    store = zarr.storage.LocalStore(root, read_only=True)
    gpu_mode = zarr.config.enable_gpu
files = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]

def drop():
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)

def checksum(a):
    return int(a.view(cupy.uint32).sum(dtype=cupy.uint64))

n = spec["chunk_items"]
times = []
with gpu_mode():
    arr = zarr.open_array(store, path=spec["array"], mode="r")
    last = type(arr.metadata.codecs[-1])
    codec = last.__module__ + "." + last.__qualname__
    for r in range(1 + runs):
        if mode == "cold":
            drop()
        cupy.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        if spec["what"] == "whole":
            out = arr[:]
            cupy.cuda.runtime.deviceSynchronize()
            dt = time.perf_counter() - t0
            total = checksum(out)
        else:
            async def read_selection(sel=spec["chunks"]):
                return await asyncio.gather(*(
                    arr._async_array.getitem(slice(c * n, (c + 1) * n)) for c in sel))
            parts = sync(read_selection())
            cupy.cuda.runtime.deviceSynchronize()
            dt = time.perf_counter() - t0
            total = sum(checksum(p) for p in parts)
        if total != spec["expected"]:
            raise SystemExit(f"{peer}: wrong bytes in run {r} ({total} != {spec['expected']})")
        if r >= 1:
            times.append(dt)
print(json.dumps({"times": times, "codec": codec}))
"""


def random_walk(items: int, seed: int) -> np.ndarray:
    steps = np.random.default_rng(seed).standard_normal(items, dtype=np.float32)
    return np.cumsum(steps, dtype=np.float32).round(1)


def write_arrays(root: str, size: int) -> dict[str, list[int]]:
    """Write both arrays (block by block); each chunk's checksum, per array."""
    import zarr
    import zarr.codecs
    import zarr.storage

    items = size // 4
    store = zarr.storage.LocalStore(root)
    sums: dict[str, list[int]] = {}
    for name, compressors, seed in (("raw", None, 1), ("zstd", zarr.codecs.ZstdCodec(level=3), 2)):
        a = zarr.create_array(
            store,
            name=name,
            shape=(items,),
            chunks=(CHUNK_ITEMS,),
            dtype="float32",
            compressors=compressors,
        )
        block = 64 * CHUNK_ITEMS
        sums[name] = []
        for start in range(0, items, block):
            data = random_walk(min(block, items - start), seed + start)
            a[start : start + len(data)] = data
            for c in range(0, len(data), CHUNK_ITEMS):
                sums[name].append(
                    int(data[c : c + CHUNK_ITEMS].view(np.uint32).sum(dtype=np.uint64))
                )
    os.sync()
    return sums


def ratio(root: str, name: str, size: int) -> float:
    stored = sum(
        os.path.getsize(os.path.join(d, f))
        for d, _, fs in os.walk(os.path.join(root, name))
        for f in fs
    )
    return size / stored


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=4096)
    parser.add_argument("--chunks", type=int, default=1000, help="chunks in the random selection")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--modes", default="warm,cold")
    parser.add_argument(
        "--peers", default="kvikpy,kvikpy-zarr-defaults,kvikpy-cpu-decode,kvikio,zarr"
    )
    parser.add_argument("--out")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    size = (args.size_mib << 20) // CHUNK_BYTES * CHUNK_BYTES
    if size == 0:
        parser.error("--size-mib must be at least 4 (one chunk)")
    root = scratch_dir("kvikpy-zarr-bench-")
    sums = write_arrays(root, size)
    n_chunks = size // CHUNK_BYTES
    rng = np.random.default_rng(7)
    selection = rng.permutation(n_chunks)[: min(args.chunks, n_chunks)].tolist()
    results: dict[str, object] = {
        "versions": versions(),
        "size_bytes": size,
        "chunk_bytes": CHUNK_BYTES,
        "selected_chunks": len(selection),
        "zstd_ratio": ratio(root, "zstd", size),
        "rows": [],
    }
    rows: list[dict[str, object]] = results["rows"]  # type: ignore[assignment]
    peers = args.peers.split(",")
    for name in ("raw", "zstd"):
        for what in ("whole", "selection"):
            chunks = list(range(n_chunks)) if what == "whole" else selection
            spec = {
                "array": name,
                "what": what,
                "chunk_items": CHUNK_ITEMS,
                "chunks": chunks,
                "expected": sum(sums[name][c] for c in chunks),
            }
            nbytes = len(chunks) * CHUNK_BYTES
            for mode in args.modes.split(","):
                for peer in peers:
                    if peer == "kvikpy-cpu-decode" and name == "raw":
                        continue
                    try:
                        got = run_child(
                            CHILD, peer, root, mode, args.runs, json.dumps(spec),
                            what=f"{peer} {name} {what} {mode}",
                        )  # fmt: skip
                    except RuntimeError as e:
                        rows.append({"array": name, "read": what, "mode": mode, "peer": peer,
                                     "error": str(e)[-300:]})  # fmt: skip
                        print(f"{name:5} {what:9} {mode:4} {peer:22} failed: {str(e)[-200:]}")
                        continue
                    median = statistics.median(got["times"])
                    row = {
                        "array": name,
                        "read": what,
                        "mode": mode,
                        "peer": peer,
                        "codec": got["codec"],
                        "median_s": median,
                        "GBps": nbytes / median / 1e9,
                        "times": got["times"],
                    }
                    rows.append(row)
                    print(f"{name:5} {what:9} {mode:4} {peer:22} {row['GBps']:7.2f} GB/s")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
    table = markdown(results)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(table)


def markdown(results: dict) -> str:
    """The table for docs/benchmarks.md: GB/s of decoded data, median of the runs."""
    lines = [
        f"{results['size_bytes'] >> 20} MiB float32 in 4 MiB chunks; zstd ratio "
        f"{results['zstd_ratio']:.2f}; selection: {results['selected_chunks']} chunks. "
        "GB/s of decoded data (median).",
        "",
        "| array | read | mode | peer | GB/s | vs kvikio | vs zarr |",
        "|---|---|---|---|---|---|---|",
    ]
    ok = [r for r in results["rows"] if "GBps" in r]
    for r in results["rows"]:
        if "error" in r:
            lines.append(f"| {r['array']} | {r['read']} | {r['mode']} | {r['peer']} | failed | | |")
            continue

        def rel(peer: str, r: dict = r) -> str:
            base = [o for o in ok if o["peer"] == peer and
                    all(o[k] == r[k] for k in ("array", "read", "mode"))]  # fmt: skip
            return f"{r['GBps'] / base[0]['GBps']:.2f}x" if base else ""

        lines.append(
            f"| {r['array']} | {r['read']} | {r['mode']} | {r['peer']} | {r['GBps']:.2f} "
            f"| {rel('kvikio')} | {rel('zarr')} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
