"""A network partition of one node: its agent runs in a network namespace joined to the host by a
veth pair; iptables DROP rules inside the namespace cut the veth both ways while the agent and its
workers keep running. The controller must requeue the node's job only after the fencing bound, the
stale copy must not train alongside the new attempt, and once healed the node comes back and nothing
runs twice.

Needs root, ip (iproute2) and iptables: skipped without them, failed under CI=true. The invariant
that the stale copy never trains alongside the new one FAILS until the workers and fencing parts
merge (as test_stalls.test_agent_stalled_past_lease_never_trains_twice).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tessera.v1 import common_pb2 as P
from tests.chaos.conftest import Factory
from tests.chaos.helpers import chaos_job, checker, require_root_and
from tests.chaos.invariants import step_lines, step_log_dir
from tests.e2e.cluster import INVENTORIES
from tests.procs import start_agent, wait_for

pytestmark = pytest.mark.slow

LEASE_S = 3.0  # FAST_CONTROLLER's --lease
HEARTBEAT_S = 0.5  # and --heartbeat-interval


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=30)


@dataclass(frozen=True)
class Netns:
    name: str
    host_if: str
    ns_if: str
    host_ip: str
    ns_ip: str

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def _rules(self, op: str) -> None:
        for chain, flag in (("INPUT", "-i"), ("OUTPUT", "-o")):
            sh(*self.exec_prefix(), "iptables", op, chain, flag, self.ns_if, "-j", "DROP")

    def cut(self) -> None:
        self._rules("-I")

    def heal(self) -> None:
        self._rules("-D")


@contextlib.contextmanager
def netns() -> Iterator[Netns]:
    pid = os.getpid()
    n = Netns(f"tchaos-{pid}", f"tcH{pid % 100000}", f"tcN{pid % 100000}",
              f"10.213.{pid % 250}.1", f"10.213.{pid % 250}.2")
    sh("ip", "netns", "add", n.name)
    try:
        sh("ip", "link", "add", n.host_if, "type", "veth", "peer", "name", n.ns_if)
        sh("ip", "link", "set", n.ns_if, "netns", n.name)
        sh("ip", "addr", "add", f"{n.host_ip}/30", "dev", n.host_if)
        sh("ip", "link", "set", n.host_if, "up")
        sh(*n.exec_prefix(), "ip", "addr", "add", f"{n.ns_ip}/30", "dev", n.ns_if)
        sh(*n.exec_prefix(), "ip", "link", "set", n.ns_if, "up")
        sh(*n.exec_prefix(), "ip", "link", "set", "lo", "up")
        yield n
    finally:
        for p in sh("ip", "netns", "pids", n.name, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(p), 9)
        sh("ip", "netns", "del", n.name, check=False)
        sh("ip", "link", "del", n.host_if, check=False)


def event_time(e: dict[str, object]) -> float:
    return datetime.datetime.fromisoformat(str(e["timestamp"])).timestamp()


def test_partitioned_node_requeued_after_the_fencing_bound_and_heals(chaos_cluster: Factory) -> None:
    require_root_and("ip", "iptables")
    with netns() as ns:
        cl = chaos_cluster([], listen=f"{ns.host_ip}:0")
        steps = step_log_dir(cl.root)
        cl.agents["node-ns"] = start_agent(cl.controller, "node-ns", INVENTORIES / "a10-node.yaml", cl.root / "node-ns",
                                           listen=f"{ns.ns_ip}:0", wrap=ns.exec_prefix())
        cl.wait_ready(1)
        with cl.client() as c:
            jid = c.submit(chaos_job("partitioned", steps, iterations=100)).id
            c.wait(jid, {"RUNNING"}, timeout=60)
            assert c.get(jid).placement.slices[0].node_id == "node-ns"
            wait_for(lambda: c.get(jid).progress.checkpoint_iteration >= 5, 60, "a first checkpoint")
            cl.add_agent("node-host", "a40-node.yaml")
            cl.wait_ready(2)

            cut_at = time.time()
            ns.cut()
            try:
                lost = cl.controller.wait_event("job_event", 30, job_id=jid, kind="NODE_LOST")
                delay = event_time(lost) - cut_at
                # The lease runs from the last heartbeat, at most one interval before the cut.
                assert delay >= LEASE_S - HEARTBEAT_S, f"requeued {delay:.2f}s after the cut"
                wait_for(lambda: c.get(jid).attempt >= 2 and c.get(jid).state == P.JOB_STATE_RUNNING, 60,
                         "the job running again elsewhere")
                assert c.get(jid).placement.slices[0].node_id == "node-host"
                wait_for(lambda: sum(s.attempt >= 2 and s.kind == "step" for s in step_lines(steps, jid)) >= 15, 60,
                         "fifteen steps of the new attempt")
            finally:
                ns.heal()
            wait_for(lambda: c.node("node-ns").state == P.NODE_STATE_READY, 30, "the partitioned node READY again")
            done = c.wait(jid, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=120)
            assert done.state == P.JOB_STATE_SUCCEEDED, done.reason
            assert done.attempt == 2
        checker(cl, [jid]).check(settle=15)
