"""The dashboard's HTML pages, rendered on the server. Every value from a job, a node or a request
is escaped (`e`; `bdi` also isolates its direction: text.py); the pages carry no inline script or
style (the CSP forbids them): behaviour is in /static/app.js, looks in /static/style.css.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from urllib.parse import urlencode

from tessera.common.nodespec import ISOLATION_WORDS
from tessera.common.tokens import Principal
from tessera.controller.dashboard import charts
from tessera.controller.dashboard.data import forecast_fields, forecast_of
from tessera.controller.dashboard.history import CapacityHistory, ProgressPoint
from tessera.controller.dashboard.text import bdi, e
from tessera.controller.metrics import GPU_STATES
from tessera.v1 import common_pb2, controller_pb2

REFRESH_S = 10
COLOURS = {"allocated": "#3b6fd4", "free": "#43a047", "unavailable": "#9e9e9e"}
FINAL = {common_pb2.JOB_STATE_SUCCEEDED, common_pb2.JOB_STATE_FAILED, common_pb2.JOB_STATE_CANCELLED}
MAX_EVENTS = 300  # the newest shown on a job page (GET /api/jobs/ID has them all)
GIB = 1024 ** 3
ON = ' class="on"'
# The words of `tessctl describe node` (clients/nodejobs.py, which the controller may not import) for
# a busy GPU that no job listed on the node holds.
HIDDEN = "(hidden: another tenant's job)"
NO_JOB = "(no job: workers ending, or a move's target)"
UNLISTED = {"hidden": HIDDEN, "nojob": NO_JOB}  # a GPU chip's class for each
# The nodes page's GPU colours (style.css `.gpu.*`), said in its header when some GPU shows one.
GPU_KEY = (("busy", "blue: held by a job listed"), ("hidden", "purple: another tenant's job"),
           ("nojob", "amber: no job, workers ending or a move's target"))
# (job id, name, its GPUs on the node) of an active job the caller may see.
HeldJob = tuple[str, str, tuple[int, ...]]
# A job's bar on the timeline, by state: cancelled is not failed (an audit saw both red).
BAR_CLASS = {common_pb2.JOB_STATE_PENDING: "pending", common_pb2.JOB_STATE_SUCCEEDED: "done",
             common_pb2.JOB_STATE_FAILED: "failed", common_pb2.JOB_STATE_CANCELLED: "cancelled"}
# The timeline's colour classes (style.css `.bar.*`, `.key.*`) and what each means.
GANTT_KEY = (("running", "running"), ("pending", "pending (forecast)"), ("done", "succeeded"),
             ("failed", "failed"), ("cancelled", "cancelled"))


def job_state(state: int) -> str:
    name = common_pb2.JobState.Name(state) if state in common_pb2.JobState.values() else "UNKNOWN"
    return name.removeprefix("JOB_STATE_").lower()


def node_state(state: int) -> str:
    name = common_pb2.NodeState.Name(state) if state in common_pb2.NodeState.values() else "UNKNOWN"
    return name.removeprefix("NODE_STATE_").lower()


def when(t: float) -> str:
    try:
        return time.strftime("%m-%d %H:%M:%SZ", time.gmtime(t)) if t > 0 else "-"
    except (OverflowError, OSError, ValueError):  # a time no calendar shows: a page, not a 500
        return "-"


def ago(now: float, t: float) -> str:
    if t <= 0:
        return "-"
    s = max(0.0, now - t)
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.1f}h ago"


def layout(title: str, who: Principal | None, body: str, nav: str = "") -> str:
    links = "".join(f'<a href="{href}"{ON if nav == key else ""}>{label}</a>'
                    for key, href, label in (("cluster", "/", "Cluster"), ("nodes", "/nodes", "Nodes"),
                                             ("jobs", "/jobs", "Jobs")))
    user = ""
    if who is not None:
        tenant = f", tenant {bdi(who.tenant)}" if who.tenant else ""
        user = (f'<span class="who">{bdi(who.name)} ({e(who.role)}{tenant}) '
                f'<button type="button" id="signout">sign out</button></span>')
    refresh = (f'<label class="refresh"><input type="checkbox" id="autorefresh" checked> refresh every '
               f"{REFRESH_S} s</label>") if who is not None else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{e(title)} - Tessera</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<link rel="icon" href="data:,"><link rel="stylesheet" href="/static/style.css">'
            f'<script src="/static/app.js" defer></script></head>'
            f'<body data-refresh="{REFRESH_S if who is not None else 0}"><header><span class="brand">Tessera</span>'
            f"<nav>{links}</nav>{user}</header><main><h1>{e(title)}</h1>{body}</main>"
            f"<footer>Read-only view of the controller. {refresh}</footer></body></html>")


def login_page(problem: str = "") -> str:
    why = f'<p class="problem" id="problem">{e(problem)}</p>' if problem else ""
    body = (f"{why}<p>The controller checks a token (docs/auth.md): paste yours (<code>tessctl</code>'s "
            f"<code>--token</code> or <code>$TESSERA_TOKEN</code>). It is kept in a cookie of this site only.</p>"
            f'<p><label>Token <input type="password" id="token" autocomplete="off" size="48"></label> '
            f'<button type="button" id="signin">Sign in</button></p>')
    return layout("Sign in", None, body)


def error_page(status: int, message: str) -> str:
    return layout(f"Error {status}", None, f'<p class="problem">{e(message)}</p><p><a href="/">Back</a></p>')


def table(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    """`rows` hold HTML already escaped."""
    h = "".join(f"<th>{e(x)}</th>" for x in head)
    b = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{h}</tr></thead><tbody>{b}</tbody></table>'


def gpu_totals(nodes: Sequence[controller_pb2.Node], now: float) -> dict[str, dict[str, int]]:
    """Now, by type and state, as the capacity history samples it (metrics.gpu_states)."""
    out: dict[str, dict[str, int]] = {}
    for n in nodes:
        busy = set(n.busy_gpus)
        usable = n.state == common_pb2.NODE_STATE_READY and n.unhealthy_until <= now
        for g in n.inventory.gpus:
            state = "allocated" if g.index in busy else "free" if usable else "unavailable"
            t = out.setdefault(g.model or "unknown", {s: 0 for s in GPU_STATES})
            t[state] += 1
    return out


def cluster_page(who: Principal, capacity: CapacityHistory, nodes: Sequence[controller_pb2.Node], now: float) -> str:
    totals = gpu_totals(nodes, now)
    rows = [[bdi(t), str(sum(v.values())), *(str(v[s]) for s in GPU_STATES)] for t, v in sorted(totals.items())]
    states: dict[str, int] = {}
    for n in nodes:
        states[node_state(n.state)] = states.get(node_state(n.state), 0) + 1
    summary = ", ".join(f"{k} {v}" for k, v in sorted(states.items())) or "none registered"
    parts = [f'<p id="summary">{len(nodes)} node{"" if len(nodes) == 1 else "s"} ({e(summary)}).</p>', "<h2>GPUs now</h2>",
             table(["GPU type", "total", *GPU_STATES], rows, "gpus") if rows else '<p class="empty">No GPUs.</p>',
             "<h2>Capacity over time</h2>",
             ('<p class="note">One sample per scheduling round (at least every two minutes), kept in the '
             "controller's memory since it started.</p>")]
    samples = list(capacity.samples)
    for t in capacity.types():
        times = [s.time for s in samples]
        series = [(state, COLOURS[state], [float(s.gpus.get(t, {}).get(state, 0)) for s in samples])
                  for state in GPU_STATES]
        parts.append(f'<h3>{bdi(t)}</h3><div class="chart-box" id="capacity-{e(t)}">'
                     f"{charts.stacked_area(f'{t} GPUs by state', times, series, 'GPUs')}</div>")
    if not capacity.types():
        parts.append(charts.stacked_area("capacity", [], [], "GPUs"))
    return layout("Cluster", who, "".join(parts), "cluster")


def unlisted_gpus(n: controller_pb2.Node, jobs: Sequence[HeldJob]) -> tuple[set[int], set[int]]:
    """The node's busy GPUs that none of `jobs` holds, as describe node splits them: those of jobs
    the caller may not list (`hidden_gpus`), and the rest (workers ending, or a move's target)."""
    rest = set(n.busy_gpus) - {g for _, _, gpus in jobs for g in gpus}
    hidden = rest & set(n.hidden_gpus)
    return hidden, rest - hidden


def _gpu_list(gpus: set[int]) -> str:
    return f"GPU{'' if len(gpus) == 1 else 's'} {', '.join(str(g) for g in sorted(gpus))}"


def nodes_page(who: Principal, nodes: Sequence[controller_pb2.Node], held: Mapping[str, Sequence[HeldJob]],
               now: float) -> str:
    """`held`: node -> the active jobs placed on it that the caller may see. A busy GPU none of them
    holds is said as describe node says it (HIDDEN, NO_JOB), never as held by a job listed here."""
    rows, shown = [], {"busy"}
    for n in nodes:
        here = held.get(n.id, ())
        hidden, no_job = unlisted_gpus(n, here)
        jobs = [f'<a href="/jobs/{e(jid)}">{bdi(name or jid)}</a>' for jid, name, _ in here]
        jobs += [f'<span class="unlisted">{e(words)} {_gpu_list(gpus)}</span>'
                 for words, gpus in ((HIDDEN, hidden), (NO_JOB, no_job)) if gpus]
        busy = set(n.busy_gpus)
        chips = ""
        for g in n.inventory.gpus:
            cls = ("hidden" if g.index in hidden else "nojob" if g.index in no_job else
                   "busy" if g.index in busy else "idle")
            shown.add(cls)
            why = f": {UNLISTED[cls]}" if cls in UNLISTED else ""
            chips += (f'<span class="gpu {cls}" title="{e(g.model)} {g.memory_bytes / GIB:.0f} GiB{e(why)}">'
                      f"{g.index}: {bdi(g.model)}</span>")
        chips += "".join(f'<span class="gpu out" title="left out: {e(g.reason)}">{g.index}: {bdi(g.model)}</span>'
                         for g in n.inventory.left_out)
        mem = f"{n.inventory.host_memory_bytes / GIB:.0f} GiB" if n.inventory.host_memory_bytes else "-"
        cpus = str(n.inventory.cpu_count or "-") + (f" ({n.busy_cpus} promised to guaranteed jobs)"
                                                    if n.busy_cpus else "")
        rows.append([f'<span id="node-{e(n.id)}">{bdi(n.id)}</span>', (f'<span class="st {node_state(n.state)}">'
                     f"{node_state(n.state)}</span>"), bdi(n.reason or ""), bdi(n.address),
                     chips or "-", ", ".join(jobs) or "-", cpus, mem,
                     e(ISOLATION_WORDS.get(n.gpu_isolation, "-")), bdi(n.agent_version or "-"),
                     ago(now, n.last_heartbeat)])
    key = "; ".join(words for cls, words in GPU_KEY if cls in shown)
    body = (table(["node", "state", "reason", "address", f"GPUs ({key})", "jobs", "CPUs", "memory",
                   "GPU isolation", "agent", "heartbeat"], rows, "nodes")
            if rows else '<p class="empty">No node has registered.</p>')
    return layout("Nodes", who, body, "nodes")


def _gantt_rows(jobs: Sequence[controller_pb2.Job], now: float) -> list[charts.GanttRow]:
    rows = []
    for j in jobs:
        f = forecast_of(j)
        colour = BAR_CLASS.get(j.state, "running")  # starting and migrating too
        band = (f.end_low or f.end, f.end_high or f.end) if (f.end_low or f.end_high) else None
        if j.state == common_pb2.JOB_STATE_PENDING and f.start > 0:
            rows.append(charts.GanttRow(j.spec.name or j.id, f"/jobs/{j.id}", colour, f.start, max(f.end, f.start),
                                        f.start, band))
        elif j.start_time > 0 and j.state in FINAL:
            rows.append(charts.GanttRow(j.spec.name or j.id, f"/jobs/{j.id}", colour, j.start_time, j.end_time))
        elif j.start_time > 0:  # running: what happened up to now, then the forecast (a stale one ends at now)
            end = max(f.end, now) if f.end > 0 else 0.0
            rows.append(charts.GanttRow(j.spec.name or j.id, f"/jobs/{j.id}", colour, j.start_time, end,
                                        now if f.end > 0 else 0.0, band))
    return rows


def _jobs_href(state: str, tenant: str) -> str:
    query = urlencode([(k, v) for k, v in (("state", state), ("tenant", tenant)) if v])
    return f"/jobs?{query}" if query else "/jobs"


def jobs_page(who: Principal, jobs: Sequence[controller_pb2.Job], state_filter: str, now: float,
              tenant_filter: str = "", matching: int = 0) -> str:
    """`jobs` in the order shown (joblist.select: not finished first, newest first); `matching` > 0:
    the list is cut, and at least that many jobs match the filters."""
    has_forecast = bool(forecast_fields())
    filters = " ".join(f'<a href="{e(_jobs_href(s, tenant_filter))}"{ON if s == state_filter else ""}>'
                       f"{s or 'all'}</a>" for s in ("", "pending", "running", "succeeded", "failed", "cancelled"))
    if tenant_filter:
        filters += f' (tenant {bdi(tenant_filter)}: <a href="{e(_jobs_href(state_filter, ""))}">any tenant</a>)'
    rows = []
    for j in jobs:
        prog = f"{j.progress.iteration}/{j.spec.iterations}" if j.spec.iterations else (
            str(j.progress.iteration) if j.progress.iteration else "-")
        f = forecast_of(j)
        start = when(j.start_time) if j.start_time else (f"~{when(f.start)}" if f.start else "-")
        end = when(j.end_time) if j.end_time else (f"~{when(f.end)}" if f.end else "-")
        rows.append([f'<a class="job" href="/jobs/{e(j.id)}">{e(j.id)}</a>', bdi(j.spec.name),
                     bdi(j.spec.tenant or "-"),
                     f'<span class="st {job_state(j.state)}">{job_state(j.state)}</span>',
                     f'<span class="reason">{bdi(j.reason)}</span>', bdi(j.cell or "-"), prog,
                     *(f'<span class="nw">{t}</span>' for t in (when(j.submit_time), start, end))])
    note = ("Times marked ~ are the controller's forecasts." if has_forecast else
            "This controller does not forecast start and end times: the chart shows what happened.")
    legend = "".join(f'<span class="key {cls}"></span>{e(words)} ' for cls, words in GANTT_KEY)
    body = (f'<p class="filters">State: {filters}</p><h2>Timeline</h2><p class="note">{note}</p>'
            f'<p class="note legend" id="gantt-key">{legend.strip()}</p>'
            f'<div class="chart-box" id="gantt">{charts.gantt("jobs over time", _gantt_rows(jobs, now), now)}</div>'
            f"<h2>Jobs ({len(jobs)})</h2>")
    order = ("The jobs not finished come first (running, starting and migrating, then pending), then the "
             "finished ones; the newest first in each.")
    if matching:
        body += (f'<p class="note cut" id="cut">Showing {len(jobs)} of at least {matching} jobs. {order} For the '
                 "others, filter by state or tenant (<code>?state=succeeded</code>, <code>?tenant=NAME</code>), "
                 "or use <code>tessctl get jobs</code>.</p>")
    else:
        body += f'<p class="note">{order}</p>'
    body += table(["job", "name", "tenant", "state", "reason", "cell", "iterations", "submitted", "start", "end"],
                  rows, "jobs") if rows else '<p class="empty" id="no-jobs">No jobs.</p>'
    return layout("Jobs", who, body, "jobs")


def _plan(p: common_pb2.Plan) -> str:
    if not p.gpu_model:
        return "-"
    text = (f"dp {p.dp} x tp {p.tp} x pp {p.pp} on {bdi(p.gpu_model)}, micro-batch {p.micro_batch}, "
            f"grad accumulation {p.grad_accum}")
    if p.memory_per_gpu_bytes:
        text += f", {p.memory_per_gpu_bytes / GIB:.1f} GiB per GPU ({bdi(p.memory_source)})"
    if p.stages:
        text += "; stages: " + ", ".join(f"{s.gpus} x {bdi(s.gpu_model)} (layers {s.layer_start}-{s.layer_end})"
                                        for s in p.stages)
    return text


def job_page(who: Principal, j: controller_pb2.Job, points: Sequence[ProgressPoint], now: float) -> str:
    f = forecast_of(j)
    total = j.spec.iterations
    pct = min(100.0, 100.0 * j.progress.iteration / total) if total else 0.0
    bar = (f'<progress max="100" value="{pct:.1f}"></progress> {j.progress.iteration}/{total} iterations'
           if total else f"{j.progress.iteration} iterations reported" if j.progress.iteration else "no progress reported")
    if j.progress.loss:
        bar += f", loss {j.progress.loss:.4g}"
    if j.progress.samples_per_second:
        bar += f", {j.progress.samples_per_second:.3g} samples/s"
    fc = "-"
    if f.known:
        fc = f"starts ~{when(f.start)}" if f.start and not j.start_time else ""
        if f.start_low and f.start_high and not j.start_time:
            fc += f" ({when(f.start_low)} to {when(f.start_high)})"
        fc += (", " if fc else "") + (f"ends ~{when(f.end)}" if f.end else "")
        if f.end_low and f.end_high:
            fc += f" ({when(f.end_low)} to {when(f.end_high)})"
    elif not forecast_fields():
        fc = "not forecast by this controller"
    if f.note:
        fc = f"{fc}; {bdi(f.note)}" if f.known else bdi(f.note)
    facts = [("State", f'<span class="st {job_state(j.state)}" id="state">{job_state(j.state)}</span>'),
             ("Reason", bdi(j.reason or "-")), ("Tenant", bdi(j.spec.tenant or "-")),
             ("Attempt", f"{j.attempt} (restarts {j.restarts})"), ("Cell", bdi(j.cell or "-")), ("Plan", _plan(j.plan)),
             ("Submitted", when(j.submit_time)), ("Started", when(j.start_time)), ("Ended", when(j.end_time)),
             ("Forecast", fc), ("Progress", bar)]
    if j.predicted_seconds or j.predicted_cost:
        facts.append(("Predicted", f"{j.predicted_seconds:.0f} s, cost {j.predicted_cost:.2f} ({bdi(j.allocation)})"))
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    place = table(["node", "GPUs"], [[bdi(s.node_id), ", ".join(str(i) for i in s.gpu_indices)]
                                     for s in j.placement.slices], "placement") if j.placement.slices else "<p>-</p>"
    events = list(j.events)[-MAX_EVENTS:]
    ev_rows = [[when(ev.time), f'<span class="kind">{bdi(ev.kind)}</span>', bdi(ev.message)] for ev in events]
    xs = [float(p.iteration) for p in points]
    curves = ("<h3>Loss</h3>" + charts.line_chart("loss", xs, [p.loss for p in points], "iteration", "loss") +
              "<h3>Throughput</h3>" +
              charts.line_chart("throughput", xs, [p.samples_per_second for p in points], "iteration", "samples/s",
                                "#2e86c1")) if any(p.loss for p in points) else (
        '<p class="empty">No loss reported (the job does not report progress, or no report reached this '
        "controller since it started).</p>")
    body = (f'<dl class="facts">{dl}</dl><h2>Placement</h2>{place}<h2>Progress</h2>'
            f'<div class="chart-box" id="curves">{curves}</div>'
            f"<h2>Events ({len(j.events)})</h2>" + table(["time", "kind", "message"], ev_rows, "events"))
    return layout(f"Job {j.id}" + (f" ({j.spec.name})" if j.spec.name else ""), who, body, "jobs")
