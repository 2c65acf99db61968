"""Workers that crash or hang are reported with their reason, retried a bounded number of times,
then failed with that reason."""

from __future__ import annotations

import pytest

from tessera.v1 import common_pb2 as P
from tests.e2e.cluster import Cluster

pytestmark = pytest.mark.slow


def spec(name: str, code: str, retries: int, progress_timeout: int = 0) -> P.JobSpec:
    return P.JobSpec(name=name, model=P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256,
                                                  seq_length=64),
                     global_batch_size=8, iterations=10, max_retries=retries,
                     entrypoint=["{python}", "-c", code], progress_timeout_seconds=progress_timeout)


def test_crash_is_retried_then_failed_with_the_programs_last_words(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([("node-a10", "a10-node.yaml")])
    code = "import sys; print('loading data', flush=True); sys.exit('config error: no such dataset tiny-shakespear')"
    with cl.client() as c:
        job = c.submit(spec("crasher", code, retries=1))
        done = c.wait(job.id, {"SUCCEEDED", "FAILED"}, timeout=120)
        assert done.state == P.JOB_STATE_FAILED
        assert done.reason.startswith("attempt 2 failed: rank 0: exit code 1")
        assert "last log line: config error: no such dataset tiny-shakespear" in done.reason
        assert "(after 1 retry)" in done.reason
        kinds = [e.kind for e in c.get(job.id, with_events=True).events]
        assert kinds.count("PLACED") == 2 and kinds.count("ATTEMPT_FAILED") == 1 and kinds[-1] == "FAILED"


def test_hung_worker_is_failed_after_its_progress_timeout(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([("node-a10", "a10-node.yaml")])
    with cl.client() as c:
        job = c.submit(spec("hanger", "import time; time.sleep(3600)", retries=0, progress_timeout=3))
        done = c.wait(job.id, {"SUCCEEDED", "FAILED"}, timeout=120)
        assert done.state == P.JOB_STATE_FAILED
        assert "no progress from rank 0 for 3s since launch (hung?)" in done.reason
    # The hung process was stopped (SIGTERM, then SIGKILL after the grace).
    cl.agents["node-a10"].wait_event("worker exited", 60, job_id=job.id)


def test_a_job_over_the_agents_disk_limit_fails_with_the_reason(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([])
    cl.add_agent("node-a10", "a10-node.yaml", "--job-disk-limit", "1M", "--disk-check-interval", "0.5")
    cl.wait_ready(1)
    code = "import os, time; open('data.bin', 'wb').write(os.urandom(4 << 20)); time.sleep(600)"
    with cl.client() as c:
        job = c.submit(spec("filler", code, retries=0))
        done = c.wait(job.id, {"SUCCEEDED", "FAILED"}, timeout=120)
        assert done.state == P.JOB_STATE_FAILED
        assert "rank 0: evicted by the agent: the job's files on this node hold 4." in done.reason
        assert "over the agent's --job-disk-limit of 976.6 KiB, killed by SIGKILL" in done.reason
