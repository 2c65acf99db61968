"""The bounds of what a node says about itself (NodeStatus in Register and Heartbeat): the
controller refuses a status outside them (INVALID_ARGUMENT naming the field, e.g.
`status.inventory.gpus[3].model`), and the declared-inventory parser (common/inventoryfile.py)
shares the GPU counts and memory sizes. docs/agent.md, "What a node may report", lists them.

Only what the agent itself decides is checked strictly (ids, addresses, inventory, worker records'
shape). What a job's own workers report (progress numbers, a worker's exit reason text) is bounded
in size but not refused for its content: one job must not be able to make its node unreachable.
"""

from __future__ import annotations

import re

from tessera.v1 import agent_pb2, common_pb2

MAX_GPUS_PER_NODE = 64
MAX_GPU_MEMORY_BYTES = 1024 * 10**9  # 1,024 GB, as the catalog counts GB
MAX_HOST_MEMORY_BYTES = 2**52  # 4 PiB
MAX_CPUS = 65_536
MAX_WORKERS = 4096  # live and retained exited records (the agent keeps at most 2,000 exited)
# Jobs whose highest launched or stopped attempt a Register carries: the agent's newest 1,000 of
# each (it remembers 10,000). The controller keeps them per node, so a bound on its memory too.
MAX_ATTEMPT_MARKS = 2_000
MAX_RANK = 65_535
MAX_TEXT = 4096  # a worker's reason or log path

NODE_ID_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
NODE_ID_RULE = "[a-z0-9][a-z0-9._-]{0,62}"
ADDRESS_RE = re.compile(r"(\[[0-9a-fA-F:.]{2,45}\]|[A-Za-z0-9][A-Za-z0-9.-]{0,252}):(\d{1,5})")
HOSTNAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# GPU model names: catalog names, or NVML's own name for a GPU the catalog lacks ("NVIDIA Foo 48GB").
# Printable ASCII only: no control characters, no bidi overrides or other invisible characters.
GPU_MODEL_RE = re.compile(r"[A-Za-z0-9][ -~]{0,63}")
UUID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,95}")
VERSION_RE = re.compile(r"[ -~]{0,64}")
# NodeStatus.features: what an agent can do that an older one cannot ("rendezvous-key").
FEATURE_RE = re.compile(r"[a-z0-9-]{1,64}")
MAX_FEATURES = 16
RENDEZVOUS_KEY_FEATURE = "rendezvous-key"
COMMIT_RE = re.compile(r"[0-9a-f]{7,64}")
NOTE_RE = re.compile(r"[ -~]{0,300}")  # printable ASCII: an agent's one-line note shown to operators
# One word per GpuIsolation value, for tables (`get nodes -o wide`, the dashboard's nodes).
ISOLATION_WORDS = {common_pb2.GPU_ISOLATION_DEVICE_CGROUPS: "cgroups", common_pb2.GPU_ISOLATION_DETECTION: "detection",
                   common_pb2.GPU_ISOLATION_NONE: "none"}

Errors = list[tuple[str, str]]


