"""`tessctl get nodes|jobs NAME...` with some names not found, as a real process over real gRPC (the fake
Controller of tests/fake_controller.py): the ones found on stdout, an error line for each other name
on stderr, exit 1 (docs/cli.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fake_controller import FakeServer, seeded

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server() -> Iterator[FakeServer]:
    srv = seeded()  # nodes node-a and node-b, job j-run
    yield srv
    srv.stop()


def tessctl(server: FakeServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TESSERA_CONTROLLER"}
    return subprocess.run([sys.executable, "-m", "tessera.clients.tessctl", "--controller", server.address, *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_get_nodes_prints_those_found(server: FakeServer) -> None:
    proc = tessctl(server, "get", "nodes", "node-a", "n9", "node-b")
    assert proc.returncode == 1
    assert [line.split()[0] for line in proc.stdout.splitlines()] == ["NAME", "node-a", "node-b"]
    assert proc.stderr == "tessctl: error: NOT_FOUND: node n9 not found\n"
    proc = tessctl(server, "get", "nodes", "n9", "node-b", "n8", "-o", "json")
    assert proc.returncode == 1 and [n["id"] for n in json.loads(proc.stdout)["nodes"]] == ["node-b"]
    assert proc.stderr.splitlines() == ["tessctl: error: NOT_FOUND: node n9 not found",
                                        "tessctl: error: NOT_FOUND: node n8 not found"]


def test_get_jobs_prints_those_found(server: FakeServer) -> None:
    proc = tessctl(server, "get", "jobs", "j-gone", "j-run", "-o", "json")
    assert proc.returncode == 1 and [j["id"] for j in json.loads(proc.stdout)["jobs"]] == ["j-run"]
    assert proc.stderr == "tessctl: error: NOT_FOUND: job j-gone not found\n"
    proc = tessctl(server, "get", "jobs", "j-run", "j-gone")
    assert proc.returncode == 1 and proc.stdout.splitlines()[1].split()[0] == "j-run"
    assert proc.stderr == "tessctl: error: NOT_FOUND: job j-gone not found\n"
