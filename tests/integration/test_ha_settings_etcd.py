"""The checks of a controller among several, on a real etcd (tests/etcd_server.py; docs/ha.md,
"Settings the controllers share"): the leader records its settings, a checkpoint root not the
cluster's is refused at start and at takeover, other differences are logged; a controller given
another's --advertise is refused at start; and a standby whose campaign lost names the leader."""

from __future__ import annotations

import signal
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from structlog.testing import capture_logs

from tessera.common.localcluster import BIN, start_controller
from tessera.controller import ha_settings as hs
from tessera.controller.election import Leadership
from tessera.controller.etcd import EtcdClient, EtcdConfig
from tests.etcd_server import cluster_tokens, etcd_endpoint, etcd_server

__all__ = ["etcd_endpoint"]


def _instance(instance: str) -> dict[str, str]:
    return {"instance": instance} if instance else {}  # none: as any Tessera's Leadership is made


@contextmanager
def _leading(endpoint: str, prefix: str, address: str, instance: str = "") -> Iterator[Leadership]:
    client = EtcdClient(EtcdConfig((endpoint,), prefix=prefix))
    try:
        lead = Leadership(client, address, ttl_s=5, **_instance(instance))
        client.call(lead.campaign(), 30)
        try:
            yield lead
        finally:
            lead.resign()
    finally:
        client.close()


@contextmanager
def _standby(endpoint: str, prefix: str, address: str, instance: str = "") -> Iterator[Leadership]:
    client = EtcdClient(EtcdConfig((endpoint,), prefix=prefix))
    try:
        yield Leadership(client, address, ttl_s=5, **_instance(instance))
    finally:
        client.close()


def _prefix() -> str:
    return f"/s-{uuid.uuid4().hex[:8]}/"


SHARED = hs.Settings("/mnt/shared/ckpt", "crius", "paper", "")


def test_each_leader_records_its_settings_and_another_root_is_refused(etcd_endpoint: str) -> None:
    prefix = _prefix()
    with _leading(etcd_endpoint, prefix, "a:1") as a:
        assert hs.read_settings(a.client) is None
        assert hs.take_over(a.client, a, SHARED) == ""
        assert hs.read_settings(a.client) == SHARED
        with _standby(etcd_endpoint, prefix, "b:1") as b:
            assert hs.check_at_start(b.client, b, SHARED) == ""
            refusal = hs.check_at_start(b.client, b, hs.Settings("/var/lib/b/checkpoints", "crius", "paper"))
            assert "/var/lib/b/checkpoints" in refusal and "/mnt/shared/ckpt" in refusal
    # One started before the key named another root is refused when it takes the lead.
    with _leading(etcd_endpoint, prefix, "b:1") as b:
        assert "/var/lib/b/checkpoints" in hs.take_over(b.client, b, hs.Settings("/var/lib/b/checkpoints"))
        assert hs.read_settings(b.client) == SHARED  # nothing of it recorded
    # Another policy leads, said once with each difference, and is the one recorded.
    fcfs = hs.Settings("/mnt/shared/ckpt", "fcfs", "paper", "sha256:00")
    with _leading(etcd_endpoint, prefix, "c:1") as c, capture_logs() as logs:
        assert hs.take_over(c.client, c, fcfs) == ""
        assert hs.read_settings(c.client) == fcfs
    differ = [e for e in logs if e["event"] == "settings_differ"]
    assert len(differ) == 1 and [d["setting"] for d in differ[0]["differences"]] == ["policy", "tenants"]


def test_another_controllers_advertise_is_refused_at_start(etcd_endpoint: str) -> None:
    prefix = _prefix()
    with _leading(etcd_endpoint, prefix, "10.0.0.1:50051", "ctl-1:/var/lib/c") as a:
        assert a.leader_hint() == ""  # a leader does not name itself
        with _standby(etcd_endpoint, prefix, "10.0.0.1:50051", "ctl-4:/var/lib/c4") as twin:
            line = hs.check_at_start(twin.client, twin, SHARED)
            assert "--advertise 10.0.0.1:50051" in line and "ctl-1:/var/lib/c" in line
        with _standby(etcd_endpoint, prefix, "10.0.0.1:50051", "ctl-1:/var/lib/c") as again:
            # Its own earlier run (restarted before its lease expired): it waits, as before.
            assert hs.check_at_start(again.client, again, SHARED) == "" and again.leader_hint() == ""
        with _standby(etcd_endpoint, prefix, "10.0.0.2:50051", "ctl-2:/var/lib/c") as other:
            assert hs.check_at_start(other.client, other, SHARED) == ""
            assert other.leader_hint() == "10.0.0.1:50051"


