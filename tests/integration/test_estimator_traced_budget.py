"""A traced-mode EstimateMemory runs in a child process under a wall-clock budget
(estimator/service/traced_child.py): past the budget it is RESOURCE_EXHAUSTED naming the mode and
the budget, and a caller that gives up (a cancel, its deadline) has the child killed; the answer and
the library's errors are those of an in-process trace. Real gRPC on loopback with mTLS (the
fixtures of test_estimator_service.py); child processes are found in /proc."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan, PlanInputError
from tessera.estimator.service.handlers import Estimator
from tessera.estimator.service.main import parse_args
from tessera.estimator.service.server import EstimatorService
from tessera.estimator.service.traced_child import (
    MODULE,
    TRACED_BUDGET_S,
    TracedCancelled,
    TracedJob,
    TracedRunner,
    _answer,
)
from tessera.v1 import common_pb2 as c
from tessera.v1 import estimator_pb2 as pb
from tests.integration.test_estimator_service import _serve

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="child processes are found in /proc")

TINY = c.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256, seq_length=32)
TINY_REQ = pb.EstimateMemoryRequest(model=TINY, plan=c.ExecutionPlan(dp=2, micro_batch=2, sharding=c.SHARDING_ZERO1),
                                    gpu="a10", mode=pb.MEMORY_MODE_TRACED, global_batch_size=8)
# A real model's size (32 layers at hidden 4,096): about 10 s of tracing after torch's import.
LONG_REQ = pb.EstimateMemoryRequest(model=c.ModelSpec(hidden_size=4096, num_layers=32, num_heads=32, vocab_size=32000,
                                                      seq_length=4096), mode=pb.MEMORY_MODE_TRACED)
FORMULA_REQ = pb.EstimateMemoryRequest(model=TINY, gpu="a10")


def _traced_children() -> set[int]:
    """This process's children running the traced child module."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == os.getpid() and MODULE.encode() in cmdline:
            found.add(int(stat.parent.name))
    return found


def _gone(pid: int | None) -> bool:
    """Killed and reaped: no /proc entry (a zombie would still have one), nor any other traced child."""
    return pid is not None and not Path(f"/proc/{pid}").exists() and not _traced_children()


def _idle(service: EstimatorService) -> bool:
    """No call on the controller's lane of heavy calls (the fixtures' client is the controller)."""
    return service._lanes[True].inside == 0


async def _until(cond: Callable[[], bool], what: str, limit_s: float = 180.0) -> None:
    """Polls cond() (the server's worker thread and the child are outside the event loop); the limit
    only bounds a failure."""
    end = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < end, f"still waiting for {what}"
        await asyncio.sleep(0.02)


def test_the_budget_is_a_flag_of_the_service() -> None:
    assert parse_args(["--insecure"]).traced_budget == TRACED_BUDGET_S == 120.0
    assert parse_args(["--insecure", "--traced-budget", "30"]).traced_budget == 30.0
    for bad in ("0", "-1", "nan", "inf"):
        with pytest.raises(SystemExit) as exit_:
            parse_args(["--insecure", "--traced-budget", bad])
        assert exit_.value.code == 2
    with pytest.raises(ValueError, match="> 0"):
        TracedRunner(0.0)


def test_a_call_cancelled_while_it_waits_for_its_turn_starts_no_child() -> None:
    pytest.importorskip("torch")
    runner = TracedRunner()
    cancel = threading.Event()
    cancel.set()
    with runner._lock, pytest.raises(TracedCancelled):  # another trace holds the turn
        runner.run(TracedJob(ModelDims(64, 2, 4, 256, 32), ExecutionPlan()), "traced", cancel)
    assert runner.last_pid is None


def test_a_child_that_dies_is_an_internal_error_with_its_stderr() -> None:
    with pytest.raises(RuntimeError, match="(?s)exited with status -9: .*Killed"):
        _answer(b"", b"Traceback ...\nKilled", -9, "traced")


@pytest.mark.slow
async def test_a_traced_estimate_in_its_child_equals_the_library() -> None:
    pytest.importorskip("torch")
    from tessera.estimator.torch.traced import traced_memory

    est = Estimator()
    async for s in _serve(est):
        m = (await s.stub.EstimateMemory(TINY_REQ)).memory
        assert _gone(est._traced.last_pid)
        lib = traced_memory(ModelDims(64, 2, 4, 256, 32), ExecutionPlan(dp=2, micro_batch=2, grad_accum=2,
                                                                           sharding="zero1"), gpu="A10-24GB")
        assert (m.parameters, m.gradients, m.optimizer, m.activations, m.other, m.total, m.capacity, m.fits,
                m.source, m.stage, m.cpu_bytes, m.reserved, tuple(m.warnings)) == (
            lib.parameters, lib.gradients, lib.optimizer, lib.activations, lib.other, lib.total, lib.capacity_bytes,
            lib.fits, lib.source, lib.stage, lib.cpu_bytes, lib.reserved, lib.warnings)
        # the first note is the trace's wall time
        assert m.notes[0].startswith("traced stage 0 of 1 in ") and tuple(m.notes[1:]) == lib.notes[1:]
        first = est._traced.last_pid
        assert (await s.stub.EstimateMemory(TINY_REQ)).memory == m  # cached: no second child
        assert est._traced.last_pid == first


