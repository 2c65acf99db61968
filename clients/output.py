"""What tessctl prints: tables in the habits of kubectl, and JSON (the proto3 JSON mapping).

Pure functions of the messages and of `now` (seconds since the epoch, passed in by the caller), so
they are tested with literal inputs. docs/cli.md describes every column and JSON shape.
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from tessera.clients.features import features
from tessera.clients.nodejobs import on_node, unlisted_rows
from tessera.clients.output_forecast import forecast_columns, forecast_pairs
from tessera.clients.output_objective import objective_pairs
from tessera.common import jobspec
from tessera.common.nodespec import ISOLATION_WORDS
from tessera.common.utctime import utc_text
from tessera.v1 import common_pb2, controller_pb2

REASON_WIDTH = 40
NONE = "-"

JOB_COLUMNS = ("ID", "NAME", "TENANT", "STATE", "GPUS", "ITER", "AGE", "REASON")
JOB_WIDE_COLUMNS = JOB_COLUMNS[:-1] + ("PLAN(dp/tp/pp/mb/ga)", "NODES", "ATTEMPT", "LOSS", "START~", "END~", "REASON")
NODE_COLUMNS = ("NAME", "STATE", "GPUS", "FREE", "SOURCE", "HEARTBEAT", "ADDRESS")
NODE_WIDE_COLUMNS = NODE_COLUMNS + ("HOSTNAME", "CPUS", "MEMORY", "ISOLATION", "VERSION", "REASON")
EVENT_COLUMNS = ("SEQ", "AGE", "KIND", "MESSAGE")


# -- untrusted text ---------------------------------------------------------------------------------

# Control characters (ESC starts terminal escape sequences), format characters (bidi overrides such
# as U+202E, zero-width joiners, BOMs), surrogates, private-use and unassigned code points, and line
# and paragraph separators: a name, reason or hostname holding one could redraw or reorder what a
# terminal shows.
_UNSAFE = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def safe(text: str) -> str:
    """Text from the network as a terminal may show it: every control, format or invisible
    character becomes a visible escape (\x1b, \u202e, \U000e0001); the rest is kept. The one
    function every table, describe and message of tessctl prints untrusted strings through (JSON
    output is escaped by json itself)."""
    if text.isascii() and text.isprintable():
        return text
    out = []
    for ch in text:
        if unicodedata.category(ch) not in _UNSAFE:
            out.append(ch)
            continue
        code = ord(ch)
        out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


def one_line(text: str) -> str:
    """Whitespace runs (newlines, tabs) as one space, then `safe`."""
    return safe(" ".join(text.split()))


# -- JSON -------------------------------------------------------------------------------------------


def to_dict(message: Message) -> dict[str, Any]:
    """The proto3 JSON mapping of a message: snake_case keys, enums by name, every scalar and list
    field present even when default; int64 fields are strings and bytes are base64, as the mapping
    says; unset message fields (a pending job's plan) are absent. Points in time (`is_time`) are
    RFC 3339 strings in UTC ("2026-11-26T10:11:23.5Z"), null when unset (0)."""
    result: dict[str, Any] = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _in_field_order(message.DESCRIPTOR, result)


def _in_field_order(descriptor: Any, value: dict[str, Any]) -> dict[str, Any]:
    """Keys in the order the .proto declares them (MessageToDict puts defaults last), recursively."""
    out: dict[str, Any] = {}
    for field in descriptor.fields:
        if field.name not in value:
            continue
        v = value[field.name]
        sub = field.message_type
        if sub is not None and not sub.GetOptions().map_entry:
            v = [_in_field_order(sub, x) for x in v] if isinstance(v, list) else _in_field_order(sub, v)
        elif is_time(descriptor.name, field.name, field.type) and isinstance(v, (int, float)):
            v = rfc3339(float(v))
        out[field.name] = v
    return out


# Messages whose double fields named `time` or `*_time`, and these others, are points in time
# (seconds since the epoch). Not every message: the estimator's `iter_time`, `fwd_time` are durations.
_TIME_MESSAGES = frozenset({"Job", "Node", "JobEvent", "Progress", "VersionInfo", "Forecast"})
_TIME_FIELDS = frozenset({"last_heartbeat", "unhealthy_until", "start_low", "start_high", "end_low", "end_high",
                          "made_at"})
# Points in time of other messages, named one by one (an SLO's `deadline` is a wall time, its
# `iterations_within_seconds` a duration).
_TIME_OF = frozenset({("ListTenantsResponse", "loaded_at"), ("Tenant", "no_preempt_until"), ("Slo", "deadline")})
_DOUBLE = 1  # FieldDescriptor.TYPE_DOUBLE


def is_time(message: str, field: str, kind: int) -> bool:
    if kind != _DOUBLE:
        return False
    return (message, field) in _TIME_OF or (message in _TIME_MESSAGES and (
        field == "time" or field.endswith("_time") or field in _TIME_FIELDS))


def rfc3339(t: float) -> str | None:
    """Seconds since the epoch as RFC 3339 in UTC, to the microsecond with trailing zeros cut;
    None for 0 (unset) or a value no calendar holds."""
    import datetime as dt

    if not t > 0:
        return None
    try:
        text = dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="microseconds")
    except (OverflowError, OSError, ValueError):
        return None
    date, _, frac = text.removesuffix("+00:00").partition(".")
    frac = frac.rstrip("0")
    return f"{date}.{frac}Z" if frac else f"{date}Z"


def dumps(value: Any, *, compact: bool = False) -> str:
    """One JSON value as text: indented for a person, or on one line (watch streams)."""
    if compact:
        return json.dumps(value, separators=(",", ":"), sort_keys=False)
    return json.dumps(value, indent=2, sort_keys=False)


def jobs_json(jobs: Sequence[controller_pb2.Job]) -> dict[str, Any]:
    """`get jobs -o json`: {"jobs": [Job, ...]} (the ListJobsResponse mapping, all pages joined)."""
    out = to_dict(controller_pb2.ListJobsResponse(jobs=jobs))
    out.pop("continue_token", None)
    return out


def nodes_json(nodes: Sequence[controller_pb2.Node]) -> dict[str, Any]:
    """`get nodes -o json`: {"nodes": [Node, ...]} (the ListNodesResponse mapping)."""
    return to_dict(controller_pb2.ListNodesResponse(nodes=nodes))


# -- small formats ----------------------------------------------------------------------------------


def age(since: float, now: float) -> str:
    """kubectl-style age of a timestamp: 45s, 12m, 5h, 3d; "-" when the timestamp is unset."""
    if not 0 < since < math.inf:  # unset, or a worker's own unusable time
        return NONE
    s = max(0, int(now - since))
    if s < 120:
        return f"{s}s"
    if s < 120 * 60:
        return f"{s // 60}m"
    if s < 48 * 3600:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def _state_options(p: common_pb2.Plan) -> list[tuple[str, str]]:
    """How the plan keeps model state and activations, which its memory figure assumes (plain data
    parallelism of the same plan may need far more: a reader took it for a plan that cannot fit)."""
    if not p.HasField("options"):
        return []
    o = p.options
    return [("Sharding", common_pb2.Sharding.Name(o.sharding).removeprefix("SHARDING_").lower()
             if o.sharding else "none"),
            ("Checkpointing", common_pb2.Checkpointing.Name(o.checkpointing).removeprefix("CHECKPOINTING_").lower()
             if o.checkpointing else "none")]


def job_state(state: int) -> str:
    return common_pb2.JobState.Name(state).removeprefix("JOB_STATE_") if state else "UNKNOWN"


def node_state(state: int) -> str:
    return common_pb2.NodeState.Name(state).removeprefix("NODE_STATE_") if state else "UNKNOWN"


def node_status(node: controller_pb2.Node, now: float) -> str:
    """The node's state, with ",UNHEALTHY" while its launch failures keep placements off it
    (kubectl's "Ready,SchedulingDisabled")."""
    state = node_state(node.state)
    return state + ",UNHEALTHY" if node.unhealthy_until > now else state


def launch_backoff(job: controller_pb2.Job, now: float) -> str:
    """`describe job`'s launch failures: the count and when the next placement may be tried."""
    if not job.launch_failures:
        return "0"
    if job.next_launch_time > now:
        return f"{job.launch_failures} (next try {_fmt_time(job.next_launch_time)}, in {job.next_launch_time - now:.0f}s)"
    return f"{job.launch_failures} (next try at the next round)"


def source(src: int) -> str:
    return {common_pb2.INVENTORY_SOURCE_NVML: "nvml", common_pb2.INVENTORY_SOURCE_DECLARED: "declared"}.get(
        src, "unknown"
    )


def truncate(text: str, width: int = REASON_WIDTH) -> str:
    """One line, at most `width` characters ("..." marks a cut), made `safe`."""
    text = one_line(text)
    if len(text) <= width:
        return text
    return text[: width - 3] + "..."


def gib(n: int) -> str:
    """Host memory in GiB, as free(1) and kubectl show it."""
    return f"{n / 1024**3:.0f}Gi" if n else NONE


def gb(n: int) -> str:
    """GPU memory in GB (10^9), as GPU names and the catalog give it: 80GB, 3.2GB, 38MB."""
    if not n:
        return NONE
    if n < 10**9:
        return f"{n / 1e6:.0f}MB"
    return f"{n / 1e9:.0f}GB" if n >= 10**10 else f"{n / 1e9:.1f}GB"


GpuModels = Mapping[tuple[str, int], str]


def gpu_models(nodes: Sequence[controller_pb2.Node]) -> dict[tuple[str, int], str]:
    """(node id, GPU index) -> GPU model, from the nodes' inventories (for job_gpus)."""
    return {(n.id, g.index): g.model for n in nodes for g in n.inventory.gpus}


def gpu_summary(models: Sequence[str]) -> str:
    """"4xA100-80GB", or "2xA100-80GB,1xA40-48GB" for a mix; "-" for none."""
    if not models:
        return NONE
    counts = Counter(m or "?" for m in models)
    return ",".join(f"{n}x{m}" for m, n in counts.items())


def job_gpus(job: controller_pb2.Job, models: GpuModels | None = None) -> str:
    """GPUs of a job's (current or last) placement: "2xA100-80GB". Each GPU's model comes from its
    node's inventory when `models` knows it (a placement across GPU types reads
    "4xA100-80GB,2xA40-48GB"), else from the plan."""
    models = models or {}
    per_gpu = [models.get((s.node_id, i), job.plan.gpu_model) for s in job.placement.slices for i in s.gpu_indices]
    return gpu_summary(per_gpu)


def job_plan(job: controller_pb2.Job) -> str:
    p = job.plan
    if not job.HasField("plan") or not (p.dp or p.tp or p.pp):
        return NONE
    return f"{p.dp}/{p.tp}/{p.pp}/{p.micro_batch}/{p.grad_accum}"


def job_nodes(job: controller_pb2.Job) -> str:
    nodes = [s.node_id for s in job.placement.slices]
    return ",".join(dict.fromkeys(nodes)) or NONE


def job_iter(job: controller_pb2.Job) -> str:
    if not job.spec.iterations:  # an opaque job counts no iterations (docs/opaque-jobs.md)
        return str(job.progress.iteration) if job.HasField("progress") else "-"
    return f"{job.progress.iteration}/{job.spec.iterations}"


def job_loss(job: controller_pb2.Job) -> str:
    if not job.HasField("progress") or job.progress.iteration <= 0:
        return NONE
    return f"{job.progress.loss:.4g}"


def node_gpus(node: controller_pb2.Node) -> str:
    return gpu_summary([g.model for g in node.inventory.gpus])


def wide_version(node: controller_pb2.Node) -> str:
    """`get nodes -o wide`'s VERSION: "0.1.0+1a2b3c4" (the commit's first 7 digits when the agent
    reported one). The version alone has read 0.1.0 on every build so far: a rollout's progress
    did not show in the column the upgrade steps tell operators to watch (an upgrade audit)."""
    if not node.agent_version:
        return NONE
    return f"{node.agent_version}+{node.agent_commit[:7]}" if node.agent_commit else node.agent_version


def agent_build(node: controller_pb2.Node) -> str:
    """`describe node`'s agent line: "0.1.0 (commit 1a2b3c4d5e6f)"; "-" before the agent reported."""
    if not node.agent_version:
        return NONE
    return f"{node.agent_version} (commit {node.agent_commit[:12] or 'unknown'})"


def gpu_isolation(node: controller_pb2.Node) -> str:
    """`describe node`'s line on what keeps workers off GPUs they were not given (docs/agent.md)."""
    why = f" (device cgroups off: {one_line(node.gpu_isolation_note)})" if node.gpu_isolation_note else ""
    if node.gpu_isolation == common_pb2.GPU_ISOLATION_DEVICE_CGROUPS:
        return "device cgroups: a worker can open only its attempt's GPUs here"
    if node.gpu_isolation == common_pb2.GPU_ISOLATION_DETECTION:
        return "NVML detection only: a job found on a GPU it was not given is evicted within a refresh" + why
    if node.gpu_isolation == common_pb2.GPU_ISOLATION_NONE:
        return "none: a declared inventory has no GPUs to guard" + why
    return "unknown (the agent has not said)"


def node_free(node: controller_pb2.Node) -> int:
    busy = set(node.busy_gpus)
    return sum(1 for g in node.inventory.gpus if g.index not in busy)


# -- tables -----------------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by three spaces, as kubectl prints them; no trailing blanks.
    Every cell is made `safe`."""
    rows = [[safe(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = []
    for row in [list(headers), *rows]:
        lines.append("   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def job_row(job: controller_pb2.Job, now: float, wide: bool = False, models: GpuModels | None = None) -> list[str]:
    head = [
        job.id, job.spec.name, job.spec.tenant, job_state(job.state), job_gpus(job, models), job_iter(job),
        age(job.submit_time, now),
    ]
    if not wide:
        return head + [truncate(job.reason) or NONE]
    return head + [
        job_plan(job), job_nodes(job), str(job.attempt), job_loss(job), *forecast_columns(job, now),
        one_line(job.reason) or NONE,
    ]


def jobs_table(
    jobs: Sequence[controller_pb2.Job], now: float, wide: bool = False, models: GpuModels | None = None
) -> str:
    return table(JOB_WIDE_COLUMNS if wide else JOB_COLUMNS, [job_row(j, now, wide, models) for j in jobs])


def node_row(node: controller_pb2.Node, now: float, wide: bool = False) -> list[str]:
    row = [
        node.id, node_status(node, now), node_gpus(node), str(node_free(node)), source(node.inventory.source),
        age(node.last_heartbeat, now), node.address or NONE,
    ]
    if wide:
        inv = node.inventory
        row += [
            inv.hostname or NONE, str(inv.cpu_count) if inv.cpu_count else NONE, gib(inv.host_memory_bytes),
            ISOLATION_WORDS.get(node.gpu_isolation, NONE), wide_version(node), one_line(node.reason) or NONE,
        ]
    return row


def nodes_table(nodes: Sequence[controller_pb2.Node], now: float, wide: bool = False) -> str:
    return table(NODE_WIDE_COLUMNS if wide else NODE_COLUMNS, [node_row(n, now, wide) for n in nodes])


def events_table(events: Sequence[common_pb2.JobEvent], now: float) -> str:
    rows = [[str(e.seq), age(e.time, now), e.kind or NONE, one_line(e.message)] for e in events]
    return table(EVENT_COLUMNS, rows)


# -- describe ---------------------------------------------------------------------------------------


def _fmt_time(t: float) -> str:
    return (utc_text(t) or NONE) if 0 < t < math.inf else NONE


def _kv(pairs: Sequence[tuple[str, str]], indent: int = 0) -> list[str]:
    pairs = [(safe(k), safe(v)) for k, v in pairs]
    width = max((len(k) for k, _ in pairs), default=0) + 2
    return [" " * indent + f"{k + ':':<{width}}{v}".rstrip() for k, v in pairs]


def _priority(spec: common_pb2.JobSpec) -> str:
    """`describe job`'s Priority line: best-effort, or guaranteed with its promise (docs/tenants.md)."""
    if spec.priority != common_pb2.PRIORITY_GUARANTEED:
        return "best-effort"
    g = spec.guarantee
    parts = [f"{g.num_gpus} x {g.gpu_type or 'any type'}"]
    if g.num_cpus:
        parts.append(f"{g.num_cpus} CPUs")
    if g.plan:
        parts.append(f"plan {g.plan}")
    return "guaranteed: " + ", ".join(parts)


def describe_job(job: controller_pb2.Job, now: float) -> str:
    """`describe job`: the spec, state with its reason, plan, placement, progress and events."""
    spec = job.spec
    m = spec.model
    model = "none (opaque job)" if not spec.HasField("model") else m.name if not m.hidden_size else (
        f"{m.name + ' ' if m.name else ''}hidden={m.hidden_size} layers={m.num_layers} heads={m.num_heads} "
        f"vocab={m.vocab_size} seq={m.seq_length}"
    )
    lines = _kv([
        ("ID", job.id), ("Name", spec.name), ("Tenant", spec.tenant), ("Priority", _priority(spec)),
        ("State", job_state(job.state)),
        ("Reason", one_line(job.reason) or NONE), ("Model", model),
        ("Global batch", str(spec.global_batch_size or NONE)), ("Iterations", job_iter(job)),
        ("GPU hint", (f"{spec.hint.gpus or 'any count'} of {', '.join(spec.hint.gpu_types) or 'any type'}"
                      if spec.hint.gpus or spec.hint.gpu_types else NONE)),
        *program_pairs(spec),
        ("Max retries", str(spec.max_retries)), ("Attempt", str(job.attempt)), ("Restarts", str(job.restarts)),
        ("Launch failures", launch_backoff(job, now)),
        ("Submitted", f"{_fmt_time(job.submit_time)} ({age(job.submit_time, now)} ago)"),
        ("Started", _fmt_time(job.start_time)), ("Ended", _fmt_time(job.end_time)),
        *objective_pairs(job), *forecast_pairs(job, now),
    ])
    lines += ["Features:", *_kv(features(job), indent=2)]
    if spec.env:
        lines.append("Env:")
        lines += _kv(sorted(spec.env.items()), indent=2)
    if job.HasField("plan"):
        p = job.plan
        mem = gb(p.memory_per_gpu_bytes)
        if p.memory_per_gpu_bytes:  # in GiB too: the reasons (PLACED, PENDING) give memory in GiB
            mem += f" = {p.memory_per_gpu_bytes / 2**30:.1f} GiB"
        lines.append("Plan:")
        lines += _kv([
            ("Cell", job.cell or NONE), ("GPU model", p.gpu_model or NONE), ("dp/tp/pp", f"{p.dp}/{p.tp}/{p.pp}"),
            ("Micro batch", str(p.micro_batch)), ("Grad accum", str(p.grad_accum)),
            *_state_options(p),
            ("Memory/GPU", f"{mem} ({p.memory_source or 'unknown source'})"),
        ], indent=2)
    if job.placement.slices:
        lines.append("Placement:")
        lines += _kv([(s.node_id, "GPUs " + ",".join(map(str, s.gpu_indices))) for s in job.placement.slices],
                     indent=2)
        lines += _kv([("Rendezvous", job.placement.rendezvous or NONE)], indent=2)
    if job.HasField("progress"):
        pr = job.progress
        ckpt = str(pr.checkpoint_iteration) if pr.checkpoint_iteration >= 0 else "none"
        lines.append("Progress:")
        lines += _kv([
            ("Iteration", job_iter(job)), ("Loss", job_loss(job)), ("Samples/s", f"{pr.samples_per_second:.1f}"),
            ("Step time", f"{pr.step_time_seconds:.3f}s"), ("Peak memory", gb(pr.peak_memory_bytes)),
            ("Checkpoint", ckpt), ("Reported", f"{age(pr.time, now)} ago" if pr.time else NONE),
        ], indent=2)
    lines.append("Events:")
    if job.events:
        lines += ["  " + line for line in events_table(job.events, now).splitlines()]
    else:
        lines.append("  <none>")
    return "\n".join(lines)


def program_pairs(spec: common_pb2.JobSpec) -> list[tuple[str, str]]:
    """`describe job`'s lines of what runs: the entrypoint, the launcher whole (a built-in's name,
    or a template's argv, per rank or per node, and its head's), and the checkpoint interval. A
    live audit read `Entrypoint: (reference trainer)` of a template that runs a script of its own,
    and no launcher at all."""
    la, own = spec.launcher, jobspec.runs_own_program(spec)
    entry = " ".join(spec.entrypoint) or ("(the launcher template's program)" if own else "(reference trainer)")
    if spec.entrypoint and jobspec.template_runs_own_program(la):  # stored before submit refused it
        entry += " (never run: the launcher template has no {entrypoint})"
    if la.argv:
        launcher = f"{' '.join(la.argv)} (template, one process per {'node' if la.per_node else 'rank'})"
    elif la.name and la.name != "direct":
        launcher = f"{la.name} (one process per node, starting its ranks)"
    else:
        launcher = f"direct ({'' if la.name else 'default: '}one process per rank)"
    pairs = [("Entrypoint", entry), ("Launcher", launcher)]
    if la.argv and la.head_argv:
        pairs.append(("Launcher head", f"{' '.join(la.head_argv)} (node rank 0)"))
    # TESSERA_CHECKPOINT_EVERY = 0 means "the trainer's default" only where Tessera's trainer runs.
    every = str(spec.checkpoint_every) if spec.checkpoint_every else (
        "not set (the program decides)" if own else "trainer default")
    return [*pairs, ("Checkpoint every", every)]


def describe_node(node: controller_pb2.Node, now: float, jobs: Sequence[controller_pb2.Job] = ()) -> str:
    """`describe node`: state with its reason, inventory, each GPU, and the jobs placed on it (a row
    for its busy GPUs that no job of `jobs` holds, saying why: clients/nodejobs.py)."""
    inv = node.inventory
    lines = _kv([
        ("Name", node.id), ("Address", node.address or NONE), ("State", node_status(node, now)),
        ("Reason", one_line(node.reason) or NONE), ("Hostname", inv.hostname or NONE),
        ("Inventory", source(inv.source) + (" (no GPU probed: workers run on CPU)"
                                            if inv.source == common_pb2.INVENTORY_SOURCE_DECLARED else "")),
        ("CPUs", (str(inv.cpu_count) if inv.cpu_count else NONE)
         + (f" ({node.busy_cpus} promised to guaranteed jobs)" if node.busy_cpus else "")),
        ("Memory", gib(inv.host_memory_bytes)),
        ("Capacity", f"{node_gpus(node)} ({node_free(node)} free)"),
        ("Agent", agent_build(node)),
        ("GPU isolation", gpu_isolation(node)),
        ("Heartbeat", f"{_fmt_time(node.last_heartbeat)} ({age(node.last_heartbeat, now)} ago)"),
        ("Launch failures", str(node.launch_failures) + (
            f" (unhealthy: no placements until {_fmt_time(node.unhealthy_until)})"
            if node.unhealthy_until > now else "")),
    ])
    busy = set(node.busy_gpus)
    rows = [
        [str(g.index), g.model or "?", gb(g.memory_bytes), gb(g.foreign_used_bytes),
         ",".join(map(str, g.nvlink_peers)) or "pcie", "busy" if g.index in busy else "free", g.uuid or NONE]
        for g in inv.gpus
    ]
    lines.append("GPUs:")
    if rows:
        lines += ["  " + line for line in
                  table(("INDEX", "MODEL", "MEMORY", "FOREIGN", "NVLINK", "USE", "UUID"), rows).splitlines()]
    else:
        lines.append("  <none>")
    if inv.left_out:
        lines.append("Left out (not scheduled):")
        lines += ["  " + line for line in table(
            ("INDEX", "MODEL", "UUID", "WHY"),
            [[str(g.index), g.model or "?", g.uuid or NONE, one_line(g.reason)] for g in inv.left_out]).splitlines()]
    lines.append("Jobs:")
    placed = on_node(node, jobs)
    jrows = [[j.id, j.spec.name, job_state(j.state),
              ",".join(",".join(map(str, s.gpu_indices)) for s in j.placement.slices if s.node_id == node.id)]
             for j in placed]
    for label, gpus in unlisted_rows(node, jobs):
        jrows.append([label, NONE, NONE, ",".join(map(str, gpus))])
    if jrows:
        lines += ["  " + line for line in table(("ID", "NAME", "STATE", "GPUS"), jrows).splitlines()]
    else:
        lines.append("  <none>")
    return "\n".join(lines)
