"""The reference trainer as real processes: learning, DP=2 on gloo, SIGTERM + resume, agent stop, exit 3.

Every run uses the same tiny model (hidden 32, 2 layers, 2 heads, vocab 64, seq 32), global batch 8 and
30 iterations, on CPU. A single-process run is the reference the other runs are compared with.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tessera.clients.trainer import latest_checkpoint
from tessera.v1 import agent_pb2, agent_pb2_grpc
from tests.fake_agent import serve

pytestmark = pytest.mark.slow

ITERATIONS = 30
GLOBAL_BATCH = 8
MODEL = {"name": "tiny", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "vocab_size": 64, "seq_length": 32}
# (a) the loss after 30 steps must be below this fraction of the first step's loss (ln 64 = 4.16 at
# start; the run ends near 1.8).
LEARNED_FRACTION = 0.6
# (b) DP=2 vs one process, same global batch: every step's loss within this relative tolerance
# (only the order of floating-point sums differs).
DP_RTOL = 1e-4
# (c) stop + resume vs an uninterrupted run: the same computation, so the losses match to the
# printed precision (7 significant digits).
RESUME_RTOL = 1e-6
PROC_TIMEOUT = 120

STEP = re.compile(r"step iteration=(\d+)/\d+ loss=(\S+)")


def _contract_env(ckpt: Path, plan: dict[str, int], world_size: int = 1, rank: int = 0, port: int = 0,
                  **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TESSERA_") and k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                         "MASTER_ADDR", "MASTER_PORT"}}
    env.update({
        "TESSERA_JOB_ID": "job-test",
        "TESSERA_ATTEMPT": "1",
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port or 29500),
        "TESSERA_RENDEZVOUS": f"127.0.0.1:{port or 29500}",
        "TESSERA_PLAN": json.dumps({"dp": world_size, "tp": 1, "pp": 1, **plan}),
        "TESSERA_MODEL": json.dumps(MODEL),
        "TESSERA_ITERATIONS": str(ITERATIONS),
        "TESSERA_GLOBAL_BATCH_SIZE": str(GLOBAL_BATCH),
        "TESSERA_CHECKPOINT_DIR": str(ckpt),
        "TESSERA_CHECKPOINT_EVERY": "10",
        "TESSERA_INVENTORY_SOURCE": "declared",
        "CUDA_VISIBLE_DEVICES": "",
        "TESSERA_DIST_TIMEOUT_SECONDS": "60",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra)
    return env


ARGV = [sys.executable, "-m", "tessera.clients.trainer.reference"]


@dataclass
class Run:
    rc: int
    out: str
    err: str

    @property
    def losses(self) -> dict[int, float]:
        return {int(m.group(1)): float(m.group(2)) for m in STEP.finditer(self.out)}


def train(env: dict[str, str], cwd: Path) -> Run:
    p = subprocess.run(ARGV, check=False, env=env, cwd=cwd, capture_output=True, text=True,
                       timeout=PROC_TIMEOUT)
    return Run(p.returncode, p.stdout, p.stderr)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------ a fake node agent


class FakeAgent(agent_pb2_grpc.NodeAgentServicer):
    """Records reports; asks for a stop from iteration `stop_at` on, and for one checkpoint in its
    answer to the first report when `checkpoint_first`."""

    def __init__(self, stop_at: int | None = None, checkpoint_first: bool = False) -> None:
        self.stop_at = stop_at
        self.checkpoint_first = checkpoint_first
        self.requests: list[agent_pb2.ReportProgressRequest] = []

    async def ReportProgress(self, request, context):
        self.requests.append(request)
        stop = self.stop_at is not None and request.progress.iteration >= self.stop_at
        ckpt = self.checkpoint_first and len(self.requests) == 1
        return agent_pb2.ReportProgressResponse(stop_requested=stop, checkpoint_requested=ckpt)




# ------------------------------------------------------------------------------------- reference


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, FakeAgent, Path]:
    """One process, micro_batch 8, no accumulation, reporting to a fake agent that asks for a
    checkpoint in its first answer (checkpoints change nothing in the numerics)."""
    tmp = tmp_path_factory.mktemp("reference")
    agent = FakeAgent(checkpoint_first=True)
    with serve(agent) as addr:
        run = train(_contract_env(tmp / "ckpt", {"micro_batch": 8, "grad_accum": 1}, TESSERA_AGENT_ADDR=addr),
                    tmp)
    assert run.rc == 0, run.err
    return run, agent, tmp / "ckpt"


def test_single_process_learns_checkpoints_and_reports(reference: tuple[Run, FakeAgent, Path]) -> None:
    run, agent, ckpt = reference
    assert "fresh start" in run.out
    losses = run.losses
    assert sorted(losses) == list(range(1, ITERATIONS + 1))
    assert losses[1] > 3.5  # ~ln(64) before any learning
    assert losses[ITERATIONS] < LEARNED_FRACTION * losses[1], losses

    # Checkpoints every 10 and at the end, the last 2 kept, `latest` points at the newest.
    assert sorted(p.name for p in ckpt.iterdir()) == [".lock", "FENCE", "latest", "staging", "step-20", "step-30"]
    assert (ckpt / "FENCE").read_text() == "1\n" and not list((ckpt / "staging" / "attempt-1").iterdir())
    assert (ckpt / "latest").read_text().strip() == "step-30"
    ref = latest_checkpoint(ckpt)
    assert ref is not None and ref.iteration == 30
    meta = ref.meta()
    assert (meta["world_size"], meta["data_position"], meta["plan"]["micro_batch"]) == (1, 30 * GLOBAL_BATCH, 8)

    # The agent's checkpoint request (answer to the report of iteration 1) is honoured at the next
    # step boundary, and reported at once (forced, past the throttle).
    assert "checkpoint iteration=2 " in run.out
    pairs = [(r.progress.iteration, r.progress.checkpoint_iteration) for r in agent.requests]
    assert pairs[0] == (1, -1)
    assert next(p for p in pairs if p[1] != -1) == (2, 2)

    # Progress reached the agent, throttled, and the last (forced) report says done + checkpointed.
    assert 2 <= len(agent.requests) < ITERATIONS
    first, last = agent.requests[0], agent.requests[-1]
    assert (first.job_id, first.attempt, first.rank, first.progress.iteration) == ("job-test", 1, 0, 1)
    assert (last.progress.iteration, last.progress.checkpoint_iteration) == (30, 30)
    assert last.progress.loss == pytest.approx(losses[30], rel=1e-6)
    assert last.progress.samples_per_second > 0 and last.progress.step_time_seconds > 0


def test_dp2_on_gloo_matches_single_process(reference: tuple[Run, FakeAgent, Path], tmp_path: Path) -> None:
    """DP=2, micro_batch 2 x grad_accum 2 per rank = the reference's global batch of 8; the ranks
    meet through a store whose values they seal with the attempt's key (reference/rendezvous.py)."""
    port = free_port()
    ckpt = tmp_path / "ckpt"
    procs = []
    for rank in (0, 1):
        env = _contract_env(ckpt, {"micro_batch": 2, "grad_accum": 2}, world_size=2, rank=rank, port=port,
                            TESSERA_RENDEZVOUS_KEY="5a" * 32)
        procs.append(subprocess.Popen(ARGV, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    runs = []
    for p in procs:
        out, err = p.communicate(timeout=PROC_TIMEOUT)
        runs.append(Run(p.returncode, out, err))
    for r in runs:
        assert r.rc == 0, r.err
        assert "rendezvous=sealed" in r.out
    ref_losses = reference[0].losses
    for r in runs:  # both ranks print the all-reduced loss
        assert sorted(r.losses) == sorted(ref_losses)
        for it, loss in r.losses.items():
            assert loss == pytest.approx(ref_losses[it], rel=DP_RTOL), f"iteration {it}"

    # The DP=2 checkpoint restores onto one process and continues on the same curve.
    single = tmp_path / "single"
    single.mkdir()
    shutil.copytree(ckpt / "step-20", single / "step-20")
    run = train(_contract_env(single, {"micro_batch": 8, "grad_accum": 1}), tmp_path)
    assert run.rc == 0, run.err
    assert "resumed from step 20" in run.out and "written at world size 2" in run.out
    assert sorted(run.losses) == list(range(21, ITERATIONS + 1))
    for it, loss in run.losses.items():
        assert loss == pytest.approx(ref_losses[it], rel=DP_RTOL), f"iteration {it}"


def test_a_rank_without_the_key_and_one_with_it_fail_at_once_not_at_the_timeout(tmp_path: Path) -> None:
    """A rolling upgrade places an attempt on an agent that passes the key and on one that does not:
    both meet under the same key names, so the rank with the key reads a value it cannot open and
    says so, instead of each waiting for keys the other never writes (the timeout is 60 s here)."""
    port = free_port()
    procs = []
    for rank, key in ((0, {"TESSERA_RENDEZVOUS_KEY": "5a" * 32}), (1, {})):
        env = _contract_env(tmp_path / "ckpt", {"micro_batch": 2, "grad_accum": 2}, world_size=2, rank=rank,
                            port=port, **key)
        procs.append(subprocess.Popen(ARGV, env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=PROC_TIMEOUT) for p in procs]
    assert [p.returncode for p in procs] != [0, 0]
    assert "is not sealed with this attempt's key" in outs[0][1], outs[0][1][-2000:]
    assert "wait timeout" not in outs[0][1]


def _read_lines(stream, q: queue.Queue[str | None]) -> None:
    for line in stream:
        q.put(line)
    q.put(None)


def test_sigterm_checkpoints_exits_0_and_resumes(reference: tuple[Run, FakeAgent, Path], tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    # Only the stop and the end checkpoint; steps padded to 100 ms so that ~2.5 s of the run remain
    # after SIGTERM is sent at step 5 (the SIGTERM must land mid-run).
    env = _contract_env(ckpt, {"micro_batch": 8}, TESSERA_CHECKPOINT_EVERY="1000",
                        TESSERA_TRAINER_MIN_STEP_SECONDS="0.1")
    p = subprocess.Popen(ARGV, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_read_lines, args=(p.stdout, lines), daemon=True).start()
    out = []
    deadline = time.monotonic() + PROC_TIMEOUT
    while True:
        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        assert line is not None, "trainer ended before step 5: " + "".join(out) + p.stderr.read()
        out.append(line)
        if line.startswith("step iteration=5/"):
            break
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=PROC_TIMEOUT) == 0, p.stderr.read()
    while (line := lines.get(timeout=10)) is not None:
        out.append(line)
    text = "".join(out)
    m = re.search(r"stopped iteration=(\d+) .*checkpoint_iteration=(\d+) reason=SIGTERM", text)
    assert m, text
    stopped = int(m.group(1))
    assert 5 <= stopped < ITERATIONS and int(m.group(2)) == stopped
    ref = latest_checkpoint(ckpt)
    assert ref is not None and ref.iteration == stopped
    assert (ckpt / "latest").read_text().strip() == f"step-{stopped}"

    # Restart on the same checkpoint directory: resumes at that step and finishes.
    run = train(_contract_env(ckpt, {"micro_batch": 8}, TESSERA_CHECKPOINT_EVERY="1000"), tmp_path)
    assert run.rc == 0, run.err
    assert f"resumed from step {stopped}" in run.out and "done iteration=30" in run.out
    ref_losses = reference[0].losses
    assert sorted(run.losses) == list(range(stopped + 1, ITERATIONS + 1))
    for it, loss in run.losses.items():
        assert loss == pytest.approx(ref_losses[it], rel=RESUME_RTOL), f"iteration {it}"
    assert latest_checkpoint(ckpt).iteration == ITERATIONS  # type: ignore[union-attr]

    # Launched again after the end (e.g. a relaunch that raced the completion): nothing to train.
    again = train(_contract_env(ckpt, {"micro_batch": 8}), tmp_path)
    assert again.rc == 0, again.err
    assert "resumed from step 30" in again.out and "done iteration=30" in again.out and not again.losses


def test_agent_stop_request_checkpoints_and_exits_0(tmp_path: Path) -> None:
    """The agent answers the first report (iteration 1) with stop_requested: stop at the next boundary."""
    agent = FakeAgent(stop_at=1)
    ckpt = tmp_path / "ckpt"
    with serve(agent) as addr:
        run = train(_contract_env(ckpt, {"micro_batch": 8}, TESSERA_AGENT_ADDR=addr), tmp_path)
    assert run.rc == 0, run.err
    assert "stopped iteration=2 " in run.out and "reason=agent" in run.out
    assert latest_checkpoint(ckpt).iteration == 2  # type: ignore[union-attr]
    last = agent.requests[-1].progress
    assert (last.iteration, last.checkpoint_iteration) == (2, 2)


def test_plan_it_cannot_run_exits_3_with_the_reason(tmp_path: Path) -> None:
    """tp=4 cannot split 2 attention heads: exit 3 with one line, before any checkpoint. (Real TP, PP,
    FSDP plans are trained in test_trainer_plans.py.)"""
    env = _contract_env(tmp_path / "ckpt", {"micro_batch": 8}, world_size=4)
    env["TESSERA_PLAN"] = json.dumps({"dp": 1, "tp": 4, "pp": 1, "micro_batch": 8, "grad_accum": 1})
    run = train(env, tmp_path)
    assert run.rc == 3
    assert run.err.strip().splitlines()[-1] == ("plan tp=4 does not divide the model's num_heads=2 (tensor "
                                                "parallelism splits whole attention heads)")
    assert not (tmp_path / "ckpt").exists()
