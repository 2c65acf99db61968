"""The estimator service keeps a warm spare for traced estimates (estimator/service/traced_child.py):
after one traced estimate the next child is already running, with torch imported and a tiny model
traced, so the next estimate pays its own trace only. Its answer is the one a fresh child gives; a
spare that died while it waited is replaced; `close` ends it, and so does the daemon's stop.
tessctl's in-process runner keeps none. Child processes are found in /proc."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tessera.common import rpc
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan
from tessera.estimator.service.traced_child import MODULE, TracedJob, TracedRunner
from tessera.v1 import estimator_pb2_grpc
from tests.integration.test_estimator_traced_budget import (
    TINY_REQ,
    _children_of,
    _running,
    _traced_children,
    until_gone,
)
from tests.procs import BIN, env

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="child processes are found in /proc")]

JOB = TracedJob(ModelDims(64, 2, 4, 256, 32), ExecutionPlan(dp=2, micro_batch=2, sharding="zero1"), gpu="A10-24GB")


def children_become(want: set[int]) -> set[int]:
    """The traced children once they are `want` (the limit only bounds a failure): a spare just
    started shows the parent's command line in /proc until its exec, and was missed (a CI run)."""
    end = time.monotonic() + 60
    while (got := _traced_children()) != want and time.monotonic() < end:
        time.sleep(0.05)
    return got


def test_the_next_estimate_runs_in_the_warm_spare_and_close_ends_it() -> None:
    pytest.importorskip("torch")
    runner = TracedRunner(spare=True)
    try:
        first = runner.run(JOB, "traced")
        spare = runner._spare
        assert spare is not None and children_become({spare.pid}) == {spare.pid}  # the first child gone, a spare waits
        again = runner.run(JOB, "traced")
        assert runner.last_pid == spare.pid and again.total == first.total and again.parameters == first.parameters
        assert runner._spare is not None and children_become({runner._spare.pid}) == {runner._spare.pid}
        assert runner._spare.pid != spare.pid
    finally:
        runner.close()  # a failure above must not leave its spare to the next test
    assert not _traced_children() and runner._spare is None
    assert runner.run(JOB, "traced").total == first.total and not _traced_children()  # closed: no new spare


def test_a_spare_that_died_waiting_is_replaced_by_a_fresh_child() -> None:
    pytest.importorskip("torch")
    runner = TracedRunner(spare=True)
    first = runner.run(JOB, "traced")
    assert runner._spare is not None
    dead = runner._spare.pid
    os.kill(dead, signal.SIGKILL)
    runner._spare.wait()
    assert runner.run(JOB, "traced").total == first.total and runner.last_pid != dead
    runner.close()


def test_a_spare_that_cannot_be_started_costs_neither_the_answer_nor_the_lock() -> None:
    """Before: the spare's Popen raised in run()'s finally, before the lock was released: the
    estimate's answer was lost and every later run (and close) waited for ever."""
    pytest.importorskip("torch")
    runner = TracedRunner(spare=True)
    real = runner._child

    def child(warm: bool) -> subprocess.Popen[bytes]:
        if warm:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        return real(warm)

    runner._child = child  # type: ignore[method-assign]
    assert runner.run(JOB, "traced").total > 0
    assert not runner._lock.locked() and runner._spare is None
    assert runner.run(JOB, "traced").total > 0
    runner.close()


def test_the_in_process_runner_keeps_no_spare() -> None:
    pytest.importorskip("torch")
    runner = TracedRunner()
    runner.run(JOB, "traced")
    assert runner._spare is None and not _traced_children()


def _spares(pid: int) -> set[int]:
    return {c for c in _children_of(pid) if MODULE.encode() in Path(f"/proc/{c}/cmdline").read_bytes()}


def _started(log: Path, proc: subprocess.Popen[bytes]) -> str:
    """The address the daemon logged when it started serving."""
    end = time.monotonic() + 60
    while True:
        for line in log.read_text().splitlines():
            if '"estimator_started"' in line:
                return str(json.loads(line)["listen"])
        assert time.monotonic() < end and proc.poll() is None, log.read_text()
        time.sleep(0.05)


def test_the_daemon_keeps_a_spare_and_ends_it_when_it_stops(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    log = tmp_path / "e.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(BIN / "tessera-estimator"), "--listen", "127.0.0.1:0", "--insecure"], env=env(),
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        with rpc.sync_channel(_started(log, proc), insecure=True) as ch:
            assert estimator_pb2_grpc.EstimatorStub(ch).EstimateMemory(TINY_REQ, timeout=240).memory.total > 0
        (spare,) = _spares(proc.pid)
        assert _running(spare)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        until_gone(spare, "the spare outlived its estimator")
    finally:
        proc.kill()
