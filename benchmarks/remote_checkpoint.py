"""A safetensors checkpoint read from a loopback S3 server onto the GPU: kvikpy's
``load_file("s3://...")`` against the Run:ai model streamer and boto3 + safetensors,
beside the server's own ceiling, measured in the same run.

One checkpoint of ``--size-mib`` in ``--tensors`` tensors of random float32, float16 and
(where torch writes the file) bfloat16 values is uploaded once, with boto3, to a bucket of
moto's S3 server, started by this script on 127.0.0.1 in a process of its own (werkzeug's
threaded server) and stopped however the run ends. Every client reads it from there with
the same fake credentials, given in the environment (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL``). Contenders
(``--libs``):

* ``kvikpy``: ``kvikpy.safetensors.load_file(url, device=device)``, at kvikpy's default
  threads and task size (recorded);
* ``runai``: the Run:ai model streamer (``runai_model_streamer.SafetensorsStreamer``:
  ``stream_file(url)``, then every tensor of ``get_tensors()`` moved to the device), set up
  for a path-style, plain-HTTP endpoint as its documentation says
  (``RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=0``, ``AWS_EC2_METADATA_DISABLED=true``);
  its threads are ``RUNAI_STREAMER_CONCURRENCY`` (``--runai-concurrency``; unset, its
  default, 8 for object storage), recorded as used;
* ``boto3+safetensors``: ``get_object`` of the whole object into bytes,
  ``safetensors.torch.load`` of those, then every tensor moved to the device;
* ``ceiling``: the server's own ceiling: the object fetched with ``--ceiling-streams``
  concurrent signed ranged GETs (``http.client``, one connection each, ranges of
  ``--ceiling-part-mib``, by default the object split evenly between the streams) into one
  host buffer, checked and discarded: what the server sends a client that does nothing
  else;
* ``kvikpy-numpy`` and ``boto3-numpy``, with ``--device cpu`` only: the same into numpy
  arrays (``framework="numpy"``, ``safetensors.numpy.load``), for machines without torch
  or a GPU (the checkpoint then has no bfloat16 tensors).

Local rows, ``local-*``: the same checkpoint bytes read from a file on the local disk (the
file the object was uploaded from, kept in the scratch folder; its filesystem is
recorded), its pages in the page cache (warm: the file is read once before each of their
processes, and the share of its pages cached then is recorded), so that the remote and
local numbers sit side by side:

* ``local-kvikpy``: ``kvikpy.safetensors.load_file(path, device=device)``;
* ``local-kvikpy-into``: ``kvikpy.safetensors.load_into(tensors, path)`` into tensors
  allocated before, as ``kvikpy-into`` does from the server;
* ``local-safetensors``: ``safetensors.torch.load_file(path, device=device)``;
* ``local-instanttensor``: InstantTensor's ``safe_open(path, framework="pt",
  device=device, backend=BackendPolicy.BUFFERED)``, every tensor of ``tensors()``: one
  process on one GPU, no process group; its buffered backend, the one for a file the page
  cache holds (its default reads with ``O_DIRECT``). It loads onto CUDA devices only:
  skipped with ``--device cpu``;
* ``local-flashpack``: FlashPack's ``assign_from_file(model, pack, device=device)``.
  FlashPack reads its own file format only, so the checkpoint is converted into it once
  (``pack_to_file`` of the tensors ``safetensors.torch.load_file`` reads, every dtype
  kept), in a process of its own before the rounds and outside every clock (its time and
  the pack's size are recorded); the pack is warmed as the checkpoint is. FlashPack
  assigns tensors to a ``torch.nn.Module``, not into a dict, so each load gets a module
  built before the clock that holds every tensor as a parameter on the meta device (no
  memory, as FlashPack's own ``from_flashpack`` builds a model's skeleton), and the load's
  tensors are its parameters afterwards. With ``--device cpu`` it runs with
  ``FLASHPACK_CPU_PARALLEL_READ=1`` (unless set): by default FlashPack maps a file for a
  host target lazily, and the load would read no byte.

Under the table, ratios of the medians: each kvikpy row against the peers that read from
the same place (the server, or the local file), and ``kvikpy`` against ``local-kvikpy``.

GB/s is checkpoint bytes (the object's size, for the local rows too, FlashPack's included)
per second, from the start of the load to its last tensor on the device (synchronised).
Each library runs in its own fresh process per round, the order reversed every other
round; a process does one verified warm-up load, then ``--runs`` timed loads. Every load's
tensors (names, dtypes, shapes, device) are checked outside the clock against per-tensor
sums of their bytes computed when the file was written (the ceiling's buffer, zeroed
before each fetch, against the object's byte sum). Reported: the median over all timed
loads with the lowest and highest, the child's peak host RSS (``VmHWM``, beside its
resident size before the first load; ``ru_maxrss`` would start at the parent's own peak,
kept through vfork and exec) and the peak GPU memory of a load: the device's used memory
(``torch.cuda.mem_get_info``, sampled every 5 ms by a thread) above what it was before the
load, torch's cache emptied between loads as in a fresh process, and what the process
still held on the device between loads beyond its CUDA context (a library's own pools).
Libraries that cannot be imported are reported as skipped with the reason; a peer that
fails is reported and the others go on (a kvikpy failure makes the exit status 1).

moto's server answers a GET, ranged or not, by reading the whole object from its spooled
temporary file and slicing it, so with a 2 GiB object each 4 MiB range would cost a
2 GiB read: that would measure moto, not the clients. Its process therefore keeps an
object's bytes in memory once read (one small change to ``FakeKey.value``, made before
the server starts; its S3 protocol and request handling are moto's own), and the object
is read once before the first contender. ``--moto-as-is`` runs moto unchanged.

Usage: python -m benchmarks remote-checkpoint [--size-mib 2048] [--tensors 256]
    [--rounds 2] [--runs 3] [--device cuda:0] [--libs kvikpy,runai,boto3+safetensors,ceiling]
    [--ceiling-streams 16] [--runai-concurrency N] [--out F.json] [--markdown F.md]

The remote and local rows of one run, side by side (every contender but the staging
variants)::

    --libs kvikpy,kvikpy-into,runai,boto3+safetensors,ceiling,local-kvikpy,\
local-kvikpy-into,local-safetensors,local-instanttensor,local-flashpack

On the GPU machine (no network): the wheels of ``make remote-wheels`` (.rwhl/),
``make streamer-wheels`` (.swhl/) and ``make peer-wheels`` (.pwhl/, FlashPack) installed
beside kvikpy's (.gpu/), InstantTensor's from .whl/: carry .pwhl/ beside .gpu/ .rwhl/
.swhl/ .whl/.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import numpy as np

from benchmarks.common import run_child, scratch_dir, versions, warm_page_cache, write_report

BUCKET = "kvikpy-bench"
KEY = "model.safetensors"
MiB = 1 << 20

# What each contender does, for the table.
LIBS = {
    "kvikpy": '`kvikpy.safetensors.load_file("s3://...", device=...)`',
    "runai": "Run:ai `SafetensorsStreamer.stream_file`, each tensor `.to(device)`",
    "boto3+safetensors": "boto3 `get_object` into bytes, `safetensors.torch.load`, "
    "each tensor `.to(device)`",
    "kvikpy-into": '`kvikpy.safetensors.load_into(tensors, "s3://...")` into tensors '
    "allocated before, staging at its default (`checkpoint_staging` 512 MiB)",
    "kvikpy-into-256m": "the same, `checkpoint_staging` 256 MiB",
    "kvikpy-into-1g": "the same, `checkpoint_staging` 1 GiB",
    "kvikpy-numpy": '`kvikpy.safetensors.load_file("s3://...", framework="numpy")`',
    "boto3-numpy": "boto3 `get_object` into bytes, `safetensors.numpy.load`",
    "ceiling": "the server's ceiling",
    # The local rows: the table adds where they read from (a warm page cache).
    "local-kvikpy": "`kvikpy.safetensors.load_file(path, device=...)`",
    "local-kvikpy-into": "`kvikpy.safetensors.load_into(tensors, path)` into tensors "
    "allocated before, staging at its default",
    "local-safetensors": "`safetensors.torch.load_file(path, device=...)`",
    "local-instanttensor": 'InstantTensor `safe_open(path, framework="pt", device=..., '
    "backend=BackendPolicy.BUFFERED)`, every tensor of `tensors()`, one process, no process "
    "group",
    "local-flashpack": "FlashPack `assign_from_file(model, pack, device=...)` into a module "
    "whose parameters wait on the meta device; the pack converted from the checkpoint "
    "(`pack_to_file`) once before the rounds, not timed",
}
DEFAULT_LIBS = "kvikpy,runai,boto3+safetensors,ceiling"
# The remote and the local rows side by side (all but kvikpy-into's staging variants).
FULL_LIBS = (
    "kvikpy,kvikpy-into,runai,boto3+safetensors,ceiling,local-kvikpy,local-kvikpy-into,"
    "local-safetensors,local-instanttensor,local-flashpack"
)
HOST_ONLY = ("kvikpy-numpy", "boto3-numpy")  # numpy arrays: host memory, no bfloat16
INTO = {"kvikpy-into": None, "kvikpy-into-256m": 256 * MiB, "kvikpy-into-1g": 1024 * MiB}
# The same checkpoint read from the local disk, not from the server.
LOCAL = (
    "local-kvikpy",
    "local-kvikpy-into",
    "local-safetensors",
    "local-instanttensor",
    "local-flashpack",
)
# A failure here fails the run.
OWN = ("kvikpy", "kvikpy-numpy", *INTO, "local-kvikpy", "local-kvikpy-into")
# Beside common.PEERS: the clients, the server and the local peers.
EXTRA_VERSIONS = (
    "runai-model-streamer",
    "runai-model-streamer-s3",
    "boto3",
    "botocore",
    "moto",
    "werkzeug",
    "instanttensor",
    "flashpack",
    "accelerate",
)
# Fake credentials: moto accepts any.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "kvikpy_bench_key",
    "AWS_SECRET_ACCESS_KEY": "kvikpy_bench_secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}
RUNAI_SETTINGS = (
    "RUNAI_STREAMER_CONCURRENCY",
    "RUNAI_STREAMER_CHUNK_BYTESIZE",
    "RUNAI_STREAMER_MEMORY_LIMIT",
    "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING",
)

# moto's S3 server in this process's child: started on an ephemeral port of ``host``,
# which it prints; it stops when its standard input closes (the benchmark ends or dies).
SERVER = r"""
import logging, os, sys
host, cache = sys.argv[1], sys.argv[2] == "1"
if cache:
    # moto re-reads the whole object for every GET and slices it: keep the bytes once read.
    from moto.s3.models import FakeKey
    stored = FakeKey.value
    def value(self):
        got = self.__dict__.get("_bench_value")
        if got is None:
            got = self.__dict__["_bench_value"] = stored.fget(self)
        return got
    def set_value(self, new):
        self.__dict__.pop("_bench_value", None)
        stored.fset(self, new)
    FakeKey.value = property(value, set_value)
