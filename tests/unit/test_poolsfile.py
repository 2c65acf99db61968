"""`pools:` cluster files: the one parser (tessera.estimator.clusterfile.parse_pools), its golden spec,
every bad input as `FILE line N: field F: why`, and the CLI and the Cell estimator reading alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.clients.estimate import load_cluster
from tessera.common.yamlfile import InputFileError, read_yaml
from tessera.estimator.cells import ClusterSpec, GpuPool
from tessera.estimator.clusterfile import ClusterFileError, PoolSpec, read_pools_file
from tessera.estimator.service.handlers import cluster_spec

REPO = Path(__file__).resolve().parents[2]

VALID = """\
name: lab
description: two pools
pools:
  - gpu: a100
    nodes: 2
    gpus_per_node: 4
    intra_link: nvlink
  - {gpu: A10, num_gpus: 6, gpus_per_node: 2, nic_gbps: 3.125, pcie_gbps: 16}
  - {gpu: H100, nodes: 1, gpus_per_node: 8, price_per_hour: 2, currency: EUR}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def test_valid_file_gives_the_spec(tmp_path: Path) -> None:
    assert read_pools_file(_write(tmp_path, VALID)) == (
        PoolSpec("A100-80GB", 8, 4, "nvlink"),
        PoolSpec("A10-24GB", 6, 2, "", nic_gbps=3.125, pcie_gbps=16.0),
        PoolSpec("H100-80GB", 8, 8, "", price_per_hour=2.0, currency="EUR"),
    )


POOL = "pools:\n  - gpu: A100\n    nodes: 1\n    gpus_per_node: 4\n"  # the pool's keys are lines 2-4

BAD = [
    ("pools:\n  - {gpu: Z9, nodes: 1, gpus_per_node: 4}\n", 2, "pools[0].gpu", "unknown GPU model 'Z9'"),
    ("pools:\n  - gpu: A100\n    gpus_per_node: 4\n", 2, "pools[0]", "give nodes or num_gpus (one of them)"),
    (POOL + "    num_gpus: 4\n", 2, "pools[0]", "give nodes or num_gpus (one of them)"),
    ("pools:\n  - gpu: A100\n    nodes: 1\n    gpus_per_node: 0\n", 4, "pools[0].gpus_per_node",
     "must be an integer >= 1, got 0"),
    ("pools:\n  - gpu: A100\n    nodes: 1.5\n    gpus_per_node: 4\n", 3, "pools[0].nodes",
     "must be an integer >= 1, got 1.5"),
    ("pools:\n  - gpu: A100\n    nodes: 200000\n    gpus_per_node: 4\n", 3, "pools[0].nodes",
     "must be <= 100,000, got 200,000"),
    (POOL.replace("gpus_per_node: 4", "gpus_per_node: 4096"), 4, "pools[0].gpus_per_node",
     "must be <= 1,024, got 4,096"),
    (POOL + "    color: red\n", 5, "pools[0].color", "unknown key (known: gpu, nodes, num_gpus"),
    (POOL + "    intra_link: infiniband\n", 5, "pools[0].intra_link", "must be nvlink or pcie, got 'infiniband'"),
    ("pools:\n  - gpu: A10\n    nodes: 1\n    gpus_per_node: 4\n    intra_link: nvlink\n", 5,
     "pools[0].intra_link", "A10-24GB has no NVLink in the catalog"),
    (POOL + "    nic_gbps: 0\n", 5, "pools[0].nic_gbps", "must be a number 0.0125..10,000 (GB/s"),
    (POOL + "    nic_gbps: .inf\n", 5, "pools[0].nic_gbps", "must be a finite number, got '.inf'"),
    (POOL + "    pcie_gbps: fast\n", 5, "pools[0].pcie_gbps", "must be a number 0.0125..10,000 (GB/s"),
    (POOL + "    price_per_hour: -1\n", 5, "pools[0].price_per_hour",
     "must be a number >= 0 (per GPU-hour), got -1"),
    (POOL + "    price_per_hour: 2\n    currency: usd\n", 6, "pools[0].currency",
     "must be an ISO 4217 code such as USD, got 'usd'"),
    (POOL + "    currency: USD\n", 5, "pools[0].currency", "given without price_per_hour"),
    (POOL + "    nodes: 2\n", 5, "pools[0].nodes", "duplicate key (first at line 3)"),
    ("pools: []\n", 1, "pools", "must be a non-empty list"),
    ("pools:\n  - A100\n", 2, "pools[0]", "must be a mapping with gpu, nodes and gpus_per_node"),
    (POOL + "owner: me\n", 5, "owner", "unknown key (known: pools, name, description)"),
    (POOL + "name: [a]\n", 5, "name", "expected a string, got ['a']"),
]


@pytest.mark.parametrize(("text", "line", "field", "why"), BAD, ids=[f"{b[2]}:{b[3][:24]}" for b in BAD])
def test_bad_input_names_file_line_and_field(tmp_path: Path, text: str, line: int, field: str, why: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ClusterFileError) as err:
        read_pools_file(path)
    assert (err.value.file, err.value.line, err.value.field) == (str(path), line, field)
    assert err.value.reason.startswith(why), err.value.reason
    assert str(err.value) == f"{path} line {line}: field {field}: {err.value.reason}"
    # `tessctl estimate --cluster` reads the file through the same parser: the same error.
    with pytest.raises(ClusterFileError) as cli:
        load_cluster([str(path)])
    assert str(cli.value) == str(err.value)
    # The Cell estimator's ClusterSpec.from_mapping checks the same (it has no file: `F: why`).
    with pytest.raises(InputFileError) as lib:  # the reader's own refusals are not a ClusterFileError here
        ClusterSpec.from_mapping(read_yaml(path))
    assert (lib.value.field, lib.value.reason) == (field, err.value.reason)


@pytest.mark.parametrize("name", ["four-types.yaml", "espresso-rental.yaml"])
def test_the_cli_and_the_estimator_build_the_same_cluster(name: str) -> None:
    path = REPO / "examples" / "clusters" / name
    library = ClusterSpec.from_mapping(read_yaml(path))
    assert cluster_spec(load_cluster([str(path)])) == library
    assert all(isinstance(p, GpuPool) for p in library.pools) and len(library.pools) == 4


def test_defaults_are_the_estimators(tmp_path: Path) -> None:
    (pool,) = ClusterSpec.from_mapping(read_yaml(_write(tmp_path, POOL))).pools
    assert (pool.gpu, pool.num_gpus, pool.intra_link, pool.nic_gbps, pool.pcie_gbps, pool.price_per_hour) == (
        "A100-80GB", 4, "nvlink", 12.5, 32.0, None)
