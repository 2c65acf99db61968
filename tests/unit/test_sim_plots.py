"""The simulator's charts, built from literal numbers and read back from the matplotlib figures:
a count on every curve, units on every axis, one meaning per chart, trace and cluster in titles."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from tessera.controller.sim.plots import Context, Series, figures

SERIES = {
    "crius": Series([3600.0, 7200.0, 1800.0], 5, [1.0, 2.0, 3.0], 300.0),
    "fcfs": Series([36000.0], 5, [1.0, 1.0, 0.0], 300.0),
}
COMPARISON = {
    "reference": "crius",
    "fcfs": {"jct_reduction_finished": 0.8889, "jct_reduction_padded": 0.95, "throughput_ratio": 3.0},
}


def texts(fig):  # type: ignore[no-untyped-def]
    ax = fig.axes[0]
    legend = ax.get_legend()
    return (ax.get_title(), ax.get_xlabel(), ax.get_ylabel(),
            [t.get_text() for t in legend.get_texts()] if legend else [],
            [t.get_text() for t in ax.get_xticklabels()])


def test_each_chart_has_counts_units_one_meaning_and_trace_and_cluster() -> None:
    figs = figures(SERIES, COMPARISON, Context("arena-philly", "crius-1280", "arena"))
    assert sorted(figs) == ["jct_cdf.png", "jct_reduction_finished.png", "jct_reduction_padded.png",
                            "throughput.png", "throughput_ratio.png"]
    for name, fig in figs.items():
        assert len(fig.axes) == 1, name  # one chart per file
        title, xl, yl, _, _ = texts(fig)
        assert "arena-philly on crius-1280" in title, name
        assert "(" in xl and "(" in yl, (name, xl, yl)  # a unit on both axes

    title, xl, yl, legend, _ = texts(figs["jct_cdf.png"])
    assert legend == ["crius (3/5 finished)", "fcfs (1/5 finished)"]
    assert xl == "job completion time (h)" and yl == "fraction of submitted jobs finished (0-1)"
    # the CDF is over the submitted jobs: crius's curve ends at 3/5, at 2 h
    line = figs["jct_cdf.png"].axes[0].get_lines()[0]
    assert list(line.get_xdata()) == [0.5, 1.0, 2.0] and list(line.get_ydata()) == pytest.approx([0.2, 0.4, 0.6])

    _, xl, yl, legend, _ = texts(figs["throughput.png"])
    assert legend == ["crius (3/5 finished)", "fcfs (1/5 finished)"]
    assert xl == "time since the first round (h)" and yl == "cluster throughput (samples/s)"

    title, _, yl, _, ticks = texts(figs["jct_reduction_padded.png"])
    assert yl == "JCT reduction (%)" and ticks == ["fcfs\n(1/5 finished)"] and "crius (3/5 finished)" in title
    assert "padded" in title and "finished jobs" not in title.split("\n")[0].split(":")[-1]
    _, _, yl, _, _ = texts(figs["jct_reduction_finished.png"])
    assert yl == "JCT reduction (%)"
    bars = figs["jct_reduction_finished.png"].axes[0].patches
    assert [round(b.get_height(), 2) for b in bars] == [88.89]
    _, _, yl, _, _ = texts(figs["throughput_ratio.png"])
    assert yl == "throughput ratio (x)"
    assert [b.get_height() for b in figs["throughput_ratio.png"].axes[0].patches] == [3.0]


def test_morphling_throughput_is_in_iterations_and_figures_save(tmp_path: Path) -> None:
    figs = figures(SERIES, {"reference": "crius"}, Context("morphling-base", "morphling-64", "morphling"))
    assert sorted(figs) == ["jct_cdf.png", "throughput.png"]  # nothing to compare with
    assert texts(figs["throughput.png"])[2] == "cluster throughput (iterations/s)"
    figs["jct_cdf.png"].savefig(tmp_path / "cdf.png")
    assert (tmp_path / "cdf.png").stat().st_size > 0