logging.getLogger("werkzeug").setLevel(logging.ERROR)
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address=host, port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
sys.stdin.read()
server.stop()
"""

CHILD = r"""
import contextlib, gc, json, os, resource, sys, threading, time
lib, url, device, runs, expected_path = sys.argv[1:6]
runs = int(runs)
with open(expected_path) as fh:
    expected = json.load(fh)
bucket, key = url[len("s3://"):].split("/", 1)
local = lib.startswith("local-")
path = expected["local_path"]  # the same checkpoint on the local disk
source = path if local else url
torch = None
if lib == "local-instanttensor" and device == "cpu":
    print(json.dumps({"skipped": "InstantTensor loads onto CUDA devices only "
                      "(its safe_open refuses a cpu device)"}))
    sys.exit(0)
if lib == "local-flashpack" and device == "cpu":
    # For a host target FlashPack maps the file lazily by default: the load would read none
    # of it. Its parallel reader reads the bytes.
    os.environ.setdefault("FLASHPACK_CPU_PARALLEL_READ", "1")
try:
    into = lib.startswith("kvikpy-into") or lib == "local-kvikpy-into"
    if lib in ("kvikpy", "runai", "boto3+safetensors") or into or local:
        import torch
    if lib in ("kvikpy", "kvikpy-numpy", "local-kvikpy") or into:
        import kvikpy, kvikpy.safetensors
    if lib == "runai":
        import runai_model_streamer_s3.credentials.credentials  # the S3 plug-in
        from runai_model_streamer import SafetensorsStreamer
    if lib in ("boto3+safetensors", "boto3-numpy"):
        import boto3
    if lib in ("boto3+safetensors", "local-safetensors"):
        import safetensors.torch
    if lib == "boto3-numpy":
        import safetensors.numpy
    if lib == "local-instanttensor":
        from instanttensor import BackendPolicy, safe_open
    if lib == "local-flashpack":
        from flashpack import assign_from_file
    if lib == "ceiling":
        import http.client
        from urllib.parse import urlsplit
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials
except (ImportError, OSError) as e:
    print(json.dumps({"skipped": f"{type(e).__name__}: {e}"}))
    sys.exit(0)
