"""Two controllers on one etcd (docs/ha.md): one leads; kill -9 of the leader while a job runs; the
standby leads within the bound with a higher epoch, the agent follows it, the job keeps running once,
and the state is all there."""

from __future__ import annotations

import collections
import contextlib
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tessera.clients.sdk import Client, RpcError
from tessera.v1 import common_pb2 as P
from tests.chaos.invariants import Checker
from tests.e2e.cluster import INVENTORIES
from tests.etcd_server import cluster_tokens, etcd_server
from tests.procs import Daemon, kill_strays, start_agent, start_controller, wait_for

pytestmark = pytest.mark.slow

TTL = 2
# docs/ha.md: a standby leads at most TTL + etcd's expiry sweep (0.5 s) + a watch notification and a
# campaign transaction (milliseconds) after the leader's last keep-alive; the rest is slack for this
# loaded 2-core machine (loading the state, the log line).
BOUND_S = TTL + 3.0
# A fence above the failover gap (docs/ha.md, "Failover and the agents' fence"; controller/ha.py
# failover_gap: heartbeat interval 0.5 s + max(the agent's 5 s call deadline, TTL + 0.5 s) + a 2 s
# backoff = 7.5 s), so that the agent never stops the job's workers during the failover: the job
# runs on under its first launch. The node lease is above the fence, as it must be.
NO_FENCE = ["--lease", "10", "--fence", "8"]


def sleeper(name: str) -> P.JobSpec:
    return P.JobSpec(name=name, model=P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256,
                                                  seq_length=64),
                     global_batch_size=8, iterations=10, progress_timeout_seconds=-1,
                     entrypoint=["{python}", "-c", "import time; time.sleep(3600)"])


def _leading(d: Daemon) -> dict:  # type: ignore[type-arg]
    return d.wait_event("controller_leading", 30)


@dataclass
class Pair:
    """Controller a leading (its controller_leading line: `first`), b its standby, one agent that
    knows both agent ports and is registered with a, and the admin's token."""

    a: Daemon
    b: Daemon
    agent: Daemon
    first: dict[str, Any]
    token: str


@contextlib.contextmanager
def leader_and_standby(tmp_path: Path, *extra: str, leader_env: dict[str, str] | None = None) -> Iterator[Pair]:
    """One etcd, two controllers sharing a tokens file (fenced above the failover gap: NO_FENCE),
    and an agent; everything stopped afterwards (resumed first if a test left it SIGSTOPped)."""
    daemons: list[Daemon] = []
    with etcd_server(tmp_path) as etcd:
        try:
            auth, token = cluster_tokens(tmp_path)
            ha = ["--checkpoint-root", str(tmp_path / "shared-ckpt"),
                  "--store", "etcd", "--etcd-endpoints", etcd.address, "--etcd-lease-ttl", str(TTL),
                  "--policy", "frenzy", *NO_FENCE, *auth, *extra]
            a = start_controller(tmp_path / "a", *ha, extra_env=leader_env)
            daemons.append(a)
            first = _leading(a)
            b = start_controller(tmp_path / "b", *ha)
            daemons.append(b)
            agent = start_agent(f"{a.agent_address},{b.agent_address}", "node-a10", INVENTORIES / "a10-node.yaml",
                                tmp_path / "node-a10")
            daemons.append(agent)
            a.wait_event("node_registered", 30, node_id="node-a10")
            yield Pair(a, b, agent, first, token)
        finally:
            for d in reversed(daemons):
                if d.proc.poll() is None:
                    d.proc.send_signal(signal.SIGCONT)
                d.stop()
            kill_strays(tmp_path)


