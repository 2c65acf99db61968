"""Issue 13 on a real cluster: nobody runs what they may not (findings 1 and the env hooks), no job
runs twice (finding 7: an agent restarted while its worker finishes; finding 4: a stalled agent's
workers fence themselves)."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from tessera.clients.sdk import RpcError
from tessera.v1 import common_pb2 as P
from tests.e2e.cluster import Cluster
from tests.procs import tessctl, wait_for

pytestmark = pytest.mark.slow
ROOT = os.geteuid() == 0
MODEL = P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256, seq_length=64)


def spec(name: str, iterations: int = 10, entrypoint: tuple[str, ...] = (), **env: str) -> P.JobSpec:
    s = P.JobSpec(name=name, model=MODEL, global_batch_size=8, iterations=iterations, max_retries=0,
                  entrypoint=list(entrypoint))
    s.env.update(env)
    return s


def test_finding_1_the_shell_job_runs_unprivileged(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([("node-a10", "a10-node.yaml")])
    with cl.client() as c:
        script = 'id; id -u; ls "${TESSERA_CHECKPOINT_DIR%/*}"; head -1 /etc/shadow'
        job = c.submit(spec("whoami", entrypoint=("/bin/sh", "-c", script)))
        done = c.wait(job.id, {"SUCCEEDED", "FAILED"}, timeout=120)
    log = tessctl(cl.controller.address, "logs", job.id).stdout
    print(log)
    uid = int(next(m for m in re.findall(r"^(?:\[rank \d+\] )?(\d+)$", log, re.MULTILINE)))
    assert uid != 0, log
    assert done.state == P.JOB_STATE_FAILED and "exit code 1" in done.reason  # head could not read it
    if ROOT:
        assert uid == 65534 and "uid=65534(nobody)" in log
        assert "cannot open '/etc/shadow' for reading: Permission denied" in log
        # The checkpoint root lists every job's id: the workers may pass through it, not read it.
        assert re.search(r"ls: cannot open directory '.*/checkpoints': Permission denied", log), log


def test_loader_hooks_are_refused_at_submit(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([("node-a10", "a10-node.yaml")])
    with cl.client() as c, pytest.raises(RpcError) as err:
        c.submit(spec("preload", LD_PRELOAD="/tmp/evil.so"))
    assert err.value.code == "INVALID_ARGUMENT"
    assert err.value.message.startswith("env.LD_PRELOAD: refused: a dynamic-loader hook")


def test_finding_7_a_job_finishing_while_its_agent_restarts_is_not_run_again(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    # A lease (and so a fence) long enough for an agent restart on a loaded machine.
    cl: Cluster = cluster_factory([("node-a10", "a10-node.yaml")], controller_args=("--lease", "30", "--down-after", "60"))
    agent = cl.agents["node-a10"]
    with cl.client() as c:
        job = c.submit(spec("short", iterations=60, TESSERA_TRAINER_MIN_STEP_SECONDS="0.1"))
        wait_for(lambda: c.get(job.id).progress.iteration >= 5, 180, "the worker training")
        agent.kill9()
        agent = cl.add_agent("node-a10", "a10-node.yaml")  # the same work dir: re-adopts the worker
        agent.wait_event("re-adopted worker", 5, job_id=job.id)
        done = c.wait(job.id, {"SUCCEEDED", "FAILED"}, timeout=180)
        assert done.state == P.JOB_STATE_SUCCEEDED, done.reason
        assert done.attempt == 1
        kinds = [e.kind for e in c.get(job.id, with_events=True).events]
        assert kinds.count("PLACED") == 1, kinds
    exited = agent.wait_event("worker exited", 10, job_id=job.id)
    assert (exited["exit_code"], exited["reason"]) == (0, "exit code 0")


def test_finding_4_a_stopped_agent_s_workers_fence_themselves(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([("node-a10", "a10-node.yaml")])
    agent = cl.agents["node-a10"]
    fence = agent.wait_event("registered", 10)["fence_seconds"]
    grace = 10.0  # the agent's default --fence-grace
    with cl.client() as c:
        job = c.submit(spec("stalled", iterations=100_000, TESSERA_TRAINER_MIN_STEP_SECONDS="0.05"))
        wait_for(lambda: c.get(job.id).progress.iteration >= 3, 180, "the worker training")
        exit_file = cl.root / "node-a10" / "jobs" / job.id / "attempt-1" / "rank-0.exit"
        agent.proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            wait_for(exit_file.exists, fence + grace + 10, "the fenced worker's exit")
            took = time.monotonic() - stopped
        finally:
            agent.proc.send_signal(signal.SIGCONT)
    print(f"agent stopped: its worker was dead {took:.2f} s later (fence {fence:g} s, grace {grace:g} s)")
    # The deadline counts from the last acknowledged heartbeat, sent before the stop.
    assert took <= fence + grace + 1.0
    exited = agent.wait_event("worker exited", 30, job_id=job.id)
    assert exited["reason"].startswith("fenced: no lease renewal for "), exited