import numpy as np

cuda = torch is not None and torch.device(device).type == "cuda"
target = torch.device(device) if torch is not None else None
machine = ""

def gpu_used():
    free, total = torch.cuda.mem_get_info(target)
    return total - free

if cuda:
    torch.zeros(1, device=target)  # the CUDA context, before any clock
    torch.cuda.synchronize(target)
    torch.cuda.empty_cache()
    machine = torch.cuda.get_device_name(target)
    gpu_floor = gpu_used()  # the context alone

def sync():
    if cuda:
        torch.cuda.synchronize(target)

def memory_mib(field):
    # VmHWM, not ru_maxrss: through vfork and exec, ru_maxrss starts at the launching
    # process's own peak; VmHWM is this program's alone.
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

settings = {}
prepare = None  # what a load needs ready before its clock starts, done before each load
kinds = {}
if torch is not None:
    kinds = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
if lib in ("kvikpy", "local-kvikpy"):
    def load():
        return kvikpy.safetensors.load_file(source, device=device)
elif into:
    # The tensors exist before the clock (as a model's do); only the staging is the load's.
    staging = expected["staging"].get(lib)
    if staging is not None:
        kvikpy.defaults.set("checkpoint_staging", staging)
    _, header, _ = kvikpy.safetensors.read_header(source)
    targets = {n: torch.empty(i["shape"], dtype=kinds[i["dtype"]], device=target)
               for n, i in header.items()}
    def load():
        kvikpy.safetensors.load_into(targets, source)
        return targets
elif lib == "local-safetensors":
    def load():
        return safetensors.torch.load_file(path, device=device)
elif lib == "local-instanttensor":
    # One process on one GPU, no process group; its buffered backend: the page cache holds
    # the file (its default backend reads with O_DIRECT).
    gpu = target if target.index is not None else torch.device("cuda", torch.cuda.current_device())
    def load():
        with safe_open(path, framework="pt", device=gpu, backend=BackendPolicy.BUFFERED) as f:
            out = dict(f.tensors())
        settings.update(backend=f.backend.name, chunk_size=f.chunk_size, io_depth=f.io_depth,
                        concurrency=f.concurrency, buffer_size=f.buffer_size)
        return out
elif lib == "local-flashpack":
    pack = expected["flashpack_path"]
    settings = {"pack_bytes": expected["flashpack_bytes"],
                "convert_seconds": expected["flashpack_seconds"]}
    settings |= {k: v for k, v in sorted(os.environ.items()) if k.startswith("FLASHPACK_")}
    model = None
    def prepare():
        # A model's skeleton, as FlashPack's from_flashpack builds one: every tensor a
        # parameter on the meta device (no memory), which the load replaces with its own.
        global model
        model = torch.nn.Module()
        for name, info in expected["tensors"].items():
            *parents, leaf = name.split(".")
            owner = model
            for part in parents:
                if part not in owner._modules:
                    owner.add_module(part, torch.nn.Module())
                owner = owner._modules[part]
            empty = torch.empty(info["shape"], dtype=kinds[info["dtype"]], device="meta")
            owner.register_parameter(leaf, torch.nn.Parameter(empty, requires_grad=False))
    def load():
        assign_from_file(model, pack, device=target)
        return dict(model.named_parameters())
elif lib == "kvikpy-numpy":
    def load():
        return kvikpy.safetensors.load_file(url, device="cpu", framework="numpy")
