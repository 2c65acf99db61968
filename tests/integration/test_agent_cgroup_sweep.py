"""The agent's sweep of the device cgroups that SIGKILLed keepers leave (nodeagent/agent.py,
devicefilter.prune; docs/agent.md "GPU isolation"): once at start, then every retention interval,
whether or not attempts expire (--attempt-ttl 0). Before, the sweep rode on the attempts' retention
task: it ran twice at start with --attempt-ttl, and never after start without it. The sweep itself
is faked (no root, no cgroups needed); the agent is real, against a fake registry on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tessera.nodeagent import cgroups, devicefilter, retention
from tessera.nodeagent.testing import FakeRegistry, wait_until
from tests.integration.test_agent_grpc import TIMEOUT, make_agent, registry
from tests.workerenv import worker_dir

__all__ = ["registry", "worker_dir"]

MINORS = {0: 0, 1: 1, 2: 2, 3: 3}


@pytest.fixture
def sweeps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The cgroup sweeps and attempt prunes the agent makes, in order; no systemd scopes."""
    seen: list[str] = []
    monkeypatch.setattr(cgroups, "probe", lambda: (False, "no scopes in this test"))
    monkeypatch.setattr(devicefilter, "prune", lambda home=None: seen.append("cgroups") or [])
    monkeypatch.setattr(retention, "prune_attempts", lambda *a, **k: seen.append("attempts") or [])
    return seen


def count_sleeps(monkeypatch: pytest.MonkeyPatch, seconds: float) -> list[float]:
    """asyncio.sleep as before, each sleep of exactly `seconds` recorded."""
    real: Callable[..., Awaitable[Any]] = asyncio.sleep
    slept: list[float] = []

    async def sleep(delay: float, *a: Any, **k: Any) -> Any:
        if delay == seconds:
            slept.append(delay)
        return await real(delay, *a, **k)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    return slept


async def test_start_sweeps_once_with_attempt_retention_on(registry: tuple[FakeRegistry, str], worker_dir: Path,
                                                          sweeps: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    interval = 86_400.0 + 0.125  # no task's other sleep is this long
    monkeypatch.setattr(retention, "INTERVAL_S", interval)
    slept = count_sleeps(monkeypatch, interval)
    a = make_agent(registry[1], worker_dir, gpu_minors=MINORS, attempt_ttl_seconds=3600.0)
    await a.start()
    try:
        # Both periodic tasks (attempts, cgroups) have done what they do before their first wait.
        await wait_until(lambda: len(slept) >= 2, TIMEOUT, "both retention tasks to wait")
        assert sweeps.count("cgroups") == 1 and sweeps.count("attempts") == 1, sweeps
    finally:
        await a.close(grace=0)


async def test_the_sweep_repeats_without_attempt_retention(registry: tuple[FakeRegistry, str], worker_dir: Path,
                                                           sweeps: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retention, "INTERVAL_S", 0.01)
    a = make_agent(registry[1], worker_dir, gpu_minors=MINORS, attempt_ttl_seconds=0)
    await a.start()
    try:
        await wait_until(lambda: sweeps.count("cgroups") >= 3, TIMEOUT, "the sweep to repeat")
        assert "attempts" not in sweeps
    finally:
        await a.close(grace=0)


async def test_no_sweep_without_device_isolation(registry: tuple[FakeRegistry, str], worker_dir: Path,
                                                 sweeps: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    interval = 86_400.0 + 0.125
    monkeypatch.setattr(retention, "INTERVAL_S", interval)
    slept = count_sleeps(monkeypatch, interval)
    a = make_agent(registry[1], worker_dir, attempt_ttl_seconds=3600.0)
    await a.start()
    try:
        await wait_until(lambda: len(slept) >= 1, TIMEOUT, "the attempts' task to wait")
        assert sweeps == ["attempts"]
    finally:
        await a.close(grace=0)
