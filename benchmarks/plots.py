"""Render the committed benchmark results (docs/benchmarks/*.json) as PNG plots.

Usage: python -m benchmarks.plots [--folder docs/benchmarks]
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
    sizes_plot(plt, args.folder, ceilings)


def sizes_plot(plt, folder: str, ceilings: dict) -> None:
    """Throughput against file size, one panel per destination, one line per library."""
    with open(os.path.join(folder, "sizes-h100.json")) as fh:
        sizes = json.load(fh)
    dests = ["device", "pinned", "host"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), sharey=True)
    styles = {"kvikpy": "o-", "kvikio": "s--", "kvikio-tuned": "^--", "numpy": "x:"}
    labels = {
        "kvikpy": "kvikpy (defaults)",
        "kvikio": "kvikio 26.10 (defaults)",
        "kvikio-tuned": "kvikio 26.10 (16 threads, 16 MiB)",
        "numpy": "numpy.fromfile (+ cupy.asarray)",
    }
    for ax, dest in zip(axes, dests, strict=True):
        for lib, style in styles.items():
            rows = sorted(
                (r for r in sizes["rows"] if r["lib"] == lib and r["dest"] == dest),
                key=lambda r: r["size"],
            )
            if rows:
                ax.plot(
                    [r["size"] for r in rows],
                    [r["median_GBps"] for r in rows],
                    style,
                    label=labels[lib],
                )
        if dest == "device":
            ax.axhline(ceilings["pinned_h2d_GBps"], color="black", lw=0.8, label="pinned H2D")
        ax.axhline(
            ceilings["pread_warm_16t_GBps"],
            color="gray",
            ls=":",
            label="pread ceiling, 16 threads",
        )
        ax.set_xscale("log", base=2)
        ticks = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30]
        ax.set_xticks(ticks, ["4K", "64K", "1M", "16M", "256M", "1G"])
        ax.set_title(f"warm file into {dest} memory (open+read+close)")
        ax.set_xlabel("file size")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GB/s (median)")
    axes[0].legend(loc="upper left", fontsize=8)
    fig.suptitle(f"{sizes['header']['device']}, {sizes['header']['date']}", fontsize=9)
    fig.tight_layout()
    out = os.path.join(folder, "sizes-h100.png")
    fig.savefig(out, dpi=110)
    print("wrote", out)


if __name__ == "__main__":
    main()
