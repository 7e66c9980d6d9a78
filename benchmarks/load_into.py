"""A transformers checkpoint into a model on the GPU: time and peak memory of
kvikpy.safetensors.load_pretrained (into a model that exists, and into a meta-device
model it materialises) against kvikpy.safetensors.load_file + load_state_dict,
safetensors.torch.load_file + load_state_dict, and transformers' own
from_pretrained(device_map="cuda"), each method in its own process.

The checkpoint is a Llama model built from a config (bfloat16, random weights), written
with save_pretrained: about 2 GiB in one file, and about 8 GiB in 2 GiB shards. Warm page
cache. Memory, per method, in its first run:

- ``gpu_torch_peak``: torch.cuda.max_memory_allocated (includes the model itself);
- ``gpu_device_peak``: the device's used memory (cudaMemGetInfo, polled every ms),
  above what it was before the model existed: torch's cache, kvikpy's own allocations
  and the staging included;
- ``rss_peak``: the process's resident host memory (pinned staging included), polled,
  above what it was before the load.

Time: each method's median of ``--runs`` loads in one process; over ``--rounds`` rounds
(each runs every method once in a fresh process, the order rotating from round to
round) the median round, with the lowest and highest (``min_s``, ``max_s``).

Usage: python -m benchmarks load_into [--sizes 2,8 --runs 2 --rounds 1 --methods ...
    --out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from importlib import metadata

from benchmarks.common import run_child, scratch_dir, versions, warm_page_cache

CHILD = r"""
import json, sys, threading, time
import torch
method, folder, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.cuda.init()
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
device_base = total - free

def rss():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0

class Poll:
    def __init__(self):
        self.gpu = 0
        self.host = 0
        self.stop = threading.Event()
    def run(self):
        while not self.stop.is_set():
            f, t = torch.cuda.mem_get_info()
            self.gpu = max(self.gpu, t - f)
            self.host = max(self.host, rss())
            time.sleep(0.001)

from transformers import AutoConfig, AutoModelForCausalLM
config = AutoConfig.from_pretrained(folder)
import os
files = sorted(
    os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".safetensors")
)

def meta_model():
    from accelerate import init_empty_weights
    with init_empty_weights():  # parameters on meta, buffers (rotary) real
        return AutoModelForCausalLM.from_config(config).to(torch.bfloat16)

def cuda_model():
    m = meta_model()
    m.to_empty(device="cuda")
    return m

def run_once():
    import kvikpy.safetensors as kst
    if method == "load_into":
        model = cuda_model()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        kst.load_pretrained(model, folder)
    elif method == "load_into_meta":
        model = meta_model()
        t0 = time.perf_counter()
        kst.load_pretrained(model, folder, device="cuda")
    elif method == "load_file":
        model = cuda_model()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        state = kst.load_files(files, device="cuda")
        model.load_state_dict(state, strict=False)
        del state
    elif method == "load_file_only":
        model = None
        t0 = time.perf_counter()
        state = kst.load_files(files, device="cuda")
        torch.cuda.synchronize()
        model = state
    elif method == "safetensors":
        from safetensors.torch import load_file
        model = cuda_model()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for f in files:
            state = load_file(f, device="cuda")
            model.load_state_dict(state, strict=False)
            del state
    elif method == "from_pretrained":
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(
            folder, device_map="cuda", dtype=torch.bfloat16
        )
    else:
        raise SystemExit(f"unknown method {method}")
    torch.cuda.synchronize()
    return time.perf_counter() - t0, model

def checksum(model):
    if isinstance(model, dict):
        items = model.items()
    else:
        items = model.state_dict().items()
    return float(sum(v.float().abs().sum() for k, v in items if v.is_floating_point()))

times = []
memory = {}
for i in range(runs):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    rss_before = rss()
    poll = Poll()
    thread = threading.Thread(target=poll.run, daemon=True)
    thread.start()
    took, model = run_once()
    poll.stop.set()
    thread.join(5)
    if i == 0:
        model_bytes = sum(
            v.numel() * v.element_size()
            for v in (model.values() if isinstance(model, dict) else model.state_dict().values())
        )
        memory = {
            "model_bytes": model_bytes,
            "gpu_torch_peak": torch.cuda.max_memory_allocated(),
            "gpu_device_peak": poll.gpu - device_base,
            "rss_peak": poll.host - rss_before,
        }
        total = checksum(model)
    times.append(took)
    del model
print(json.dumps({"times": times, "memory": memory, "checksum": total}))
"""

METHODS = (
    "load_into",
    "load_into_meta",
    "load_file",
    "load_file_only",
    "safetensors",
    "from_pretrained",
)


def make_checkpoint(folder: str, gib: int) -> int:
    """A bfloat16 Llama checkpoint of about ``gib`` GiB written with save_pretrained
    (2 GiB shards); returns its bytes on disk."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, inter, heads = (2048, 5632, 16) if gib <= 2 else (4096, 11008, 32)
    per_layer = 4 * hidden * hidden + 3 * hidden * inter
    vocab = 32000
    layers = max(1, (gib * (1 << 30) // 2 - 2 * vocab * hidden) // per_layer)
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=inter,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        num_hidden_layers=int(layers),
        vocab_size=vocab,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.to_empty(device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02, generator=g)
    model.save_pretrained(folder, max_shard_size="2GB" if gib > 2 else "100GB")
    del model
    torch.cuda.empty_cache()
    size = 0
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if name.endswith(".safetensors"):
            size += os.path.getsize(path)
            warm_page_cache(path)
    return size


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="2,8", help="checkpoint sizes in GiB")
    parser.add_argument("--runs", type=int, default=2, help="loads per process")
    parser.add_argument("--rounds", type=int, default=1, help="processes per method")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = []
    for gib in (int(s) for s in args.sizes.split(",")):
        folder = scratch_dir(f"kvikpy-load-into-{gib}g-")
        size = make_checkpoint(folder, gib)
        row: dict = {"gib": gib, "file_bytes": size, "shards": 0, "methods": {}}
        row["shards"] = sum(n.endswith(".safetensors") for n in os.listdir(folder))
        sums: dict[str, float] = {}
        methods = args.methods.split(",")
        medians: dict[str, list[float]] = {m: [] for m in methods}
        for turn in range(args.rounds):
            shift = turn % len(methods)
            for method in methods[shift:] + methods[:shift]:
                if "failed" in row["methods"].get(method, {}):
                    continue
                try:
                    r = run_child(CHILD, method, folder, args.runs, what=method, timeout=600)
                except RuntimeError as e:
                    row["methods"][method] = {"failed": str(e)[-600:]}
                    continue
                medians[method].append(statistics.median(r["times"]))
                row["methods"].setdefault(method, dict(r["memory"]))  # the first round's
                sums.setdefault(method, r["checksum"])
        for method, got in medians.items():
            # A method that failed in any round is reported as failed, not half timed.
            if got and "failed" not in row["methods"][method]:
                row["methods"][method] |= {
                    "median_s": statistics.median(got),
                    "min_s": min(got),
                    "max_s": max(got),
                    "rounds": got,
                    "GBps": size / statistics.median(got) / 1e9,
                }
        # The reference: safetensors' own loader, else kvikpy's load_file into the model.
        ref = sums.get("safetensors", sums.get("load_file"))
        row["checksums"] = sums
        row["checksums_agree"] = ref is not None and all(
            abs(v - ref) <= 1e-6 * abs(ref) for m, v in sums.items() if m != "load_file_only"
        )
        rows.append(row)
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
    found = versions()
    for name in ("transformers", "accelerate"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    result = {"versions": found, "rows": rows}
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
