"""The cells of 02-frameworks-dlpack.ipynb and 03-file-formats.ipynb, kept as code for
review.

`python notebooks/build.py` writes every notebook from these cells; `make notebooks` also
executes them to refresh their outputs (the test suite executes them on every run).
"""

from nbformat.v4 import new_code_cell, new_markdown_cell

SETUP = (
    "import importlib.util\n"
    "import os\n"
    "import tempfile\n"
    "{time}\n"
    "import numpy as np\n\n"
    "import kvikpy\n\n"
    "DEVICE = 'cuda' if kvikpy.cuda_available() else 'cpu'\n"
    "HAVE = {m: importlib.util.find_spec(m) is not None for m in ('torch', 'cupy', 'jax')}\n"
    "where = 'GPU memory' if DEVICE == 'cuda' else 'host memory (no GPU here)'\n"
    "installed = ', '.join(m for m, ok in HAVE.items() if ok) or 'numpy only'\n"
    "print('kvikpy', kvikpy.__version__, '| reading into', where, '| installed:', installed)\n"
    "workdir = tempfile.mkdtemp(prefix='kvikpy-nb-')"
)

FRAMEWORKS = [
    new_markdown_cell(
        "# PyTorch, CuPy, JAX and numpy through DLPack\n\n"
        "`kvikpy.read` returns a `kvikpy.Buffer`; every array library takes it without a "
        "copy through DLPack. Cells for libraries that are not installed say so and move on."
    ),
    new_code_cell(SETUP.replace("{time}", "")),
    new_code_cell(
        "path = os.path.join(workdir, 'weights.bin')\n"
        "ROWS, COLS = 512, 1024  # a float32 matrix of 2 MiB; scale ROWS up for more data\n"
        "w = np.random.default_rng(0).standard_normal((ROWS, COLS)).astype(np.float32)\n"
        "w.tofile(path)\n"
        "buf = kvikpy.read(path, device=DEVICE, dtype='float32', shape=(ROWS, COLS))\n"
        "buf"
    ),
    new_markdown_cell("## One buffer, every framework"),
    new_code_cell(
        "if HAVE['torch']:\n"
        "    import torch\n\n"
        "    t = torch.from_dlpack(buf)\n"
        "    same = bool((t.cpu().numpy() == w).all())\n"
        "    print('torch', t.shape, t.dtype, t.device, 'equal:', same)\n"
        "else:\n"
        "    print('torch is not installed here')\n"
        "if HAVE['cupy'] and DEVICE == 'cuda':\n"
        "    import cupy\n\n"
        "    c = cupy.from_dlpack(buf)\n"
        "    print('cupy', c.shape, c.dtype, 'equal:', bool((cupy.asnumpy(c) == w).all()))\n"
        "if HAVE['jax'] and DEVICE == 'cuda':\n"
        "    import jax.dlpack\n\n"
        "    j = jax.dlpack.from_dlpack(buf)\n"
        "    print('jax', j.shape, j.dtype, 'equal:', bool((np.asarray(j) == w).all()))\n"
        "host = buf.to_numpy()  # host memory: a view; GPU memory: a copy to the host\n"
        "print('numpy', host.shape, host.dtype, 'equal:', bool((host == w).all()))"
    ),
    new_markdown_cell(
        "## Byte ranges\n\n"
        "`offset` and `size` read part of a file: here rows 100 to 199 of the matrix."
    ),
    new_code_cell(
        "row = COLS * 4  # bytes per row\n"
        "rows = kvikpy.read(path, offset=100 * row, size=100 * row, device=DEVICE,\n"
        "                   dtype='float32', shape=(100, COLS))\n"
        "assert (rows.to_numpy() == w[100:200]).all()\n"
        "rows"
    ),
    new_markdown_cell(
        "## Reads into arrays you already have\n\n"
        "`CuFile.read` fills an existing array, host or GPU: numpy arrays, torch tensors, "
        "CuPy arrays. `pread` returns a future instead of waiting."
    ),
    new_code_cell(
        "if DEVICE == 'cuda' and HAVE['torch']:\n"
        "    dst = torch.empty((ROWS, COLS), dtype=torch.float32, device='cuda')\n"
        "else:\n"
        "    dst = np.empty((ROWS, COLS), dtype=np.float32)\n"
        "with kvikpy.CuFile(path) as f:\n"
        "    future = f.pread(dst)\n"
        "    print('bytes read:', future.get(), 'into', type(dst).__module__)"
    ),
    new_markdown_cell(
        "## Stream-ordered reads (GPU)\n\n"
        "With `stream=`, the call returns at once and work queued on that stream later "
        "sees the bytes, as a CUDA copy would."
    ),
    new_code_cell(
        "if DEVICE == 'cuda' and HAVE['torch']:\n"
        "    s = torch.cuda.Stream()\n"
        "    ordered = kvikpy.read(\n"
        "        path, device='cuda', dtype='float32', shape=(ROWS, COLS), stream=s\n"
        "    )\n"
        "    with torch.cuda.stream(s):\n"
        "        total = torch.from_dlpack(ordered).sum()\n"
        "    s.synchronize()\n"
        "    print('sum on the stream:', float(total), 'expected', float(w.sum()))\n"
        "else:\n"
        "    print('stream-ordered reads need a GPU and torch; skipped here')"
    ),
    new_markdown_cell(
        "## A checkpoint straight into a model's parameters\n\n"
        "`kvikpy.safetensors.load_into(target, files)` writes each tensor's bytes from the "
        "file into the tensor the target already has (a `torch.nn.Module`, or a mapping of "
        "names to torch tensors or numpy arrays): no second copy of the weights. "
        "`load_file` followed by `load_state_dict` holds the whole checkpoint a second time "
        "until the state dict is dropped. The cell writes a 32 MiB checkpoint and measures "
        "the memory each way uses besides the model (GPU memory with torch on a GPU, the "
        "process's resident host memory otherwise)."
    ),
    new_code_cell(
        "import json\n"
        "import struct\n\n"
        "from kvikpy.safetensors import load_file, load_into\n\n"
        "ckpt = os.path.join(workdir, 'model.safetensors')\n"
        "rng = np.random.default_rng(0)\n"
        "layers = {f'layer.{i}': rng.standard_normal(1 << 19, np.float32) for i in range(16)}\n"
        "header, at = {}, 0\n"
        "for name, a in layers.items():\n"
        "    span = [at, at + a.nbytes]\n"
        "    header[name] = {'dtype': 'F32', 'shape': list(a.shape), 'data_offsets': span}\n"
        "    at += a.nbytes\n"
        "text = json.dumps(header).encode()\n"
        "with open(ckpt, 'wb') as fh:\n"
        "    fh.write(struct.pack('<Q', len(text)) + text)\n"
        "    for a in layers.values():\n"
        "        fh.write(a.tobytes())\n"
        "\n"
        "on_gpu = DEVICE == 'cuda' and HAVE['torch']\n"
        "if on_gpu:\n"
        "    model = {n: torch.empty(a.shape, device='cuda') for n, a in layers.items()}\n"
        "else:\n"
        "    model = {n: np.ones(a.shape, np.float32) for n, a in layers.items()}  # touched\n"
        "\n"
        "\n"
        "def used():\n"
        "    if on_gpu:\n"
        "        torch.cuda.synchronize()\n"
        "        free, total = torch.cuda.mem_get_info()\n"
        "        return total - free\n"
        "    with open('/proc/self/statm') as fh:\n"
        "        return int(fh.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')\n"
        "\n"
        "\n"
        "base = used()\n"
        "load_into(model, ckpt)\n"
        "into = used() - base\n"
        "base = used()\n"
        "state = load_file(ckpt, device=DEVICE, framework='torch' if on_gpu else 'numpy')\n"
        "for n, t in model.items():\n"
        "    t[...] = state[n]  # what load_state_dict does\n"
        "both = used() - base\n"
        "del state\n"
        "host = {n: t.cpu().numpy() if on_gpu else t for n, t in model.items()}\n"
        "same = all(bool((host[n] == a).all()) for n, a in layers.items())\n"
        "print('memory besides the model while loading a 32 MiB checkpoint:')\n"
        "print(f'  load_into                  {into / 2**20:6.1f} MiB')\n"
        "print(f'  load_file + copy per name  {both / 2**20:6.1f} MiB')\n"
        "print('weights equal to the file:', same)"
    ),
    new_markdown_cell(
        "## Saving and resuming a training run\n\n"
        "`kvikpy.safetensors.save_file(state, path, blocking=False)` copies the tensors and "
        "returns at once, so training goes on while the checkpoint is written; "
        "`get()` waits for the file. The cell trains a small model for 20 steps, saves it "
        "in the background, trains 10 more, then loads the checkpoint and trains the same "
        "10 steps again: the losses are the same (with torch when it is installed, on the "
        "GPU when there is one; plain numpy otherwise)."
    ),
    new_code_cell(
        "from kvikpy.safetensors import load_file, save_file\n\n"
        "rng = np.random.default_rng(1)\n"
        "x = rng.standard_normal((256, 8), dtype=np.float32)\n"
        "y = x @ rng.standard_normal(8, dtype=np.float32) + np.float32(0.5)\n"
        "if HAVE['torch']:\n"
        "    import torch\n\n"
        "    on = 'cuda' if DEVICE == 'cuda' else 'cpu'\n"
        "    X, Y = torch.from_numpy(x).to(on), torch.from_numpy(y).to(on)\n"
        "    torch.manual_seed(0)\n"
        "    net = torch.nn.Linear(8, 1).to(on)\n"
        "    sgd = torch.optim.SGD(net.parameters(), lr=0.05)\n\n"
        "    def step():\n"
        "        sgd.zero_grad()\n"
        "        loss = ((net(X).squeeze(1) - Y) ** 2).mean()\n"
        "        loss.backward()\n"
        "        sgd.step()\n"
        "        return loss.item()\n\n"
        "    def weights():\n"
        "        return dict(net.state_dict())\n\n"
        "    def resume(path):\n"
        "        net.load_state_dict(load_file(path, device=on))\n"
        "else:\n"
        "    params = {'weight': np.zeros(8, np.float32), 'bias': np.zeros(1, np.float32)}\n\n"
        "    def step():\n"
        "        err = x @ params['weight'] + params['bias'] - y\n"
        "        params['weight'] -= np.float32(0.1) * (x.T @ err) / len(y)\n"
        "        params['bias'] -= np.float32(0.1) * err.mean(keepdims=True)\n"
        "        return float((err**2).mean())\n\n"
        "    def weights():\n"
        "        return params\n\n"
        "    def resume(path):\n"
        "        saved = load_file(path, framework='numpy')\n"
        "        params.update({k: v.copy() for k, v in saved.items()})\n\n"
        "\n"
        "for _ in range(20):\n"
        "    step()\n"
        "ckpt = os.path.join(workdir, 'step-20.safetensors')\n"
        "saving = save_file(weights(), ckpt, {'step': '20'}, blocking=False)\n"
        "first = [step() for _ in range(10)]  # goes on while the file is written\n"
        "print(saving, '->', saving.get(), 'bytes')\n"
        "resume(ckpt)\n"
        "again = [step() for _ in range(10)]\n"
        "print('losses after step 20:', ' '.join(f'{v:.4f}' for v in first))\n"
        "print('the same after resuming:', first == again)"
    ),
    new_markdown_cell("## Clean up\n\nThe files this notebook wrote go with their folder."),
    new_code_cell("import shutil\n\nshutil.rmtree(workdir)"),
]