elif lib == "runai":
    settings = {k: os.environ.get(k, "default") for k in expected["runai_settings"]}
    def load():
        out = {}
        with SafetensorsStreamer() as streamer:
            streamer.stream_file(url)
            for name, t in streamer.get_tensors():
                out[name] = t.to(target)  # its tensors are the caller's (owned=True)
        return out
elif lib in ("boto3+safetensors", "boto3-numpy"):
    import botocore
    settings = {"botocore": botocore.__version__}
    def fetch():
        client = boto3.client("s3")
        return client.get_object(Bucket=bucket, Key=key)["Body"].read()
    if lib == "boto3-numpy":
        def load():
            return safetensors.numpy.load(fetch())
    else:
        def load():
            return {k: v.to(target) for k, v in safetensors.torch.load(fetch()).items()}
else:  # the server's ceiling: concurrent signed ranged GETs into one host buffer
    endpoint = urlsplit(os.environ["AWS_ENDPOINT_URL"])
    size = expected["file_bytes"]
    streams = expected["ceiling_streams"]
    part = expected["ceiling_part_bytes"] or -(-size // streams)
    creds = Credentials(os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])
    region = os.environ["AWS_DEFAULT_REGION"]
    object_url = f"{endpoint.scheme}://{endpoint.netloc}/{bucket}/{key}"
    parts = [(a, min(size, a + part)) for a in range(0, size, part)]
    settings = {"streams": min(streams, len(parts)), "part_bytes": part, "requests": len(parts)}
    buf = np.zeros(size, dtype=np.uint8)
    view = memoryview(buf)

    def stream(todo, lock, errors):
        conn = http.client.HTTPConnection(endpoint.hostname, endpoint.port, timeout=300)
        try:
            while True:
                with lock:
                    if not todo:
                        return
                    a, b = todo.pop()
                request = AWSRequest(method="GET", url=object_url,
                                     headers={"Range": f"bytes={a}-{b - 1}"})
                S3SigV4Auth(creds, "s3", region).add_auth(request)
                conn.request("GET", f"/{bucket}/{key}", headers=dict(request.headers.items()))
                response = conn.getresponse()
                if response.status != 206:
                    raise RuntimeError(f"bytes {a}-{b - 1}: HTTP {response.status}")
                got = a
                while got < b:
                    n = response.readinto(view[got:b])
                    if not n:
                        raise RuntimeError(f"bytes {a}-{b - 1}: short body at {got}")
                    got += n
                response.read()
        except BaseException as e:
            errors.append(e)
        finally:
            conn.close()

    def load():
        todo, lock, errors = list(reversed(parts)), threading.Lock(), []
        threads = [threading.Thread(target=stream, args=(todo, lock, errors))
                   for _ in range(settings["streams"])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return buf

DTYPES = {}
if torch is not None:
    DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}

def check(state):
    # Outside the clock: every tensor's name, dtype, shape, device and byte sum.
    if lib == "ceiling":
        got = int(state.sum(dtype=np.int64))
        if got != expected["file_sum"]:
            raise SystemExit(f"ceiling: the fetched bytes sum to {got}, not {expected['file_sum']}")
        return size
    want = expected["tensors"]
    if set(state) != set(want):
        raise SystemExit(f"{lib}: tensors {sorted(set(state) ^ set(want))[:5]} differ")
    names = sorted(want)
    if torch is not None:
        for k in names:
            t = state[k]
            if (DTYPES.get(t.dtype), list(t.shape)) != (want[k]["dtype"], want[k]["shape"]):
                raise SystemExit(f"{lib}: {k} is {t.dtype} {list(t.shape)}, not {want[k]}")
            if t.device.type != target.type or (
                target.index is not None and t.device.index != target.index
            ):
                raise SystemExit(f"{lib}: {k} is on {t.device}, not {target}")
        sums = torch.stack([
            state[k].reshape(-1).view(torch.uint8).sum(dtype=torch.int64) for k in names
        ]).tolist()
    else:
        np_dtypes = {"F32": np.float32, "F16": np.float16}
        for k in names:
            a = state[k]
            if (a.dtype, list(a.shape)) != (np_dtypes[want[k]["dtype"]], want[k]["shape"]):
                raise SystemExit(f"{lib}: {k} is {a.dtype} {list(a.shape)}, not {want[k]}")
        sums = [
            int(np.ascontiguousarray(state[k]).reshape(-1).view(np.uint8).sum(dtype=np.int64))
            for k in names
        ]
    for k, s in zip(names, sums):
        if s != want[k]["sum"]:
            raise SystemExit(f"{lib}: {k} holds different bytes (sum {s}, not {want[k]['sum']})")
    return expected["tensor_bytes"]

class GpuPeak:
    # The device's used memory, sampled every 5 ms while a load runs.
    def __init__(self):
        self.base = self.peak = 0
    def poll(self):
        while not self.done.wait(0.005):
            self.peak = max(self.peak, gpu_used())
    def __enter__(self):
        self.base = self.peak = gpu_used()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)
        self.thread.start()
        return self
    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, gpu_used())

def settle():
    if prepare is not None:
        prepare()  # the last load's tensors go with what it replaces
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        sync()
    if lib == "ceiling":
        buf.fill(0)  # a fetch that wrote nothing fails its check

