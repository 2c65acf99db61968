"""Workers on GPUs they were not given (nodeagent/gpuguard.py): literal statuses and NVML findings."""

from __future__ import annotations

from tessera.nodeagent.gpuguard import trespasses
from tessera.v1 import agent_pb2
from tessera.v1 import common_pb2 as P


def worker(job: str, attempt: int, rank: int, pid: int, gpus: list[int], exited: bool = False) -> agent_pb2.WorkerStatus:
    return agent_pb2.WorkerStatus(job_id=job, attempt=attempt, rank=rank, pid=pid, gpu_indices=gpus,
                                  state=P.WORKER_STATE_EXITED if exited else P.WORKER_STATE_RUNNING)


STATUSES = [worker("j-a", 1, 0, 100, [0]), worker("j-a", 1, 1, 101, [1]), worker("j-b", 3, 0, 200, [2, 3])]


def test_workers_on_their_attempts_gpus_are_left_alone() -> None:
    # Rank 0 of j-a on its sibling rank's GPU is within its attempt: no other job's GPU.
    assert trespasses(STATUSES, {0: {100}, 1: {101, 100}, 2: {200}, 3: {200}}) == {}
    assert trespasses(STATUSES, {}) == {}


def test_a_worker_on_another_jobs_gpu_evicts_its_job() -> None:
    out = trespasses(STATUSES, {2: {200, 101}, 3: {200}})
    assert list(out) == ["j-a"]
    assert out["j-a"] == ("evicted by the agent: attempt 1 ran on GPU 2 of this node, which was not given to it "
                          "(its GPUs here: 0,1); GPUs are given by CUDA_VISIBLE_DEVICES, which the job must not change")


def test_unknown_and_exited_sessions_are_not_judged() -> None:
    statuses = [*STATUSES, worker("j-c", 1, 0, 300, [3], exited=True)]
    assert trespasses(statuses, {0: {300, 999}}) == {}