FORMATS = [
    new_markdown_cell(
        "# Real file formats to the GPU\n\n"
        "A safetensors checkpoint into tensors, and a `.npy` array whose header is parsed "
        "on the host and whose data goes straight to the device, each timed against the "
        "usual way."
    ),
    new_code_cell(SETUP.replace("{time}", "import time\n")),
    new_code_cell(
        "import statistics\n\n\n"
        "def timed(fn, repeat=3):\n"
        '    """fn\'s result and its median seconds over `repeat` calls, after one untimed call\n'
        '    (which pays one-time costs: CUDA context, kvikpy\'s threads and buffers)."""\n'
        "    fn()\n"
        "    times = []\n"
        "    for _ in range(repeat):\n"
        "        t0 = time.perf_counter()\n"
        "        out = fn()\n"
        "        if DEVICE == 'cuda' and HAVE['torch']:\n"
        "            import torch\n\n"
        "            torch.cuda.synchronize()  # GPU work counts until it is done\n"
        "        times.append(time.perf_counter() - t0)\n"
        "    return out, statistics.median(times)"
    ),
    new_markdown_cell(
        "## safetensors\n\n"
        "The format is an 8-byte header length, a JSON header, then the tensors' bytes. "
        "This cell writes one by hand (so it needs no extra package): 64 float32 tensors."
    ),
    new_code_cell(
        "import json\n"
        "import struct\n\n"
        "TENSORS, ROWS = 64, 256  # scale up for a real measurement\n"
        "rng = np.random.default_rng(1)\n"
        "state = {f'layer.{i}.weight': rng.standard_normal((ROWS, 1024)).astype(np.float32)\n"
        "         for i in range(TENSORS)}\n"
        "header, offset = {}, 0\n"
        "for name, a in state.items():\n"
        "    header[name] = {'dtype': 'F32', 'shape': list(a.shape),\n"
        "                    'data_offsets': [offset, offset + a.nbytes]}\n"
        "    offset += a.nbytes\n"
        "blob = json.dumps(header).encode()\n"
        "ckpt = os.path.join(workdir, 'model.safetensors')\n"
        "with open(ckpt, 'wb') as fh:\n"
        "    fh.write(struct.pack('<Q', len(blob)) + blob)\n"
        "    for a in state.values():\n"
        "        fh.write(a.tobytes())\n"
        "print(f'{os.path.getsize(ckpt) / 2**20:.1f} MiB checkpoint, {TENSORS} tensors')"
    ),
    new_code_cell(
        "from kvikpy.safetensors import load_file\n\n"
        "framework = 'torch' if HAVE['torch'] else 'numpy'\n"
        "loaded, t_kvikpy = timed(lambda: load_file(ckpt, device=DEVICE, framework=framework))\n"
        "first = loaded['layer.0.weight']\n"
        "first_host = first.cpu().numpy() if framework == 'torch' else first\n"
        "assert (first_host == state['layer.0.weight']).all()\n"
        "ms = t_kvikpy * 1e3\n"
        "print(f'kvikpy: {len(loaded)} {framework} tensors on {DEVICE} in {ms:.1f} ms '\n"
        "      '(median of 3)')\n"
        "if importlib.util.find_spec('safetensors') and HAVE['torch']:\n"
        "    from safetensors.torch import load_file as reference\n\n"
        "    _, t_ref = timed(lambda: reference(ckpt, device=DEVICE))\n"
        "    ratio = t_ref / t_kvikpy\n"
        "    print(f'safetensors: {t_ref * 1e3:.1f} ms (kvikpy is {ratio:.1f}x as fast)')\n"
        "else:\n"
        "    print('safetensors with torch is not installed here: no comparison')"
    ),
    new_markdown_cell(
        "## A `.npy` array\n\n"
        "numpy's own functions parse the header; kvikpy then reads the data section "
        "straight into device memory with the right dtype and shape."
    ),
    new_code_cell(
        "arr = rng.standard_normal((2048, 1024)).astype(np.float32)\n"
        "npy = os.path.join(workdir, 'array.npy')\n"
        "np.save(npy, arr)\n"
        "with open(npy, 'rb') as fh:\n"
        "    version = np.lib.format.read_magic(fh)\n"
        "    fmt = np.lib.format\n"
        "    v1 = version == (1, 0)\n"
        "    parse = fmt.read_array_header_1_0 if v1 else fmt.read_array_header_2_0\n"
        "    shape, fortran, dtype = parse(fh)\n"
        "    data_offset = fh.tell()\n"
        "assert not fortran\n"
        "on_device, t_kvikpy = timed(\n"
        "    lambda: kvikpy.read(npy, offset=data_offset, device=DEVICE, dtype=dtype,\n"
        "                        shape=shape)\n"
        ")\n\n\n"
        "def numpy_way():\n"
        "    host = np.load(npy)\n"
        "    if DEVICE == 'cuda' and HAVE['cupy']:\n"
        "        import cupy\n\n"
        "        dev = cupy.asarray(host)\n"
        "        cupy.cuda.runtime.deviceSynchronize()\n"
        "        return dev\n"
        "    return host\n\n\n"
        "_, t_numpy = timed(numpy_way)\n"
        "assert (on_device.to_numpy() == arr).all()\n"
        "how = 'numpy.load + copy' if DEVICE == 'cuda' else 'numpy.load'\n"
        "print(f'kvikpy {t_kvikpy * 1e3:.1f} ms, {how} {t_numpy * 1e3:.1f} ms (medians of 3)')\n"
        "on_device"
    ),
    new_markdown_cell("## Clean up\n\nThe files this notebook wrote go with their folder."),
    new_code_cell("import shutil\n\nshutil.rmtree(workdir)"),
]
