"""Live step times flow from a running job to the estimates: real controller and estimator processes
on loopback, one simulated node (a fake NodeAgent servicer plus Register/Heartbeat calls made here).

The node says its inventory came from NVML: this test stands in for an agent on a GPU machine, the
only case in which the controller learns from step times by default.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.clients.sdk import Client
from tessera.common import identity
from tessera.common.localcluster import Daemon, start_controller, start_estimator, tls_config, wait_for
from tessera.common.rpc import sync_channel
from tessera.v1 import agent_pb2, agent_pb2_grpc, estimator_pb2, estimator_pb2_grpc
from tessera.v1 import common_pb2 as P
from tests.fake_agent import serve

STEP_S = 0.5


class Agent(agent_pb2_grpc.NodeAgentServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self.launches: queue.Queue[agent_pb2.LaunchRequest] = queue.Queue()

    async def Launch(self, req: agent_pb2.LaunchRequest, ctx: object) -> agent_pb2.LaunchResponse:
        self.launches.put(req)
        return agent_pb2.LaunchResponse(started=True)

    async def Stop(self, req: agent_pb2.StopRequest, ctx: object) -> agent_pb2.StopResponse:
        return agent_pb2.StopResponse()

    async def Drain(self, req: agent_pb2.DrainRequest, ctx: object) -> agent_pb2.DrainResponse:
        return agent_pb2.DrainResponse()


def inventory(source: int) -> P.NodeInventory:
    return P.NodeInventory(source=source, hostname="sim", gpus=[
        P.Gpu(index=i, uuid=f"GPU-{i}", model="A100-80GB", memory_bytes=80 * 2**30, nvlink_peers=[1 - i])
        for i in range(2)])


@pytest.fixture(scope="module")
def estimator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_estimator(tmp_path_factory.mktemp("est") / "estimator.log")
    yield d
    d.stop()


def run_job(tmp: Path, estimator: str, source: int, *extra: str) -> tuple[P.Job, agent_pb2.LaunchRequest]:
    """Submit a job to a fresh controller, let the simulated node run it and report 16 steps of
    STEP_S seconds (after the warm-up) with one slow outlier; the job as the controller then has it."""
    agent = Agent()
    ctl = start_controller(tmp / "state", "--estimator", estimator, *extra)
    try:
        node_tls = tls_config(identity.node("gpu-node"))
        with serve(agent, node="gpu-node") as address, \
                sync_channel(ctl.agent_address, tls=node_tls, peer=identity.CONTROLLER) as ch, \
                Client(ctl.address, token=ctl.token) as client:
            registry = agent_pb2_grpc.AgentRegistryStub(ch)
            status = agent_pb2.NodeStatus(node_id="gpu-node", address=address, inventory=inventory(source))
            epoch = registry.Register(agent_pb2.RegisterRequest(request_id="r1", status=status)).controller_epoch
            job = client.submit(P.JobSpec(name="learn", model=P.ModelSpec(name="gpt2-small"), global_batch_size=8,
                                          iterations=10_000))
            launch = agent.launches.get(timeout=30)
            assert launch.job_id == job.id
            for it in range(1, 21):
                seconds = 3.0 if it in (1, 2) else (9.0 if it == 10 else STEP_S)  # warm-up, one straggler
                workers = [agent_pb2.WorkerStatus(job_id=job.id, attempt=launch.attempt, rank=r.rank,
                                                  state=P.WORKER_STATE_RUNNING, pid=1000 + r.rank,
                                                  gpu_indices=r.gpu_indices)
                           for r in launch.ranks]
                workers[0].progress.CopyFrom(P.Progress(iteration=it, step_time_seconds=seconds, loss=1.0,
                                                        time=float(it), checkpoint_iteration=-1))
                status.ClearField("workers")
                status.workers.extend(workers)
                # The controller folds a heartbeat in before answering it: no wait needed after.
                assert not registry.Heartbeat(agent_pb2.HeartbeatRequest(status=status,
                                                                         controller_epoch=epoch)).reregister
            return client.get(job.id, with_events=True), launch
    finally:
        ctl.stop()


def cell_of(estimator: str, job: P.Job) -> estimator_pb2.Cell:
    with sync_channel(estimator, tls=tls_config(identity.CONTROLLER), peer=identity.ESTIMATOR) as ch:
        stub = estimator_pb2_grpc.EstimatorStub(ch)
        resp = stub.GetCells(estimator_pb2.GetCellsRequest(
            model=job.spec.model, global_batch_size=job.spec.global_batch_size,
            cluster=estimator_pb2.ClusterSpec(pools=[estimator_pb2.GpuPool(
                gpu="A100-80GB", num_gpus=2, gpus_per_node=2, intra_link=estimator_pb2.INTRA_LINK_NVLINK)])))
    p = job.plan
    (cell,) = [c for c in resp.cells if c.num_gpus == p.dp * p.tp * p.pp and c.num_stages == p.pp]
    return cell


def test_nvml_node_step_times_reach_controller_and_estimator(tmp_path: Path, estimator: Daemon) -> None:
    job, _ = run_job(tmp_path, estimator.address, P.INVENTORY_SOURCE_NVML)
    (measured,) = [e.message for e in job.events if e.kind == "MEASURED"]
    # Median of the distinct post-warm-up steps: the straggler (9 s) does not move it.
    assert f"measured {STEP_S:.4g} s/iteration" in measured and "estimated" in measured, measured

    # The estimator refits its model of the job's model key (which carries the tenant) ...
    def refitted() -> int | None:
        with sync_channel(estimator.address, tls=tls_config(identity.CONTROLLER), peer=identity.ESTIMATOR) as ch:
            n = estimator_pb2_grpc.EstimatorStub(ch).Health(estimator_pb2.HealthRequest()).fitted_models
        return n or None

    wait_for(refitted, 30, "the estimator to refit the job's model from its step times")
    # ... but its shared Cells stay estimates: another tenant asking about the model must not get
    # this tenant's measured time (the controller keeps that per tenant).
    cell = cell_of(estimator.address, job)
    assert cell.iter_time_seconds.source != "measured" and cell.iter_time_seconds.value != pytest.approx(STEP_S)


def test_declared_node_step_times_are_not_learned(tmp_path: Path, estimator: Daemon) -> None:
    job, _ = run_job(tmp_path, estimator.address, P.INVENTORY_SOURCE_DECLARED)
    assert not [e for e in job.events if e.kind == "MEASURED"]


def test_learning_from_declared_nodes_when_asked(tmp_path: Path, estimator: Daemon) -> None:
    job, _ = run_job(tmp_path, estimator.address, P.INVENTORY_SOURCE_DECLARED, "--learn-step-times", "all")
    assert [e for e in job.events if e.kind == "MEASURED"]


def test_unreachable_estimator_does_not_stop_the_job(tmp_path: Path) -> None:
    job, _ = run_job(tmp_path, "127.0.0.1:1", P.INVENTORY_SOURCE_NVML)
    assert [e for e in job.events if e.kind == "MEASURED"]
    assert job.state in (P.JOB_STATE_STARTING, P.JOB_STATE_RUNNING)
