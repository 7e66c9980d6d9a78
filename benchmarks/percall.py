"""Where the microseconds of a small blocking read go: the per-call cost of 4 KiB
``CuFile.read`` calls into a torch tensor, a CuPy array, a numpy array and a kvikpy
buffer, and of the file-per-call loop (open a 4 KiB file, read it whole into one of
them, close), beside the cost of each step such a call takes (the consumer's interface
lookups, the ordering handshake, the file read, the copy to the GPU, the wait).

Each library runs in its own fresh process (kvikpy, kvikio in compat mode); every
measurement is ``--calls`` calls at consecutive 4 KiB offsets of one warm file (or over
2,048 warm 4 KiB files, the file rows), timed after a warm-up and a device synchronisation, repeated ``--repeats`` times in
alternating order; the table shows the median and the range in microseconds per call.
The last call of each row is checked against the file's bytes.

Usage (GPU machine): python -m benchmarks percall [--calls 4000] [--repeats 5]
    [--out percall.json] [--markdown percall.md]
"""

# ruff: noqa: E501  (the child script keeps one measured step to a line)
from __future__ import annotations

import argparse
import json
import os
import statistics

from benchmarks.common import run_child, scratch_dir, versions, warm_page_cache, write_random_file

CHILD = r"""
import json, os, sys, time
lib, path, calls, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
import numpy as np
import torch, cupy
PAGE = 4096
NFILES = 2048  # divides the big file's page count: file k holds its page k
fpaths = [os.path.join(os.path.dirname(path), "files", f"{k:05d}.bin") for k in range(NFILES)]
size = os.path.getsize(path)
truth = np.fromfile(path, dtype=np.uint8)
slots = size // PAGE
t = torch.zeros(PAGE, dtype=torch.uint8, device="cuda")
c = cupy.zeros(PAGE, dtype=cupy.uint8)
h = np.zeros(PAGE, dtype=np.uint8)
torch.cuda.synchronize(); cupy.cuda.runtime.deviceSynchronize()
if lib == "kvikpy":
    import kvikpy as mod
    from kvikpy import _lib
else:
    import kvikio as mod
f = mod.CuFile(path, "r")
rows = {}

def sync():
    torch.cuda.synchronize()
    cupy.cuda.runtime.deviceSynchronize()

def check(name, got, at):
    want = truth[at * PAGE:(at + 1) * PAGE]
    if not np.array_equal(got, want):
        raise SystemExit(f"{name}: wrong bytes")

def timed(name, fn, verify=None):
    for i in range(200):
        fn(i % slots)
    sync()
    t0 = time.perf_counter()
    for i in range(calls):
        fn(i % slots)
    sync()
    us = (time.perf_counter() - t0) / calls * 1e6
    if verify is not None:
        got, at = verify(), (calls - 1) % slots
        if isinstance(got, tuple):  # (bytes, the slot they came from)
            got, at = got
        check(name, got, at)
    rows.setdefault(name, []).append(us)

work = []
work.append(("read torch", lambda i: f.read(t, PAGE, i * PAGE), lambda: t.cpu().numpy()))
work.append(("read cupy", lambda i: f.read(c, PAGE, i * PAGE), lambda: cupy.asnumpy(c)))
tv = torch.zeros(slots * PAGE, dtype=torch.uint8, device="cuda")
views = [tv[k * PAGE:(k + 1) * PAGE] for k in range(slots)]
work.append((
    "read torch views",
    lambda i: f.read(views[i], PAGE, i * PAGE),
    lambda: views[(calls - 1) % slots].cpu().numpy(),
))
cv = cupy.zeros(slots * PAGE, dtype=cupy.uint8)
cviews = [cv[k * PAGE:(k + 1) * PAGE] for k in range(slots)]
work.append((
    "read cupy views",
    lambda i: f.read(cviews[i], PAGE, i * PAGE),
    lambda: cupy.asnumpy(cviews[(calls - 1) % slots]),
))
work.append(("read numpy", lambda i: f.read(h, PAGE, i * PAGE), lambda: h.copy()))

def file_loop(buf):
    def one(i):
        with mod.CuFile(fpaths[i % NFILES], "r") as g:
            g.read(buf)
    return one

last_file = (calls - 1) % NFILES
work.append(("files torch: open + read 4 KiB + close", file_loop(t), lambda: (t.cpu().numpy(), last_file)))
work.append(("files cupy: open + read 4 KiB + close", file_loop(c), lambda: (cupy.asnumpy(c), last_file)))
work.append(("files numpy: open + read 4 KiB + close", file_loop(h), lambda: (h.copy(), last_file)))
if lib == "kvikpy":
    b = mod.read(path, size=PAGE)
    bc = cupy.from_dlpack(b)
    work.append(("read kvikpy buffer", lambda i: f.read(b, PAGE, i * PAGE), lambda: cupy.asnumpy(bc)))
    work.append(("intake torch", lambda i: _lib.buffer_nbytes(t, True), None))
    work.append(("intake cupy", lambda i: _lib.buffer_nbytes(c, True), None))
    work.append(("intake numpy", lambda i: _lib.buffer_nbytes(h, True), None))
    work.append(("intake kvikpy buffer", lambda i: _lib.buffer_nbytes(b, True), None))
    fd = os.open(path, os.O_RDONLY)
    pinned = cupy.cuda.alloc_pinned_memory(PAGE)
    pinned_np = np.frombuffer(pinned, dtype=np.uint8, count=PAGE)
    stream = cupy.cuda.Stream(non_blocking=True)
    ev = cupy.cuda.Event(disable_timing=True)
    legacy = cupy.cuda.Stream.null
    work.append(("step: torch __cuda_array_interface__", lambda i: t.__cuda_array_interface__, None))
    work.append(("step: torch __dlpack__(stream=1)", lambda i: t.__dlpack__(stream=1, max_version=(1, 0)), None))
    work.append(("step: torch.cuda.current_stream().cuda_stream", lambda i: torch.cuda.current_stream().cuda_stream, None))
    work.append(("step: torch data_ptr + nbytes", lambda i: (t.data_ptr(), t.nbytes), None))
    work.append(("step: cupy __cuda_array_interface__", lambda i: c.__cuda_array_interface__, None))
    work.append(("step: os.preadv 4 KiB", lambda i: os.preadv(fd, [pinned_np], i * PAGE), None))
    work.append(("step: event record + sync (legacy stream)", lambda i: (ev.record(legacy), ev.synchronize()), None))
    work.append(("step: copy 4 KiB pinned->GPU + stream sync", lambda i: (cupy.cuda.runtime.memcpyAsync(c.data.ptr, pinned.ptr, PAGE, 1, stream.ptr), stream.synchronize()), None))
    work.append(("step: copy 4 KiB pinned->GPU on legacy + sync", lambda i: (cupy.cuda.runtime.memcpyAsync(c.data.ptr, pinned.ptr, PAGE, 1, 0), legacy.synchronize()), None))
    pageable = np.zeros(PAGE, dtype=np.uint8)
    work.append(("step: cudaMemcpy 4 KiB pinned->GPU (synchronous)", lambda i: cupy.cuda.runtime.memcpy(c.data.ptr, pinned.ptr, PAGE, 1), None))
    work.append(("step: cudaMemcpy 4 KiB pageable->GPU (synchronous)", lambda i: cupy.cuda.runtime.memcpy(c.data.ptr, pageable.ctypes.data, PAGE, 1), None))
    work.append(("step: pageable copy + stream sync", lambda i: (cupy.cuda.runtime.memcpyAsync(c.data.ptr, pageable.ctypes.data, PAGE, 1, stream.ptr), stream.synchronize()), None))
    mapped = cupy.cuda.runtime.hostAlloc(PAGE, 2)  # cudaHostAllocMapped
    gather = cupy.RawKernel(r'''
extern "C" __global__ void pull(const unsigned int* src, unsigned int* dst, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i];
}''', "pull")
    def by_kernel(i):
        gather((1,), (1024,), (cupy.uint64(mapped), c.data.ptr, cupy.int32(PAGE // 4)), stream=stream)
        stream.synchronize()
    work.append(("step: kernel pulls 4 KiB of mapped host memory + sync", by_kernel, None))
    work.append(("step: empty kernel launch + sync", lambda i: (gather((1,), (1,), (cupy.uint64(mapped), c.data.ptr, cupy.int32(0)), stream=stream), stream.synchronize()), None))
    work.append(("step: pread + copy + sync (the floor)", lambda i: (os.preadv(fd, [pinned_np], i * PAGE), cupy.cuda.runtime.memcpyAsync(c.data.ptr, pinned.ptr, PAGE, 1, stream.ptr), stream.synchronize()), None))
for r in range(repeats):
    order = work if r % 2 == 0 else work[::-1]
    for name, fn, verify in order:
        timed(name, fn, verify)
f.close()
print(json.dumps(rows))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2, help="fresh processes per library")
    ap.add_argument("--out")
    ap.add_argument("--markdown")
    args = ap.parse_args()
    folder = scratch_dir("kvikpy-percall-")
    path = os.path.join(folder, "percall.bin")
    write_random_file(path, 64 << 20, seed=7)
    # The file rows' 4 KiB files: file k holds page k of the big file.
    os.makedirs(os.path.join(folder, "files"))
    with open(path, "rb") as whole:
        for k in range(2048):
            with open(os.path.join(folder, "files", f"{k:05d}.bin"), "wb") as out:
                out.write(whole.read(4096))
    warm_page_cache(path)
    env_note = os.environ.get("KVIKIO_COMPAT_MODE")
    os.environ["KVIKIO_COMPAT_MODE"] = "ON"
    merged: dict[str, dict[str, list[float]]] = {"kvikpy": {}, "kvikio": {}}
    libs = ["kvikpy", "kvikio"]
    for r in range(args.rounds):
        for lib in libs if r % 2 == 0 else libs[::-1]:
            rows = run_child(CHILD, lib, path, args.calls, args.repeats, what=f"{lib} per-call")
            for name, values in rows.items():
                merged[lib].setdefault(name, []).extend(values)
    if env_note is None:
        os.environ.pop("KVIKIO_COMPAT_MODE", None)
    summary = {
        lib: {
            name: {"median": statistics.median(v), "min": min(v), "max": max(v)}
            for name, v in rows.items()
        }
        for lib, rows in merged.items()
    }
    lines = ["| step | kvikpy µs | kvikio µs |", "|---|---|---|"]
    for name, s in summary["kvikpy"].items():
        other = summary["kvikio"].get(name)
        cell = f"{other['median']:.1f} ({other['min']:.1f}-{other['max']:.1f})" if other else ""
        lines.append(f"| {name} | {s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f}) | {cell} |")
    table = "\n".join(lines)
    print(table)
    result = {"versions": versions(), "calls": args.calls, "summary": summary, "raw": merged}
    if args.out:
        with open(args.out, "w") as out:
            json.dump(result, out, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as out:
            out.write(table + "\n")


if __name__ == "__main__":
    main()
