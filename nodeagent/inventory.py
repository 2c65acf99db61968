"""The node's GPU inventory: declared in a YAML file (docs/inventory.md) or probed from NVML.

`parse_declared` is pure (a parsed YAML document in, a NodeInventory out). `load_declared` adds the
file read and the host facts; `probe_nvml` talks to the driver through nvidia-ml-py and tolerates
each NVML call failing on its own, since older drivers and some GPUs lack NVLink or process queries.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, TypeGuard

import structlog
import yaml

from tessera.common import gpus as catalog
from tessera.common.errors import FailedPrecondition, InvalidInput
from tessera.v1 import common_pb2

log = structlog.get_logger("tessera.nodeagent.inventory")

MAX_COUNT = 64
MAX_MEMORY_GB = 1024
_GROUP_KEYS = frozenset({"model", "count", "memory_gb", "nvlink"})


class InventoryError(InvalidInput, ValueError):
    """The declared inventory file is unreadable or invalid; the message names the field."""


class NvmlUnavailable(FailedPrecondition, RuntimeError):
    """NVML cannot be loaded or initialised (no driver, no GPU, no library)."""


@dataclass(frozen=True)
class HostFacts:
    hostname: str
    cpu_count: int
    memory_bytes: int


def host_facts() -> HostFacts:
    """This machine's hostname, CPU count and physical memory (0 when the OS will not say)."""
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        mem = 0
    return HostFacts(socket.gethostname(), os.cpu_count() or 0, int(mem))


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_declared(doc: object, node_id: str, host: HostFacts) -> common_pb2.NodeInventory:
    """Build a declared NodeInventory from the parsed YAML document.

    Groups are numbered in order; within an `nvlink: true` group every GPU lists the others as
    NVLink peers. UUIDs are "DECLARED-<node>-<index>" so they can never collide with real ones.
    """
    if not isinstance(doc, Mapping):
        raise InventoryError("inventory: must be a mapping with a 'gpus' list")
    extra = sorted(str(k) for k in doc if k != "gpus")
    if extra:
        raise InventoryError(f"{extra[0]}: unknown key (the file holds only 'gpus')")
    groups = doc.get("gpus")
    if not isinstance(groups, list) or not groups:
        raise InventoryError("gpus: must be a non-empty list of GPU groups")
    inv = common_pb2.NodeInventory(
        source=common_pb2.INVENTORY_SOURCE_DECLARED,
        hostname=host.hostname,
        cpu_count=host.cpu_count,
        host_memory_bytes=host.memory_bytes,
    )
    index = 0
    for gi, group in enumerate(groups):
        field = f"gpus[{gi}]"
        if not isinstance(group, Mapping):
            raise InventoryError(f"{field}: must be a mapping with model and count")
        unknown = sorted(str(k) for k in group if k not in _GROUP_KEYS)
        if unknown:
            raise InventoryError(
                f"{field}.{unknown[0]}: unknown key (known: {', '.join(sorted(_GROUP_KEYS))})"
            )
        model = group.get("model")
        if not isinstance(model, str) or not model.strip():
            raise InventoryError(f"{field}.model: required, a catalog GPU name such as A100-80GB")
        try:
            entry = catalog.lookup(model)
        except catalog.UnknownGpuError as exc:
            raise InventoryError(f"{field}.model: {exc}") from None
        count = group.get("count")
        if not _is_int(count) or not 1 <= count <= MAX_COUNT:
            raise InventoryError(f"{field}.count: must be an integer in 1..{MAX_COUNT}, got {count!r}")
        memory_bytes = entry.memory_bytes
        if "memory_gb" in group:
            mem = group["memory_gb"]
            if not isinstance(mem, int | float) or isinstance(mem, bool) or not 0 < mem <= MAX_MEMORY_GB:
                raise InventoryError(
                    f"{field}.memory_gb: must be a number in (0, {MAX_MEMORY_GB}], got {mem!r}"
                )
            memory_bytes = int(mem * catalog.GB)  # GB as the catalog counts them (10^9)
        nvlink = group.get("nvlink", False)
        if not isinstance(nvlink, bool):
            raise InventoryError(f"{field}.nvlink: must be true or false, got {nvlink!r}")
        members = list(range(index, index + count))
        for i in members:
            inv.gpus.append(
                common_pb2.Gpu(
                    index=i,
                    uuid=f"DECLARED-{node_id}-{i}",
                    model=entry.name,
                    memory_bytes=memory_bytes,
                    nvlink_peers=[p for p in members if p != i] if nvlink else [],
                )
            )
        index += count
    return inv


