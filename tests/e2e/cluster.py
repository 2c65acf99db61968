"""A real local cluster per test: a controller and agents with declared GPUs, as processes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tessera.clients.sdk import Client
from tessera.v1 import common_pb2 as P
from tests.procs import REPO, Daemon, kill_strays, start_agent, start_controller, wait_for
from tests.workerenv import worker_python

INVENTORIES = REPO / "examples" / "inventories"


@dataclass
class Cluster:
    root: Path
    controller: Daemon
    policy: str = "frenzy"
    agents: dict[str, Daemon] = field(default_factory=dict)
    # The controller's extra flags, given again on a restart (--prices, --tenants, ...).
    controller_args: tuple[str, ...] = ()

    def client(self) -> Client:
        return Client(self.controller.address, token=self.controller.token)

    def client_as(self, name: str) -> Client:
        """A client holding the token of `name` (localcluster.CREDENTIALS: admin, alice, bob)."""
        return Client(self.controller.address, token=self.controller.tokens[name])

    def add_agent(self, node_id: str, inventory: str, *extra: str) -> Daemon:
        # Run as root, the agents run workers as nobody: `root` is a folder nobody can reach
        # (worker_dir), and --worker-python an interpreter nobody can run (tests/workerenv.py).
        a = start_agent(self.controller, node_id, INVENTORIES / inventory, self.root / node_id,
                        "--worker-python", worker_python(), *extra)
        self.agents[node_id] = a
        return a

    def wait_ready(self, n: int, timeout: float = 30) -> None:
        with self.client() as c:
            wait_for(lambda: sum(x.state == P.NODE_STATE_READY for x in c.nodes()) >= n, timeout, f"{n} nodes READY")

    def restart_controller(self) -> Daemon:
        port = self.controller.address.rpartition(":")[2]
        agent_port = self.controller.agent_address.rpartition(":")[2]
        self.controller = start_controller(self.root / "state", "--policy", self.policy, *self.controller_args,
                                           listen=f"127.0.0.1:{port}", agent_listen=f"127.0.0.1:{agent_port}")
        return self.controller


def make_cluster(root: Path, nodes: list[tuple[str, str]], policy: str, controller_args: tuple[str, ...] = ()) -> Cluster:
    c = Cluster(root, start_controller(root / "state", "--policy", policy, *controller_args), policy=policy,
                controller_args=controller_args)
    for node_id, inv in nodes:
        c.add_agent(node_id, inv)
    c.wait_ready(len(nodes))
    return c


@pytest.fixture
def cluster_factory(worker_dir: Path) -> Iterator:  # type: ignore[type-arg]
    made: list[Cluster] = []

    def make(nodes: list[tuple[str, str]], policy: str = "frenzy", controller_args: tuple[str, ...] = ()) -> Cluster:
        """Most tests pin Frenzy (MARP + HAS) for placements they can predict; Crius tests ask for it.
        `controller_args` come after the fast defaults (a later flag wins: `--lease 20`)."""
        c = make_cluster(worker_dir, nodes, policy, controller_args)
        made.append(c)
        return c

    yield make
    for c in made:
        for a in c.agents.values():
            a.stop()
        c.controller.stop()
    kill_strays(worker_dir)