rss_start = memory_mib("VmRSS")
times, gpu_peaks, gpu_held, verified, passes = [], [], [], 0, 0
for i in range(1 + runs):
    settle()
    peak = GpuPeak() if cuda else contextlib.nullcontext()
    with peak:
        sync()
        t0 = time.perf_counter()
        state = load()
        sync()
        took = time.perf_counter() - t0
    verified += check(state)
    passes += 1
    if i:  # the first load is the warm-up
        times.append(took)
        if cuda:
            gpu_peaks.append((peak.peak - peak.base) / 2**20)
            # What the process still held on the device from the loads before this one.
            gpu_held.append((peak.base - gpu_floor) / 2**20)
    del state
if lib in ("kvikpy", "kvikpy-numpy", "local-kvikpy") or into:
    settings = {k: kvikpy.defaults.get(k)
                for k in ("num_threads", "task_size", "checkpoint_staging")}
print(json.dumps({
    "times": times,
    "verified_bytes": verified,
    "verified_loads": passes,
    "gpu_peak_mib": gpu_peaks,
    "gpu_held_mib": gpu_held,
    "rss_start_mib": rss_start,
    "rss_peak_mib": memory_mib("VmHWM"),
    "settings": settings,
    "machine": machine,
}))
"""

# FlashPack's format from the checkpoint, once, outside every clock: the tensors as
# safetensors reads them onto the host, every dtype kept (no target dtype).
CONVERT = r"""
import json, os, sys, time
src, dst = sys.argv[1:3]
try:
    import torch
    import safetensors.torch
    from flashpack import pack_to_file
except (ImportError, OSError) as e:
    print(json.dumps({"skipped": f"{type(e).__name__}: {e}"}))
    sys.exit(0)
t0 = time.perf_counter()
pack_to_file(safetensors.torch.load_file(src), dst, None)
print(json.dumps({"seconds": time.perf_counter() - t0, "bytes": os.path.getsize(dst)}))
"""


@contextlib.contextmanager
def moto_server(cache: bool, log_path: str) -> Iterator[tuple[str, int]]:
    """moto's S3 server in a process of its own on 127.0.0.1 (``cache``: objects kept in
    memory once read); yields its endpoint URL and process id, and stops it however the
    block ends (its standard input closed, then terminated, then killed)."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, "127.0.0.1", "1" if cache else "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.isdigit():
            proc.wait(timeout=30)
            with open(log_path) as fh:
                raise RuntimeError(f"moto's server did not start: {fh.read()[-2000:]}")
        yield f"http://127.0.0.1:{int(line)}", proc.pid
    finally:
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def write_checkpoint(path: str, size_mib: int, count: int, bfloat16: bool) -> dict[str, Any]:
    """A checkpoint of about ``size_mib`` MiB in ``count`` tensors of random values (never
    all zeros), cycling float32, float16 and, with ``bfloat16`` (torch writes the file),
    bfloat16; returns each tensor's dtype, shape and the sum of its bytes."""
    names = ["F32", "F16", "BF16"] if bfloat16 else ["F32", "F16"]
    itemsize = {"F32": 4, "F16": 2, "BF16": 2}
    per = (size_mib * MiB) // count
    tensors: dict[str, Any] = {}
    info: dict[str, Any] = {}

    def shape(dtype: str) -> list[int]:
        n = max(1, per // itemsize[dtype])
        return [n // 1024, 1024] if n >= 1024 else [n]

    rng = np.random.default_rng(0)
    torch: Any = None
    if bfloat16:
        import torch
        from safetensors.torch import save_file as save
    else:
        from safetensors.numpy import save_file as save
    for i in range(count):
        dtype = names[i % len(names)]
        values = rng.standard_normal(shape(dtype), dtype=np.float32)
        if torch is not None:
            kind = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[dtype]
            t = torch.from_numpy(values).to(kind)
            raw = t.reshape(-1).view(torch.uint8).numpy()
        else:
            t = values.astype({"F32": np.float32, "F16": np.float16}[dtype])
            raw = t.reshape(-1).view(np.uint8)
        name = f"model.layers.{i}.weight"
        tensors[name] = t
        info[name] = {"dtype": dtype, "shape": list(t.shape), "sum": int(raw.sum(dtype=np.int64))}
    save(tensors, path)
    return {"tensors": info, "dtypes": names}


def file_sum(path: str) -> int:
    """The sum of the bytes of ``path``, 256 MiB at a time."""
    total = 0
    with open(path, "rb") as fh:
        while block := fh.read(256 * MiB):
            total += int(np.frombuffer(block, dtype=np.uint8).sum(dtype=np.int64))
    return total


def describe_host() -> str:
    """The CPU's model, its count, memory and kernel."""
    model = platform.processor() or "CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = ""
    with contextlib.suppress(OSError), open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                memory = f", {int(line.split()[1]) / 2**20:.0f} GiB memory"
                break
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpus} CPUs ({model}){memory}, Linux {platform.release()}"


def summary(times: list[float], size: int) -> dict[str, float]:
    """GB/s of ``size`` bytes: the median load, the slowest and the fastest."""
    return {
        "median_GBps": size / statistics.median(times) / 1e9,
        "min_GBps": size / max(times) / 1e9,
        "max_GBps": size / min(times) / 1e9,
    }


def warm(path: str) -> float | None:
    """Read ``path`` once so that the page cache holds it; return the share of its pages
    cached then (``kvikpy.get_page_cache_info``), or ``None`` where that cannot be told."""
    warm_page_cache(path)
    try:
        import kvikpy

        cached, total = kvikpy.get_page_cache_info(path)
    except (ImportError, OSError, RuntimeError):
        return None
    return cached / total if total else 1.0


def filesystem(path: str) -> str:
    """The type of the filesystem that holds ``path`` and where it is mounted (from
    ``/proc/mounts``), or ``"unknown"``."""
    real = os.path.realpath(path)
    mount, kind = "", "unknown"
    with contextlib.suppress(OSError), open("/proc/mounts") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) < 3:
                continue
            point = fields[1].replace("\\040", " ")
            inside = real == point or real.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(mount):
                mount, kind = point, fields[2]
    return f"{kind} at {mount}" if mount else kind


