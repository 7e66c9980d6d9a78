"""Arrow tables onto the GPU: an IPC file of 10 columns (ints, floats, nulls, a string
column, a list column) read whole and as 2 of 10 columns, warm (in the page cache) and
cold (dropped from it), by ``kvikpy.arrow.read_ipc`` against pyarrow's route (memory-map,
``read_all``, then each column's buffers to the GPU with CuPy).

Each route is run once untimed before the clock starts (CUDA's start-up, CuPy's import,
the pinned staging buffers and the thread pool are a process's first-call costs, not a
read's; the JSON keeps that first call's time apart as ``first_call_seconds``). Prints
seconds, GB/s and the bytes each route read from the file, and where the whole-table
read's time goes (``phases``: the footer and metadata, the batch read, handing every
column out as an Arrow device array), and the whole table written back by
``kvikpy.arrow.write_ipc`` (from GPU memory) against pyarrow's route (to the host, then its
IPC writer); ``--device cpu`` runs both routes in host memory (no GPU needed).
Usage: python -m benchmarks arrow [--size-mib 4096] [--runs 3] [--device cuda] [--out F]
    [--markdown F]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np

from benchmarks.common import scratch_dir, write_report

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


def warm(path: str) -> None:
    with open(path, "rb") as fh:
        while fh.read(256 << 20):
            pass


def phases(path: str, device: str, runs: int) -> dict[str, float]:
    """Where a warm whole-table read's time goes, median seconds of ``runs``: the footer
    and metadata alone (no record batch chosen), the whole read (``read_ipc``), and
    handing every column of every record batch out as an Arrow (device) array."""
    import kvikpy.arrow

    meta, read, export = [], [], []
    for _ in range(runs):
        warm(path)
        t0 = time.perf_counter()
        kvikpy.arrow.read_ipc(path, batches=[], device=device)
        meta.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        table = kvikpy.arrow.read_ipc(path, device=device)
        sync(device)
        read.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for name in table.column_names:
            for chunk in table.column(name):
                chunk.__arrow_c_device_array__()
        export.append(time.perf_counter() - t0)
        del table
    return {
        "metadata": statistics.median(meta),
        "read": statistics.median(read),
        "export_columns": statistics.median(export),
    }


def writes(path: str, device: str, runs: int, folder: str) -> dict[str, Any]:
    """The whole table written back as an IPC file (into the page cache, no fsync), median
    of ``runs``: ``kvikpy.arrow.write_ipc`` of the table read by kvikpy (from GPU memory
    on a GPU) against pyarrow's route (the table copied to the host, then pyarrow's IPC
    writer)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    import kvikpy.arrow

    table = kvikpy.arrow.read_ipc(path, device=device)
    sync(device)
    out = os.path.join(folder, "written.arrow")
    own, theirs = [], []
    size = 0
    for _ in range(runs):
        t0 = time.perf_counter()
        size = kvikpy.arrow.write_ipc(out, table)
        own.append(time.perf_counter() - t0)
        os.unlink(out)
        t0 = time.perf_counter()
        host = pa.table(table.to_host())
        with ipc.new_file(out, host.schema) as w:
            w.write_table(host)
        theirs.append(time.perf_counter() - t0)
        os.unlink(out)
        del host
    return {
        "bytes": size,
        "kvikpy": stats(own),
        "pyarrow": stats(theirs),
    }


def stats(times: list[float]) -> dict[str, Any]:
    return {
        "seconds": statistics.median(times),
        "min": min(times),
        "max": max(times),
        "runs": times,
    }


