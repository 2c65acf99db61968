"""Cluster files, the one parser of each of their two formats.

- `pools:` (the estimator's form; examples/clusters/*.yaml, docs/estimator-service.md): GPU pools with
  their node size, links and price. Read by `tessctl estimate cells|stages --cluster` and by the Cell
  estimator's `ClusterSpec.from_mapping`.
- `node_groups:` (the simulator's form; controller/sim/clusters/*.json, docs/simulator.md): named
  groups of identical nodes. Read by `tessera-sim --cluster` (controller/sim/clusters.py) and by
  `tessctl estimate --cluster`.

Both are YAML or JSON, read by tessera.common.yamlfile; the parsers here are pure (a parsed document
in, a frozen spec out) and raise ClusterFileError naming the field, which the readers locate as
`FILE line N: field F: why`. The library and the CLI convert the specs to their own types, so they
accept and refuse the same files. This module lives in the estimator library, not the controller, so
that the CLI may use it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.common.gpus import UnknownGpuError, lookup
from tessera.common.yamlfile import InputFileError, read_and_parse, refuse_unknown_keys


class ClusterFileError(InputFileError):
    """A cluster file (either format) that cannot be used; `field` names the offending key."""


# Bounds of both formats: the simulator builds every node and the wire format holds 32-bit counts,
# so a hostile count must be an error, not an exhausted memory or an overflow.
MAX_NODES_PER_GROUP = 100_000
MAX_GPUS_PER_NODE = 1_024
# A link's bandwidth, GB/s per node and direction (GpuPool's unit): 0.1 Gb/s, a tenth of 1 Gb/s
# Ethernet, to 80 Tb/s, ten times a node of 8 x 800 Gb/s NICs. At 1e-300 every transfer took ~1e297 s
# (the Cells' iteration times and costs with it); a link past either end is a typo.
MIN_LINK_GBPS = 0.0125
MAX_LINK_GBPS = 10_000.0


def link_gbps_refusal(v: object) -> str | None:
    """Why `v` is not a link bandwidth (NaN and inf are not), or None when it is one."""
    if isinstance(v, int | float) and not isinstance(v, bool) and MIN_LINK_GBPS <= v <= MAX_LINK_GBPS:
        return None
    return (f"must be a number {MIN_LINK_GBPS:g}..{MAX_LINK_GBPS:,.0f} (GB/s per direction: 0.1 Gb/s to "
            f"80 Tb/s), got {v!r}")


# -- pools ----------------------------------------------------------------------------------------------

POOLS_TOP_KEYS = ("pools", "name", "description")
POOL_KEYS = ("gpu", "nodes", "num_gpus", "gpus_per_node", "intra_link", "nic_gbps", "pcie_gbps", "price_per_hour",
             "currency")
LINKS = ("", "nvlink", "pcie")


@dataclass(frozen=True)
class PoolSpec:
    """One pool as the file gives it: `gpu` the catalog's canonical name, `num_gpus` (nodes x
    gpus_per_node when the file gives nodes); `intra_link` "" = not said (the catalog decides);
    None = not said, the consumer's default."""

    gpu: str
    num_gpus: int
    gpus_per_node: int
    intra_link: str = ""
    nic_gbps: float | None = None
    pcie_gbps: float | None = None
    price_per_hour: float | None = None
    currency: str = ""


def parse_pools(doc: Any) -> tuple[PoolSpec, ...]:
    """The pools of one parsed `pools:` document; ClusterFileError naming the field."""
    if not isinstance(doc, Mapping):
        raise ClusterFileError("pools", "the file must be a mapping with a 'pools' list")
    refuse_unknown_keys(doc, POOLS_TOP_KEYS, "", ClusterFileError)
    _text(doc, "name", "")
    _text(doc, "description", "")
    items = doc.get("pools")
    if not isinstance(items, list) or not items:
        raise ClusterFileError("pools", "must be a non-empty list")
    return tuple(_pool(f"pools[{i}]", p) for i, p in enumerate(items))


