"""The cells of 01-quickstart.ipynb, kept as code for review.

`python notebooks/build.py` writes every notebook from these cells; `make notebooks` also
executes them to refresh their outputs (the test suite executes them on every run).
"""

from nbformat.v4 import new_code_cell, new_markdown_cell

CELLS = [
    new_markdown_cell(
        "# kvikpy quickstart\n\n"
        "kvikpy reads files into GPU or host memory with kvikio's API and a Rust engine. "
        "This notebook runs anywhere: it makes its own data, reads into the GPU when there "
        "is one (`DEVICE = 'cuda'`) and into host memory otherwise (`device='cpu'`), and "
        "says which below."
    ),
    new_code_cell(
        "import os\n"
        "import tempfile\n"
        "import time\n\n"
        "import numpy as np\n\n"
        "import kvikpy\n\n"
        "SIZE_MIB = 64  # scale up to measure your machine\n"
        "workdir = tempfile.mkdtemp(prefix='kvikpy-quickstart-')\n"
        "path = os.path.join(workdir, 'data.bin')\n"
        "threads = kvikpy.defaults.get('num_threads')\n"
        "DEVICE = 'cuda' if kvikpy.cuda_available() else 'cpu'\n"
        "where = 'GPU memory' if DEVICE == 'cuda' else 'host memory (no GPU here)'\n"
        "print('kvikpy', kvikpy.__version__, '|', threads, 'I/O threads | reading into', where)"
    ),
    new_markdown_cell("## Write and read with `CuFile`"),
    new_code_cell(
        "a = np.random.default_rng(0).standard_normal(SIZE_MIB * 2**20 // 8)\n"
        "with kvikpy.CuFile(path, 'w') as f:\n"
        "    written = f.write(a)\n"
        "b = np.empty_like(a)\n"
        "with kvikpy.CuFile(path, 'r') as f:\n"
        "    f.read(b)  # a process's first read also starts kvikpy's I/O threads\n"
        "    t0 = time.perf_counter()\n"
        "    nread = f.read(b)\n"
        "    dt = time.perf_counter() - t0\n"
        "assert np.array_equal(a, b)\n"
        "print(f'wrote {written:,} B; a second read of {nread:,} B ran at '\n"
        "      f'{nread / dt / 1e9:.2f} GB/s into host memory')"
    ),
    new_markdown_cell(
        "## One call: `kvikpy.read`\n\n"
        "`kvikpy.read` allocates the destination on `device` and returns a `kvikpy.Buffer` "
        "once the bytes have landed; any DLPack consumer takes it without a copy "
        "(`torch.from_dlpack(buf)`, `cupy.from_dlpack(buf)`, `np.from_dlpack(buf)` for "
        "host memory). `progress=True` draws a tqdm bar of the bytes as they arrive "
        "(tqdm is optional). The first GPU read of a process also creates the CUDA context "
        "and kvikpy's pinned staging buffers, so its rate is lower than later reads'."
    ),
    new_code_cell(
        "import importlib.util\n\n"
        "bar = importlib.util.find_spec('tqdm') is not None\n"
        "buf = kvikpy.read(path, device=DEVICE, dtype='float64', progress=bar)\n"
        "assert np.array_equal(buf.to_numpy(), a)  # from GPU memory: a copy back to check\n"
        "buf"
    ),
    new_markdown_cell(
        "## Non-blocking reads: futures and `await`\n\n"
        "`pread` returns an `IOFuture` at once; `get()` waits without holding the GIL. "
        "In Jupyter the future can simply be awaited."
    ),
    new_code_cell(
        "c = np.empty_like(a)\n"
        "half = c.nbytes // 2\n"
        "with kvikpy.CuFile(path, 'r') as f:\n"
        "    first = f.pread(c[: c.size // 2])\n"
        "    second = f.pread(c[c.size // 2 :], file_offset=half)\n"
        "    print('done right away?', first.done(), second.done())\n"
        "    n1 = await first\n"
        "    n2 = second.get()\n"
        "assert n1 + n2 == a.nbytes and np.array_equal(a, c)\n"
        "print('read', n1 + n2, 'bytes in two futures')"
    ),
    new_markdown_cell(
        "## Settings\n\n`defaults.set` applies at once; as a context manager it restores on exit."
    ),
    new_code_cell(
        "print('task_size before:', kvikpy.defaults.get('task_size'))\n"
        "with kvikpy.defaults.set({'task_size': 1 << 20, 'num_threads': 2}):\n"
        "    print('inside:', kvikpy.defaults.get('task_size'), "
        "kvikpy.defaults.get('num_threads'))\n"
        "print('after:', kvikpy.defaults.get('task_size'))"
    ),
    new_markdown_cell(
        "## Coming from kvikio\n\nExisting kvikio code runs unchanged with one import line."
    ),
    new_code_cell(
        "import kvikpy as kvikio\n\n"
        "x = np.arange(100)\n"
        "f = kvikio.CuFile(path, 'w')\n"
        "f.write(x)\n"
        "f.close()\n"
        "y = np.empty_like(x)\n"
        "with kvikio.CuFile(path, 'r') as f:\n"
        "    f.read(y)\n"
        "assert all(x == y)\n"
        "# compat_mode is the setting (AUTO by default, as `python -m kvikpy info` prints);\n"
        "# is_compat_mode_preferred() says whether it resolves to POSIX here.\n"
        "mode = kvikio.defaults.get('compat_mode').name\n"
        "posix = kvikio.defaults.is_compat_mode_preferred()\n"
        "print('kvikio-style round trip OK; compat_mode', mode, '| POSIX I/O:', posix)"
    ),
    new_code_cell("import shutil\n\nshutil.rmtree(workdir)"),
]
