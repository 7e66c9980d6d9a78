"""The cells of 05-measure-your-machine.ipynb, kept as code for review.

`python notebooks/build.py` writes every notebook from these cells; `make notebooks` also
executes them to refresh their outputs (the test suite executes them on every run).
"""

from nbformat.v4 import new_code_cell, new_markdown_cell

CELLS = [
    new_markdown_cell(
        "# Measuring your machine\n\n"
        "How fast can kvikpy move a file into memory here, and what limits it? This "
        "notebook prints what kvikpy sees, sweeps thread counts and read sizes, and draws "
        "the result next to a reference line: on a GPU machine the ceiling of reads into "
        "GPU memory, one large pinned host-to-device copy; on a machine without a GPU, "
        "one large `os.preadv` of the file on one thread, which more threads and small "
        "reads can beat. It reads into GPU memory when there is a GPU, otherwise into "
        "host memory. The plot needs matplotlib (`pip install matplotlib`)."
    ),
    new_code_cell(
        "import os\n"
        "import statistics\n"
        "import subprocess\n"
        "import sys\n"
        "import tempfile\n"
        "import time\n\n"
        "import numpy as np\n\n"
        "import kvikpy\n\n"
        "SIZE_MIB = 64  # the test file; scale up (e.g. 4096) for a real measurement\n"
        "print(subprocess.run([sys.executable, '-m', 'kvikpy', 'info'],\n"
        "                     capture_output=True, text=True, check=True).stdout)"
    ),
    new_markdown_cell(
        "## A test file in the page cache\n\n"
        "Random bytes (never zeros: some storage compresses them), read once so the sweep "
        "measures warm reads."
    ),
    new_code_cell(
        "DEVICE = 'cuda' if kvikpy.cuda_available() else 'cpu'\n"
        "path = os.path.join(tempfile.mkdtemp(prefix='kvikpy-measure-'), 'data.bin')\n"
        "np.random.default_rng(0).integers(0, 256, SIZE_MIB << 20, dtype=np.uint8).tofile(path)\n"
        "with open(path, 'rb') as fh:\n"
        "    while fh.read(64 << 20):\n"
        "        pass\n"
        "buf = kvikpy.read(path, device=DEVICE)  # also the destination of the sweep\n"
        "print(f'{SIZE_MIB} MiB into {DEVICE}:', buf)"
    ),
    new_markdown_cell(
        "## Sweep: threads and read sizes\n\n"
        "Each point is the median of 5 reads after a warm-up; `CuFile.read` returns once "
        "the bytes have landed, so the clock needs no extra synchronisation."
    ),
    new_code_cell(
        "cpus = len(os.sched_getaffinity(0))\n"
        "threads = sorted({1, 2, 4, 8, 16, cpus} & set(range(1, max(cpus, 1) * 2 + 1)))\n"
        "sizes = [s << 20 for s in (1, 16, SIZE_MIB) if s <= SIZE_MIB]\n"
        "results = {}\n"
        "with kvikpy.CuFile(path) as f:\n"
        "    for n in threads:\n"
        "        with kvikpy.defaults.set(num_threads=n):\n"
        "            for size in sizes:\n"
        "                view = buf.view('|u1', 1, 8, [size], 0, size)\n"
        "                f.read(view)\n"
        "                times = []\n"
        "                for _ in range(5):\n"
        "                    t0 = time.perf_counter()\n"
        "                    f.read(view)\n"
        "                    times.append(time.perf_counter() - t0)\n"
        "                results[n, size] = size / statistics.median(times) / 1e9\n"
        "for (n, size), gbps in results.items():\n"
        "    print(f'{n:>2} threads, {size >> 20:>5} MiB: {gbps:6.2f} GB/s')"
    ),
    new_markdown_cell(
        "## The reference line\n\n"
        "On a GPU machine it is a ceiling: reads into GPU memory cannot beat one large "
        "copy from pinned host memory to the device (PCIe or NVLink-C2C). Without a GPU "
        "there is no such ceiling, and the line is only a reference: one `os.preadv` of "
        "the whole warm file into a host array on one thread (the median of 5). Several "
        "threads exceed it, and so do small reads repeated into the same buffer, whose "
        "bytes stay in the CPU's caches (1 MiB reads can run several times faster than "
        "memory)."
    ),
    new_code_cell(
        "if DEVICE == 'cuda':\n"
        "    import cupy\n\n"
        "    pinned = cupy.cuda.alloc_pinned_memory(SIZE_MIB << 20)\n"
        "    dev = cupy.empty(SIZE_MIB << 20, dtype=cupy.uint8)\n"
        "    cupy.cuda.runtime.memcpy(dev.data.ptr, pinned.ptr, SIZE_MIB << 20, 1)\n"
        "    cupy.cuda.runtime.deviceSynchronize()\n"
        "    t0 = time.perf_counter()\n"
        "    cupy.cuda.runtime.memcpy(dev.data.ptr, pinned.ptr, SIZE_MIB << 20, 1)\n"
        "    cupy.cuda.runtime.deviceSynchronize()\n"
        "    ceiling, label = (SIZE_MIB << 20) / (time.perf_counter() - t0) / 1e9, 'pinned H2D'\n"
        "else:\n"
        "    host = np.empty(SIZE_MIB << 20, dtype=np.uint8)\n"
        "    fd = os.open(path, os.O_RDONLY)\n"
        "    os.preadv(fd, [host], 0)\n"
        "    times = []\n"
        "    for _ in range(5):\n"
        "        t0 = time.perf_counter()\n"
        "        os.preadv(fd, [host], 0)\n"
        "        times.append(time.perf_counter() - t0)\n"
        "    ceiling = (SIZE_MIB << 20) / statistics.median(times) / 1e9\n"
        "    label = 'one preadv, one thread (reference)'\n"
        "    os.close(fd)\n"
        "print(f'{label}: {ceiling:.2f} GB/s')"
    ),
    new_code_cell(
        "import matplotlib.pyplot as plt\n\n"
        "fig, ax = plt.subplots(figsize=(6, 3.5))\n"
        "for size in sizes:\n"
        "    ax.plot(threads, [results[n, size] for n in threads], 'o-',\n"
        "            label=f'{size >> 20} MiB reads')\n"
        "ax.axhline(ceiling, color='black', lw=0.8, label=label)\n"
        "ax.set_xscale('log', base=2)\n"
        "ax.set_xticks(threads, [str(n) for n in threads])\n"
        "ax.set_xlabel('I/O threads (num_threads)')\n"
        "ax.set_ylabel('GB/s (median of 5)')\n"
        "ax.set_title(f'warm reads into {DEVICE} memory')\n"
        "ax.legend(fontsize=8)\n"
        "ax.grid(alpha=0.3)\n"
        "plt.show()"
    ),
    new_markdown_cell(
        "## Reading the plot\n\n"
        "- Lines that rise with threads and flatten mean the page cache (memory "
        "bandwidth) is the limit: kvikpy's default thread count (CPUs available, at most "
        "16) sits on the flat part.\n"
        "- A flat line at a low value with one thread is one CPU copying at its speed: "
        "more threads help, or, on a GPU with one thread, kvikpy's page-cache DMA.\n"
        "- Into GPU memory, small reads sit lower: each pays fixed costs (a DMA round "
        "trip, thread wake-ups); read many small files with `kvikpy.read_many` instead. "
        "Into host memory, small reads repeated into one buffer stay in the CPU's caches "
        "and can look faster than memory: measure with the sizes your program reads.\n"
        "- On a GPU machine, near the ceiling line the copy engine or the link is the "
        "limit; nothing in software goes faster.\n"
        "- For your own files, `python -m kvikpy bench FILE` runs one such measurement "
        "from the command line."
    ),
    new_markdown_cell("## Clean up\n\nThe files this notebook wrote go with their folder."),
    new_code_cell("import shutil\n\nshutil.rmtree(os.path.dirname(path))"),
]
