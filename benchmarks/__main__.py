"""`python -m benchmarks NAME [ARGS...]`: run one of kvikpy's benchmarks.

NAME is one of: demo, ceilings, large (against kvikio), small (many small files),
checkpoint (safetensors), host (into numpy), smoke (per-call cost of small reads),
startup (import to the first 1 MiB on the GPU), ranges (random byte ranges), sizes
(throughput against file size into device, pinned and host memory), batch (read_many
and read_ranges against per-file loops), progress (what progress=True costs), tasks
(kvikpy's own throughput at several task sizes), wheels (two builds of kvikpy side by
side), remote (RemoteFile over HTTP into GPU memory against kvikio), zarr (zarr arrays
into CuPy: kvikpy.zarr.GDSStore against kvikio's and zarr's), distributed (a sharded
checkpoint onto every GPU of a host: kvikpy's process_group load against InstantTensor
and fastsafetensors), multi_gpu (every GPU of a host at once: copy and pread ceilings
against kvikpy's read_many over all GPUs), dask_sum (a dask sum over a raw file read by
kvikpy.dask, one worker per GPU, one GPU against all), regimes (kvikpy against kvikio
in every regime side by side: per-call reads, a file loop, writes, the first read, a
large file cold, warm and half warm, and the disk's own ceiling), percall (where the
microseconds of a small blocking read go, step by step, against kvikio), load_into (a
transformers checkpoint into a model: time and peak GPU and host memory of
load_pretrained against load_file + load_state_dict, safetensors and from_pretrained),
arrow (Arrow IPC tables onto the GPU: kvikpy.arrow.read_ipc against pyarrow plus CuPy,
whole and 2 of 10 columns, warm and cold), arrow-zstd (a compressed IPC file onto the
GPU: nvCOMP decoding against host decoding and pyarrow plus CuPy), arrow-wide (a table of
100,000 columns on the host, whole and chosen by name, against pyarrow), arrow-host (Arrow
tables into host memory against pyarrow's read_all and memory map, three shapes),
remote-checkpoint (a safetensors checkpoint from a loopback S3 server onto the GPU:
kvikpy's load_file against the Run:ai model streamer and boto3 + safetensors, beside the
server's own ceiling), save (a checkpoint written by kvikpy's save_file, its background
save and save_pretrained against safetensors, torch.save and torch.distributed.checkpoint,
to the disk and to /dev/shm).
Each prints a summary and takes --help; see docs/benchmarks.md for the results so far.
"""

from __future__ import annotations

import importlib
import sys

SCRIPTS = {
    "demo": "benchmarks.demo",
    "ceilings": "benchmarks.ceilings",
    "large": "benchmarks.compare_kvikio",
    "small": "benchmarks.small_files",
    "checkpoint": "benchmarks.checkpoint",
    "host": "benchmarks.host_read",
    "smoke": "benchmarks.gpu_smoke",
    "startup": "benchmarks.startup",
    "ranges": "benchmarks.ranges",
    "sizes": "benchmarks.sizes",
    "batch": "benchmarks.batch",
    "progress": "benchmarks.progress",
    "tasks": "benchmarks.tasks",
    "wheels": "benchmarks.wheels",
    "remote": "benchmarks.remote",
    "zarr": "benchmarks.zarr_read",
    "distributed": "benchmarks.distributed",
    "multi_gpu": "benchmarks.multi_gpu",
    "dask_sum": "benchmarks.dask_sum",
    "regimes": "benchmarks.regimes",
    "percall": "benchmarks.percall",
    "load_into": "benchmarks.load_into",
    "save": "benchmarks.save",
    "arrow": "benchmarks.arrow_tables",
    "arrow-zstd": "benchmarks.arrow_zstd",
    "arrow-wide": "benchmarks.arrow_wide",
    "arrow-host": "benchmarks.arrow_host",
    "remote-checkpoint": "benchmarks.remote_checkpoint",
}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in SCRIPTS:
        print(__doc__)
        return 2
    name = sys.argv.pop(1)
    sys.argv[0] = f"python -m benchmarks {name}"
    result = importlib.import_module(SCRIPTS[name]).main()
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
