"""`get nodes A B` and `get jobs A B` with some names not found print the ones found and an error line
for each other, exit 1 (kubectl's habit); `describe node` says which busy GPUs hold jobs the caller
may not list (docs/cli.md)."""

from __future__ import annotations

import io
import json
import re
import time
from typing import Any

import pytest

from tessera.clients import nodejobs, output, tessctl
from tessera.clients.sdk import RpcError
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2 as C


def _node(node_id: str, busy: tuple[int, ...] = (), hidden: tuple[int, ...] = ()) -> C.Node:
    gpus = [P.Gpu(index=i, model="A40-48GB", memory_bytes=48 * 10**9) for i in range(4)]
    return C.Node(id=node_id, state=P.NODE_STATE_READY, last_heartbeat=time.time(), busy_gpus=list(busy),
                  hidden_gpus=list(hidden), inventory=P.NodeInventory(gpus=gpus))


def _job(job_id: str, node_id: str = "", gpus: tuple[int, ...] = ()) -> C.Job:
    job = C.Job(id=job_id, spec=P.JobSpec(name=f"name-{job_id}"), state=P.JOB_STATE_RUNNING)
    if node_id:
        job.placement.slices.add(node_id=node_id, gpu_indices=list(gpus))
    return job


class FakeClient:
    """ListNodes, GetJob and ListJobs answered from literals, as the controller answers a user: its
    own jobs only, every node with every busy GPU and those of jobs it may not list."""

    def __init__(self, nodes: list[C.Node], jobs: list[C.Job], errors: dict[str, RpcError] | None = None) -> None:
        self._nodes, self._jobs = nodes, {j.id: j for j in jobs}
        self._errors = errors or {}
        self.calls: list[str] = []

    def nodes(self) -> list[C.Node]:
        self.calls.append("ListNodes")
        return list(self._nodes)

    def node(self, node_id: str) -> C.Node:
        return next(n for n in self._nodes if n.id == node_id)

    def get(self, job_id: str, with_events: bool = False) -> C.Job:
        self.calls.append(f"GetJob {job_id}")
        if job_id in self._errors:
            raise self._errors[job_id]
        if job_id not in self._jobs:
            raise RpcError("NOT_FOUND", f"job {job_id} not found")
        return self._jobs[job_id]

    def list(self, **_: Any) -> list[C.Job]:
        return list(self._jobs.values())

    def close(self) -> None:
        pass


def _job_rows(text: str) -> list[list[str]]:
    """The cells of describe node's jobs table (columns are 2+ spaces apart)."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.split("Jobs:\n")[1].splitlines()]


def _run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], client: FakeClient,
         *argv: str) -> tuple[int, str, str]:
    monkeypatch.setattr(tessctl, "connect", lambda *_a, **_k: client)
    out = io.StringIO()
    rc = tessctl.main(list(argv), out=out)
    return rc, out.getvalue(), capsys.readouterr().err


NODES = [_node("n1"), _node("n2")]
JOBS = [_job("j-1"), _job("j-2")]


# -- get nodes / get jobs with names ----------------------------------------------------------------


@pytest.mark.parametrize("resource", ["nodes", "jobs"])
def test_the_names_found_are_printed_and_each_missing_one_is_an_error(
        resource: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: the first missing name's error alone, nothing on stdout."""
    a, b = ("n1", "n2") if resource == "nodes" else ("j-1", "j-2")
    kind = resource[:-1]
    rc, out, err = _run(monkeypatch, capsys, FakeClient(NODES, JOBS), "get", resource, a, "x9", b, "x8")
    assert rc == 1
    assert [line.split()[0] for line in out.splitlines()] == ["NAME" if kind == "node" else "ID", a, b]
    assert err == f"tessctl: error: NOT_FOUND: {kind} x9 not found\ntessctl: error: NOT_FOUND: {kind} x8 not found\n"
    rc, out, err = _run(monkeypatch, capsys, FakeClient(NODES, JOBS), "get", resource, "x9", a, "-o", "json")
    assert rc == 1 and [i["id"] for i in json.loads(out)[resource]] == [a]
    assert err == f"tessctl: error: NOT_FOUND: {kind} x9 not found\n"
    rc, out, _ = _run(monkeypatch, capsys, FakeClient(NODES, JOBS), "get", resource, "x9", a, "-o", "name")
    assert (rc, out) == (1, f"{kind}/{a}\n")


