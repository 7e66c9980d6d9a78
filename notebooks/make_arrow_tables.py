"""The cells of 08-arrow-tables.ipynb, kept as code for review.

`python notebooks/build.py` writes every notebook from these cells; `make notebooks` also
executes them to refresh their outputs (the test suite executes them on every run).
"""

from nbformat.v4 import new_code_cell, new_markdown_cell

CELLS = [
    new_markdown_cell(
        "# Arrow tables onto the GPU\n\n"
        "`kvikpy.arrow.read_ipc` reads Arrow IPC files (Feather v2, `.arrow`) and IPC "
        "streams (Hugging Face `datasets` cache shards) straight into GPU memory: the "
        "footer or message headers first, then only the chosen columns' buffers, in one "
        "parallel batch read into one allocation. The notebook makes its own files with "
        "pyarrow and runs on a GPU when there is one, otherwise in host memory."
    ),
    new_code_cell(
        "import json\n"
        "import os\n"
        "import tempfile\n"
        "import time\n\n"
        "import numpy as np\n"
        "import pyarrow as pa\n"
        "import pyarrow.feather as feather\n"
        "import pyarrow.ipc as ipc\n\n"
        "import kvikpy\n"
        "import kvikpy.arrow\n\n"
        "DEVICE = 'cuda' if kvikpy.cuda_available() else 'cpu'\n"
        "print('kvikpy', kvikpy.__version__, '| pyarrow', pa.__version__, '| device', DEVICE)\n"
        "folder = tempfile.mkdtemp(prefix='kvikpy-arrow-')"
    ),
    new_markdown_cell(
        "## A `datasets`-style shard to tensors\n\n"
        "`datasets` writes its cache as IPC streams of 1000-row record batches, its "
        "features in the schema metadata. Each record batch of a fixed-width column "
        "without nulls is a DLPack tensor (torch, CuPy, numpy on the host)."
    ),
    new_code_cell(
        "rows = 10_000\n"
        "rng = np.random.default_rng(0)\n"
        "shard = pa.table(\n"
        "    {\n"
        "        'input_ids': pa.array(\n"
        "            [rng.integers(0, 32000, 16).tolist() for _ in range(rows)],\n"
        "            pa.list_(pa.int32()),\n"
        "        ),\n"
        "        'label': pa.array(rng.integers(0, 2, rows)),\n"
        "        'text': pa.array([f'example {i}' for i in range(rows)]),\n"
        "    },\n"
        "    metadata={'huggingface': json.dumps({'info': {'features': {}}})},\n"
        ")\n"
        "shard_path = os.path.join(folder, 'data-00000-of-00001.arrow')\n"
        "with ipc.new_stream(shard_path, shard.schema) as w:\n"
        "    for batch in shard.to_batches(max_chunksize=1000):\n"
        "        w.write_batch(batch)\n\n"
        "t = kvikpy.arrow.read_ipc(shard_path, device=DEVICE)\n"
        "t"
    ),
    new_code_cell(
        "labels = t.column('label')\n"
        "first = np.from_dlpack(labels[0]) if DEVICE == 'cpu' else labels[0]\n"
        "try:\n"
        "    import torch\n\n"
        "    first = torch.from_dlpack(labels[0])\n"
        "except ImportError:\n"
        "    pass\n"
        "print(type(first).__name__, first[:8])\n"
        "print(t.schema.metadata[b'huggingface'])"
    ),
    new_markdown_cell(
        "## A column subset of a Feather file\n\n"
        "Only the chosen columns' buffers are read: `nbytes` is what came from the file."
    ),
    new_code_cell(
        "n = 2_000_000\n"
        "wide = pa.table({f'c{i}': rng.random(n) for i in range(10)})\n"
        "feather_path = os.path.join(folder, 'wide.feather')\n"
        "feather.write_feather(wide, feather_path, compression='uncompressed')\n\n"
        "for columns in (None, ['c3', 'c7']):\n"
        "    t0 = time.perf_counter()\n"
        "    t = kvikpy.arrow.read_ipc(feather_path, columns=columns, device=DEVICE)\n"
        "    dt = time.perf_counter() - t0\n"
        "    mib = t.nbytes / 2**20\n"
        "    print(f'{t.num_columns:2} columns: {mib:7.1f} MiB read in {dt * 1e3:6.1f} ms')"
    ),
    new_markdown_cell(
        "## The numbers against pyarrow\n\n"
        "pyarrow's route to the GPU: memory-map, `read_all`, then each buffer to the GPU "
        "(on the host: copied to numpy). `python -m benchmarks arrow` measures a 4 GiB "
        "table, warm and cold; see docs/benchmarks.md."
    ),
    new_code_cell(
        "def pyarrow_route(path, columns=None):\n"
        "    with pa.memory_map(path) as source:\n"
        "        table = ipc.open_file(source).read_all()\n"
        "        if columns:\n"
        "            table = table.select(columns)\n"
        "        out = []\n"
        "        for column in table.columns:\n"
        "            for chunk in column.chunks:\n"
        "                for buf in chunk.buffers():\n"
        "                    if buf is not None:\n"
        "                        host = np.frombuffer(buf, dtype=np.uint8)\n"
        "                        if DEVICE == 'cpu':\n"
        "                            out.append(host.copy())\n"
        "                        else:\n"
        "                            import cupy\n\n"
        "                            out.append(cupy.asarray(host))\n"
        "        return out\n\n\n"
        "def best(fn, repeat=5):\n"
        "    times = []\n"
        "    for _ in range(repeat):\n"
        "        t0 = time.perf_counter()\n"
        "        fn()\n"
        "        times.append(time.perf_counter() - t0)\n"
        "    return min(times)\n\n\n"
        "k = best(lambda: kvikpy.arrow.read_ipc(feather_path, device=DEVICE))\n"
        "p = best(lambda: pyarrow_route(feather_path))\n"
        "print(f'whole table: kvikpy {k * 1e3:.1f} ms, pyarrow {p * 1e3:.1f} ms ({p / k:.1f}x)')"
    ),
    new_markdown_cell(
        "## Back to pyarrow\n\n"
        "A host table (`device='cpu'`) is an Arrow C stream, so `pyarrow.table` takes it "
        "without a copy; GPU tables export `__arrow_c_device_stream__`."
    ),
    new_code_cell(
        "subset = kvikpy.arrow.read_ipc(shard_path, columns=['text', 'label'], device='cpu')\n"
        "host = pa.table(subset)\n"
        "assert host.equals(shard.select(['text', 'label']))\n"
        "host.slice(0, 3).to_pylist()"
    ),
    new_markdown_cell("## Clean up\n\nThe files this notebook wrote go with their folder."),
    new_code_cell("import shutil\n\nshutil.rmtree(folder)"),
]
