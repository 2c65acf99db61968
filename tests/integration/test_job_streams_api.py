"""The streaming RPCs (WatchJob, WatchJobs, StreamJobLogs) of a real controller over gRPC: who may read
what, and the updates they push. No agents: jobs stay PENDING until cancelled, which is all a watch
needs; reading placed workers' logs is the e2e test's (tests/e2e/test_opaque_jobs_e2e.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tessera.clients.sdk import Client, RpcError
from tessera.common.localcluster import env as cluster_env
from tessera.v1 import common_pb2 as P
from tests.procs import REPO, Daemon, start_controller


@pytest.fixture(scope="module")
def ctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_controller(tmp_path_factory.mktemp("streams") / "state")
    yield d
    d.stop()


def as_(ctl: Daemon, name: str | None) -> Client:
    return Client(ctl.address, token=ctl.tokens[name] if name else None)


def opaque(name: str) -> P.JobSpec:
    return P.JobSpec(name=name, entrypoint=["/bin/true"], hint=P.ResourceHint(gpus=1))


def test_another_tenant_can_neither_watch_nor_read_logs(ctl: Daemon) -> None:
    with as_(ctl, "alice") as alice, as_(ctl, "bob") as bob:
        job = alice.submit(opaque("alices"))
        calls = (lambda c: list(c.watch_job(job.id, timeout=10)),
                 lambda c: list(c.stream_logs(job.id, timeout=10)),
                 lambda c: list(c.stream_logs(job.id, all_ranks=True, follow=True, timeout=10)))
        for call in calls:
            with pytest.raises(RpcError) as e:
                call(bob)
            assert (e.value.code, e.value.message) == ("NOT_FOUND", f"job {job.id} not found")
        # The owner reads it: not placed yet, so there is no log to read (a follow would wait).
        with pytest.raises(RpcError) as e:
            list(alice.stream_logs(job.id, timeout=10))
        assert e.value.code == "FAILED_PRECONDITION" and "has not been placed yet" in e.value.message
        with pytest.raises(RpcError) as e:
            list(alice.stream_logs(job.id, tail_lines=-1, timeout=10))
        assert e.value.code == "INVALID_ARGUMENT" and e.value.message.startswith("tail_lines:")
        bobs = bob.watch_jobs(timeout=10)
        first = next(bobs)
        assert first.batch_end and not first.HasField("job")  # bob's list holds none of alice's jobs
        bobs.close()
        # Who ended it is in its record, the audit trail (an admin's cancel read as its owner's).
        assert alice.cancel(job.id).reason == "cancelled by alice (user)"


def test_streams_refuse_an_unauthenticated_caller(ctl: Daemon) -> None:
    with as_(ctl, None) as anon:
        for call in (lambda: list(anon.watch_job("j-x", timeout=10)), lambda: next(anon.watch_jobs(timeout=10)),
                     lambda: list(anon.stream_logs("j-x", timeout=10))):
            with pytest.raises(RpcError) as e:
                call()
            assert e.value.code == "UNAUTHENTICATED"


def test_watches_push_changes_and_end_with_the_job(ctl: Daemon) -> None:
    with as_(ctl, "alice") as alice:
        job = alice.submit(opaque("watched"))
        updates = alice.watch_job(job.id, timeout=30)
        first = next(updates)
        assert first.job.state == P.JOB_STATE_PENDING and [e.kind for e in first.events] == ["SUBMITTED"]
        listed = alice.watch_jobs(states=["pending", "cancelled"], timeout=30)
        initial = []
        while not (u := next(listed)).batch_end:
            initial.append(u.job.id)
        assert job.id in initial
        alice.cancel(job.id)
        rest = list(updates)  # the stream ends once the job has ended
        assert rest[-1].job.state == P.JOB_STATE_CANCELLED and "CANCELLED" in [e.kind for r in rest for e in r.events]
        changed = next(u for u in listed if u.HasField("job") and u.job.id == job.id)
        assert changed.job.state == P.JOB_STATE_CANCELLED
        listed.close()


def test_tessctl_list_watch_and_wait_exit_status(ctl: Daemon) -> None:
    """`get jobs --watch` reads the list stream; `wait` on a job that gets cancelled exits 4."""
    with as_(ctl, "admin") as admin:
        job = admin.submit(opaque("waited"))
        env = cluster_env({"TESSERA_TOKEN": ctl.token})
        base = [sys.executable, "-m", "tessera.clients.tessctl", "--controller", ctl.address]
        watch = subprocess.Popen([*base, "get", "jobs", "--watch", "-o", "json"], cwd=REPO, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait = subprocess.Popen([*base, "wait", job.id, "--timeout", "2m"], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert watch.stdout is not None and wait.stdout is not None
            first = json.loads(watch.stdout.readline())
            assert job.id in [j["id"] for j in first["jobs"]]
            assert job.id in wait.stdout.readline()  # its first update came: the stream is open
            admin.cancel(job.id)
            out, err = wait.communicate(timeout=60)
            assert wait.returncode == 4, out + err
            assert f"{job.id} CANCELLED" in out
            while True:  # the list watch prints the list again with the job cancelled
                jobs = {j["id"]: j for j in json.loads(watch.stdout.readline())["jobs"]}
                if jobs[job.id]["state"] == "JOB_STATE_CANCELLED":
                    break
        finally:
            watch.kill()
            watch.communicate(timeout=30)


def test_one_caller_holds_at_most_so_many_streams(ctl: Daemon) -> None:
    """Each open watch wakes at every change and rescans its tenant's jobs: 60 idle ones of one
    user over 3,000 jobs held the controller's loop at 98%. The caller past the bound is told so;
    another caller is not affected, and a closed stream frees its slot."""
    from tessera.controller.streams import LIST_STREAMS

    def opened(stream: Any) -> Any:  # the SDK's stream of JobUpdate: a generator
        while not next(stream).batch_end:  # the first batch: the caller's jobs, then its end
            pass
        return stream

    with as_(ctl, "alice") as alice, as_(ctl, "bob") as bob:
        held = [opened(alice.watch_jobs(timeout=60)) for _ in range(LIST_STREAMS)]
        with pytest.raises(RpcError) as e:
            opened(alice.watch_jobs(timeout=10))
        assert e.value.code == "RESOURCE_EXHAUSTED" and "holds 16 open list watches and log streams" in e.value.message
        job = alice.submit(opaque("still-watched"))
        one = alice.watch_job(job.id, timeout=60)  # a job's watch is counted apart: scripts wait on many
        assert next(one).job.id == job.id
        one.close()
        alice.cancel(job.id)
        opened(bob.watch_jobs(timeout=10)).close()
        held.pop().close()
        for _ in range(100):  # the server frees the slot when it sees the cancel
            try:
                opened(alice.watch_jobs(timeout=10)).close()
                break
            except RpcError as exc:
                assert exc.code == "RESOURCE_EXHAUSTED"
                time.sleep(0.05)
        else:
            pytest.fail("a closed stream did not free its slot")
        for w in held:
            w.close()