def _pool(field: str, p: Any) -> PoolSpec:
    if not isinstance(p, Mapping):
        raise ClusterFileError(field, "must be a mapping with gpu, nodes and gpus_per_node")
    refuse_unknown_keys(p, POOL_KEYS, field, ClusterFileError)
    per = _int_at_least(p, "gpus_per_node", field, MAX_GPUS_PER_NODE)
    if ("nodes" in p) == ("num_gpus" in p):
        raise ClusterFileError(field, "give nodes or num_gpus (one of them)")
    if "num_gpus" in p:
        n = _int_at_least(p, "num_gpus", field, MAX_NODES_PER_GROUP * MAX_GPUS_PER_NODE)
    else:
        n = _int_at_least(p, "nodes", field, MAX_NODES_PER_GROUP) * per
    link = p.get("intra_link", "")
    if link not in LINKS:
        raise ClusterFileError(f"{field}.intra_link", f"must be nvlink or pcie, got {link!r}")
    gpu = catalog_gpu(p.get("gpu"), f"{field}.gpu")
    if link == "nvlink" and lookup(gpu).nvlink_gbps <= 0:
        raise ClusterFileError(f"{field}.intra_link", f"{gpu} has no NVLink in the catalog")
    speeds: dict[str, float] = {}
    for key in ("nic_gbps", "pcie_gbps"):
        if key in p:
            v = p[key]
            why = link_gbps_refusal(v)
            if why:
                raise ClusterFileError(f"{field}.{key}", why)
            speeds[key] = float(v)
    price = None
    if "price_per_hour" in p:
        v = p["price_per_hour"]
        if not _is_number(v) or not 0 <= v < math.inf:
            raise ClusterFileError(f"{field}.price_per_hour", f"must be a number >= 0 (per GPU-hour), got {v!r}")
        price = float(v)
    currency = ""
    if "currency" in p:
        cur = p["currency"]
        if not isinstance(cur, str) or not re.fullmatch(r"[A-Z]{3}", cur):
            raise ClusterFileError(f"{field}.currency", f"must be an ISO 4217 code such as USD, got {cur!r}")
        if price is None:
            raise ClusterFileError(f"{field}.currency", "given without price_per_hour")
        currency = cur
    return PoolSpec(gpu, n, per, link, speeds.get("nic_gbps"), speeds.get("pcie_gbps"), price, currency)


def read_pools_file(path: str | Path) -> tuple[PoolSpec, ...]:
    """Read and parse a `pools:` cluster file; ClusterFileError `FILE line N: field F: why`."""
    return read_and_parse(path, parse_pools, ClusterFileError)


# -- node groups ------------------------------------------------------------------------------------------

NODE_GROUPS_TOP_KEYS = ("node_groups", "name", "description")
NODE_GROUP_KEYS = ("prefix", "count", "gpus", "gpu_type", "memory_gb", "nvlink_islands", "cpus", "host_memory_gb")
# Bounds of a node's host resources (a hostile count must be an error, not an overflow).
MAX_CPUS_PER_NODE = 65_536
MAX_HOST_MEMORY_GB = 1_048_576.0


@dataclass(frozen=True)
class NodeGroupSpec:
    """`count` nodes named prefix + index, each with `gpus` GPUs of `gpu_type` and `memory_gb` each;
    `nvlink_islands`: 0 = PCIe only, k = the GPUs split into k NVLink islands. `gpu_type` is the
    catalog's name when `in_catalog`, else the file's: a simulated cluster may hold GPUs the catalog
    lacks (frenzy-mixed's RTX 6000), which only the estimator, needing their specs, refuses."""

    prefix: str
    count: int
    gpus: int
    gpu_type: str
    memory_gb: float
    nvlink_islands: int = 0
    in_catalog: bool = True
    # Host resources of each node (Morphling: CPUs and host memory are resources next to GPUs);
    # 0 = not given (the node is not limited by them).
    cpus: int = 0
    host_memory_gb: float = 0.0


@dataclass(frozen=True)
class NodeGroupsSpec:
    groups: tuple[NodeGroupSpec, ...]
    name: str = ""  # "" = not given (the simulator names the cluster after the file)
    description: str = ""


def parse_node_groups(doc: Any) -> NodeGroupsSpec:
    """The node groups of one parsed `node_groups:` document; ClusterFileError naming the field."""
    if not isinstance(doc, Mapping):
        raise ClusterFileError("node_groups", "the file must be a mapping with a 'node_groups' list")
    refuse_unknown_keys(doc, NODE_GROUPS_TOP_KEYS, "", ClusterFileError)
    name, description = _text(doc, "name", ""), _text(doc, "description", "")
    items = doc.get("node_groups")
    if not isinstance(items, list) or not items:
        raise ClusterFileError("node_groups", "expected a non-empty list")
    groups: list[NodeGroupSpec] = []
    for i, g in enumerate(items):
        group = _node_group(f"node_groups[{i}]", g)
        first = next((j for j, h in enumerate(groups) if h.prefix == group.prefix), None)
        if first is not None:
            raise ClusterFileError(f"node_groups[{i}].prefix", f"{group.prefix!r} is also the prefix of "
                                   f"node_groups[{first}] (node names must be unique)")
        groups.append(group)
    return NodeGroupsSpec(tuple(groups), name, description)


