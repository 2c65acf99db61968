"""What real agents and an unchanged torchrun script make a job's reasons say (docs/opaque-jobs.md,
"What a job's reasons say of its processes"): the failing global rank's error, not torchrun's summary
border, under the node rank of its launcher; a program that ignores SIGTERM is said to have been
SIGKILLed after the grace. Synchronised on job states, log lines and a file the test writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.v1 import common_pb2 as P
from tests.e2e.cluster import Cluster
from tests.procs import tessctl, wait_for

pytestmark = pytest.mark.slow

# Rank 1 raises once the test writes the file named in argv[1]; rank 0 waits in a barrier meanwhile.
CRASH = """\
import os, sys, time
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
print(f"rank {rank} up", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
if rank == 1:
    raise ValueError("bad batch shape in rank 1 (simulated)")
dist.barrier()
"""

DEAF = """\
import signal, time
signal.signal(signal.SIGTERM, lambda *a: print("got SIGTERM, ignoring", flush=True))
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def test_a_torchrun_failure_and_a_kill_after_the_grace(cluster_factory, worker_dir: Path) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([("node-a", "a40-node.yaml")], controller_args=("--stop-grace", "1"))
    crash, deaf, go = worker_dir / "crash.py", worker_dir / "deaf.py", worker_dir / "go"
    crash.write_text(CRASH)
    deaf.write_text(DEAF)
    with cl.client() as c:
        job = c.submit(P.JobSpec(name="crash-ddp", entrypoint=[str(crash), str(go)], launcher=P.Launcher(name="torchrun"),
                                 hint=P.ResourceHint(gpus=2), workdir=str(worker_dir)))
        running = c.wait(job.id, {"RUNNING"}, timeout=120)
        assert running.reason == "running (the program reports no progress)"
        events = [e.message for e in c.get(job.id, with_events=True).events if e.kind == "RUNNING"]
        assert events == ["its 1 torchrun launcher (2 ranks) running (attempt 1)"]
        go.write_text("")
        done = c.wait(job.id, {"SUCCEEDED", "FAILED"}, timeout=120)
        assert done.reason == ("attempt 1 failed: node rank 0 (torchrun on node-a): exit code 1; last log line: "
                               "global rank 1: ValueError: bad batch shape in rank 1 (simulated)"), done.reason

        job = c.submit(P.JobSpec(name="deaf", entrypoint=["{python}", str(deaf)], hint=P.ResourceHint(gpus=1)))
        c.wait(job.id, {"RUNNING"}, timeout=120)
        wait_for(lambda: "ready" in tessctl(cl.controller.address, "logs", job.id, check=False).stdout, 60,
                 "its SIGTERM handler set")
        c.drain("node-a", "maintenance")
        wait_for(lambda: c.get(job.id).state == P.JOB_STATE_PENDING, 60, "the job requeued")
        (stopped,) = [e.message for e in c.get(job.id, with_events=True).events if e.kind == "STOPPED"]
        assert stopped == ("node node-a is draining: maintenance; rank 0 did not exit within the 1 s grace after "
                           "SIGTERM, killed by SIGKILL"), stopped
        c.cancel(job.id)