class _Deleted:
    """A watch that reports the leader key deleted at once (the campaign goes on to try again)."""

    def __init__(self) -> None:
        self.events = [SimpleNamespace(type=1, DELETE=1)]

    def __aiter__(self) -> _Deleted:
        return self

    async def __anext__(self) -> Any:
        if self.events:
            return SimpleNamespace(events=[self.events.pop()])
        raise StopAsyncIteration

    def cancel(self) -> None:
        pass


def test_a_standby_whose_campaign_lost_names_the_leader(etcd_endpoint: str) -> None:
    """Its transaction lost to the leader after its read found no key: the read of the key it
    watches from is the leader it names (before, "no leader elected yet" for up to a TTL)."""
    prefix = _prefix()
    with _leading(etcd_endpoint, prefix, "a:1") as a, _standby(etcd_endpoint, prefix, "b:1") as b:
        b.seen_leader = None  # as _try_take left it: no key when it read, then its transaction lost
        b.client.watch = SimpleNamespace(Watch=lambda requests: _Deleted())

        async def wait() -> None:
            await b._wait_leader_gone()

        b.client.call(wait(), 10)
        assert b.seen_leader == ("a:1", a.epoch) and b.leader_hint() == "a:1"


def _refused(tmp_path: Path, name: str, endpoint: str, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [str(BIN / "tessera-controller"), "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / name),
            "--insecure", "--store", "etcd", "--etcd-endpoints", endpoint, *extra]
    return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)


def test_controllers_refused_at_start_and_a_policy_change_said_at_takeover(tmp_path: Path) -> None:
    with etcd_server(tmp_path) as etcd:
        auth, _ = cluster_tokens(tmp_path)
        ha = ["--store", "etcd", "--etcd-endpoints", etcd.address, "--etcd-lease-ttl", "2", *auth]
        shared = str(tmp_path / "shared-ckpt")
        a = start_controller(tmp_path / "a", *ha, "--checkpoint-root", shared)
        b = None
        try:
            a.wait_event("controller_leading", 30)
            own = _refused(tmp_path, "c", etcd.address, *auth, "--checkpoint-root", str(tmp_path / "c" / "ckpt"))
            assert own.returncode == 2, own.stderr
            line = own.stderr.strip().splitlines()[-1]
            assert line.startswith("tessera-controller: error: --checkpoint-root ") and shared in line
            assert str(tmp_path / "c" / "ckpt") in line
            twin = _refused(tmp_path, "d", etcd.address, *auth, "--checkpoint-root", shared, "--advertise", a.address)
            assert twin.returncode == 2, twin.stderr
            assert "each controller needs its own --advertise" in twin.stderr.strip().splitlines()[-1]
            b = start_controller(tmp_path / "b", *ha, "--checkpoint-root", shared, "--policy", "fcfs")
            a.proc.send_signal(signal.SIGTERM)  # a clean stop: b leads at once
            differ = b.wait_event("settings_differ", 30)
            assert differ["differences"] == [{"setting": "policy", "last_leader": "crius", "this": "fcfs"}]
            b.wait_event("controller_leading", 30)
        finally:
            for d in (b, a):
                if d is not None:
                    d.stop()



def test_the_key_of_a_dead_instance_under_this_advertise_is_waited_out(etcd_endpoint: str, tmp_path: Path) -> None:
    """A machine (or pod) replaced under another host name, with the same --advertise, restarted
    before its old lease expired: it waits that lease out and starts."""
    prefix = _prefix()
    client = EtcdClient(EtcdConfig((etcd_endpoint,), prefix=prefix))
    try:
        # Leases long enough to outlive the new controller's start on a busy machine (2 s did not).
        dead = Leadership(client, "127.0.0.1:1", ttl_s=8, instance="gone:/var/lib/c")
        client.call(dead.campaign(), 30)
        client.loop.call_soon_threadsafe(dead._keepalive.cancel)  # type: ignore[union-attr]  # it died
        auth, _ = cluster_tokens(tmp_path)
        e = start_controller(tmp_path / "e", "--store", "etcd", "--etcd-endpoints", etcd_endpoint, "--etcd-prefix",
                             prefix, "--etcd-lease-ttl", "8", "--advertise", "127.0.0.1:1", "--checkpoint-root",
                             str(tmp_path / "ckpt"), *auth)
        try:
            assert e.wait_event("advertise_in_use_waiting", 8)["leader_instance"] == "gone:/var/lib/c"
            e.wait_event("controller_leading", 30)
        finally:
            e.stop()
    finally:
        client.close()
