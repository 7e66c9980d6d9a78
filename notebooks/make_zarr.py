"""The cells of 06-zarr-on-the-gpu.ipynb, kept as code for review.

`python notebooks/build.py` writes every notebook from these cells; `make notebooks` also
executes them to refresh their outputs (the test suite executes them on every run).
"""

from nbformat.v4 import new_code_cell, new_markdown_cell

CELLS = [
    new_markdown_cell(
        "# Zarr on the GPU\n\n"
        "`kvikpy.zarr.GDSStore` is a zarr 3 store of a local directory (a subclass of "
        "zarr's `LocalStore`) whose reads go through kvikpy: the chunks of one array read "
        "are read in one kvikpy batch, straight into GPU memory when zarr's GPU mode is "
        "on, and zstd or lz4 chunks decode on the GPU through nvCOMP. This notebook "
        "writes an array with plain zarr on the CPU, reads it onto the GPU through the "
        "kvikpy store, compressed and not, and times it against zarr's own `LocalStore` "
        "(and kvikio's `GDSStore` where kvikio is installed). Without a GPU the reads "
        "land in host memory and the timings are skipped. It needs zarr 3: `pip install "
        "'kvikpy[zarr]'` (with the wheel's path in place of `kvikpy` while kvikpy is not "
        "on the Package Index)."
    ),
    new_code_cell(
        "import statistics\n"
        "import subprocess\n"
        "import tempfile\n"
        "import time\n\n"
        "import numpy as np\n"
        "import zarr\n"
        "import zarr.codecs\n"
        "import zarr.storage\n\n"
        "import kvikpy\n"
        "import kvikpy.zarr\n\n"
        "GPU = kvikpy.cuda_available()\n"
        "# The array: 1 GiB on a GPU (256 chunks, enough to keep nvCOMP's batch decode busy),\n"
        "# 64 MiB without one; 4096 for a real measurement.\n"
        "SIZE_MIB = 1024 if GPU else 64\n"
        "print('zarr', zarr.__version__, '| GPU:', GPU, '| nvCOMP:', "
        "kvikpy.zarr.nvcomp_available())"
    ),
    new_markdown_cell(
        "## Write with zarr on the CPU\n\n"
        "A float32 random walk (a cumulative sum rounded to 0.1, which zstd compresses "
        "about 2.5x) in 4 MiB chunks, stored twice: uncompressed, and zstd-compressed. "
        "Plain zarr writes both; nothing here depends on kvikpy."
    ),
    new_code_cell(
        "root = tempfile.mkdtemp(prefix='kvikpy-zarr-')\n"
        "items = (SIZE_MIB << 20) // 4\n"
        "steps = np.random.default_rng(0).standard_normal(items, dtype=np.float32)\n"
        "data = np.cumsum(steps, dtype=np.float32).round(1)\n"
        "for name, compressors in [('raw', None), ('zstd', zarr.codecs.ZstdCodec(level=3))]:\n"
        "    a = zarr.create_array(zarr.storage.LocalStore(root), name=name, shape=data.shape,\n"
        "                          chunks=(1 << 20,), dtype='float32', "
        "compressors=compressors)\n"
        "    a[:] = data\n"
        "print(subprocess.run(['du', '-sh', f'{root}/raw', f'{root}/zstd'],\n"
        "                     capture_output=True, text=True).stdout)"
    ),
    new_markdown_cell(
        "## Read through the kvikpy store\n\n"
        "`kvikpy.zarr.enable_gpu()` is `zarr.config.enable_gpu()` (reads land in CuPy "
        "arrays) with larger batches: zarr then hands kvikpy many chunks per batch read "
        "and nvCOMP many chunks per decode. Without a GPU the same store reads into numpy "
        "arrays."
    ),
    new_code_cell(
        "store = kvikpy.zarr.GDSStore(root, read_only=True)\n"
        "if GPU:\n"
        "    import cupy\n\n"
        "    with kvikpy.zarr.enable_gpu():\n"
        "        for name in ('raw', 'zstd'):\n"
        "            got = zarr.open_array(store, path=name, mode='r')[:]\n"
        "            assert isinstance(got, cupy.ndarray)\n"
        "            assert (cupy.asnumpy(got) == data).all()\n"
        "            print(name, type(got).__module__, got.dtype, got.shape, 'equal')\n"
        "else:\n"
        "    for name in ('raw', 'zstd'):\n"
        "        got = zarr.open_array(store, path=name, mode='r')[:]\n"
        "        assert (got == data).all()\n"
        "        print(name, type(got).__module__, got.dtype, got.shape, 'equal')"
    ),
    new_markdown_cell(
        "## Timings\n\n"
        "Each store reads the whole array onto the GPU: one warm-up, then the median of "
        "five warm reads (the files sit in the page cache). kvikio's `GDSStore` is timed "
        "where kvikio is installed; zarr's `LocalStore` reads each chunk into host memory "
        "and copies it. For zstd, zarr (and kvikio, which uses zarr's codecs) decode on "
        "the CPU; kvikpy decodes on the GPU where nvCOMP is installed."
    ),
    new_code_cell(
        "def timed(store, path, gpu_mode):\n"
        "    times = []\n"
        "    with gpu_mode():\n"
        "        arr = zarr.open_array(store, path=path, mode='r')\n"
        "        for _ in range(6):\n"
        "            cupy.cuda.runtime.deviceSynchronize()\n"
        "            t0 = time.perf_counter()\n"
        "            out = arr[:]\n"
        "            cupy.cuda.runtime.deviceSynchronize()\n"
        "            times.append(time.perf_counter() - t0)\n"
        "    assert (cupy.asnumpy(out) == data).all()\n"
        "    return data.nbytes / statistics.median(times[1:]) / 1e9\n\n\n"
        "if GPU:\n"
        "    stores = {\n"
        "        'kvikpy GDSStore': (store, kvikpy.zarr.enable_gpu),\n"
        "        'zarr LocalStore': (zarr.storage.LocalStore(root, read_only=True),\n"
        "                            zarr.config.enable_gpu),\n"
        "    }\n"
        "    try:\n"
        "        import kvikio.zarr\n\n"
        "        stores['kvikio GDSStore'] = (kvikio.zarr.GDSStore(root, read_only=True),\n"
        "                                     zarr.config.enable_gpu)\n"
        "    except ImportError:\n"
        "        print('kvikio is not installed: its GDSStore is not timed')\n"
        "    for name in ('raw', 'zstd'):\n"
        "        for label, (s, mode) in stores.items():\n"
        "            print(f'{name:4} {label:16} {timed(s, name, mode):6.2f} GB/s')\n"
        "else:\n"
        "    print('no GPU here: nothing to time')"
    ),
    new_markdown_cell(
        "## What to take away\n\n"
        "* Swap `zarr.storage.LocalStore(path)` for `kvikpy.zarr.GDSStore(path)` and "
        "`zarr.config.enable_gpu()` for `kvikpy.zarr.enable_gpu()`; nothing else in "
        "zarr code changes, and the files are ordinary zarr 3 (or 2) arrays.\n"
        "* `pip install kvikpy[nvcomp]` moves zstd and lz4 decoding to the GPU; without "
        "it those chunks decode on the CPU, as zarr's codecs do.\n"
        "* nvCOMP decodes the chunks of a batch in parallel, so GPU decoding pays off with "
        "many chunks: on the H100 a 64 MiB zstd array in 16 chunks of 4 MiB decoded at 0.76 "
        "GB/s against 1.05 GB/s for zarr's CPU codec, while 1,024 such chunks (4 GiB) "
        "decoded at 11.1 GB/s against 1.3 GB/s. Prefer smaller chunks, or more of them, for "
        "compressed arrays read onto the GPU.\n"
        "* `python -m benchmarks zarr` (docs/benchmarks.md) measures the same reads at "
        "4 GiB, cold as well as warm, with a random selection of chunks."
    ),
    new_markdown_cell("## Clean up\n\nThe files this notebook wrote go with their folder."),
    new_code_cell("import shutil\n\nshutil.rmtree(root)"),
]
