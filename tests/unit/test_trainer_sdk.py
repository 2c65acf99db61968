"""The trainer SDK: contract parsing, checkpoint discovery and writing, progress reports, signals."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tessera.clients.trainer import (
    DEFAULT_MODEL,
    ContractError,
    ModelDims,
    Plan,
    TrainerContext,
    checkpoint_writer,
    latest_checkpoint,
    list_checkpoints,
)
from tessera.v1 import agent_pb2, agent_pb2_grpc
from tests.fake_agent import serve

FULL_ENV = {
    "TESSERA_JOB_ID": "job-42",
    "TESSERA_ATTEMPT": "3",
    "RANK": "1",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.7",
    "MASTER_PORT": "29400",
    "TESSERA_RENDEZVOUS": "10.0.0.7:29400",
    "TESSERA_PLAN": json.dumps({"dp": 4, "tp": 1, "pp": 1, "micro_batch": 2, "grad_accum": 4,
                                "gpu_model": "A100-80GB", "memory_per_gpu_bytes": 12345678901,
                                "memory_source": "formula"}),
    "TESSERA_MODEL": json.dumps({"name": "gpt2-small", "hidden_size": 768, "num_layers": 12, "num_heads": 12,
                                 "vocab_size": 50257, "seq_length": 1024}),
    "TESSERA_ITERATIONS": "500",
    "TESSERA_GLOBAL_BATCH_SIZE": "32",
    "TESSERA_CHECKPOINT_DIR": "/shared/ckpt/job-42",
    "TESSERA_CHECKPOINT_EVERY": "25",
    "TESSERA_AGENT_ADDR": "127.0.0.1:7070",
    "CUDA_VISIBLE_DEVICES": "2",
    "TESSERA_INVENTORY_SOURCE": "nvml",
}


# ---------------------------------------------------------------------------------------------- env


def test_from_env_golden() -> None:
    ctx = TrainerContext.from_env(FULL_ENV)
    assert (ctx.job_id, ctx.attempt, ctx.rank, ctx.local_rank, ctx.world_size, ctx.local_world_size) == (
        "job-42", 3, 1, 0, 4, 2)
    assert (ctx.master_addr, ctx.master_port, ctx.rendezvous) == ("10.0.0.7", 29400, "10.0.0.7:29400")
    assert ctx.plan == Plan(dp=4, tp=1, pp=1, micro_batch=2, grad_accum=4, gpu_model="A100-80GB",
                            memory_per_gpu_bytes=12345678901, memory_source="formula")
    assert ctx.plan.world_size == 4 and ctx.plan.global_batch == 32 and dict(ctx.plan.extra) == {}
    assert ctx.model == ModelDims("gpt2-small", 768, 12, 12, 50257, 1024) and ctx.model.complete
    assert (ctx.iterations, ctx.global_batch_size) == (500, 32)
    assert ctx.checkpoint_dir == Path("/shared/ckpt/job-42")
    assert (ctx.checkpoint_every, ctx.checkpoint_interval()) == (25, 25)
    assert ctx.agent_addr == "127.0.0.1:7070"
    assert (ctx.cuda_visible_devices, ctx.inventory_source, ctx.gpu_allowed) == ("2", "nvml", True)
    assert ctx.in_tessera and not ctx.is_rank0
    assert not ctx.stop_requested and not ctx.checkpoint_requested


def test_from_env_defaults_outside_tessera() -> None:
    ctx = TrainerContext.from_env({})
    assert (ctx.job_id, ctx.attempt, ctx.rank, ctx.world_size, ctx.in_tessera) == ("local", 1, 0, 1, False)
    assert ctx.plan == Plan(dp=1, tp=1, pp=1, micro_batch=8, grad_accum=1)
    assert ctx.global_batch_size == 8
    assert ctx.model == DEFAULT_MODEL and ctx.model.complete
    assert ctx.iterations == 100
    assert ctx.checkpoint_dir == Path("checkpoints")
    assert (ctx.checkpoint_every, ctx.checkpoint_interval()) == (0, 10)
    assert ctx.agent_addr == "" and ctx.cuda_visible_devices is None and ctx.gpu_allowed
    assert ctx.report(1, 1.0, 1.0, 1.0) is False  # no agent: a no-op


def test_from_env_proto_json_forms_and_fallbacks() -> None:
    # protobuf's JSON mapping: camelCase, int64 as strings, zero fields omitted.
    env = {
        "WORLD_SIZE": "2", "RANK": "0",
        "TESSERA_RENDEZVOUS": "[fd00::1]:29501",
        "TESSERA_PLAN": json.dumps({"dp": 2, "microBatch": 4, "gpuModel": "V100-32GB",
                                    "memoryPerGpuBytes": "1000", "zeroStage": 2, "offload": "optimizer",
                                    "activationCheckpointing": True, "ppSchedule": "GPipe",
                                    "futureKnob": 1}),
        "TESSERA_MODEL": json.dumps({"name": "gpt2-medium"}),
        "TESSERA_INVENTORY_SOURCE": "DECLARED",
        "CUDA_VISIBLE_DEVICES": "",
    }
    ctx = TrainerContext.from_env(env)
    assert ctx.plan == Plan(dp=2, tp=1, pp=1, micro_batch=4, grad_accum=1, gpu_model="V100-32GB",
                            memory_per_gpu_bytes=1000, zero_stage=2, offload="optimizer", activation_checkpointing="full",
                            pp_schedule="gpipe")
    assert dict(ctx.plan.extra) == {"futureKnob": 1}
    assert ctx.global_batch_size == 8  # no TESSERA_GLOBAL_BATCH_SIZE: the plan's
    assert ctx.model == ModelDims(name="gpt2-medium") and not ctx.model.complete
    assert (ctx.master_addr, ctx.master_port) == ("fd00::1", 29501)
    assert ctx.inventory_source == "declared" and not ctx.gpu_allowed


def test_from_env_no_plan_uses_world_size_and_overrides_win() -> None:
    ctx = TrainerContext.from_env({"WORLD_SIZE": "3", "RANK": "2"}, iterations=7)
    assert ctx.plan.dp == 3 and ctx.global_batch_size == 24 and ctx.iterations == 7


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"TESSERA_PLAN": "{not json"}, "TESSERA_PLAN is not valid JSON"),
        ({"TESSERA_PLAN": "[1, 2]"}, "TESSERA_PLAN must be a JSON object"),
        ({"TESSERA_PLAN": '{"dp": "two"}'}, "plan.dp must be an integer"),
        ({"TESSERA_PLAN": '{"tp": -1}'}, "plan.tp must be >= 0"),
        ({"TESSERA_PLAN": '{"zero_stage": 4}'}, "plan.zero_stage must be 0, 1, 2 or 3"),
        ({"TESSERA_PLAN": '{"offload": "maybe"}'}, "plan.offload must be one of none, optimizer"),
        ({"TESSERA_PLAN": '{"sharding": "zero4"}'}, "plan.sharding must be one of none, zero1"),
        ({"TESSERA_PLAN": '{"pp_schedule": "zigzag"}'}, "plan.pp_schedule must be one of gpipe, 1f1b"),
        ({"TESSERA_MODEL": '{"hidden_size": 1.5}'}, "model.hidden_size must be an integer"),
        ({"TESSERA_ITERATIONS": "ten"}, "TESSERA_ITERATIONS must be an integer"),
        ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK=2 is outside WORLD_SIZE=2"),
        ({"TESSERA_RENDEZVOUS": "host:port"}, "TESSERA_RENDEZVOUS must be host:port"),
    ],
)
def test_from_env_malformed(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ContractError, match=fragment):
        TrainerContext.from_env(env)


def test_sdk_does_not_import_torch() -> None:
    code = ("import sys, tessera.clients, tessera.clients.trainer, tessera.clients.trainer.reference, "
            "tessera.clients.trainer.reference.cli, tessera.clients.trainer.reference.config, tessera.clients.trainer.reference.data; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ------------------------------------------------------------------------------------- checkpoints


def _complete(root: Path, n: int) -> Path:
    d = root / f"step-{n}"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"iteration": n}))
    return d


def test_latest_checkpoint_discovery(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "missing") is None
    assert latest_checkpoint(tmp_path) is None
    _complete(tmp_path, 5)
    _complete(tmp_path, 10)
    (tmp_path / "step-15.tmp").mkdir()  # being written (or crashed while written)
    _complete(tmp_path, 16).rename(tmp_path / "step-16.tmp")
    (tmp_path / "step-20").mkdir()  # no meta.json: not complete
    (tmp_path / "step-x").mkdir()
    (tmp_path / "latest").write_text("step-99\n")  # dangling pointer: ignored
    ref = latest_checkpoint(tmp_path)
    assert ref is not None and (ref.iteration, ref.path) == (10, tmp_path / "step-10")
    assert ref.meta() == {"iteration": 10}
    assert [c.iteration for c in list_checkpoints(tmp_path)] == [5, 10]
    ctx = TrainerContext.from_env({"TESSERA_CHECKPOINT_DIR": str(tmp_path)})
    assert ctx.latest_checkpoint() == ref


def test_checkpoint_writer_atomic_latest_and_keep(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    for n in (10, 20, 30):
        with checkpoint_writer(root, n, {"world_size": 2}) as d:
            assert d == root / "staging" / "attempt-1" / f"step-{n}" and d.is_dir()
            assert latest_checkpoint(root) is None or latest_checkpoint(root).iteration < n  # type: ignore[union-attr]
            (d / "state.bin").write_bytes(b"x" * n)
    assert sorted(p.name for p in root.iterdir()) == [".lock", "FENCE", "latest", "staging", "step-20", "step-30"]
    assert (root / "latest").read_text() == "step-30\n" and (root / "FENCE").read_text() == "1\n"
    assert not list((root / "staging" / "attempt-1").iterdir())
    ref = latest_checkpoint(root)
    assert ref is not None and ref.iteration == 30 and (ref.path / "state.bin").read_bytes() == b"x" * 30
    meta = ref.meta()
    assert meta["iteration"] == 30 and meta["world_size"] == 2 and meta["time"] > 0 and meta["attempt"] == 1

    with pytest.raises(RuntimeError), checkpoint_writer(root, 40) as d:
        (d / "state.bin").write_bytes(b"partial")
        raise RuntimeError("disk full")
    assert sorted(p.name for p in root.iterdir()) == [".lock", "FENCE", "latest", "staging", "step-20", "step-30"]
    assert latest_checkpoint(root).iteration == 30  # type: ignore[union-attr]
    assert not list((root / "staging" / "attempt-1").iterdir())


# ---------------------------------------------------------------------------------------- reports


class FakeAgent(agent_pb2_grpc.NodeAgentServicer):
    def __init__(self) -> None:
        self.requests: list[agent_pb2.ReportProgressRequest] = []
        self.stop = False
        self.checkpoint = False
        self.got_one = threading.Event()

    async def ReportProgress(self, request, context):
        self.requests.append(request)
        self.got_one.set()
        return agent_pb2.ReportProgressResponse(stop_requested=self.stop, checkpoint_requested=self.checkpoint)




class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_report_sends_progress_and_applies_answers() -> None:
    agent = FakeAgent()
    clock = Clock()
    with serve(agent) as addr:
        ctx = TrainerContext.from_env({**FULL_ENV, "TESSERA_AGENT_ADDR": addr}, clock=clock)
        with ctx:
            assert ctx.report(7, 2.5, 123.0, 0.25, peak_memory_bytes=4096, checkpoint_iteration=5) is True
            assert not ctx.stop_requested and not ctx.checkpoint_requested
            req = agent.requests[-1]
            assert (req.job_id, req.attempt, req.rank) == ("job-42", 3, 1)
            p = req.progress
            assert (p.iteration, p.loss, p.samples_per_second, p.step_time_seconds, p.peak_memory_bytes,
                    p.checkpoint_iteration) == (7, 2.5, 123.0, 0.25, 4096, 5)
            assert abs(p.time - time.time()) < 60

            # Throttled: a second report within 0.5 s is skipped unless forced.
            agent.checkpoint = True
            clock.now += 0.1
            assert ctx.report(8, 2.4, 1.0, 1.0) is False
            assert len(agent.requests) == 1 and not ctx.checkpoint_requested
            assert ctx.report(8, 2.4, 1.0, 1.0, force=True) is True
            assert ctx.checkpoint_requested and not ctx.stop_requested

            agent.checkpoint, agent.stop = False, True
            clock.now += 0.6
            assert ctx.report(9, 2.3, 1.0, 1.0) is True
            assert ctx.stop_requested and ctx.should_stop() and ctx.stop_reason == "agent"
            assert ctx.checkpoint_requested  # answers set flags, they never clear them
            assert [r.progress.iteration for r in agent.requests] == [7, 8, 9]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_report_survives_unreachable_agent(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    ctx = TrainerContext.from_env({"TESSERA_AGENT_ADDR": f"127.0.0.1:{_free_port()}"}, clock=clock)
    with ctx, caplog.at_level(logging.WARNING, logger="tessera.clients.trainer.context"):
        t0 = time.monotonic()
        assert ctx.report(1, 1.0, 1.0, 1.0) is False
        assert time.monotonic() - t0 < 5.0  # bounded by the report deadline (1 s) plus slack
        assert "progress report to agent" in caplog.text and "training goes on" in caplog.text
        # Backing off: an unforced report right after a failure does not even try.
        clock.now += 0.6
        t0 = time.monotonic()
        assert ctx.report(2, 1.0, 1.0, 1.0) is False
        assert time.monotonic() - t0 < 0.05
        assert ctx.report(3, 1.0, 1.0, 1.0, force=True) is False
        assert not ctx.stop_requested


def test_report_reaches_agent_that_starts_late() -> None:
    """An agent that was down comes back: the next report after the back-off gets through."""
    agent = FakeAgent()
    clock = Clock()
    ctx = TrainerContext.from_env({"TESSERA_AGENT_ADDR": "127.0.0.1:1"}, clock=clock)
    assert ctx.report(1, 1.0, 1.0, 1.0) is False
    with serve(agent) as addr:
        ctx.close()
        ctx.agent_addr = addr
        clock.now += 11.0
        assert ctx.report(2, 1.0, 1.0, 1.0) is True
    ctx.close()


# ---------------------------------------------------------------------------------------- signals


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_handlers_request_stop(signum: int) -> None:
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        ctx = TrainerContext.from_env({})
        ctx.install_signal_handlers()
        assert not ctx.should_stop()
        os.kill(os.getpid(), signum)
        deadline = time.monotonic() + 5
        while not ctx.should_stop() and time.monotonic() < deadline:
            time.sleep(0.001)  # the handler runs in the main thread at the next bytecode boundary
        assert ctx.should_stop() and ctx.stop_reason == signal.Signals(signum).name
        if signum == signal.SIGINT:
            with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C interrupts for real
                os.kill(os.getpid(), signum)
                time.sleep(1)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def test_worker_stops_itself_when_its_agent_stays_unreachable() -> None:
    from tessera.clients.trainer import TrainerContext

    now = [0.0]
    ctx = TrainerContext.from_env({"TESSERA_JOB_ID": "j-1", "TESSERA_AGENT_ADDR": "127.0.0.1:1",
                                   "TESSERA_AGENT_LOSS_TIMEOUT": "5"}, clock=lambda: now[0])
    stopped_at = None
    for i in range(40):
        now[0] = i * 0.5
        ctx.report(i, 1.0, 1.0, 0.1, force=True)
        if ctx.should_stop():
            stopped_at = now[0]
            break
    assert stopped_at == 5.0 and ctx.stop_reason == "agent unreachable"
    ctx.close()


def test_a_later_attempt_replaces_an_older_attempts_copy_of_a_step(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tessera.clients.trainer import checkpoint_writer, latest_checkpoint

    with checkpoint_writer(tmp_path, 10, attempt=1) as a:
        (a / "state").write_text("first")
    with checkpoint_writer(tmp_path, 10, attempt=2) as b:  # claims the fence at promotion
        (b / "state").write_text("second")
    got = latest_checkpoint(tmp_path)
    assert got is not None and got.iteration == 10 and got.meta()["attempt"] == 2
    assert (tmp_path / "step-10" / "state").read_text() == "second"
    assert not list((tmp_path / "staging" / "attempt-2").iterdir())  # the replaced copy is gone too
