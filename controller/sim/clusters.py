"""Simulated clusters, as data files.

Tessera's format (controller/sim/clusters/*.json; YAML works too):

    {"name": "...", "description": "...",
     "node_groups": [{"prefix": "a100-", "count": 80, "gpus": 4, "gpu_type": "A100-40GB",
                      "memory_gb": 40, "nvlink_islands": 1}, ...]}

`nvlink_islands`: 0 = PCIe only, k = the node's GPUs split into k NVLink islands of equal size.
Its one parser is tessera.estimator.clusterfile.parse_node_groups, shared with `tessctl estimate
--cluster`; this module turns its spec into simulated nodes. The Crius artifact's own format
(data/arena/cluster_1280.json: `[{"a100": {"node_num": 80}, ...}]`) is read too, with the artifact's
GPUs per node and memory. A bad file gets `ClusterError: FILE line N: field F: why`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.common.yamlfile import parse_with_lines, read_yaml
from tessera.controller.core.snapshot import GpuView, NodeView
from tessera.estimator.clusterfile import (
    MAX_NODES_PER_GROUP,
    ClusterFileError,
    NodeGroupsSpec,
    parse_node_groups,
)

GB = 1000**3
BUILTIN = Path(__file__).with_name("clusters")

# The Crius artifact's GPU types: GPUs per node (NODE_CAPACITY), memory (gpu_specs_suite), NVLink.
ARENA_TYPES: dict[str, tuple[str, int, int, int]] = {
    "a100": ("A100-40GB", 4, 40, 1),
    "v100": ("V100-32GB", 16, 32, 1),
    "a40": ("A40-48GB", 2, 48, 0),
    "a10": ("A10-24GB", 2, 24, 0),
}


ClusterError = ClusterFileError  # the simulator's name for the one cluster-file error


@dataclass(frozen=True)
class NodeGroup:
    prefix: str
    count: int
    gpus: int
    gpu_type: str
    memory_gb: float
    nvlink_islands: int = 0
    cpus: int = 0  # per node; 0 = not given
    host_memory_gb: float = 0.0  # per node; 0 = not given


@dataclass(frozen=True)
class Cluster:
    name: str
    groups: tuple[NodeGroup, ...]
    description: str = ""

    def nodes(self) -> tuple[NodeView, ...]:
        out = []
        for g in self.groups:
            width = max(2, len(str(g.count - 1)))
            per = g.gpus // g.nvlink_islands if g.nvlink_islands else 0
            gpus = tuple(GpuView(i, g.gpu_type, int(g.memory_gb * GB), island=(i // per if per else -1))
                         for i in range(g.gpus))
            for k in range(g.count):
                out.append(NodeView(f"{g.prefix}{k:0{width}d}", gpus, cpus=g.cpus,
                                    host_memory_bytes=int(g.host_memory_gb * GB)))
        return tuple(out)

    def gpu_types(self) -> list[str]:
        seen: list[str] = []
        for g in self.groups:
            if g.gpu_type not in seen:
                seen.append(g.gpu_type)
        return seen

    def total_gpus(self) -> int:
        return sum(g.count * g.gpus for g in self.groups)

    def per_node(self, gpu_type: str) -> int:
        return max((g.gpus for g in self.groups if g.gpu_type == gpu_type), default=0)

    def memory_gb(self, gpu_type: str) -> float:
        return max((g.memory_gb for g in self.groups if g.gpu_type == gpu_type), default=0.0)

    def cluster_gpus(self) -> tuple[tuple[str, int, int], ...]:
        tot: dict[tuple[str, int], int] = {}
        for g in self.groups:
            k = (g.gpu_type, int(g.memory_gb * GB))
            tot[k] = tot.get(k, 0) + g.count * g.gpus
        return tuple(sorted((m, b, c) for (m, b), c in tot.items()))


def builtin_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN.glob("*.json"))


def load_cluster(name_or_path: str) -> Cluster:
    """A built-in cluster by name (crius-1280, crius-testbed, morphling-64, frenzy-mixed, ...) or a file."""
    p = Path(name_or_path)
    if not p.suffix and not p.exists():
        p = BUILTIN / f"{name_or_path}.json"
        if not p.exists():
            raise ClusterError("", f"unknown cluster {name_or_path!r}: use a file or one of "
                               f"{', '.join(builtin_names())}")
    doc = read_yaml(p, ClusterError)
    if isinstance(doc, list):
        return parse_with_lines(doc, str(p), lambda d: _arena(p, d))
    return cluster_of(parse_with_lines(doc, str(p), parse_node_groups), p.stem)


def cluster_of(spec: NodeGroupsSpec, default_name: str) -> Cluster:
    """The simulated cluster of a parsed `node_groups:` file (named `default_name` if it has no name)."""
    groups = tuple(NodeGroup(g.prefix, g.count, g.gpus, g.gpu_type, g.memory_gb, g.nvlink_islands, g.cpus,
                             g.host_memory_gb) for g in spec.groups)
    return Cluster(spec.name or default_name, groups, spec.description)


def _arena(p: Path, doc: list[Any]) -> Cluster:
    if len(doc) != 1 or not isinstance(doc[0], dict):
        raise ClusterError("[0]", "expected [{<gpu type>: {\"node_num\": N}, ...}]")
    groups = []
    for t, spec in doc[0].items():
        if t not in ARENA_TYPES:
            raise ClusterError(f"[0].{t}", f"GPU type {t!r} is unknown to the Crius artifact "
                               f"(known: {', '.join(ARENA_TYPES)})")
        num = spec.get("node_num") if isinstance(spec, dict) else None
        if isinstance(num, bool) or not isinstance(num, int) or not 0 < num <= MAX_NODES_PER_GROUP:
            raise ClusterError(f"[0].{t}.node_num", f"expected a positive integer, got {num!r}")
        name, per, mem, isl = ARENA_TYPES[t]
        groups.append(NodeGroup(f"{t}-", num, per, name, float(mem), isl))
    return Cluster(p.stem, tuple(groups), "Crius artifact cluster file")