async def test_an_error_in_the_child_is_the_error_the_library_raises() -> None:
    pytest.importorskip("torch")
    from tessera.estimator.torch.traced import traced_memory

    with pytest.raises(PlanInputError) as lib:
        traced_memory(ModelDims(64, 2, 4, 256, 32), ExecutionPlan(dp=2, sharding="zero3"))
    req = pb.EstimateMemoryRequest(model=TINY, plan=c.ExecutionPlan(dp=2, sharding=c.SHARDING_ZERO3),
                                   mode=pb.MEMORY_MODE_TRACED)
    est = Estimator()
    with pytest.raises(PlanInputError) as direct:  # the library's error type, in process (tessctl's path)
        est.estimate_memory(req)
    assert (direct.value.field, direct.value.reason) == (lib.value.field, lib.value.reason) == (
        "plan.sharding", lib.value.reason)
    async for s in _serve(est):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await s.stub.EstimateMemory(req)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details() == f"plan.sharding: {lib.value.reason}"
    assert _gone(est._traced.last_pid)


async def test_a_trace_past_its_budget_is_refused_and_its_child_killed() -> None:
    pytest.importorskip("torch")
    est = Estimator(traced_budget_s=0.5)
    async for s in _serve(est):
        pids = []
        for _ in range(2):  # the second is not stuck behind the first: the lane and the turn were freed
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await s.stub.EstimateMemory(LONG_REQ)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (err.value.details() or "").startswith("mode: traced estimate exceeded its 0.5 s budget")
            assert _gone(est._traced.last_pid)
            pids.append(est._traced.last_pid)
        assert pids[0] != pids[1] and len(est._memory) == 0  # a refusal is not an answer to keep
        assert (await s.stub.EstimateMemory(FORMULA_REQ)).memory.total > 0
        assert (await s.stub.Health(pb.HealthRequest())).status == "SERVING"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["cancel", "deadline"])
async def test_a_caller_that_gives_up_has_the_trace_killed(how: str) -> None:
    """Before, the trace ran on in its thread (the largest model: 148 s of a core) for nobody."""
    pytest.importorskip("torch")
    est = Estimator()  # the default budget: only the caller's giving up stops it
    async for s in _serve(est):
        call = s.stub.EstimateMemory(LONG_REQ, timeout=2.0 if how == "deadline" else None)
        if how == "cancel":
            await _until(lambda: est._traced.last_pid in _traced_children(), "the trace's child")
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
        else:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await _until(functools.partial(_idle, s.service), "the call's thread to end")
        assert est._traced.last_pid is not None  # it had started its child
        assert _gone(est._traced.last_pid)
        assert len(est._memory) == 0  # killed, not run to its end for nobody
        resp = await s.stub.EstimateMemory(TINY_REQ)  # the traced lane answers the next call
        assert resp.memory.source == "traced"


@pytest.mark.slow
def test_the_service_process_never_imports_torch() -> None:
    pytest.importorskip("torch")
    script = ("import json, sys\n"
              "from tessera.estimator.service.handlers import Estimator\n"
              "from tessera.v1 import estimator_pb2 as pb\n"
              "req = pb.EstimateMemoryRequest()\n"
              f"req.ParseFromString(bytes.fromhex({TINY_REQ.SerializeToString().hex()!r}))\n"
              "total = Estimator().estimate_memory(req).memory.total\n"
              "print(json.dumps({'total': total, 'torch': 'torch' in sys.modules}))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=240)
    got = json.loads(out.stdout)
    assert got["total"] > 0 and got["torch"] is False


def _children_of(pid: int) -> set[int]:
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _running(pid: int) -> bool:
    """Alive and not a zombie (a container's PID 1 may never reap an orphan)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def until_gone(pid: int, what: str) -> None:
    """Polls until the process is gone (or a zombie); the limit only bounds a failure."""
    end = time.monotonic() + 60
    while _running(pid):
        assert time.monotonic() < end, what
        time.sleep(0.05)


def test_the_child_dies_with_a_killed_estimator() -> None:
    # The estimator's stand-in starts the child as TracedRunner does and is SIGKILLed: it cannot
    # kill its child itself. The child waits for its job on a pipe this test holds open, so only its
    # parent-death signal can end it.
    script = ("import os, subprocess, sys, time\n"
              f"subprocess.Popen([sys.executable, '-P', '-m', {MODULE!r}, str(os.getpid())])\n"
              "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)
    try:
        end = time.monotonic() + 60
        while not (children := _children_of(parent.pid)):
            assert time.monotonic() < end and parent.poll() is None, "the child never started"
            time.sleep(0.05)
        (child,) = children
        parent.kill()
        parent.wait()
        until_gone(child, "the trace's child outlived its estimator")
    finally:
        parent.kill()
        assert parent.stdin is not None
        parent.stdin.close()  # a child that survived reads EOF and exits


def test_tessctl_takes_the_budget_in_process_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    from tessera.clients.tessctl import main
    from tests.procs import REPO

    job = str(REPO / "examples" / "jobs" / "medium.yaml")
    argv = ["estimate", "memory", "-f", job, "--gpu", "a100", "--mode", "traced"]
    assert main([*argv, "--traced-budget", "0.2"]) == 1  # not even torch's import fits
    err = capsys.readouterr().err
    assert err == ("tessctl: error: RESOURCE_EXHAUSTED: mode: traced estimate exceeded its 0.2 s budget "
                   "(--traced-budget); the formula modes answer at once\n")
    assert not _traced_children()
    assert main([*argv, "--traced-budget", "10m", "--estimator", "127.0.0.1:1"]) == 1  # as --tls-dir without it
    assert "--traced-budget: only without --estimator" in capsys.readouterr().err
