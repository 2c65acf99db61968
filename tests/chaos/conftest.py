"""A chaos cluster per test: the e2e cluster (tests/e2e/cluster.py), with the first controller
optionally armed to kill itself at a named crash point (common/crashpoints.py)."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster
from tests.procs import kill_strays, start_controller

Factory = Callable[..., Cluster]


@pytest.fixture
def chaos_cluster(tmp_path: Path) -> Iterator[Factory]:
    made: list[Cluster] = []

    def make(nodes: list[tuple[str, str]], policy: str = "frenzy", crash_at: str = "",
             listen: str = "127.0.0.1:0") -> Cluster:
        env = {"TESSERA_CRASH_AT": crash_at} if crash_at else None
        c = Cluster(tmp_path, start_controller(tmp_path / "state", "--policy", policy, listen=listen, extra_env=env),
                    policy=policy)
        made.append(c)
        for node_id, inv in nodes:
            c.add_agent(node_id, inv)
        c.wait_ready(len(nodes))
        return c

    yield make
    for c in made:
        for d in [*c.agents.values(), c.controller]:
            if d.proc.poll() is None:
                d.proc.send_signal(signal.SIGCONT)  # a stopped daemon cannot act on SIGTERM
            d.stop()
    kill_strays(tmp_path)
