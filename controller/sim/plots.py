"""PNG plots of a simulation, one meaning per chart, each titled with the trace and the cluster:

- `throughput.png`: cluster throughput over time per policy (5-round moving mean, as the Crius
  artifact draws it); samples/s, or iterations/s under the Morphling rules (whose jobs carry no batch);
- `jct_cdf.png`: JCT CDF over the *submitted* jobs, so that curves of policies that finished
  different numbers of jobs compare the same set (a curve ends at its finished share); each curve
  is labelled with its count, "crius (23/51 finished)";
- `jct_reduction_finished.png`, `jct_reduction_padded.png`: the reference policy's JCT reduction
  against each other policy, by each of the two averagings (docs/simulator.md), in %;
- `throughput_ratio.png`: the reference's average throughput over each other policy's (x).

`figures` builds them from plain numbers (`Series`), `draw` from simulation results and saves them.
matplotlib is optional (dev extra): without it `draw` returns the reason and writes nothing.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tessera.controller.sim.engine import SimResult
from tessera.controller.sim.metrics import jct_list

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class Series:
    """What the plots need of one policy's run."""

    jcts_s: Sequence[float]  # JCT of each finished job, seconds
    submitted: int  # jobs that arrived within the run
    throughput: Sequence[float]  # cluster throughput per round
    round_s: float  # seconds per round

    @property
    def finished(self) -> int:
        return len(self.jcts_s)


@dataclass(frozen=True)
class Context:
    trace: str
    cluster: str
    rules: str = ""

    @property
    def throughput_unit(self) -> str:
        # Morphling's jobs have no batch in the trace: the simulator counts iterations (docs/simulator.md)
        return "iterations/s" if self.rules == "morphling" else "samples/s"

    def title(self, what: str) -> str:
        rules = f", {self.rules} rules" if self.rules else ""
        return f"{textwrap.fill(what, 72)}\n{self.trace} on {self.cluster}{rules}"


def count_label(label: str, s: Series) -> str:
    return f"{label} ({s.finished}/{s.submitted} finished)"


def series_of(res: SimResult, interval_s: float) -> Series:
    horizon = len(res.rounds)
    return Series(jct_list(res), sum(1 for j in res.jobs if j.arrive_round < horizon),
                  [r.throughput for r in res.rounds], interval_s)


def figures(series: Mapping[str, Series], comparison: Mapping[str, Any], ctx: Context) -> dict[str, Figure]:
    """The charts by file name, as matplotlib figures (not saved; the caller closes them)."""
    from matplotlib.figure import Figure

    out: dict[str, Figure] = {}

    fig = Figure(figsize=(12, 4.5), dpi=120)
    ax = fig.subplots()
    for label, s in series.items():
        ys = list(s.throughput)
        xs = [i * s.round_s / 3600 for i in range(len(ys))]
        sm = [sum(ys[max(0, i - 2): i + 3]) / len(ys[max(0, i - 2): i + 3]) for i in range(len(ys))]
        ax.plot(xs, sm, label=count_label(label, s), linewidth=1.2)
    ax.set_xlabel("time since the first round (h)")
    ax.set_ylabel(f"cluster throughput ({ctx.throughput_unit})")
    ax.set_title(ctx.title("Cluster throughput, 5-round moving mean"), fontsize=10)
    ax.grid(axis="y", linestyle="--", color="lightgray")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    out["throughput.png"] = fig

    fig = Figure(figsize=(7, 4.5), dpi=120)
    ax = fig.subplots()
    for label, s in series.items():
        hrs = sorted(x / 3600 for x in s.jcts_s)
        n = max(s.submitted, 1)
        ax.step(hrs, [(i + 1) / n for i in range(len(hrs))], where="post", label=count_label(label, s))
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("fraction of submitted jobs finished (0-1)")
    ax.set_ylim(0, 1.02)
    if any(x > 0 for s in series.values() for x in s.jcts_s):
        ax.set_xscale("log")
    ax.set_title(ctx.title("JCT CDF over submitted jobs (a curve ends at its finished share)"), fontsize=10)
    ax.grid(linestyle="--", color="lightgray")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    out["jct_cdf.png"] = fig

    others = [k for k in comparison if isinstance(comparison[k], dict)]
    if not others:
        return out
    ref = str(comparison.get("reference", "crius"))
    ticks = [count_label(k, series[k]).replace(" (", "\n(") if k in series else k for k in others]
    ref_s = series.get(ref)
    ref_txt = count_label(ref, ref_s) if ref_s else ref
    charts = (
        ("jct_reduction_finished.png", "jct_reduction_finished", 100.0, "JCT reduction (%)",
         f"JCT reduction of {ref_txt} against each policy: means over each one's finished jobs"),
        ("jct_reduction_padded.png", "jct_reduction_padded", 100.0, "JCT reduction (%)",
         (f"JCT reduction of {ref_txt} against each policy: the Crius artifact's averaging (unfinished "
          "jobs padded with the largest JCT)")),
        ("throughput_ratio.png", "throughput_ratio", 1.0, "throughput ratio (x)",
         f"Average cluster throughput of {ref} / each policy's"),
    )
    for name, key, scale, ylabel, what in charts:
        fig = Figure(figsize=(max(7.0, 1.3 * len(others)), 4.8), dpi=120)
        ax = fig.subplots()
        vals = [scale * float(comparison[k][key]) for k in others]
        bars = ax.bar(range(len(others)), vals, 0.6)
        ax.bar_label(bars, labels=[f"{v:.1f}%" if scale != 1.0 else f"{v:.2f}x" for v in vals], fontsize=8)
        ax.set_xticks(range(len(others)))
        ax.set_xticklabels(ticks, fontsize=8, rotation=30 if len(others) > 6 else 0,
                           ha="right" if len(others) > 6 else "center")
        ax.set_xlabel("policy compared with (jobs it finished)")
        ax.set_ylabel(ylabel)
        ax.axhline(1.0 if scale == 1.0 else 0.0, color="black", linewidth=0.8)
        ax.set_title(ctx.title(what), fontsize=9)
        ax.grid(axis="y", linestyle="--", color="lightgray")
        fig.tight_layout()
        out[name] = fig
    return out


def draw(results: dict[str, SimResult], comparison: dict[str, Any], out: Path, interval_s: float = 0.0) -> list[str]:
    """Write the charts under `out`; return the files written (or one line saying why none was)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return ["(no plots: matplotlib is not installed; pip install matplotlib)"]
    first = next(iter(results.values()), None)
    if first is None:
        return []
    if not interval_s and len(first.rounds) > 1:
        interval_s = first.rounds[1].time - first.rounds[0].time
    ctx = Context(first.trace, first.cluster, first.rules)
    figs = figures({k: series_of(v, interval_s) for k, v in results.items()}, comparison, ctx)
    written = []
    for name, fig in figs.items():
        p = out / name
        fig.savefig(p)
        written.append(str(p))
    return written
