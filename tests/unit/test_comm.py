"""Communication model: bus factors, alpha-beta fallback, profiled table with interpolation."""

from __future__ import annotations

import json

import pytest

from tessera.estimator.comm import (
    AlphaBeta,
    CommError,
    CommModel,
    CommPoint,
    CommTable,
    Link,
    bus_factor,
)

LINK = Link("nvlink", 100.0, latency_s=10e-6, efficiency=1.0)


def test_bus_factors_follow_nccl_tests() -> None:
    assert bus_factor("all_reduce", 4) == 1.5
    assert bus_factor("all_gather", 4) == 0.75
    assert bus_factor("reduce_scatter", 8) == 0.875
    assert bus_factor("all_to_all", 2) == 0.5
    assert bus_factor("p2p", 2) == 1.0
    assert bus_factor("all_reduce", 1) == 0.0


def test_alpha_beta_golden() -> None:
    # ring all-reduce over 4 ranks: 2(n-1) latency steps + 2(n-1)/n * bytes / bandwidth
    t = AlphaBeta().time("all_reduce", 1e9, 4, LINK)
    assert t.seconds == pytest.approx(6 * 10e-6 + 1.5 * 1e9 / 100e9)
    assert t.source == "formula:alpha-beta"
    # two groups sharing the link take twice the bandwidth term
    t2 = AlphaBeta().time("all_gather", 1e9, 4, LINK, sharing=2)
    assert t2.seconds == pytest.approx(3 * 10e-6 + 2 * 0.75 * 1e9 / 100e9)
    assert AlphaBeta().time("p2p", 5e8, 2, Link("ib", 10.0, 0.0, 0.5)).seconds == pytest.approx(0.1)


def table() -> CommTable:
    return CommTable.from_points(
        [CommPoint("all_reduce", "nvlink", 2, 1000, 1e-3), CommPoint("all_reduce", "nvlink", 2, 3000, 3e-3),
         CommPoint("all_reduce", "nvlink", 2, 5000, 4e-3)], name="t")


def test_interpolation_between_below_and_above_points() -> None:
    t = table()
    assert t.lookup("all_reduce", "nvlink", 2, 2000) == pytest.approx(2e-3)
    assert t.lookup("all_reduce", "nvlink", 2, 4000) == pytest.approx(3.5e-3)
    assert t.lookup("all_reduce", "nvlink", 2, 10) == pytest.approx(1e-3)  # latency floor
    assert t.lookup("all_reduce", "nvlink", 2, 7000) == pytest.approx(5e-3)  # last segment's slope
    assert t.lookup("all_gather", "nvlink", 2, 1000) is None
    assert t.lookup("all_reduce", "pcie", 2, 1000) is None


def test_unprofiled_world_size_scales_by_bus_factor() -> None:
    # 4 ranks move 1.5x the bytes per link of 2 ranks: 2000 bytes at world 4 ~ 3000 bytes at world 2
    assert table().lookup("all_reduce", "nvlink", 4, 2000) == pytest.approx(3e-3)


def test_model_prefers_table_and_says_so() -> None:
    m = CommModel(table())
    a = m.time("all_reduce", 2000, 2, LINK)
    assert a.source == "profiled:t" and a.seconds == pytest.approx(2e-3)
    b = m.time("all_gather", 2000, 2, LINK)
    assert b.source == "formula:alpha-beta"
    assert m.time("all_reduce", 2000, 1, LINK).seconds == 0.0


def test_json_round_trip_and_errors() -> None:
    t = table()
    again = CommTable.from_json(t.to_json())
    assert again.keys() == t.keys()
    assert again.lookup("all_reduce", "nvlink", 2, 2000) == pytest.approx(2e-3)
    with pytest.raises(CommError, match="^entries:"):
        CommTable.from_json(json.dumps({"name": "x"}))
    with pytest.raises(CommError, match=r"^entries\[0\]:"):
        CommTable.from_json({"entries": [{"op": "all_reduce"}]})
    with pytest.raises(CommError, match="^op:"):
        CommTable.from_points([CommPoint("broadcast", "nvlink", 2, 1, 1.0)])
    with pytest.raises(CommError, match="^link.kind:"):
        Link("carrier-pigeon", 1.0)
    with pytest.raises(CommError, match="^link.bandwidth_gbps:"):
        Link("ib", 0.0)
    with pytest.raises(CommError, match="^nbytes:"):
        AlphaBeta().time("p2p", -1, 2, LINK)