def cached_text(row: dict[str, Any]) -> str:
    """Where a local row read from: the local file, warm, with the least share of the
    file's pages that the page cache held before any of its processes, where known."""
    shares = [s for s in row.get("page_cache_resident", []) if s is not None]
    text = "from the local file, warm page cache"
    if shares and min(shares) >= 1:
        text += " (every page of the file cached before each process)"
    elif shares:
        text += f" (at least {min(shares):.1%} of the file's pages cached before each process)"
    return text


def how(lib: str, row: dict[str, Any]) -> str:
    """The table's description of ``lib``, with the settings its processes reported."""
    s = row.get("settings", {})
    if lib in LOCAL:
        text = LIBS[lib]
        if lib in OWN and s:
            text += f", {s['num_threads']} threads, {s['task_size'] / MiB:g} MiB tasks"
        if lib == "local-instanttensor" and s:
            text += (
                f", its {s['backend']} backend, {s['chunk_size'] / MiB:g} MiB chunks, "
                f"I/O depth {s['io_depth']}, a {s['buffer_size'] / MiB:,.0f} MiB GPU buffer"
            )
        if lib == "local-flashpack" and s:
            text += f" ({s['convert_seconds']:.2f} s, a {s['pack_bytes'] / MiB:,.1f} MiB pack)"
        return f"{text}; {cached_text(row)}"
    if lib in OWN and s:
        return f"{LIBS[lib]}, {s['num_threads']} threads, {s['task_size'] / MiB:g} MiB tasks"
    if lib == "runai" and s:
        threads = s.get("RUNAI_STREAMER_CONCURRENCY", "default")
        if threads == "default":
            threads = "its default concurrency (8 threads for object storage, by its docs)"
        else:
            threads = f"{threads} threads"
        return f"{LIBS[lib]}, {threads}"
    if lib == "ceiling" and s:
        return (
            f"{s['streams']} concurrent signed ranged GETs (`http.client`) of "
            f"{s['part_bytes'] / MiB:,.4g} MiB into host memory, discarded"
        )
    return LIBS[lib]


