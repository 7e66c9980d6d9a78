"""The cells of 07-scale-out.ipynb, kept as code for review.

`python notebooks/build.py` writes every notebook from these cells; `make notebooks` also
executes them to refresh their outputs (the test suite executes them on every run).
"""

from nbformat.v4 import new_code_cell, new_markdown_cell

CELLS = [
    new_markdown_cell(
        """# Scale out: several GPUs, many ranks, a Dask cluster

Three ways past one GPU, each checked against numpy on the same bytes:

1. one batch spread over every GPU of this machine (`device=[...]`);
2. a safetensors checkpoint read once for the two ranks of a `torch.distributed` job
   (NCCL between two GPUs, gloo in host memory without them);
3. a Dask array whose chunks kvikpy reads on the workers of a cluster (one worker per GPU
   with `dask_cuda`, CPU workers otherwise).

Each part runs with whatever this machine has and says what it skipped. Part 2 needs
PyTorch and part 3 dask (the `dask` extra: `pip install 'kvikpy[dask]'`, with the wheel's
path in place of `kvikpy` while kvikpy is not on the Package Index). The outputs saved
with this notebook come from the machine described in the first output; the sizes are
small so that it runs anywhere (raise `SIZE_MIB` for a measurement)."""
    ),
    new_code_cell(
        """import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import kvikpy

SIZE_MIB = 64  # per file / per array; e.g. 2048 on a GPU machine
GPUS = kvikpy.device_count() if kvikpy.cuda_available() else 0
folder = Path(tempfile.mkdtemp(prefix="kvikpy-scale-"))
print(f"GPUs: {GPUS} | CPUs: {os.cpu_count()} | kvikpy {kvikpy.__version__}")"""
    ),
    new_markdown_cell(
        """## 1. One batch over every GPU

`read_many(paths, device=[...])` splits the files into runs with about the same bytes per
device and reads the parts at the same time; `batch.device_of(i)` says where file `i`
went. With fewer than two GPUs the same call runs on the one device there is."""
    ),
    new_code_cell(
        """rng = np.random.default_rng(0)
paths = []
for i in range(8):
    p = folder / f"part{i}.bin"
    rng.integers(0, 255, (SIZE_MIB << 20) // 8, dtype=np.uint8).tofile(p)
    paths.append(p)
devices = [f"cuda:{g}" for g in range(GPUS)] or ["cpu"]


def timed_read(device):
    kvikpy.read_many(paths, device=device)  # warm-up (and the page cache)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        batch = kvikpy.read_many(paths, device=device)  # returns once all landed
        times.append(time.perf_counter() - start)
    return batch, sorted(times)[1]


def host_bytes(buf):
    if buf.device == "cpu":
        return bytes(buf)
    import cupy

    with cupy.cuda.Device(int(buf.device.split(":")[1])):
        return cupy.asnumpy(cupy.from_dlpack(buf)).tobytes()


batch, spread_s = timed_read(devices)
for i, p in enumerate(paths):  # every file's bytes, checked where they landed
    assert host_bytes(batch[i]) == p.read_bytes()
print("files per device:", batch.indices)
total = sum(p.stat().st_size for p in paths)
rate = total / spread_s / 1e9
print(f"{len(devices)} device(s): {rate:.1f} GB/s (median of 3, warm)")
if GPUS >= 2:
    _, one_s = timed_read("cuda:0")
    print(f"one GPU: {total / one_s / 1e9:.1f} GB/s; {GPUS} GPUs: {one_s / spread_s:.2f}x")"""
    ),
    new_markdown_cell(
        """## 2. A checkpoint read once for two ranks

Each rank reads half of the checkpoint's bytes from storage; the process group's
all-gather hands each the other half. The two ranks are real processes started the way
`torchrun` starts them. Needs torch; NCCL on two GPUs, gloo in host memory otherwise."""
    ),
    new_code_cell(
        '''RANK_SCRIPT = """
import os, sys, torch, torch.distributed as dist
import kvikpy.safetensors
backend, device, path = sys.argv[1:]
rank = int(os.environ["RANK"])
if device == "cuda":
    torch.cuda.set_device(rank)
    device = f"cuda:{rank}"
dist.init_process_group(backend)
state = kvikpy.safetensors.load_file(path, device, process_group=dist.group.WORLD)
total = sum(int(t.double().sum().item()) for t in state.values())
print(rank, len(state), next(iter(state.values())).device, total)
dist.destroy_process_group()
"""

try:
    import torch
    import torch.distributed as dist
except ImportError:
    torch = None
if torch is None or not dist.is_available():
    print("skipped: torch.distributed is not installed here")
else:
    import json
    import struct

    def save_file(tensors, path):  # the safetensors layout: header, then data
        header, offset = {}, 0
        for name, a in tensors.items():
            header[name] = {
                "dtype": "I32",
                "shape": list(a.shape),
                "data_offsets": [offset, offset + a.nbytes],
            }
            offset += a.nbytes
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(path, "wb") as fh:
            fh.write(struct.pack("<Q", len(text)) + text)
            for a in tensors.values():
                fh.write(a.tobytes())

    tensors = {
        f"layer{i}.weight": rng.integers(-99, 99, (256, 1024), dtype=np.int32) for i in range(16)
    }
    ckpt = folder / "model.safetensors"
    save_file(tensors, str(ckpt))
    backend, device = ("nccl", "cuda") if GPUS >= 2 else ("gloo", "cpu")
    script = folder / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", WORLD_SIZE="2")
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), backend, device, str(ckpt)],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    # Each rank prints one line last (gloo and NCCL may print their own before it).
    outputs = [r.communicate(timeout=300)[0].splitlines()[-1].split() for r in ranks]
    expected = sum(int(a.sum()) for a in tensors.values())
    for out in outputs:
        assert int(out[-1]) == expected, out
    print(backend, [" ".join(o[:3]) for o in outputs], "| sums equal numpy:", expected)
    print("(rank, tensors, device) per rank")'''
    ),
    new_markdown_cell(
        """## 3. A Dask array read by the workers

`kvikpy.dask.from_raw` makes a dask array over a raw file; each read task reads a group of
neighbouring chunks with one kvikpy batch read on the worker. With `dask_cuda` there is
one worker per GPU and the chunks are CuPy arrays on it."""
    ),
    new_code_cell(
        """try:
    import dask
    from dask.distributed import Client, LocalCluster

    import kvikpy.dask
except ImportError:
    Client = None
try:
    from dask_cuda import LocalCUDACluster
except ImportError:
    LocalCUDACluster = None

if Client is None:
    print("skipped: dask is not installed here (pip install 'kvikpy[dask]')")
else:
    raw = folder / "array.f32"
    values = rng.standard_normal((SIZE_MIB << 20) // 4 // 256 * 256, dtype=np.float32)
    values.tofile(raw)
    shape = (values.size // 256, 256)
    # Dask's scratch space (its locks, the workers' spilled data) goes with this
    # notebook's folder.
    dask.config.set({"temporary-directory": str(folder)})
    if GPUS and LocalCUDACluster is not None:
        cluster, device = LocalCUDACluster(dashboard_address=None), "cuda"
    else:
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None)
        device = "cpu"
    with cluster, Client(cluster) as client:
        chunks = (shape[0] // 8, 256)
        x = kvikpy.dask.from_raw(raw, "float32", shape, chunks=chunks, device=device)
        total = float(x.sum(dtype="float64").compute())  # warms the workers up
        times = []
        for _ in range(3):
            start = time.perf_counter()
            x.sum(dtype="float64").compute()
            times.append(time.perf_counter() - start)
        workers = len(client.scheduler_info()["workers"])
    assert np.isclose(total, values.sum(dtype=np.float64))
    print(
        f"{workers} workers ({device} chunks), sum equals numpy; "
        f"{values.nbytes / sorted(times)[1] / 1e9:.2f} GB/s (median of 3 after a warm-up, "
        "graph included)"
    )"""
    ),
    new_markdown_cell(
        """## Clean up

The files this notebook wrote go with their folder."""
    ),
    new_code_cell(
        """import shutil

shutil.rmtree(folder)"""
    ),
]