def markdown(report: dict[str, Any]) -> str:
    """The results as the table of docs/benchmarks.md."""
    lines = [
        f"{report['file_bytes'] / 2**30:.2f} GiB IPC file, {report['rows']:,} rows, "
        f"10 columns, median of {report['runs']} runs after one untimed call of each route",
        "",
        "| read | kvikpy | bytes kvikpy read | pyarrow + CuPy | kvikpy / pyarrow |",
        "|---|---|---|---|---|",
    ]
    for r in report["results"]:
        k, p = r["kvikpy"], r["pyarrow"]
        lines.append(
            f"| {r['cache']}, {r['columns']} | {k['seconds'] * 1e3:,.1f} ms "
            f"({k['gbps']:.2f} GB/s) | {k['bytes'] / 2**20:,.0f} MiB | "
            f"{p['seconds'] * 1e3:,.1f} ms ({p['gbps']:.2f} GB/s) | "
            f"{p['seconds'] / k['seconds']:.2f}x |"
        )
    ph = report["phases"]
    lines += [
        "",
        f"Whole table, warm, by phase: metadata {ph['metadata'] * 1e3:.2f} ms, read "
        f"{ph['read'] * 1e3:.1f} ms (metadata included), every column handed out as an "
        f"Arrow array {ph['export_columns'] * 1e3:.2f} ms. The first call of a process "
        f"took {report['first_call_seconds'] * 1e3:.0f} ms (start-up included; untimed "
        "above).",
    ]
    w = report.get("write")
    if w:
        k, p = w["kvikpy"]["seconds"], w["pyarrow"]["seconds"]
        lines += [
            "",
            f"Writing the whole table back ({w['bytes'] / 2**20:,.0f} MiB, into the page "
            f"cache): `write_ipc` {k * 1e3:,.1f} ms ({w['bytes'] / k / 1e9:.2f} GB/s), "
            f"pyarrow (to the host, then its IPC writer) {p * 1e3:,.1f} ms: {p / k:.2f}x.",
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default=None, help="the JSON results")
    parser.add_argument("--markdown", default=None, help="the table, also printed")
    args = parser.parse_args()
    if args.runs < 1 or args.size_mib < 1:
        parser.error("--runs and --size-mib must be at least 1")
    folder = scratch_dir("kvikpy-arrow-")
    path = os.path.join(folder, "table.arrow")
    rows = write_table(path, args.size_mib << 20)
    size = os.path.getsize(path)
    print(f"{size / 2**30:.2f} GiB IPC file, {rows:,} rows, 10 columns", flush=True)
    routes = {"kvikpy": kvikpy_route, "pyarrow": pyarrow_route}
    # One untimed call of each route first: CUDA's start-up, CuPy's import, the pinned
    # staging buffers and the pool's threads are the process's, not the read's.
    first_call = 0.0
    for name, route in routes.items():
        warm(path)
        t0 = time.perf_counter()
        out, _ = route(path, None, args.device)
        sync(args.device)
        if name == "kvikpy":
            first_call = time.perf_counter() - t0
        del out
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
                        warm(path)
                    t0 = time.perf_counter()
                    out, nbytes = route(path, columns, args.device)
                    sync(args.device)
                    times.append(time.perf_counter() - t0)
                    del out
                row[name] = stats(times)
                row[name]["bytes"] = nbytes
                row[name]["gbps"] = nbytes / row[name]["seconds"] / 1e9
            results.append(row)
            k, p = row["kvikpy"], row["pyarrow"]
            print(
                f"{cache:4} {label:16} kvikpy {k['seconds'] * 1e3:8.1f} ms "
                f"({k['gbps']:6.2f} GB/s, {k['bytes'] / 2**20:,.0f} MiB)  pyarrow "
                f"{p['seconds'] * 1e3:8.1f} ms ({p['gbps']:6.2f} GB/s)  "
                f"{p['seconds'] / k['seconds']:.2f}x",
                flush=True,
            )
    report = {
        "file_bytes": size,
        "rows": rows,
        "runs": args.runs,
        "device": args.device,
        "first_call_seconds": first_call,
        "phases": phases(path, args.device, args.runs),
        "write": writes(path, args.device, args.runs, folder),
        "results": results,
    }
    os.unlink(path)
    write_report(markdown(report), report, args.markdown, args.out)


if __name__ == "__main__":
    main()
