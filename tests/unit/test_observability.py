"""The pieces behind docs/observability.md: the health service's statuses and watchers, the build
info, the controller's new metrics, and the Grafana board's queries against the metrics defined."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2
from prometheus_client import REGISTRY

from tessera.common import buildinfo
from tessera.common.hooks import LIVE, NOT_SERVING, SERVING, Hooks
from tessera.controller import metrics
from tessera.controller.store import JobRecord
from tessera.controller.view import NodeInfo
from tessera.v1 import common_pb2

REPO = Path(__file__).resolve().parents[2]
BOARD = REPO / "deploy" / "grafana" / "tessera.json"


class _Ctx:
    pass


async def _next(gen: object) -> int:
    return int((await asyncio.wait_for(gen.__anext__(), 5)).status)  # type: ignore[attr-defined]


async def test_every_watcher_hears_each_change_and_a_shutdown() -> None:
    hooks = Hooks("tessera-test", ["tessera.v1.Thing"], serving=False)
    hooks.register(_FakeServer())  # type: ignore[arg-type]
    health = hooks.health
    assert health.status("") == NOT_SERVING and health.status("tessera.v1.Thing") == NOT_SERVING
    assert health.status(LIVE) == SERVING
    req = health_pb2.HealthCheckRequest(service="tessera.v1.Thing")
    a, b = health.Watch(req, _Ctx()), health.Watch(req, _Ctx())
    assert await _next(a) == NOT_SERVING and await _next(b) == NOT_SERVING
    pending_a, pending_b = asyncio.ensure_future(_next(a)), asyncio.ensure_future(_next(b))
    await asyncio.sleep(0)
    hooks.set_serving(True)
    assert await pending_a == SERVING and await pending_b == SERVING
    await a.aclose()  # one watcher leaving must not silence the other (grpcio-health-checking's would)
    pending_b = asyncio.ensure_future(_next(b))
    await asyncio.sleep(0)
    hooks.shutdown()
    assert await pending_b == NOT_SERVING
    assert health.status(LIVE) == NOT_SERVING
    hooks.set_serving(True)  # frozen once shutting down
    assert health.status("") == NOT_SERVING and not hooks.serving
    await b.aclose()
    unknown = health.Watch(health_pb2.HealthCheckRequest(service="later"), _Ctx())
    assert await _next(unknown) == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
    await unknown.aclose()


class _FakeServer:
    """Takes the registrations Hooks.register makes (add_generic_rpc_handlers and the named ones)."""

    def __init__(self) -> None:
        self.handlers: list[object] = []

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        self.handlers.append(handlers)

    def add_registered_method_handlers(self, service: str, handlers: object) -> None:
        self.handlers.append(service)


def test_build_info_names_the_commit_from_the_environment_or_the_source_tree(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(buildinfo.COMMIT_ENV, "ABCDEF1234567")
    assert buildinfo.git_commit() == "abcdef1234567"
    monkeypatch.setenv(buildinfo.COMMIT_ENV, "not a commit")
    commit = buildinfo.git_commit()
    direct = buildinfo._direct_url()
    dir_info = direct.get("dir_info")
    if isinstance(dir_info, dict) and dir_info.get("editable") and str(direct.get("url", "")).endswith(REPO.name):
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=False).stdout.strip()
        assert commit == head  # the editable install of this checkout: its HEAD
    else:
        assert commit == "" or re.fullmatch(r"[0-9a-f]{40}", commit)
    v = buildinfo.version_info("tessctl", 12.0)
    assert v.component == "tessctl" and v.version and v.python_version.count(".") == 2 and v.start_time == 12.0


@dataclass
class _View:
    nodes: dict[str, NodeInfo]
    busy: dict[str, set[int]] = field(default_factory=dict)

    def node_ids(self) -> list[str]:
        return sorted(self.nodes)

    def node(self, node_id: str) -> NodeInfo:
        return self.nodes[node_id]

    def busy_gpus(self, exclude: str = "") -> dict[str, set[int]]:
        return self.busy


def _node(node_id: str, model: str, n: int, state: int, unhealthy_until: float = 0.0) -> NodeInfo:
    inv = common_pb2.NodeInventory()
    for i in range(n):
        inv.gpus.add(index=i, model=model)
    return NodeInfo(node_id, "", inv, state, "", True, 0.0, 0.0, 0, unhealthy_until)


def _gpus(t: str, state: str) -> float | None:
    return REGISTRY.get_sample_value("tessera_gpus", {"type": t, "state": state})


def test_gpus_by_type_and_state() -> None:
    ready, down = common_pb2.NODE_STATE_READY, common_pb2.NODE_STATE_DOWN
    view = _View({"a": _node("a", "T1-TEST", 4, ready), "b": _node("b", "T1-TEST", 2, down),
                  "c": _node("c", "T2-TEST", 2, ready, unhealthy_until=200.0)}, busy={"a": {0, 1, 2}, "b": {1}})
    metrics.update_nodes(view, now=100.0)  # type: ignore[arg-type]
    assert (_gpus("T1-TEST", "allocated"), _gpus("T1-TEST", "free"), _gpus("T1-TEST", "unavailable")) == (4, 1, 1)
    assert (_gpus("T2-TEST", "allocated"), _gpus("T2-TEST", "free"), _gpus("T2-TEST", "unavailable")) == (0, 0, 2)
    metrics.update_nodes(_View({"a": view.nodes["a"]}), now=300.0)  # type: ignore[arg-type]
    assert _gpus("T2-TEST", "unavailable") is None and _gpus("T1-TEST", "free") == 4  # gone, not stale


def test_gpu_types_of_nodes_no_longer_known_leave_no_series() -> None:
    """A node that registers again and again with new model names keeps one type's series, not
    every name it ever sent (which grew /metrics and update_nodes without bound)."""
    ready = common_pb2.NODE_STATE_READY
    for i in range(50):
        metrics.update_nodes(_View({"a": _node("a", f"Z{i:03d}-TEST", 2, ready)}), now=0.0)  # type: ignore[arg-type]
    names = {s.labels["type"] for m in REGISTRY.collect() if m.name == "tessera_gpus" for s in m.samples}
    assert {n for n in names if n.startswith("Z")} == {"Z049-TEST"}


def _job(tenant: str, gpus: int, attempt: int = 0, submit: float = 10.0) -> JobRecord:
    placement = common_pb2.Placement()
    if gpus:
        placement.slices.add(node_id="a", gpu_indices=list(range(gpus)))
    return JobRecord("j", "r", common_pb2.JobSpec(tenant=tenant), common_pb2.JOB_STATE_RUNNING, "", submit,
                     attempt=attempt, placement=placement)


def test_tenant_gpu_seconds_and_queue_wait() -> None:
    def used(tenant: str) -> float:
        return REGISTRY.get_sample_value("tessera_tenant_gpu_seconds_total", {"tenant": tenant}) or 0.0

    before_a, before_b = used("ta-test"), used("tb-test")
    acc = metrics.GpuSeconds()
    jobs = [_job("ta-test", 4), _job("ta-test", 2), _job("tb-test", 1)]
    acc.tick(jobs, 100.0)  # the first tick only starts the clock
    acc.tick(jobs, 102.5)
    acc.tick(jobs[:1], 103.5)
    assert used("ta-test") - before_a == pytest.approx(6 * 2.5 + 4 * 1.0)
    assert used("tb-test") - before_b == pytest.approx(2.5)

    def waits() -> tuple[float, float]:
        count = REGISTRY.get_sample_value("tessera_queue_wait_seconds_count") or 0.0
        total = REGISTRY.get_sample_value("tessera_queue_wait_seconds_sum") or 0.0
        return count, total

    c0, s0 = waits()
    metrics.job_started(_job("ta-test", 0, attempt=0, submit=10.0), now=70.0)
    metrics.job_started(_job("ta-test", 0, attempt=1, submit=10.0), now=500.0)  # a restart: not queueing
    c1, s1 = waits()
    assert (c1 - c0, s1 - s0) == (1, 60.0)


def _exported() -> set[str]:
    """Every sample name the default registry can expose, labelled families included (a family with
    no child yet shows no sample, but its names are fixed by its type)."""
    import tessera.common.hooks  # noqa: F401  (tessera_build_info)

    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
                "gauge": ("",), "summary": ("_sum", "_count", "_created"), "info": ("_info",)}
    names: set[str] = set()
    for family in REGISTRY.collect():
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    return names


def test_every_grafana_query_names_a_metric_the_controller_exports() -> None:
    board = json.loads(BOARD.read_text())
    assert board["uid"] and board["title"] == "Tessera"
    exported = _exported()
    queries = [t["expr"] for p in board["panels"] for t in p.get("targets", ())]
    assert len(queries) >= 15
    named: set[str] = set()
    for q in queries:
        found = set(re.findall(r"\btessera_[a-z0-9_]+", q))
        assert found, f"query names no tessera metric: {q}"
        assert found <= exported, f"{q}: {sorted(found - exported)} not exported"
        named |= found
    # What the operators' issue asked for is on the board.
    assert {"tessera_gpus", "tessera_queue_wait_seconds_bucket", "tessera_tenant_gpu_seconds_total",
            "tessera_build_info"} <= named
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


def test_a_job_state_this_build_has_no_name_for_does_not_freeze_the_job_gauges() -> None:
    """A record with state 99 (written by another build, or by hand) made update_jobs raise on every
    inspection pass, and the job and queue gauges stopped moving."""

    class Jobs:
        def jobs(self) -> list[JobRecord]:
            return [_job("t", 0).with_(state=99), _job("t", 0).with_(state=common_pb2.JOB_STATE_PENDING)]

    metrics.update_jobs(Jobs())  # type: ignore[arg-type]
    assert REGISTRY.get_sample_value("tessera_queue_length") == 1
    assert REGISTRY.get_sample_value("tessera_jobs", {"state": "pending"}) == 1
