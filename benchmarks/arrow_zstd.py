"""Compressed Arrow IPC tables onto the GPU: a ZSTD- (or LZ4-) compressed IPC file read
warm by ``kvikpy.arrow.read_ipc`` with ``decode="gpu"`` (nvCOMP on the GPU) against
``decode="host"`` (host decoding, one copy to the GPU) and pyarrow's route (``read_all``
then each buffer to the GPU with CuPy).

Prints seconds and GB/s of decoded table per second for each route; ``--device cpu``
runs the host routes only (a smoke test, no GPU needed).
Usage: python -m benchmarks arrow-zstd [--size-mib 1024] [--runs 3] [--codec zstd]
[--batch-rows 65536] [--device cuda] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.common import scratch_dir


def write_table(path: str, nbytes: int, codec: str, rows: int) -> int:
    """Write a compressed IPC file of about ``nbytes`` decoded; return the decoded bytes."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    rng = np.random.default_rng(0)
    words = np.array([f"token{i:05d}" for i in range(5000)])
    batch = pa.record_batch(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "label": pa.array(rng.integers(0, 10, rows, dtype=np.int32)),
            "score": pa.array(rng.random(rows, dtype=np.float32).round(2)),
            "text": pa.array(words[rng.integers(0, 5000, rows)].tolist()),
        }
    )
    count = max(1, nbytes // batch.nbytes)
    options = ipc.IpcWriteOptions(compression=codec)
    with ipc.new_file(path, batch.schema, options=options) as w:
        for _ in range(count):
            w.write_batch(batch)
    return int(batch.nbytes * count)


def best(fn: Callable[[], Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--codec", choices=["zstd", "lz4"], default="zstd")
    p.add_argument("--batch-rows", type=int, default=1 << 16, help="rows per record batch")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    import pyarrow as pa
    import pyarrow.ipc as ipc

    import kvikpy.arrow

    path = os.path.join(scratch_dir("kvikpy-arrow-zstd-"), f"t-{args.codec}.arrow")
    decoded = write_table(path, args.size_mib << 20, args.codec, args.batch_rows)
    pieces, host, _, _ = kvikpy._lib.ipc_decode_plan(path, None, None)
    gpu_work = {
        "frames_or_blocks": sum(1 for p in pieces if p[0] != 0),
        "copies": sum(1 for p in pieces if p[0] == 0),
        "host_decoded_buffers": len(host),
    }
    print(
        f"{os.path.getsize(path):,} bytes on disk, {decoded:,} decoded; for the GPU: "
        f"{gpu_work['frames_or_blocks']} frames or blocks, {gpu_work['copies']} copies; "
        f"{gpu_work['host_decoded_buffers']} buffers decoded on the host"
    )
    routes: dict[str, Callable[[], Any]] = {
        "kvikpy decode=host": lambda: kvikpy.arrow.read_ipc(
            path, device=args.device, decode="host"
        ),
    }
    if args.device != "cpu":
        import cupy

        def pyarrow_route() -> None:
            table = ipc.open_file(path).read_all()
            for column in table.columns:
                for chunk in column.chunks:
                    for buf in chunk.buffers():
                        if buf is not None:
                            cupy.asarray(np.frombuffer(buf, dtype=np.uint8))
            cupy.cuda.Device().synchronize()

        def in_place() -> None:
            kvikpy.arrow._ZSTD_IN_PLACE = True
            try:
                kvikpy.arrow.read_ipc(path, decode="gpu")
            finally:
                kvikpy.arrow._ZSTD_IN_PLACE = False

        routes["kvikpy decode=gpu"] = lambda: kvikpy.arrow.read_ipc(path, decode="gpu")
        if args.codec == "zstd":
            routes["kvikpy gpu, in place"] = in_place
        routes["pyarrow + cupy"] = pyarrow_route
    else:
        routes["pyarrow read_all"] = lambda: pa.table(ipc.open_file(path).read_all())
    results = {}
    for name, fn in routes.items():
        fn()  # warm: the file in the page cache, nvCOMP loaded
        seconds = best(fn, args.runs)
        results[name] = {"seconds": seconds, "gb_per_s": decoded / seconds / 1e9}
        print(f"{name:22s} {seconds:8.3f} s  {decoded / seconds / 1e9:7.2f} GB/s decoded")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "codec": args.codec,
                    "decoded_bytes": decoded,
                    "gpu_work": gpu_work,
                    "routes": results,
                },
                f,
            )


if __name__ == "__main__":
    main()