def load_declared(
    path: str | os.PathLike[str], node_id: str, host: HostFacts | None = None
) -> common_pb2.NodeInventory:
    """Read and validate a declared inventory file; InventoryError with the field on any problem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(f"{p}: cannot read: {exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InventoryError(f"{p}: not valid YAML: {exc}") from None
    try:
        return parse_declared(doc, node_id, host or host_facts())
    except InventoryError as exc:
        raise InventoryError(f"{p}: {exc}") from None


# --- NVML -------------------------------------------------------------------------------------------


def _text(value: object) -> str:
    # nvidia-ml-py returns str on recent releases and bytes on older ones.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _import_pynvml() -> ModuleType:
    try:
        import pynvml
    except ImportError as exc:  # the dependency is declared, but keep the message clear
        raise NvmlUnavailable(f"nvidia-ml-py is not installed: {exc}") from None
    module: ModuleType = pynvml
    return module


def _same_session(pid: int, own_pids: Collection[int]) -> bool:
    """True when pid is a worker or one of its descendants: workers lead their own session."""
    if pid in own_pids:
        return True
    try:
        return os.getsid(pid) in own_pids
    except OSError:  # gone, or in another PID namespace (containers): not ours
        return False


def _foreign_used(nv: Any, handle: Any, own_pids: Collection[int]) -> int:
    """Bytes held on one GPU by processes the agent does not manage."""
    used: dict[int, int] = {}
    for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        fn = getattr(nv, query, None)
        if fn is None:
            continue
        try:
            procs = fn(handle)
        except nv.NVMLError as exc:
            log.debug("nvml process query failed", query=query, error=str(exc))
            continue
        for proc in procs:
            mem = getattr(proc, "usedGpuMemory", None)
            # None (or NVML's "not available" sentinel) when the driver hides per-process memory.
            if isinstance(mem, int) and 0 <= mem < 1 << 62 and not _same_session(proc.pid, own_pids):
                used[proc.pid] = max(used.get(proc.pid, 0), mem)
    return sum(used.values())


def _nvlink_peers(nv: Any, handles: list[Any]) -> list[list[int]]:
    """NVLink peers of every GPU.

    First the driver's P2P answer (it also covers NVSwitch systems, where a link's remote end is the
    switch, not a GPU); where that query is missing, the remote PCI bus id of each active link.
    """
    n = len(handles)
    peers: list[set[int]] = [set() for _ in range(n)]
    p2p_ok = hasattr(nv, "nvmlDeviceGetP2PStatus") and hasattr(nv, "NVML_P2P_CAPS_INDEX_NVLINK")
    for i in range(n):
        for j in range(i + 1, n):
            if not p2p_ok:
                break
            try:
                status = nv.nvmlDeviceGetP2PStatus(handles[i], handles[j], nv.NVML_P2P_CAPS_INDEX_NVLINK)
            except nv.NVMLError:
                p2p_ok = False
                break
            if status == getattr(nv, "NVML_P2P_STATUS_OK", 0):
                peers[i].add(j)
                peers[j].add(i)
    if p2p_ok:
        return [sorted(p) for p in peers]
    peers = [set() for _ in range(n)]  # drop a partial P2P answer
    bus_to_index: dict[str, int] = {}
    for i, h in enumerate(handles):
        try:
            bus_to_index[_text(nv.nvmlDeviceGetPciInfo(h).busId).lower()] = i
        except nv.NVMLError:
            continue
    remote_info = getattr(nv, "nvmlDeviceGetNvLinkRemotePciInfo", None)
    max_links = int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))
    for i, h in enumerate(handles):
        for link in range(max_links):
            try:
                if nv.nvmlDeviceGetNvLinkState(h, link) != getattr(nv, "NVML_FEATURE_ENABLED", 1):
                    continue
                if remote_info is None:
                    continue
                remote = bus_to_index.get(_text(remote_info(h, link).busId).lower())
            except nv.NVMLError:
                continue  # no such link, or NVLink unsupported on this GPU
            if remote is not None and remote != i:
                peers[i].add(remote)
                peers[remote].add(i)
    return [sorted(p) for p in peers]


def probe_nvml(
    own_pids: Collection[int] = frozenset(), nvml: ModuleType | None = None, host: HostFacts | None = None
) -> common_pb2.NodeInventory:
    """Probe the node's GPUs through NVML.

    `own_pids` are the session leaders of the agent's workers: memory their sessions hold is not
    foreign. Names map to the catalog with catalog.from_nvml; an unknown GPU keeps NVML's name (and
    a warning is logged) rather than being guessed. Raises NvmlUnavailable when NVML cannot start.
    """
    nv: Any = nvml if nvml is not None else _import_pynvml()
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        raise NvmlUnavailable(f"NVML is not available: {exc}") from None
    try:
        facts = host or host_facts()
        inv = common_pb2.NodeInventory(
            source=common_pb2.INVENTORY_SOURCE_NVML,
            hostname=facts.hostname,
            cpu_count=facts.cpu_count,
            host_memory_bytes=facts.memory_bytes,
        )
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as exc:
            raise NvmlUnavailable(f"NVML cannot count GPUs: {exc}") from None
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        for i, h in enumerate(handles):
            name = _text(nv.nvmlDeviceGetName(h))
            total = int(nv.nvmlDeviceGetMemoryInfo(h).total)
            try:
                uuid = _text(nv.nvmlDeviceGetUUID(h))
            except nv.NVMLError:
                uuid = f"UNKNOWN-UUID-{i}"
            entry, note = catalog.from_nvml(name, total)
            if entry is None:
                log.warning("GPU model not in the catalog; reporting NVML's name", index=i, nvml_name=name)
                model = name
            else:
                model = entry.name
                if note:
                    log.info("GPU mapped to the nearest catalog entry", index=i, note=note)
            inv.gpus.append(
                common_pb2.Gpu(
                    index=i,
                    uuid=uuid,
                    model=model,
                    memory_bytes=total,
                    foreign_used_bytes=_foreign_used(nv, h, own_pids),
                )
            )
        for gpu, peers in zip(inv.gpus, _nvlink_peers(nv, handles), strict=True):
            gpu.nvlink_peers.extend(peers)
        return inv
    finally:
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass
