"""The cells of 04-arrow-and-batches.ipynb, kept as code for review.

`python notebooks/build.py` writes every notebook from these cells; `make notebooks` also
executes them to refresh their outputs (the test suite executes them on every run).
"""

from nbformat.v4 import new_code_cell, new_markdown_cell

CELLS = [
    new_markdown_cell(
        "# Many files, many ranges, and Arrow\n\n"
        "`kvikpy.read_many` reads a folder of files into one allocation in one parallel "
        "pass, `kvikpy.read_ranges` does the same for byte ranges of one file, and "
        "`kvikpy.iter_chunks` streams a file in pieces. Every result is also an Arrow "
        "array. The notebook makes its own data and runs on a GPU when there is one, "
        "otherwise in host memory."
    ),
    new_code_cell(
        "import os\n"
        "import statistics\n"
        "import tempfile\n"
        "import time\n\n"
        "import numpy as np\n\n"
        "import kvikpy\n\n"
        "FILES = 500  # scale up to measure your machine\n"
        "DEVICE = 'cuda' if kvikpy.cuda_available() else 'cpu'\n"
        "where = 'GPU memory' if DEVICE == 'cuda' else 'host memory (no GPU here)'\n"
        "print('kvikpy', kvikpy.__version__, '| reading into', where)\n"
        "rng = np.random.default_rng(0)\n"
        "folder = tempfile.mkdtemp(prefix='kvikpy-batches-')\n"
        "paths = []\n"
        "for i in range(FILES):\n"
        "    p = os.path.join(folder, f'part-{i:05d}.bin')\n"
        "    rng.integers(0, 256, int(rng.integers(1, 64 << 10)), dtype=np.uint8).tofile(p)\n"
        "    paths.append(p)\n"
        "print(FILES, 'files,', sum(os.path.getsize(p) for p in paths) >> 10, 'KiB in all')"
    ),
    new_markdown_cell(
        "## `read_many`: a folder in one pass\n\n"
        "The batch is a sequence of `kvikpy.Buffer` views into one allocation; "
        "`offsets` marks where each file starts."
    ),
    new_code_cell(
        "def timed(fn, repeat=7):\n"
        '    """fn\'s result and its median seconds over `repeat` calls, after one untimed call\n'
        '    (which pays one-time costs: CUDA context, kvikpy\'s threads and buffers)."""\n'
        "    fn()\n"
        "    times = []\n"
        "    for _ in range(repeat):\n"
        "        t0 = time.perf_counter()\n"
        "        out = fn()  # kvikpy's reads return once the bytes have landed\n"
        "        times.append(time.perf_counter() - t0)\n"
        "    return out, statistics.median(times)\n\n\n"
        "batch, t_batch = timed(lambda: kvikpy.read_many(paths, device=DEVICE))\n"
        "print(batch)\n"
        "print('offsets:', batch.offsets[:5], '...')\n"
        "third = batch[2].to_numpy()  # a view of one file (copied back from a GPU)\n"
        "assert third.tobytes() == np.fromfile(paths[2], dtype=np.uint8).tobytes()\n"
        "batch"
    ),
    new_markdown_cell("The same files one `kvikpy.read` at a time, for comparison:"),
    new_code_cell(
        "singles, t_loop = timed(lambda: [kvikpy.read(p, device=DEVICE) for p in paths])\n"
        "print(f'read_many {FILES / t_batch:,.0f} files/s, one by one {FILES / t_loop:,.0f} '\n"
        "      f'files/s (read_many {t_loop / t_batch:.1f}x as fast; medians of 7)')"
    ),
    new_markdown_cell(
        "## As an Arrow array\n\n"
        "A batch is an Arrow `large_binary` array with one element per file: in host "
        "memory pyarrow takes it without a copy; on a GPU, Arrow's device interface "
        "(here read by nanoarrow) sees CUDA memory, offsets included."
    ),
    new_code_cell(
        "import importlib.util\n\n"
        "if importlib.util.find_spec('nanoarrow') is not None:\n"
        "    import nanoarrow.device\n\n"
        "    dev = nanoarrow.device.c_device_array(batch)\n"
        "    print('device', dev.device_type.name, '| elements', dev.array.length,\n"
        "          '| buffers', dev.array.n_buffers)\n"
        "else:\n"
        "    print('nanoarrow is not installed here (pip install nanoarrow to see the array)')\n"
        "if DEVICE == 'cpu' and importlib.util.find_spec('pyarrow') is not None:\n"
        "    import pyarrow as pa\n\n"
        "    arr = pa.array(batch)\n"
        "    print(arr.type, len(arr), 'first lengths:', [len(x.as_py()) for x in arr[:3]])"
    ),
    new_markdown_cell(
        "## Missing files\n\n"
        "By default the first failing file raises, naming it. With `errors='skip'` the "
        "batch keeps every index; failed elements are listed, raise when accessed, and "
        "are null in Arrow."
    ),
    new_code_cell(
        "try:\n"
        "    kvikpy.read_many([paths[0], os.path.join(folder, 'missing.bin')], device=DEVICE)\n"
        "except FileNotFoundError as e:\n"
        "    print('raised:', e)\n"
        "partial = kvikpy.read_many([paths[0], os.path.join(folder, 'missing.bin')],\n"
        "                           device=DEVICE, errors='skip')\n"
        "print(partial, partial.failures)"
    ),
    new_markdown_cell(
        "## `read_ranges`: many byte ranges of one file\n\n"
        "Ranges may overlap and come in any order; each becomes one element."
    ),
    new_code_cell(
        "big = os.path.join(folder, 'big.bin')\n"
        "rng.integers(0, 256, 32 << 20, dtype=np.uint8).tofile(big)\n"
        "offsets = rng.integers(0, (32 << 20) - 65536, 200)\n"
        "ranges = kvikpy.read_ranges(big, (offsets, np.full(200, 65536)), device=DEVICE)\n"
        "fd = os.open(big, os.O_RDONLY)\n"
        "assert ranges[7].to_numpy().tobytes() == os.pread(fd, 65536, int(offsets[7]))\n"
        "os.close(fd)\n"
        "print(ranges)"
    ),
    new_markdown_cell(
        "## `iter_chunks`: a file larger than you want in memory at once\n\n"
        "The next chunks are read while you work on the current one. A chunk you keep is "
        "never overwritten: the iterator reuses a buffer only when nothing else holds it."
    ),
    new_code_cell(
        "total = 0\n"
        "with kvikpy.iter_chunks(big, 4 << 20, device=DEVICE) as chunks:\n"
        "    for chunk in chunks:\n"
        "        total += int(chunk.to_numpy().sum(dtype=np.int64))\n"
        "expected = int(np.fromfile(big, dtype=np.uint8).sum(dtype=np.int64))\n"
        "assert total == expected\n"
        "print(f'8 chunks summed to {total:,}, using {chunks.allocations} buffers')"
    ),
    new_markdown_cell("## Clean up\n\nThe files this notebook wrote go with their folder."),
    new_code_cell("import shutil\n\nshutil.rmtree(folder)"),
]
