"""Simulated clusters, as data files.

Tessera's format (controller/sim/clusters/*.json):

    {"name": "...", "description": "...",
     "node_groups": [{"prefix": "a100-", "count": 80, "gpus": 4, "gpu_type": "A100-40GB",
                      "memory_gb": 40, "nvlink_islands": 1}, ...]}

`nvlink_islands`: 0 = PCIe only, k = the node's GPUs split into k NVLink islands of equal size.
The Crius artifact's own format (data/arena/cluster_1280.json: `[{"a100": {"node_num": 80}, ...}]`)
is read too, with the artifact's GPUs per node and memory. A bad file gets
`ClusterError: FILE line N: node_groups[i].field: why`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.common.errors import InvalidInput
from tessera.controller.core.snapshot import GpuView, NodeView

GB = 1000**3
BUILTIN = Path(__file__).with_name("clusters")

# The Crius artifact's GPU types: GPUs per node (NODE_CAPACITY), memory (gpu_specs_suite), NVLink.
ARENA_TYPES: dict[str, tuple[str, int, int, int]] = {
    "a100": ("A100-40GB", 4, 40, 1),
    "v100": ("V100-32GB", 16, 32, 1),
    "a40": ("A40-48GB", 2, 48, 0),
    "a10": ("A10-24GB", 2, 24, 0),
}


class ClusterError(InvalidInput, ValueError):
    """A node-groups cluster file that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class NodeGroup:
    prefix: str
    count: int
    gpus: int
    gpu_type: str
    memory_gb: float
    nvlink_islands: int = 0


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
                out.append(NodeView(f"{g.prefix}{k:0{width}d}", gpus))
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


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _array_item_lines(text: str, key: str) -> list[int]:
    """Line of each object in the array under `key` (a small scanner that skips strings)."""
    at = text.find(f'"{key}"')
    if at < 0:
        return []
    i = text.find("[", at)
    depth, lines, in_str, esc = 0, [], False, False
    while 0 <= i < len(text):
        c = text[i]
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "[{":
            depth += 1
            if c == "{" and depth == 2:
                lines.append(_line_of(text, i))
        elif c in "]}":
            depth -= 1
            if depth == 0:
                break
        i += 1
    return lines


def load_cluster(name_or_path: str) -> Cluster:
    """A built-in cluster by name (crius-1280, crius-testbed, morphling-64, frenzy-mixed, ...) or a file."""
    p = Path(name_or_path)
    if not p.suffix and not p.exists():
        p = BUILTIN / f"{name_or_path}.json"
        if not p.exists():
            raise ClusterError(f"unknown cluster {name_or_path!r}: use a file or one of {', '.join(builtin_names())}")
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ClusterError(f"{p}: cannot read: {e.strerror}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ClusterError(f"{p} line {e.lineno}: not valid JSON: {e.msg}") from None
    if isinstance(doc, list):
        return _arena(p, text, doc)
    if not isinstance(doc, dict):
        raise ClusterError(f"{p} line 1: expected an object with node_groups")
    groups = doc.get("node_groups")
    if not isinstance(groups, list) or not groups:
        raise ClusterError(f"{p} line 1: field node_groups: expected a non-empty list")
    lines = _array_item_lines(text, "node_groups")
    out = []
    for i, g in enumerate(groups):
        ln = lines[i] if i < len(lines) else 1
        where = f"{p} line {ln}: node_groups[{i}]"
        if not isinstance(g, dict):
            raise ClusterError(f"{where}: expected an object")
        out.append(_group(where, g))
    prefixes = [g.prefix for g in out]
    dup = sorted({x for x in prefixes if prefixes.count(x) > 1})
    if dup:
        raise ClusterError(f"{p}: node_groups: prefix {dup[0]!r} used twice (node names must be unique)")
    name = doc.get("name") or p.stem
    return Cluster(str(name), tuple(out), str(doc.get("description", "")))


def _group(where: str, g: dict[str, Any]) -> NodeGroup:
    def need(field: str, kind: type, positive: bool = True) -> Any:
        if field not in g:
            raise ClusterError(f"{where}.{field}: missing")
        v = g[field]
        if kind is int and (not isinstance(v, int) or isinstance(v, bool)):
            raise ClusterError(f"{where}.{field}: expected an integer, got {v!r}")
        if kind is float and (not isinstance(v, (int, float)) or isinstance(v, bool)):
            raise ClusterError(f"{where}.{field}: expected a number, got {v!r}")
        if kind is str and (not isinstance(v, str) or not v):
            raise ClusterError(f"{where}.{field}: expected a non-empty string, got {v!r}")
        if positive and kind in (int, float) and v <= 0:
            raise ClusterError(f"{where}.{field}: must be > 0, got {v!r}")
        return v

    ng = NodeGroup(need("prefix", str), need("count", int), need("gpus", int), need("gpu_type", str),
                   float(need("memory_gb", float)), int(g.get("nvlink_islands", 0)))
    if ng.nvlink_islands < 0 or (ng.nvlink_islands and ng.gpus % ng.nvlink_islands):
        raise ClusterError(f"{where}.nvlink_islands: must divide gpus ({ng.gpus}), got {ng.nvlink_islands}")
    return ng


def _arena(p: Path, text: str, doc: list[Any]) -> Cluster:
    if len(doc) != 1 or not isinstance(doc[0], dict):
        raise ClusterError(f"{p} line 1: expected [{{<gpu type>: {{\"node_num\": N}}, ...}}]")
    groups = []
    for t, spec in doc[0].items():
        at = text.find(f'"{t}"')
        ln = _line_of(text, at) if at >= 0 else 1
        if t not in ARENA_TYPES:
            raise ClusterError(f"{p} line {ln}: GPU type {t!r}: unknown to the Crius artifact "
                               f"(known: {', '.join(ARENA_TYPES)})")
        if not isinstance(spec, dict) or not isinstance(spec.get("node_num"), int) or spec["node_num"] <= 0:
            raise ClusterError(f"{p} line {ln}: {t}.node_num: expected a positive integer")
        name, per, mem, isl = ARENA_TYPES[t]
        groups.append(NodeGroup(f"{t}-", spec["node_num"], per, name, float(mem), isl))
    return Cluster(p.stem, tuple(groups), "Crius artifact cluster file")
