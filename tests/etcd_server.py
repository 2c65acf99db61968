"""A real `etcd` (Debian's etcd-server) for the tests of the etcd store and of leader failover.

Each server is a process on loopback with free ports and a temporary data dir, stopped at the end.
Without the binary the test is skipped, except under CI (`CI` set, as for the seed data in
tests/shared_data.py), where it fails: the HA tests cannot pass by not running.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tessera.common.localcluster import Daemon, local_tokens, start_etcd
from tessera.controller.election import Leadership
from tessera.controller.etcd import EtcdClient, EtcdConfig
from tessera.controller.etcdstore import EtcdStore
from tests.shared_data import in_ci


def require_etcd() -> str:
    path = shutil.which("etcd")
    if path:
        return path
    why = "etcd not found (Debian package etcd-server; scripts/setup.sh installs it as root)"
    if in_ci():
        pytest.fail(f"{why}; CI is set, so a test that needs it fails instead of skipping", pytrace=False)
    pytest.skip(why)


@contextmanager
def etcd_server(tmp: Path, tls: tuple[Path, Path, Path] | None = None) -> Iterator[Daemon]:
    """One etcd member on 127.0.0.1 (common/localcluster.py), serving clients when yielded; its
    client endpoint is `.address`. `tls`: (CA, certificate, key), client certificates required."""
    server = start_etcd(tmp, require_etcd(), tls)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def etcd_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One etcd for a test module; each test keeps to a prefix of its own (`leading_store`)."""
    with etcd_server(tmp_path_factory.mktemp("etcd")) as srv:
        yield srv.address


@contextmanager
def leading_store(endpoint: str, prefix: str, address: str = "test:1", ttl_s: int = 5,
                  marker: Path | None = None, cfg: EtcdConfig | None = None) -> Iterator[EtcdStore]:
    """An EtcdStore whose controller has won the election on `prefix` (its writes carry the fence)."""
    client = EtcdClient(cfg or EtcdConfig((endpoint,), prefix=prefix))
    try:
        lead = Leadership(client, address, ttl_s=ttl_s)
        client.call(lead.campaign(), 30)
        store = EtcdStore(client, lead, marker)
        try:
            yield store
        finally:
            lead.resign()
    finally:
        client.close()


def cluster_tokens(root: Path) -> tuple[list[str], str]:
    """One tokens file for every controller of a cluster (a client's token must hold at whichever
    leads): the `--tokens FILE` arguments, and the admin token (common/localcluster.py's callers)."""
    tokens_file, tokens = local_tokens(root / "cluster")
    return ["--tokens", str(tokens_file)], tokens["admin"]