def test_leader_killed_standby_leads_agent_follows_job_runs_once(tmp_path: Path) -> None:
    with leader_and_standby(tmp_path) as p:
        a, b, agent, first = p.a, p.b, p.agent, p.first
        # The client starts at the standby and is sent to the leader by its answer.
        with Client([b.address, a.address], token=p.token, timeout=5) as c:
            job = c.submit(sleeper("survivor"))
            assert c.target == a.address
            wait_for(lambda: c.get(job.id).state == P.JOB_STATE_RUNNING, 60, "the job RUNNING")
            assert not [e for e in b.events() if e.get("event") == "controller_leading"]

            t0 = time.monotonic()
            a.kill9()
            second = _leading(b)
            took = time.monotonic() - t0
            assert second["epoch"] > first["epoch"]
            assert took < BOUND_S, f"the standby led {took:.1f}s after the kill (bound {BOUND_S}s)"
            assert second["jobs"] == 1 and second["nodes"] == 1  # state reloaded from etcd

            b.wait_event("node_registered", 30, node_id="node-a10")
            agent.wait_event("registered", 30, controller_epoch=second["epoch"])
            got = c.get(job.id)  # the client follows: a is gone, b leads
            assert c.target == b.address
            assert got.state == P.JOB_STATE_RUNNING and got.attempt == 1, (got.state, got.reason)
            fresh = c.submit_ex(sleeper("after"))
            assert fresh.created
            assert {j.id for j in c.list()} == {job.id, fresh.job.id}
            wait_for(lambda: c.get(job.id).state == P.JOB_STATE_RUNNING
                     and c.get(fresh.job.id).state in (P.JOB_STATE_PENDING, P.JOB_STATE_RUNNING), 30,
                     "both jobs there")
        # The survivor was launched once, by the first leader, and never again.
        launches = collections.Counter((e["job_id"], e["attempt"]) for e in agent.events()
                                       if e.get("event") == "attempt launched")
        assert launches[(job.id, 1)] == 1 and not [k for k in launches if k[0] == job.id and k[1] != 1]
        assert not [e for e in b.events() if e.get("event") == "launch" and e.get("job_id") == job.id]


def test_a_clean_stop_hands_over_at_once(tmp_path: Path) -> None:
    """SIGTERM of the leader revokes its lease: the standby leads without waiting for the TTL."""
    with etcd_server(tmp_path) as etcd:
        ha = ["--checkpoint-root", str(tmp_path / "shared-ckpt"),
              "--store", "etcd", "--etcd-endpoints", etcd.address, "--etcd-lease-ttl", "10",
              *cluster_tokens(tmp_path)[0]]
        a = start_controller(tmp_path / "a", *ha)
        b = start_controller(tmp_path / "b", *ha)
        try:
            first = _leading(a)
            t0 = time.monotonic()
            a.stop()
            second = _leading(b)
            assert time.monotonic() - t0 < 10, "the standby waited for the lease to expire"
            assert second["epoch"] == first["epoch"] + 1
        finally:
            b.stop()
            a.stop()


def test_a_stalled_leader_is_deposed_and_acts_no_more(tmp_path: Path) -> None:
    """SIGSTOP of the leader past its lease: the standby leads; when the old one resumes it refuses
    everything and exits (systemd would restart it as a standby), having called no agent since."""
    # A node lease longer than the agent's call deadline (5 s): the agent's heartbeat to the stopped
    # leader hangs that long before it tries the other address (docs/ha.md); and a fence above the
    # failover gap (NO_FENCE).
    with leader_and_standby(tmp_path) as p:
        a, b, agent, first = p.a, p.b, p.agent, p.first
        with Client([a.address, b.address], token=p.token, timeout=5) as c:
            job = c.submit(sleeper("stalled"))
            wait_for(lambda: c.get(job.id).state == P.JOB_STATE_RUNNING, 60, "the job RUNNING")
            a.proc.send_signal(signal.SIGSTOP)
            second = _leading(b)
            assert second["epoch"] > first["epoch"]
            agent.wait_event("registered", 30, controller_epoch=second["epoch"])
            a.proc.send_signal(signal.SIGCONT)
            assert a.proc.wait(30) == 1
            deposed = [e for e in a.events() if e.get("event") == "controller_deposed"]
            assert deposed and deposed[0]["epoch"] == first["epoch"]
            lost_at = next(i for i, e in enumerate(a.events()) if e.get("event") == "leadership_lost")
            after = [e for e in a.events()[lost_at:] if e.get("event") in ("launch", "stop", "job_event")]
            assert not after, after
            got = c.get(job.id)
            assert got.state == P.JOB_STATE_RUNNING and got.attempt == 1


