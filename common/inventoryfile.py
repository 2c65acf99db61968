"""Declared inventory files (docs/inventory.md, examples/inventories/*.yaml): the one parser.

The agent (`tessera-agent --inventory FILE`) turns the spec into its NodeInventory; `tessctl estimate
--cluster FILE` turns it into GPU pools of one node. Both read the file through `read_inventory_file`,
so they accept and refuse the same files with the same `FILE line N: field F: why`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from tessera.common import gpus as catalog
from tessera.common.nodespec import MAX_CPUS, MAX_GPU_MEMORY_BYTES, MAX_GPUS_PER_NODE, MAX_HOST_MEMORY_BYTES
from tessera.common.yamlfile import InputFileError, parse_with_lines, read_and_parse, refuse_unknown_keys

# A node's bounds, the same the controller applies to every registration (common/nodespec.py).
MAX_COUNT = MAX_GPUS_PER_NODE
MAX_MEMORY_GB = MAX_GPU_MEMORY_BYTES // catalog.GB
GROUP_KEYS = frozenset({"model", "count", "memory_gb", "nvlink"})
TOP_KEYS = ("cpus", "gpus", "host_memory_gb")
MAX_HOST_MEMORY_GB = MAX_HOST_MEMORY_BYTES // catalog.GB


class InventoryError(InputFileError):
    """A declared inventory that cannot be used; `field` names the offending key."""


@dataclass(frozen=True)
class GpuGroupSpec:
    """`count` GPUs of catalog model `model` (canonical name), `memory_bytes` each (the file's
    memory_gb, else the catalog's); `nvlink`: every GPU of the group is an NVLink peer of the others."""

    model: str
    count: int
    memory_bytes: int
    nvlink: bool = False


@dataclass(frozen=True)
class InventorySpec:
    """The GPU groups, and the node's CPUs and host memory when the file declares them (0 = not
    declared: the agent reports the machine's own)."""

    groups: tuple[GpuGroupSpec, ...]
    cpus: int = 0
    host_memory_bytes: int = 0


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_inventory(doc: Any) -> InventorySpec:
    """The spec of one parsed document; InventoryError naming the field (no file, no line)."""
    if not isinstance(doc, Mapping):
        raise InventoryError("inventory", "must be a mapping with a 'gpus' list")
    refuse_unknown_keys(doc, TOP_KEYS, "", InventoryError)
    groups = doc.get("gpus")
    if not isinstance(groups, list) or not groups:
        raise InventoryError("gpus", "must be a non-empty list of GPU groups")
    cpus = doc.get("cpus", 0)
    if "cpus" in doc and (not _is_int(cpus) or not 1 <= cpus <= MAX_CPUS):
        raise InventoryError("cpus", f"must be an integer in 1..{MAX_CPUS}, got {cpus!r}")
    mem = doc.get("host_memory_gb", 0)
    if "host_memory_gb" in doc and (isinstance(mem, bool) or not isinstance(mem, int | float)
                                    or not 0 < mem <= MAX_HOST_MEMORY_GB):
        raise InventoryError("host_memory_gb", f"must be a number in (0, {MAX_HOST_MEMORY_GB:,}], got {mem!r}")
    spec = InventorySpec(tuple(_group(f"gpus[{gi}]", group) for gi, group in enumerate(groups)), cpus,
                         int(mem * catalog.GB))
    total = sum(g.count for g in spec.groups)
    if total > MAX_COUNT:
        raise InventoryError("gpus", f"{total} GPUs in all: a node has at most {MAX_COUNT}")
    return spec


def _group(field: str, group: Any) -> GpuGroupSpec:
    if not isinstance(group, Mapping):
        raise InventoryError(field, "must be a mapping with model and count")
    refuse_unknown_keys(group, sorted(GROUP_KEYS), field, InventoryError)
    model = group.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InventoryError(f"{field}.model", "required, a catalog GPU name such as A100-80GB")
    try:
        entry = catalog.lookup(model)
    except catalog.UnknownGpuError as exc:
        raise InventoryError(f"{field}.model", str(exc)) from None
    count = group.get("count")
    if not _is_int(count) or not 1 <= count <= MAX_COUNT:
        raise InventoryError(f"{field}.count", f"must be an integer in 1..{MAX_COUNT}, got {count!r}")
    memory_bytes = entry.memory_bytes
    if "memory_gb" in group:
        mem = group["memory_gb"]
        if not isinstance(mem, int | float) or isinstance(mem, bool) or not 0 < mem <= MAX_MEMORY_GB:
            raise InventoryError(f"{field}.memory_gb", f"must be a number in (0, {MAX_MEMORY_GB}], got {mem!r}")
        memory_bytes = int(mem * catalog.GB)  # GB as the catalog counts them (10^9)
    nvlink = group.get("nvlink", False)
    if not isinstance(nvlink, bool):
        raise InventoryError(f"{field}.nvlink", f"must be true or false, got {nvlink!r}")
    return GpuGroupSpec(entry.name, count, memory_bytes, nvlink)


def parse_inventory_doc(doc: Any, file: str) -> InventorySpec:
    """parse_inventory of a document read from `file` (by tessera.common.yamlfile): errors located."""
    return parse_with_lines(doc, file, parse_inventory)


def read_inventory_file(path: str | Path) -> InventorySpec:
    """Read and parse a declared inventory file; InventoryError `FILE line N: field F: why`."""
    return read_and_parse(path, parse_inventory, InventoryError)
