"""Arrow tables onto the GPU: an IPC file of 10 columns (ints, floats, nulls, a string
column, a list column) read whole and as 2 of 10 columns, warm (in the page cache) and
cold (dropped from it), by ``kvikpy.arrow.read_ipc`` against pyarrow's route (memory-map,
``read_all``, then each column's buffers to the GPU with CuPy).

Prints seconds, GB/s and the bytes each route read from the file; ``--device cpu`` runs
both routes into host memory (a smoke test, no GPU needed).
Usage: python -m benchmarks arrow [--size-mib 4096] [--runs 3] [--device cuda] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import numpy as np

from benchmarks.common import scratch_dir

COLUMNS = [
    "id",
    "a_i32",
    "b_f64",
    "c_f32",
    "d_i16",
    "e_u8",
    "f_f64_nulls",
    "g_i64_nulls",
    "text",
    "tokens",
]
SUBSET = ["b_f64", "text"]


def write_table(path: str, nbytes: int) -> int:
    """Write an IPC file of about ``nbytes``; return its row count."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    rows = 1 << 18
    rng = np.random.default_rng(0)
    valid = rng.random(rows) > 0.1
    lengths = rng.integers(0, 16, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    words = np.array([f"word{i:04d}" for i in range(1000)])
    batch = pa.record_batch(
        {
            "id": pa.array(np.arange(rows, dtype=np.int64)),
            "a_i32": pa.array(rng.integers(0, 1 << 30, rows, dtype=np.int32)),
            "b_f64": pa.array(rng.random(rows)),
            "c_f32": pa.array(rng.random(rows, dtype=np.float32)),
            "d_i16": pa.array(rng.integers(0, 1 << 15, rows, dtype=np.int16)),
            "e_u8": pa.array(rng.integers(0, 255, rows, dtype=np.uint8)),
            "f_f64_nulls": pa.array(rng.random(rows), mask=~valid),
            "g_i64_nulls": pa.array(rng.integers(0, 1 << 40, rows), mask=valid),
            "text": pa.array(words[rng.integers(0, 1000, rows)].tolist()),
            "tokens": pa.ListArray.from_arrays(
                pa.array(offsets), pa.array(rng.integers(0, 50000, offsets[-1], dtype=np.int32))
            ),
        }
    )
    per_batch = batch.nbytes
    count = max(1, nbytes // per_batch)
    with ipc.new_file(path, batch.schema) as w:
        for _ in range(count):
            w.write_batch(batch)
    return rows * count


def drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def kvikpy_route(path: str, columns: list[str] | None, device: str) -> tuple[Any, int]:
    import kvikpy.arrow

    t = kvikpy.arrow.read_ipc(path, columns=columns, device=device)
    return t, t.nbytes


def pyarrow_route(path: str, columns: list[str] | None, device: str) -> tuple[Any, int]:
    import pyarrow as pa
    import pyarrow.ipc as ipc

    with pa.memory_map(path) as source:
        table = ipc.open_file(source).read_all()
        if columns is not None:
            table = table.select(columns)
        out = []
        moved = 0
        for column in table.columns:
            for chunk in column.chunks:
                for buf in chunk.buffers():
                    if buf is None:
                        continue
                    host = np.frombuffer(buf, dtype=np.uint8)
                    if device == "cpu":
                        out.append(host.copy())
                    else:
                        import cupy

                        out.append(cupy.asarray(host))
                    moved += buf.size
    return out, moved


def sync(device: str) -> None:
    if device != "cpu":
        import cupy

        cupy.cuda.runtime.deviceSynchronize()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    folder = scratch_dir("kvikpy-arrow-")
    path = os.path.join(folder, "table.arrow")
    rows = write_table(path, args.size_mib << 20)
    size = os.path.getsize(path)
    print(f"{size / 2**30:.2f} GiB IPC file, {rows:,} rows, 10 columns", flush=True)
    routes = {"kvikpy": kvikpy_route, "pyarrow": pyarrow_route}
    results = []
    for cache in ("warm", "cold"):
        for label, columns in (("whole table", None), ("2 of 10 columns", SUBSET)):
            row: dict[str, Any] = {"cache": cache, "columns": label}
            for name, route in routes.items():
                times = []
                nbytes = 0
                for _ in range(args.runs):
                    if cache == "cold":
                        drop_cache(path)
                    else:
                        with open(path, "rb") as fh:
                            while fh.read(256 << 20):
                                pass
                    t0 = time.perf_counter()
                    out, nbytes = route(path, columns, args.device)
                    sync(args.device)
                    times.append(time.perf_counter() - t0)
                    del out
                best = statistics.median(times)
                row[name] = {"seconds": best, "bytes": nbytes, "gbps": nbytes / best / 1e9}
            results.append(row)
            k, p = row["kvikpy"], row["pyarrow"]
            print(
                f"{cache:4} {label:16} kvikpy {k['seconds'] * 1e3:8.1f} ms "
                f"({k['gbps']:6.2f} GB/s, {k['bytes'] / 2**20:,.0f} MiB)  pyarrow "
                f"{p['seconds'] * 1e3:8.1f} ms ({p['gbps']:6.2f} GB/s)  "
                f"{p['seconds'] / k['seconds']:.2f}x",
                flush=True,
            )
    os.unlink(path)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"file_bytes": size, "rows": rows, "results": results}, fh, indent=1)


if __name__ == "__main__":
    main()