def test_three_controllers_one_leads_after_the_leader_dies(tmp_path: Path) -> None:
    """Of two standbys exactly one takes over; the other keeps waiting and names the new leader. A
    ListJobs page begun at the old leader goes on at the new one (the continue token's key is shared
    through etcd)."""
    with etcd_server(tmp_path) as etcd:
        auth, token = cluster_tokens(tmp_path)
        ha = ["--checkpoint-root", str(tmp_path / "shared-ckpt"),
              "--store", "etcd", "--etcd-endpoints", etcd.address, "--etcd-lease-ttl", str(TTL), *auth]
        ctl = {n: start_controller(tmp_path / n, *ha) for n in ("a", "b", "c")}
        try:
            def leading(names: list[str]) -> list[str]:
                return [n for n in names if any(e.get("event") == "controller_leading" for e in ctl[n].events())]

            leaders = wait_for(lambda: leading(list(ctl)), 30, "a leader")
            assert len(leaders) == 1
            old = leaders[0]
            first = _leading(ctl[old])
            pager = Client([ctl[n].address for n in ("a", "b", "c")], token=token, timeout=5)
            submitted = {pager.submit(sleeper(f"page-{i}")).id for i in range(2)}  # PENDING: no nodes
            pages = pager.iter_jobs(page_size=1)
            seen = [next(pages).id]  # the first page, and its continue token, from the old leader
            ctl[old].kill9()
            rest = [n for n in ctl if n != old]

            def new_leaders() -> list[str]:
                return leading(rest)

            new = wait_for(new_leaders, BOUND_S + 5, "a standby leading")[0]
            other = next(n for n in rest if n != new)
            assert _leading(ctl[new])["epoch"] > first["epoch"]

            def names_new_leader() -> bool:
                with Client(ctl[other].address, token=token, timeout=5) as c:
                    try:
                        c.nodes()
                    except RpcError as exc:
                        return exc.message == f"not the leader; leader at {ctl[new].address}"
                return False

            wait_for(names_new_leader, TTL + 5, "the other standby naming the new leader")
            assert new_leaders() == [new]  # still the only one
            seen += [j.id for j in pages]  # the next pages, from the new leader
            assert pager.target == ctl[new].address and len(seen) == 2 and set(seen) == submitted
            pager.close()
            with Client([ctl[n].address for n in ("a", "b", "c")], token=token, timeout=5) as c:
                assert c.submit_ex(sleeper("three")).created and c.target == ctl[new].address
        finally:
            for d in ctl.values():
                d.stop()


@pytest.mark.parametrize("point", ["round.placed", "launch.answered"])
def test_leader_killed_mid_round_the_standby_finishes_it(tmp_path: Path, point: str) -> None:
    """kill -9 of the leader at a named point of a round (common/crashpoints.py): the standby leads
    from etcd's state and the invariants of every chaos test hold (tests/chaos/invariants.py): the
    job exists once, one attempt runs, every worker is known, nothing pending is forgotten."""
    ckpt = tmp_path / "checkpoints"  # shared by the controllers, as docs/ha.md asks
    with leader_and_standby(tmp_path, "--checkpoint-root", str(ckpt), leader_env={"TESSERA_CRASH_AT": point}) as p:
        a, b, agent, first, token = p.a, p.b, p.agent, p.first, p.token
        with Client([a.address, b.address], token=token, timeout=5) as c:
            job = c.submit(sleeper("mid-round"))
        assert a.proc.wait(60) == -signal.SIGKILL
        assert [e for e in a.events() if e.get("event") == "crash_point" and e.get("point") == point]
        second = _leading(b)
        assert second["epoch"] > first["epoch"]

        def client() -> Client:
            return Client([b.address], token=token, timeout=5)

        with client() as c:
            wait_for(lambda: c.get(job.id).state == P.JOB_STATE_RUNNING, 60, "the job RUNNING under b")
        Checker(client, [job.id], checkpoint_root=ckpt, agents=[agent]).check(settle=10)
        launched = [e for e in agent.events() if e.get("event") == "attempt launched" and e.get("job_id") == job.id]
        assert len({e["attempt"] for e in launched}) == 1, launched  # one attempt, whichever leader sent it