def markdown(report: dict[str, Any]) -> str:
    """The report's table and notes, ready for docs/benchmarks.md."""
    lines = [report["intro"], ""]
    results = report["results"]
    ceiling = results.get("ceiling")
    lines += [
        "| contender | what | GB/s | of the server's ceiling | host peak RSS, MiB "
        "(over its start) | GPU memory peak of a load, MiB (held between loads) |",
        "|---|---|---|---|---|---|",
    ]
    for lib, row in results.items():
        cell = f"{row['median_GBps']:.2f} ({row['min_GBps']:.2f}-{row['max_GBps']:.2f})"
        share = "-"  # the local rows do not read from the server
        if ceiling and lib not in LOCAL:
            share = f"{row['median_GBps'] / ceiling['median_GBps']:.0%}"
        rss = max(row["rss_peak_mib"])
        grow = max(p - s for p, s in zip(row["rss_peak_mib"], row["rss_start_mib"], strict=True))
        gpu = "-"
        if row["gpu_peak_mib"]:
            gpu = f"{max(row['gpu_peak_mib']):,.0f} (+{max(row['gpu_held_mib']):,.0f})"
        name = "server ceiling" if lib == "ceiling" else f"`{lib}`"
        lines.append(
            f"| {name} | {how(lib, row)} | {cell} | {share} | {rss:,.0f} (+{grow:,.0f}) | {gpu} |"
        )
    lines.append("")
    if ceiling:
        lines += [
            f"The server's ceiling: moto's server sent the object at "
            f"{ceiling['median_GBps']:.2f} GB/s to a plain client doing nothing but "
            "concurrent ranged GETs into host memory, in this run.",
            "",
        ]
    # One line each: the remote rows against each other, the local rows against each
    # other, kvikpy from the server against kvikpy from the local disk.
    groups: dict[tuple[bool, bool], list[str]] = {}
    for k, v in report["ratios"].items():
        own, peer = k.split("_vs_")
        group = groups.setdefault((own in LOCAL, peer in LOCAL), [])
        group.append(f"{own} / {peer}: {v:.2f}x")
    for key in ((False, False), (True, True), (False, True)):
        if key in groups:
            lines += ["; ".join(groups[key]), ""]
    for lib, why in report["skipped"].items():
        lines.append(f"`{lib}` skipped: {why}")
    for lib, why in report["failed"].items():
        first = why.strip().splitlines()[-1] if why.strip() else why
        lines.append(f"`{lib}` failed: {first}")
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--tensors", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2, help="fresh processes per library")
    parser.add_argument("--runs", type=int, default=3, help="timed loads per process")
    parser.add_argument("--device", default="cuda:0", help="cuda, cuda:N or cpu")
    parser.add_argument(
        "--libs",
        default=DEFAULT_LIBS,
        help=f"from {', '.join(LIBS)} (remote and local side by side: {FULL_LIBS})",
    )
    parser.add_argument("--ceiling-streams", type=int, default=16)
    parser.add_argument(
        "--ceiling-part-mib", type=int, default=0, help="range size (0: the object / streams)"
    )
    parser.add_argument(
        "--runai-concurrency", type=int, default=None, help="RUNAI_STREAMER_CONCURRENCY"
    )
    parser.add_argument("--moto-as-is", action="store_true", help="no in-memory object cache")
    parser.add_argument("--out", default=None, help="the JSON results")
    parser.add_argument("--markdown", default=None, help="the table, also printed")
    args = parser.parse_args()
    libs = [lib for lib in args.libs.split(",") if lib]
    unknown = [lib for lib in libs if lib not in LIBS]
    if unknown or not libs or len(set(libs)) != len(libs):
        parser.error(f"--libs: choose each at most once from {', '.join(LIBS)}")
    if min(args.size_mib, args.tensors, args.rounds, args.runs, args.ceiling_streams) < 1:
        parser.error("every count and size must be at least 1")
    if args.ceiling_part_mib < 0 or (args.runai_concurrency or 1) < 1:
        parser.error("--ceiling-part-mib and --runai-concurrency cannot be negative or zero")
    if args.device != "cpu" and not args.device.startswith("cuda"):
        parser.error("--device is cuda, cuda:N or cpu")
    host_only = [lib for lib in libs if lib in HOST_ONLY]
    if host_only and args.device != "cpu":
        parser.error(f"{', '.join(host_only)} read into host memory: only with --device cpu")
    try:
        import boto3
        from botocore.config import Config

        if importlib.util.find_spec("moto") is None:
            raise ImportError("No module named 'moto'")
    except ImportError as e:
        needs = "remote-checkpoint needs boto3 and moto[server] (make remote-wheels)"
        raise SystemExit(f"{needs}: {e}") from e
    try:
        import torch  # noqa: F401

        bfloat16 = not host_only
    except ImportError:
        bfloat16 = False

    started = time.time()
    folder = scratch_dir("kvikpy-rckpt-")
    path = os.path.join(folder, KEY)
    expected = write_checkpoint(path, args.size_mib, args.tensors, bfloat16)
    size = os.path.getsize(path)
    expected |= {
        "file_bytes": size,
        "file_sum": file_sum(path),
        "tensor_bytes": sum(
            int(np.prod(t["shape"])) * {"F32": 4, "F16": 2, "BF16": 2}[t["dtype"]]
            for t in expected["tensors"].values()
        ),
        "ceiling_streams": args.ceiling_streams,
        "ceiling_part_bytes": args.ceiling_part_mib * MiB,
        "runai_settings": list(RUNAI_SETTINGS),
        "staging": INTO,
        "local_path": path,
    }
    print(
        f"{size / MiB:,.0f} MiB checkpoint, {args.tensors} tensors "
        f"({', '.join(expected['dtypes'])}), written in {time.time() - started:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}
    local = [lib for lib in libs if lib in LOCAL]
    if "local-flashpack" in libs:
        # FlashPack reads its own format only: converted once, outside every clock.
        pack = os.path.join(folder, "model.flashpack")
        try:
            got = run_child(CONVERT, path, pack, what="local-flashpack (converting)")
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            failed["local-flashpack"] = str(e)[-3000:]
        else:
            if "skipped" in got:
                skipped["local-flashpack"] = got["skipped"]
            else:
                expected |= {
                    "flashpack_path": pack,
                    "flashpack_bytes": got["bytes"],
                    "flashpack_seconds": got["seconds"],
                }
                print(
                    f"converted into FlashPack's format in {got['seconds']:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
    expected_path = os.path.join(folder, "expected.json")
    with open(expected_path, "w") as fh:
        json.dump(expected, fh)

    # Every client, this process's boto3 included, reaches the server through these alone:
    # no proxy, no profile or credentials file of the machine's.
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(name, None)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        os.environ.pop(name, None)
    os.environ.pop("all_proxy", None)
    os.environ |= CREDENTIALS | {
        "AWS_CONFIG_FILE": os.path.join(folder, "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": os.path.join(folder, "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
        "RUNAI_STREAMER_LOG_TO_STDERR": "1",  # its log never reaches our JSON line
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    if args.runai_concurrency:
        os.environ["RUNAI_STREAMER_CONCURRENCY"] = str(args.runai_concurrency)

    samples: dict[str, dict[str, list[Any]]] = {}
    settings: dict[str, Any] = {}
    machine = ""
    server: dict[str, Any] = {}
    url = f"s3://{BUCKET}/{KEY}"
    with moto_server(not args.moto_as_is, os.path.join(folder, "moto.log")) as (endpoint, pid):
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        server = {
            "what": "moto's S3 server (werkzeug, threaded) in its own process on 127.0.0.1"
            + ("" if args.moto_as_is else ", objects kept in memory once read"),
            "endpoint": endpoint,
            "pid": pid,
        }
        client = boto3.client(
            "s3", endpoint_url=endpoint, config=Config(s3={"addressing_style": "path"})
        )
        client.create_bucket(Bucket=BUCKET)
        t0 = time.perf_counter()
        client.upload_file(path, BUCKET, KEY)
        server["upload_seconds"] = time.perf_counter() - t0
        if client.head_object(Bucket=BUCKET, Key=KEY)["ContentLength"] != size:
            raise RuntimeError("the uploaded object's size differs from the file's")
        client.get_object(Bucket=BUCKET, Key=KEY, Range="bytes=0-0")["Body"].read()
        if not local:
            os.unlink(path)  # the server holds it now
        print(
            f"uploaded to {endpoint} in {server['upload_seconds']:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        for k in range(args.rounds):
            for lib in libs if k % 2 == 0 else list(reversed(libs)):
                if lib in skipped or lib in failed:
                    continue
                cached = None
                if lib in LOCAL:  # warm: the file read once just before the process
                    cached = warm(expected["flashpack_path"] if lib == "local-flashpack" else path)
                try:
                    got = run_child(
                        CHILD, lib, url, args.device, args.runs, expected_path, what=lib
                    )
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    failed[lib] = str(e)[-3000:]  # a peer that fails is reported, not fatal
                    continue
                if "skipped" in got:
                    skipped[lib] = got["skipped"]
                    continue
                row = samples.setdefault(lib, {})
                for name in ("times", "gpu_peak_mib", "gpu_held_mib"):
                    row.setdefault(name, []).extend(got[name])
                for name in ("verified_bytes", "verified_loads", "rss_start_mib", "rss_peak_mib"):
                    row.setdefault(name, []).append(got[name])
                if lib in LOCAL:
                    row.setdefault("page_cache_resident", []).append(cached)
                settings[lib] = got["settings"]
                machine = machine or got["machine"]
                # Each contender's loads as they are measured, should the run be stopped.
                median = statistics.median(got["times"])
                print(
                    f"round {k + 1}: {lib} {size / median / 1e9:.2f} GB/s "
                    f"(median of {len(got['times'])} loads)",
                    file=sys.stderr,
                    flush=True,
                )
            print(f"round {k + 1}: {time.time() - started:.0f} s", file=sys.stderr, flush=True)
    server["stopped"] = True

    results: dict[str, dict[str, Any]] = {}
    for lib in libs:
        if lib not in samples or lib in failed:
            continue
        row = samples[lib]
        results[lib] = summary(row["times"], size) | {
            "seconds": row["times"],
            "verified_bytes": sum(row["verified_bytes"]),
            "verified_loads": sum(row["verified_loads"]),
            "rss_start_mib": row["rss_start_mib"],
            "rss_peak_mib": row["rss_peak_mib"],
            "gpu_peak_mib": row["gpu_peak_mib"],
            "gpu_held_mib": row["gpu_held_mib"],
            "settings": settings[lib],
        }
        if lib in LOCAL:
            results[lib]["page_cache_resident"] = row["page_cache_resident"]
    # kvikpy against the peers reading from where it read (the server, or the local disk),
    # and kvikpy from the server against kvikpy from the local disk.
    ratios: dict[str, float] = {}
    for own in OWN:
        for peer in results:
            if (
                own in results
                and peer not in OWN
                and peer != "ceiling"
                and (own in LOCAL) == (peer in LOCAL)
            ):
                ratios[f"{own}_vs_{peer}"] = (
                    results[own]["median_GBps"] / results[peer]["median_GBps"]
                )
    if "kvikpy" in results and "local-kvikpy" in results:
        ratios["kvikpy_vs_local-kvikpy"] = (
            results["kvikpy"]["median_GBps"] / results["local-kvikpy"]["median_GBps"]
        )
    found = versions()
    for name in EXTRA_VERSIONS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[name] = metadata.version(name)
    host = describe_host()
    machine = f"{machine}, {host}" if machine else host
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")
    peers = ", ".join(
        f"{name} {found[name]}"
        for name in (
            "kvikpy",
            "runai-model-streamer",
            "boto3",
            "safetensors",
            "torch",
            "moto",
            "instanttensor",
            "flashpack",
        )
        if name in found
    )
    size_text = f"{size / 2**30:.2f} GiB" if size >= 2**30 else f"{size / MiB:,.1f} MiB"
    intro = (
        f"`python -m benchmarks remote-checkpoint {shlex.join(sys.argv[1:])}` on {machine}, "
        f"{when} UTC, {time.time() - started:.0f} s in all; {peers}. A {size_text} "
        f"safetensors checkpoint ({args.tensors} tensors of random "
        f"{'/'.join(expected['dtypes'])} values) in one object on {server['what']}, read into "
        f"tensors on `{args.device}`; every contender in its own fresh process per round, "
        "the order reversed every other round, one verified warm-up load then "
        f"{args.runs} timed loads per process, every load's tensors verified against their "
        f"byte sums outside the clock; GB/s of the object's bytes, the median of "
        f"{args.rounds} x {args.runs} loads, lowest and highest in brackets. Host peak RSS: "
        "the process's `VmHWM`; GPU memory peak: the device's used memory during a load "
        "above its level before (sampled every 5 ms, torch's cache emptied between loads), "
        "and what the process still held on the device between loads, beyond its CUDA "
        "context."
    )
    if local:
        intro += (
            " The `local-*` rows read the same checkpoint from a file on the local disk "
            f"({filesystem(path)}), warm (its pages in the page cache: the file read once "
            "before each of their processes); FlashPack from its own format, the checkpoint "
            "converted into it once before the rounds (not timed); their GB/s of the same "
            "checkpoint bytes."
        )
    report = {
        "intro": intro,
        "results": results,
        "ratios": ratios,
        "skipped": skipped,
        "failed": failed,
    }
    raw = {
        "versions": found,
        "args": vars(args),
        "machine": machine,
        "measured_utc": when,
        "seconds": time.time() - started,
        "checkpoint": {
            "bytes": size,
            "tensor_bytes": expected["tensor_bytes"],
            "tensors": args.tensors,
            "dtypes": expected["dtypes"],
            "local_filesystem": filesystem(path) if local else None,
        },
        "server": server,
        **report,
    }
    write_report(markdown(report), raw, args.markdown, args.out)
    return 1 if any(lib in failed for lib in OWN) else 0


if __name__ == "__main__":
    raise SystemExit(main())
