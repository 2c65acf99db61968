"""`tessctl describe node` as a user, on a real controller and agent (docs/cli.md, "describe node"):
the controller hides another tenant's job from a user (its id is NOT_FOUND, ListJobs leaves it out)
but counts its GPUs busy; describe says whose they are instead of showing them busy with no job.
Bob's job runs a script that waits for a file; every wait is on job states, never on sleeps."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tessera.nodeagent.main import isolation_available
from tessera.v1 import common_pb2 as P
from tests.e2e.cluster import Cluster
from tests.procs import tessctl

pytestmark = pytest.mark.slow

WAITER = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.05)\n"


def job_rows(text: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in text.split("Jobs:\n")[1].splitlines()]


def test_a_user_is_told_which_busy_gpus_hold_another_tenants_job(cluster_factory, worker_dir: Path) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([("node-a", "a40-node.yaml")])
    addr = cl.controller.address
    script, go = worker_dir / "waiter.py", worker_dir / "go"
    script.write_text(WAITER)
    with cl.client_as("bob") as bob:
        job = bob.submit(P.JobSpec(name="bobs", entrypoint=["{python}", str(script), str(go)],
                                   workdir=str(worker_dir)))
        try:
            running = bob.wait(job.id, {"RUNNING"}, timeout=60)
            gpus = ",".join(str(g) for s in running.placement.slices for g in s.gpu_indices)
            as_alice = tessctl(addr, "describe", "node", "node-a", token=cl.controller.tokens["alice"])
            as_admin = tessctl(addr, "describe", "node", "node-a")
        finally:
            go.write_text("")
        assert bob.wait(job.id, {"SUCCEEDED", "FAILED"}, timeout=60).state == P.JOB_STATE_SUCCEEDED
    assert job.id not in as_alice.stdout
    assert job_rows(as_alice.stdout) == [["ID", "NAME", "STATE", "GPUS"],
                                         ["(hidden: another tenant's job)", "-", "-", gpus]]
    assert job_rows(as_admin.stdout) == [["ID", "NAME", "STATE", "GPUS"], [job.id, "bobs", "RUNNING", gpus]]
    # The agent's isolation reaches describe node through the controller (docs/agent.md, "GPU isolation").
    expected = "device cgroups: " if isolation_available()[0] else "none: a declared inventory"
    assert re.search(rf"^GPU isolation:\s+{expected}", as_admin.stdout, re.MULTILINE), as_admin.stdout
