"""Every input-file parser, fed a wrong value at every field of a valid file: a located
InputFileError or a result, never another exception (hostile input must not crash a command)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.clients.estimate import load_cluster
from tessera.clients.jobfile import load_job_file
from tessera.common.inventoryfile import read_inventory_file
from tessera.common.objective import load_prices
from tessera.common.yamlfile import InputFileError
from tessera.controller.sim.clusters import load_cluster as sim_cluster
from tessera.nodeagent.inventory import HostFacts, load_declared

REPO = Path(__file__).resolve().parents[2]
WRONG: list[Any] = [None, True, -1, 0, 10**30, 2.5, "", "x" * 300, [], [1, {"a": None}], {}, {"k": [1]}]


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield (*prefix, key)
        yield from _paths(value, (*prefix, key))


def _with(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    out = copy.deepcopy(doc)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


READERS: dict[str, tuple[Path, list[Callable[[Path], object]]]] = {
    "job": (REPO / "examples/jobs/medium.yaml", [load_job_file]),
    "inventory": (REPO / "examples/inventories/a100-node.yaml",
                  [read_inventory_file, lambda p: load_declared(p, "n", HostFacts("h", 1, 0)),
                   lambda p: load_cluster([str(p)])]),
    "pools": (REPO / "examples/clusters/espresso-rental.yaml", [lambda p: load_cluster([str(p)])]),
    "prices": (REPO / "examples/cost/prices.yaml", [load_prices]),
    "node_groups": (REPO / "controller/sim/clusters/frenzy-testbed.json",
                    [lambda p: load_cluster([str(p)]), lambda p: sim_cluster(str(p))]),
}


@pytest.mark.parametrize("fmt", sorted(READERS))
def test_a_wrong_value_anywhere_is_an_input_file_error(fmt: str, tmp_path: Path) -> None:
    source, readers = READERS[fmt]
    doc = yaml.safe_load(source.read_text())
    for key in ("pools", "node_groups", "gpus"):  # one item shows every field of a list; more is only slower
        if key in doc:
            doc[key] = doc[key][:1]
    path = tmp_path / f"f{source.suffix}"
    refused = 0
    for field in _paths(doc):
        for value in WRONG:
            path.write_text(yaml.safe_dump(_with(doc, field, value)))
            for read in readers:
                try:
                    read(path)
                except InputFileError as exc:
                    assert exc.file == str(path) and "\n" not in str(exc), str(exc)
                    refused += 1
    assert refused > len(list(_paths(doc))) * len(WRONG) // 2  # most wrong values are refused
