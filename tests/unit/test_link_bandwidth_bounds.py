"""A link's bandwidth (`nic_gbps`, `pcie_gbps`: GB/s per node and direction) is 0.0125..10,000 GB/s
(0.1 Gb/s to 80 Tb/s), in a cluster file and in every GpuPool (a service request's, PlaceStages's
stages). Before, any number > 0 passed: at 1e-300 a Cell over two nodes took ~1e297 s an iteration."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from tessera.estimator.cells import CellInputError, GpuPool
from tessera.estimator.clusterfile import MAX_LINK_GBPS, MIN_LINK_GBPS, ClusterFileError, parse_pools
from tests.procs import REPO

REFUSED = [1e-300, 5e-324, 0.01, 0.0, -12.5, MAX_LINK_GBPS * 1.0001, 1e300, math.inf, -math.inf, math.nan, True]
KEPT = [MIN_LINK_GBPS, 0.3125, 3.125, 12.5, 400, MAX_LINK_GBPS]


@pytest.mark.parametrize("field", ["nic_gbps", "pcie_gbps"])
@pytest.mark.parametrize("v", REFUSED)
def test_a_pool_refuses_a_link_out_of_bounds_naming_it(field: str, v: float) -> None:
    with pytest.raises(CellInputError) as err:
        GpuPool("A10-24GB", 8, 2, "pcie", **{field: v})  # type: ignore[arg-type]
    assert err.value.field == field
    assert err.value.reason.startswith("must be a number 0.0125..10,000 (GB/s per direction"), err.value.reason


@pytest.mark.parametrize("field", ["nic_gbps", "pcie_gbps"])
@pytest.mark.parametrize("v", REFUSED)
def test_a_cluster_file_refuses_the_same_links(field: str, v: float) -> None:
    doc = {"pools": [{"gpu": "A10", "nodes": 4, "gpus_per_node": 2, field: v}]}
    with pytest.raises(ClusterFileError) as err:
        parse_pools(doc)
    assert err.value.field == f"pools[0].{field}"
    assert err.value.reason.startswith("must be a number 0.0125..10,000"), err.value.reason


@pytest.mark.parametrize("v", KEPT)
def test_links_within_the_bounds_are_kept(v: float) -> None:
    assert GpuPool("A10-24GB", 8, 2, "pcie", nic_gbps=v, pcie_gbps=v).nic_gbps == v
    (spec,) = parse_pools({"pools": [{"gpu": "A10", "nodes": 4, "gpus_per_node": 2, "nic_gbps": v, "pcie_gbps": v}]})
    assert (spec.nic_gbps, spec.pcie_gbps) == (v, v)


def _links(obj: object) -> list[float]:
    if isinstance(obj, dict):
        own = [v for k, v in obj.items() if k in ("nic_gbps", "pcie_gbps")]
        return own + [x for v in obj.values() for x in _links(v)]
    if isinstance(obj, list):
        return [x for v in obj for x in _links(v)]
    return []


def test_every_link_the_repo_ships_is_within_the_bounds() -> None:
    """The example clusters, the benchmarks' recorded settings: none below 0.1 Gb/s or above 80 Tb/s."""
    files = [*REPO.glob("examples/**/*.yaml"), *REPO.glob("examples/**/*.json"), *REPO.glob("bench/**/*.json"),
             *REPO.glob("controller/sim/clusters/*.json")]
    found = []
    for f in files:
        text = Path(f).read_text()
        if "gbps" in text:
            found += _links(json.loads(text) if f.suffix == ".json" else yaml.safe_load(text))
    assert found and all(MIN_LINK_GBPS <= v <= MAX_LINK_GBPS for v in found), found
