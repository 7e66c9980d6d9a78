"""Render the committed benchmark results (docs/benchmarks/*.json) as PNG plots.

Usage: python benchmarks/plots.py [--folder docs/benchmarks]
Needs matplotlib (not a kvikpy dependency).
"""

from __future__ import annotations

import argparse
import json
import os


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parser = argparse.ArgumentParser()
    parser.add_argument("--folder", default="docs/benchmarks")
    args = parser.parse_args()
    with open(os.path.join(args.folder, "compare-kvikio-h100.json")) as fh:
        large = json.load(fh)
    with open(os.path.join(args.folder, "ceilings-h100.json")) as fh:
        ceilings = json.load(fh)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, task in zip(axes, (4, 16), strict=True):
        rows = [r for r in large["rows"] if r["task_MiB"] == task]
        threads = [r["threads"] for r in rows]
        for lib, style in (("kvikpy", "o-"), ("kvikio", "s--")):
            ax.plot(threads, [r[lib]["median_GBps"] for r in rows], style, label=lib)
        ceiling_threads = [t for t in (1, 4, 8, 16) if f"pread_warm_{t}t_GBps" in ceilings]
        ax.plot(
            ceiling_threads,
            [ceilings[f"pread_warm_{t}t_GBps"] for t in ceiling_threads],
            ":",
            color="gray",
            label="pread ceiling (pinned)",
        )
        ax.axhline(ceilings["pinned_h2d_GBps"], color="black", lw=0.8, label="pinned H2D")
        ax.set_title(f"warm 4 GiB read to GPU, {task} MiB tasks")
        ax.set_xlabel("threads")
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 4, 8, 16], ["1", "4", "8", "16"])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GB/s (median)")
    axes[1].legend(loc="lower right")
    fig.suptitle(f"{large['header']['device']}, {large['header']['date']}", fontsize=9)
    fig.tight_layout()
    out = os.path.join(args.folder, "large-read-threads-h100.png")
    fig.savefig(out, dpi=110)
    print("wrote", out)


if __name__ == "__main__":
    main()