def report_text(text: str, limit: int = MAX_TEXT) -> str:
    """`text` as a node may report it (a worker's reason, a log path): NUL and lone surrogates
    written as escapes, at most `limit` characters. The agent passes every reason through this, since
    parts of them come from peers it cannot trust: a worker's own exit record, a Stop's reason, a
    peer node's Launch error. One NUL used to make the controller refuse every heartbeat of the node
    (a lone surrogate: the agent could not encode its status at all)."""
    if "\0" in text or not text.isascii():
        text = text.replace("\0", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > limit:
        text = text[:limit - len(CLIPPED)] + CLIPPED if limit > len(CLIPPED) else text[:limit]
    return text


CLIPPED = " [...]"


def node_id_error(node_id: str) -> str | None:
    if not node_id:
        return "required"
    if not NODE_ID_RE.fullmatch(node_id):
        return f"must match {NODE_ID_RULE}"
    return None


def address_error(address: str) -> str | None:
    m = ADDRESS_RE.fullmatch(address)
    if m is None or not 1 <= int(m.group(2)) <= 65535:
        return "must be host:port (a DNS name, IPv4 or [IPv6] address, port 1-65535)"
    return None


def status_errors(status: agent_pb2.NodeStatus, prefix: str = "status") -> Errors:
    """Every bound `status` breaks, as (field, reason); [] = within bounds."""
    errs: Errors = []
    if (why := node_id_error(status.node_id)) is not None:
        errs.append((f"{prefix}.node_id", why))
    if (why := address_error(status.address)) is not None:
        errs.append((f"{prefix}.address", why))
    if not VERSION_RE.fullmatch(status.agent_version):
        errs.append((f"{prefix}.agent_version", "at most 64 printable ASCII characters"))
    if status.agent_commit and not COMMIT_RE.fullmatch(status.agent_commit):
        errs.append((f"{prefix}.agent_commit", "a git commit: 7 to 64 lowercase hex digits, or empty"))
    if status.gpu_isolation not in common_pb2.GpuIsolation.values():
        errs.append((f"{prefix}.gpu_isolation", f"unknown value {status.gpu_isolation}"))
    if not NOTE_RE.fullmatch(status.gpu_isolation_note):
        errs.append((f"{prefix}.gpu_isolation_note", "at most 300 printable ASCII characters"))
    if len(status.features) > MAX_FEATURES or not all(FEATURE_RE.fullmatch(f) for f in status.features):
        errs.append((f"{prefix}.features", f"at most {MAX_FEATURES} names of [a-z0-9-], 1 to 64 characters"))
    errs += inventory_errors(status.inventory, f"{prefix}.inventory")
    if len(status.workers) > MAX_WORKERS:
        errs.append((f"{prefix}.workers", f"more than {MAX_WORKERS} workers"))
        return errs
    if len(status.attempt_marks) > MAX_ATTEMPT_MARKS:
        errs.append((f"{prefix}.attempt_marks", f"more than {MAX_ATTEMPT_MARKS} jobs"))
    else:
        for i, m in enumerate(status.attempt_marks):
            if not JOB_ID_RE.fullmatch(m.job_id):
                errs.append((f"{prefix}.attempt_marks[{i}].job_id", "malformed"))
            if m.attempt < 0:
                errs.append((f"{prefix}.attempt_marks[{i}].attempt", "must be >= 0"))
    for i, w in enumerate(status.workers):
        f = f"{prefix}.workers[{i}]"
        if not JOB_ID_RE.fullmatch(w.job_id):
            errs.append((f"{f}.job_id", "malformed"))
        if w.state not in common_pb2.WorkerState.values():
            errs.append((f"{f}.state", f"unknown worker state {w.state}"))
        if w.attempt < 0:
            errs.append((f"{f}.attempt", "must be >= 0"))
        if not 0 <= w.rank <= MAX_RANK:
            errs.append((f"{f}.rank", f"must be in 0..{MAX_RANK}"))
        # Any index a node may have, not only those it offers now: a GPU that left the inventory
        # (MIG turned on, a recovery action, off the bus) is still in the records of the workers
        # that ran on it, kept an hour, and refusing them refused the node's every heartbeat.
        if len(w.gpu_indices) > MAX_GPUS_PER_NODE or not all(0 <= g < MAX_GPUS_PER_NODE for g in w.gpu_indices):
            errs.append((f"{f}.gpu_indices", f"at most {MAX_GPUS_PER_NODE} indices in 0..{MAX_GPUS_PER_NODE - 1}"))
        for name in ("reason", "log_path"):
            text = getattr(w, name)
            if len(text) > MAX_TEXT or "\0" in text:
                errs.append((f"{f}.{name}", f"longer than {MAX_TEXT} characters or contains NUL"))
    return errs


def inventory_errors(inv: common_pb2.NodeInventory, prefix: str) -> Errors:
    """A NodeInventory: 1..64 GPUs with unique indices in 0..63 and unique UUIDs, NVLink peers among
    the node's other GPUs, safe names, bounded sizes; the GPUs left out likewise, on indices and
    UUIDs of their own."""
    errs: Errors = []
    if inv.source not in common_pb2.InventorySource.values():
        errs.append((f"{prefix}.source", f"unknown inventory source {inv.source}"))
    gpus = inv.gpus
    if not gpus:
        return [(f"{prefix}.gpus", "a node must report at least one GPU")]
    if len(gpus) > MAX_GPUS_PER_NODE:
        return [(f"{prefix}.gpus", f"more than {MAX_GPUS_PER_NODE} GPUs")]
    seen: set[int] = set()
    uuids: set[str] = set()
    indices = {g.index for g in gpus}
    for i, g in enumerate(gpus):
        f = f"{prefix}.gpus[{i}]"
        errs += _identity_errors(f, g, seen, uuids)
        if not 0 < g.memory_bytes <= MAX_GPU_MEMORY_BYTES:
            errs.append((f"{f}.memory_bytes", f"must be in 1..{MAX_GPU_MEMORY_BYTES:,}"))
        if not 0 <= g.foreign_used_bytes <= MAX_GPU_MEMORY_BYTES:
            errs.append((f"{f}.foreign_used_bytes", f"must be in 0..{MAX_GPU_MEMORY_BYTES:,}"))
    for i, g in enumerate(gpus):  # after the indices: a peer is judged against the GPUs the node has
        peers = list(g.nvlink_peers)
        if len(set(peers)) != len(peers) or any(p not in indices or p == g.index for p in peers):
            errs.append((f"{prefix}.gpus[{i}].nvlink_peers", "must be other GPUs' indices on this node, each once"))
    errs += _left_out_errors(inv, prefix, seen, uuids)
    hostname = inv.hostname
    if hostname and not HOSTNAME_RE.fullmatch(hostname):
        errs.append((f"{prefix}.hostname", "must be 1-253 letters, digits, '.', '_' or '-'"))
    if not 0 <= inv.cpu_count <= MAX_CPUS:
        errs.append((f"{prefix}.cpu_count", f"must be in 0..{MAX_CPUS}"))
    if not 0 <= inv.host_memory_bytes <= MAX_HOST_MEMORY_BYTES:
        errs.append((f"{prefix}.host_memory_bytes", f"must be in 0..{MAX_HOST_MEMORY_BYTES:,}"))
    return errs


def _left_out_errors(inv: common_pb2.NodeInventory, prefix: str, indices: set[int], uuids: set[str]) -> Errors:
    """GPUs found but not offered (NodeInventory.left_out): indices and UUIDs the offered GPUs do not
    use, each once, safe names and a one-line reason."""
    errs: Errors = []
    if len(inv.left_out) > MAX_GPUS_PER_NODE:
        return [(f"{prefix}.left_out", f"more than {MAX_GPUS_PER_NODE} GPUs")]
    indices, uuids = set(indices), set(uuids)
    for i, g in enumerate(inv.left_out):
        f = f"{prefix}.left_out[{i}]"
        errs += _identity_errors(f, g, indices, uuids)
        if not g.reason or not NOTE_RE.fullmatch(g.reason):
            errs.append((f"{f}.reason", "must be 1-300 printable ASCII characters"))
    return errs


def _identity_errors(f: str, g: common_pb2.Gpu | common_pb2.LeftOutGpu, indices: set[int], uuids: set[str]) -> Errors:
    """One GPU's index, model and UUID, offered or left out: each index and UUID once on the node
    (`indices` and `uuids` get this GPU's), safe names."""
    errs: Errors = []
    if not 0 <= g.index < MAX_GPUS_PER_NODE:
        errs.append((f"{f}.index", f"must be in 0..{MAX_GPUS_PER_NODE - 1}"))
    elif g.index in indices:
        errs.append((f"{f}.index", f"index {g.index} listed twice"))
    indices.add(g.index)
    if not GPU_MODEL_RE.fullmatch(g.model):
        errs.append((f"{f}.model", ("must be 1-64 printable ASCII characters (no control or invisible "
                                   "characters), starting with a letter or digit")))
    if not UUID_RE.fullmatch(g.uuid):
        errs.append((f"{f}.uuid", "must be 1-96 letters, digits, '.', '_', ':', '/' or '-'"))
    elif g.uuid in uuids:  # one device reported twice
        errs.append((f"{f}.uuid", f"UUID {g.uuid} listed twice"))
    uuids.add(g.uuid)
    return errs
