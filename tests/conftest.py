"""Shared fixtures: the e2e and chaos suites start real clusters (tests/e2e/cluster.py), all over
mTLS from one dev PKI per session (`dev_pki`).

When pytest-timeout stops an asyncio test, it prints the threads' stacks, which only show the event
loop waiting; the hook below adds where every asyncio task of that test was waiting, which is the
line that hung.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Generator
from typing import Any

import pytest

from tessera.common.localcluster import DevPki, use_pki

pytest_plugins = ["tests.workerenv", "tests.e2e.cluster"]


@pytest.fixture(scope="session", autouse=True)
def dev_pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    """One CA per test session: every daemon a test starts runs with mTLS from it (localcluster),
    and tessctl and the SDK trust it through TESSERA_CA."""
    return use_pki(tmp_path_factory.mktemp("pki"))


def _task_stacks(item: pytest.Item) -> str | None:
    request = getattr(item, "_request", None)
    if request is None or item.get_closest_marker("asyncio") is None:
        return None
    try:
        runner = request.getfixturevalue("_function_scoped_runner")
    except pytest.FixtureLookupError:  # pytest-asyncio renamed its internals
        return None
    if runner is None:
        return None
    out = io.StringIO()
    for task in asyncio.all_tasks(runner.get_loop()):
        task.print_stack(file=out)
    return out.getvalue()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[Any, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and "Timeout (>" in str(report.longrepr):
        stacks = _task_stacks(item)
        if stacks:
            report.sections.append(("asyncio tasks at the timeout", stacks))
