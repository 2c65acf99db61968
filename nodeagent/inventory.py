"""The node's GPU inventory: declared in a YAML file (docs/inventory.md) or probed from NVML.

The file format has one parser, tessera.common.inventoryfile (the CLI reads the same files);
`declared_inventory` turns its spec into this node's NodeInventory, `parse_declared` and
`load_declared` are that for a parsed document and for a file. `probe_nvml` talks to the driver
through nvidia-ml-py and tolerates each NVML call failing on its own, since older drivers and some
GPUs lack NVLink or process queries.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import structlog

from tessera.common import gpus as catalog
from tessera.common.errors import FailedPrecondition
from tessera.common.inventoryfile import InventoryError, InventorySpec, parse_inventory, read_inventory_file
from tessera.nodeagent import leftout
from tessera.v1 import common_pb2

__all__ = ["HostFacts", "InventoryError", "NvmlUnavailable", "declared_inventory", "host_facts", "load_declared",
           "minor_numbers", "parse_declared", "probe_nvml"]

log = structlog.get_logger("tessera.nodeagent.inventory")


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


def declared_inventory(spec: InventorySpec, node_id: str, host: HostFacts) -> common_pb2.NodeInventory:
    """The declared NodeInventory of a parsed inventory file.

    Groups are numbered in order; within an `nvlink: true` group every GPU lists the others as
    NVLink peers. UUIDs are "DECLARED-<node>-<index>" so they can never collide with real ones.
    """
    inv = common_pb2.NodeInventory(
        source=common_pb2.INVENTORY_SOURCE_DECLARED,
        hostname=host.hostname,
        # A declared node may declare its host too (tests and demos stand in for larger machines).
        cpu_count=spec.cpus or host.cpu_count,
        host_memory_bytes=spec.host_memory_bytes or host.memory_bytes,
    )
    index = 0
    for group in spec.groups:
        members = list(range(index, index + group.count))
        for i in members:
            inv.gpus.append(
                common_pb2.Gpu(
                    index=i,
                    uuid=f"DECLARED-{node_id}-{i}",
                    model=group.model,
                    memory_bytes=group.memory_bytes,
                    nvlink_peers=[p for p in members if p != i] if group.nvlink else [],
                )
            )
        index += group.count
    return inv


def parse_declared(doc: object, node_id: str, host: HostFacts) -> common_pb2.NodeInventory:
    """The declared NodeInventory of a parsed YAML document; InventoryError naming the field."""
    return declared_inventory(parse_inventory(doc), node_id, host)


def load_declared(
    path: str | os.PathLike[str], node_id: str, host: HostFacts | None = None
) -> common_pb2.NodeInventory:
    """Read and validate a declared inventory file; InventoryError `FILE line N: field F: why`."""
    return declared_inventory(read_inventory_file(os.fspath(path)), node_id, host or host_facts())


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


@contextlib.contextmanager
def _nvml(nvml: ModuleType | None) -> Iterator[Any]:
    """NVML started (the given module, else nvidia-ml-py) and shut down again; NvmlUnavailable when
    it cannot start."""
    nv: Any = nvml if nvml is not None else _import_pynvml()
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        raise NvmlUnavailable(f"NVML is not available: {exc}") from None
    try:
        yield nv
    finally:
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass


def _same_session(pid: int, own_pids: Collection[int]) -> bool:
    """True when pid is a worker or one of its descendants: workers lead their own session."""
    if pid in own_pids:
        return True
    try:
        return os.getsid(pid) in own_pids
    except OSError:  # gone, or in another PID namespace (containers): not ours
        return False


def _session(pid: int) -> int:
    try:
        return os.getsid(pid)
    except OSError:
        return -1


def _foreign_used(nv: Any, handle: Any, own_pids: Collection[int], mine: set[int] | None = None) -> int:
    """Bytes held on one GPU by processes the agent does not manage; `mine` gets the session leaders
    (workers) of the agent's processes seen on it (nodeagent/gpuguard.py)."""
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
            if mine is not None and _same_session(proc.pid, own_pids):
                mine.add(proc.pid if proc.pid in own_pids else _session(proc.pid))
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
    own_pids: Collection[int] = frozenset(), nvml: ModuleType | None = None, host: HostFacts | None = None,
    sessions: dict[int, set[int]] | None = None, recovery_check: bool = True,
) -> common_pb2.NodeInventory:
    """Probe the node's GPUs through NVML.

    `own_pids` are the session leaders of the agent's workers: memory their sessions hold is not
    foreign; `sessions` gets, per GPU index, those of them seen on it (nodeagent/gpuguard.py). Names map to the catalog with catalog.from_nvml; an unknown GPU keeps NVML's name (and
    a warning is logged) rather than being guessed. A GPU in MIG mode, in the Prohibited compute
    mode or waiting for a recovery action (unless not `recovery_check`) goes to `left_out`, not
    `gpus`, with why (nodeagent/leftout.py). Raises NvmlUnavailable when NVML cannot start or
    cannot read the memory of a GPU it would offer.
    """
    with _nvml(nvml) as nv:
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
            try:
                uuid = _text(nv.nvmlDeviceGetUUID(h))
            except nv.NVMLError:
                uuid = f"UNKNOWN-UUID-{i}"
            why = leftout.why(nv, h, recovery_check)
            try:
                total = int(nv.nvmlDeviceGetMemoryInfo(h).total)
            except nv.NVMLError as exc:
                if not why:
                    raise NvmlUnavailable(f"NVML cannot read the memory of GPU {i}: {exc}") from None
                total = 0  # in MIG mode only a privileged caller reads the card's memory (NVML's reference)
            entry, note = catalog.from_nvml(name, total) if total else (None, "")
            if entry is None:
                if total:  # (without its memory a GPU left out keeps NVML's name: no nearest guess)
                    log.warning("GPU model not in the catalog; reporting NVML's name", index=i, nvml_name=name)
                model = name
            else:
                model = entry.name
                if note:
                    log.info("GPU mapped to the nearest catalog entry", index=i, note=note)
            if why:
                inv.left_out.append(common_pb2.LeftOutGpu(index=i, uuid=uuid, model=model, reason=why))
                continue
            inv.gpus.append(
                common_pb2.Gpu(
                    index=i,
                    uuid=uuid,
                    model=model,
                    memory_bytes=total,
                    foreign_used_bytes=_foreign_used(nv, h, own_pids,
                                                     None if sessions is None else sessions.setdefault(i, set())),
                )
            )
        # Among the offered GPUs only: a query failing on one left out would drop every GPU's answer.
        offered = [g.index for g in inv.gpus]
        for gpu, peers in zip(inv.gpus, _nvlink_peers(nv, [handles[i] for i in offered]), strict=True):
            gpu.nvlink_peers.extend(offered[p] for p in peers)
        return inv