@pytest.mark.parametrize("resource", ["nodes", "jobs"])
def test_none_found_prints_the_errors_alone(resource: str, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    for fmt in ("table", "json"):
        rc, out, err = _run(monkeypatch, capsys, FakeClient(NODES, JOBS), "get", resource, "x9", "x8", "-o", fmt)
        assert (rc, out) == (1, "")
        assert err.splitlines() == [f"tessctl: error: NOT_FOUND: {resource[:-1]} {n} not found" for n in ("x9", "x8")]


@pytest.mark.parametrize("resource", ["nodes", "jobs"])
def test_all_found_is_still_a_success(resource: str, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    a, b = ("n1", "n2") if resource == "nodes" else ("j-1", "j-2")
    rc, out, err = _run(monkeypatch, capsys, FakeClient(NODES, JOBS), "get", resource, b, a, "-o", "json")
    assert (rc, err) == (0, "") and [i["id"] for i in json.loads(out)[resource]] == [b, a]


def test_an_error_that_is_not_about_one_name_ends_the_command(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    client = FakeClient(NODES, JOBS, errors={"j-2": RpcError("UNAVAILABLE", "controller going away")})
    rc, out, err = _run(monkeypatch, capsys, client, "get", "jobs", "j-1", "j-2", "j-3")
    assert (rc, out, err) == (1, "", "tessctl: error: UNAVAILABLE: controller going away\n")
    assert "GetJob j-3" not in client.calls


def test_watching_names_none_of_which_exists_ends_at_once(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    client = FakeClient(NODES, JOBS)
    rc, out, err = _run(monkeypatch, capsys, client, "get", "nodes", "x9", "--watch")
    assert (rc, out, err) == (1, "", "tessctl: error: NOT_FOUND: node x9 not found\n")
    assert client.calls == ["ListNodes"]


# -- describe node: busy GPUs that hold no job the caller may list ------------------------------------


def test_a_user_is_told_the_busy_gpus_hold_another_tenants_job(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Before: GPUs 2 and 3 busy, and only the user's job, on 0 and 1, listed."""
    node = _node("n1", busy=(0, 1, 2, 3), hidden=(2, 3))
    rc, out, _ = _run(monkeypatch, capsys, FakeClient([node], [_job("j-1", "n1", (0, 1))]), "describe", "node", "n1")
    assert rc == 0 and _job_rows(out) == [["ID", "NAME", "STATE", "GPUS"], ["j-1", "name-j-1", "RUNNING", "0,1"],
                                          ["(hidden: another tenant's job)", "-", "-", "2,3"]]
    node = _node("n1", busy=(0, 1, 2, 3), hidden=(0, 1, 2))
    rc, out, _ = _run(monkeypatch, capsys, FakeClient([node], []), "describe", "node", "n1")
    assert _job_rows(out)[1:] == [["(hidden: another tenant's job)", "-", "-", "0,1,2"], [nodejobs.NO_JOB, "-", "-", "3"]]


def test_busy_gpus_no_job_holds_say_so(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    node = _node("n1", busy=(0, 1, 2))
    rc, out, _ = _run(monkeypatch, capsys, FakeClient([node], [_job("j-1", "n1", (0, 1))]), "describe", "node", "n1")
    assert rc == 0 and _job_rows(out)[2] == [nodejobs.NO_JOB, "-", "-", "2"]


def test_nothing_unlisted_adds_no_row(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    client = FakeClient([_node("n1", busy=(0, 1))], [_job("j-1", "n1", (0, 1)), _job("j-2", "n2", (2,))])
    rc, out, _ = _run(monkeypatch, capsys, client, "describe", "node", "n1")
    assert rc == 0 and _job_rows(out)[1:] == [["j-1", "name-j-1", "RUNNING", "0,1"]]
    client = FakeClient([_node("n1")], [])
    assert "  <none>" in _run(monkeypatch, capsys, client, "describe", "node", "n1")[1]


def test_only_this_nodes_slices_account_for_its_gpus() -> None:
    node = _node("n1", busy=(0, 2))
    assert nodejobs.unlisted_rows(node, [_job("j-1", "n1", (0,)), _job("j-2", "n2", (2,))]) == [(nodejobs.NO_JOB, [2])]


def test_a_pending_jobs_last_placement_holds_nothing() -> None:
    """A review: a requeued job keeps its last attempt's placement; its GPUs, another tenant's by
    now, were shown as the pending job's instead of hidden."""
    node = _node("n1", busy=(0, 1, 2, 3), hidden=(0, 1, 2, 3))
    mine = _job("j-1", "n1", (0, 1))
    mine.state = P.JOB_STATE_PENDING
    assert nodejobs.unlisted_rows(node, [mine]) == [(nodejobs.HIDDEN, [0, 1, 2, 3])]
    assert "j-1" not in output.describe_node(node, time.time(), [mine]).split("Jobs:")[1]
