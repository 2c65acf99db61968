"""PNG plots of a simulation: throughput over time per policy, JCT CDFs, headline ratios.

matplotlib is optional (dev extra): without it `draw` returns the reason and writes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tessera.controller.sim.engine import SimResult
from tessera.controller.sim.metrics import jct_list


def draw(results: dict[str, SimResult], comparison: dict[str, Any], out: Path) -> list[str]:
    """Write throughput.png, jct_cdf.png and ratios.png under `out`; return the files written (or
    one line saying why none was)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["(no plots: matplotlib is not installed; pip install matplotlib)"]
    written = []
    fig, ax = plt.subplots(figsize=(12, 4), dpi=120)
    for label, res in results.items():
        xs = [r.index for r in res.rounds]
        ys = [r.throughput for r in res.rounds]
        # the artifact smooths with a 5-round moving mean
        sm = [sum(ys[max(0, i - 2): i + 3]) / len(ys[max(0, i - 2): i + 3]) for i in range(len(ys))]
        ax.plot(xs, sm, label=label, linewidth=1.2)
    ax.set_xlabel("round")
    ax.set_ylabel("cluster throughput (samples/s)")
    ax.grid(axis="y", linestyle="--", color="lightgray")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    p = out / "throughput.png"
    fig.savefig(p)
    plt.close(fig)
    written.append(str(p))

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for label, res in results.items():
        hrs = sorted(x / 3600 for x in jct_list(res))
        if hrs:
            ax.plot(hrs, [(i + 1) / len(hrs) for i in range(len(hrs))], label=label)
    ax.set_xlabel("JCT (hours, finished jobs)")
    ax.set_ylabel("CDF")
    ax.set_xscale("log")
    ax.grid(linestyle="--", color="lightgray")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out / "jct_cdf.png"
    fig.savefig(p)
    plt.close(fig)
    written.append(str(p))

    others = [k for k in comparison if isinstance(comparison[k], dict)]
    if others:
        fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
        ref = comparison.get("reference", "crius")
        width = 0.25
        xs = list(range(len(others)))
        ax.bar([x - width for x in xs], [100 * comparison[k]["jct_reduction_finished"] for k in others], width,
               label=f"JCT reduction of {ref}, finished jobs (%)")
        ax.bar(xs, [100 * comparison[k]["jct_reduction_padded"] for k in others], width,
               label=f"JCT reduction of {ref}, artifact padding (%)")
        ax.bar([x + width for x in xs], [100 * comparison[k]["throughput_ratio"] for k in others], width,
               label=f"throughput of {ref} / policy (%)")
        ax.set_xticks(xs)
        ax.set_xticklabels(others)
        ax.axhline(0, color="black", linewidth=0.8)
        ax.legend(fontsize=7)
        ax.grid(axis="y", linestyle="--", color="lightgray")
        fig.tight_layout()
        p = out / "ratios.png"
        fig.savefig(p)
        plt.close(fig)
        written.append(str(p))
    return written