def _node_group(field: str, g: Any) -> NodeGroupSpec:
    if not isinstance(g, Mapping):
        raise ClusterFileError(field, "expected a mapping with prefix, count, gpus, gpu_type and memory_gb")
    refuse_unknown_keys(g, NODE_GROUP_KEYS, field, ClusterFileError)

    def need(key: str) -> Any:
        if key not in g:
            raise ClusterFileError(f"{field}.{key}", "missing")
        return g[key]

    prefix = need("prefix")
    if not isinstance(prefix, str) or not prefix:
        raise ClusterFileError(f"{field}.prefix", f"expected a non-empty string, got {prefix!r}")
    count = _positive_int(need("count"), f"{field}.count", MAX_NODES_PER_GROUP)
    gpus = _positive_int(need("gpus"), f"{field}.gpus", MAX_GPUS_PER_NODE)
    gpu_type = need("gpu_type")
    if not isinstance(gpu_type, str) or not gpu_type.strip():
        raise ClusterFileError(f"{field}.gpu_type", f"expected a non-empty string, got {gpu_type!r}")
    try:
        gpu_type, in_catalog = lookup(gpu_type).name, True
    except UnknownGpuError:
        in_catalog = False
    mem = need("memory_gb")
    if not _is_number(mem):
        raise ClusterFileError(f"{field}.memory_gb", f"expected a number, got {mem!r}")
    if not 0 < mem < math.inf:
        raise ClusterFileError(f"{field}.memory_gb", f"must be > 0, got {mem!r}")
    islands = g.get("nvlink_islands", 0)
    if isinstance(islands, bool) or not isinstance(islands, int):
        raise ClusterFileError(f"{field}.nvlink_islands", f"expected an integer, got {islands!r}")
    if islands < 0 or (islands and gpus % islands):
        raise ClusterFileError(f"{field}.nvlink_islands", f"must divide gpus ({gpus}), got {islands}")
    cpus = g.get("cpus", 0)
    if isinstance(cpus, bool) or not isinstance(cpus, int) or not 0 <= cpus <= MAX_CPUS_PER_NODE:
        raise ClusterFileError(f"{field}.cpus", f"expected an integer from 0 to {MAX_CPUS_PER_NODE:,}, got {cpus!r}")
    host = g.get("host_memory_gb", 0)
    if not _is_number(host) or not 0 <= host <= MAX_HOST_MEMORY_GB:
        raise ClusterFileError(f"{field}.host_memory_gb", f"expected a number from 0 to {MAX_HOST_MEMORY_GB:,.0f}, "
                               f"got {host!r}")
    return NodeGroupSpec(prefix, count, gpus, gpu_type, float(mem), islands, in_catalog, cpus, float(host))


def read_node_groups_file(path: str | Path) -> NodeGroupsSpec:
    """Read and parse a `node_groups:` cluster file; ClusterFileError `FILE line N: field F: why`."""
    return read_and_parse(path, parse_node_groups, ClusterFileError)


# -- values ---------------------------------------------------------------------------------------------


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _int_at_least(obj: Mapping[str, Any], key: str, field: str, hi: int, lo: int = 1) -> int:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ClusterFileError(f"{field}.{key}", f"must be an integer >= {lo}, got {v!r}")
    if v > hi:
        raise ClusterFileError(f"{field}.{key}", f"must be <= {hi:,}, got {v:,}")
    return v


def _positive_int(v: Any, field: str, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ClusterFileError(field, f"expected an integer, got {v!r}")
    if v <= 0:
        raise ClusterFileError(field, f"must be > 0, got {v!r}")
    if v > hi:
        raise ClusterFileError(field, f"must be <= {hi:,}, got {v:,}")
    return v


def catalog_gpu(name: Any, field: str) -> str:
    """The catalog's name of a GPU the file names; ClusterFileError when it has none."""
    if not isinstance(name, str) or not name.strip():
        raise ClusterFileError(field, "required, a catalog GPU name such as A100-80GB")
    try:
        return lookup(name).name
    except UnknownGpuError as exc:
        raise ClusterFileError(field, str(exc)) from None


def _text(doc: Mapping[str, Any], key: str, default: str) -> str:
    v = doc.get(key)
    if v is None:  # absent, or `name:` with nothing after it
        return default
    if not isinstance(v, str):
        raise ClusterFileError(key, f"expected a string, got {v!r}")
    return v