def minor_numbers(inv: common_pb2.NodeInventory, nvml: ModuleType | None = None) -> dict[int, int]:
    """GPU index -> the minor number of its /dev/nvidiaN (device isolation, nodeagent/devicefilter.py).

    GPUs left out count too, where NVML answers for them (a faulted GPU may not): one that clears (a
    GPU reset ends its recovery action) is offered again while the agent runs, and a worker placed on
    it must be confined to it, not refused. A declared inventory has no devices: its indices stand for
    minors, so tests can check the filter on device nodes of their own. NvmlUnavailable when NVML
    cannot say for every GPU offered.
    """
    if inv.source != common_pb2.INVENTORY_SOURCE_NVML:
        return {g.index: g.index for g in inv.gpus}
    with _nvml(nvml) as nv:
        def minor(index: int) -> int:
            return int(nv.nvmlDeviceGetMinorNumber(nv.nvmlDeviceGetHandleByIndex(index)))

        try:
            out = {g.index: minor(g.index) for g in inv.gpus}
        except nv.NVMLError as exc:
            raise NvmlUnavailable(f"NVML cannot give the GPUs' minor numbers: {exc}") from None
        for g in inv.left_out:
            with contextlib.suppress(nv.NVMLError):
                out[g.index] = minor(g.index)
        return out
