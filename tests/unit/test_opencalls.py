"""The count behind the bounds on health, reflection and Info calls (tessera.common.opencalls)."""

from __future__ import annotations

import pytest

from tessera.common.errors import ResourceExhausted
from tessera.common.opencalls import OpenCallBounds, OpenCalls, is_local, peer_host


@pytest.mark.parametrize(("peer", "host"), [
    ("ipv4:10.0.0.5:41234", "ipv4:10.0.0.5"),
    ("ipv6:[::1]:5", "ipv6:[::1]"),
    ("ipv6:%5B::1%5D:41234", "ipv6:%5B::1%5D"),  # as grpcio 1.85 writes an IPv6 peer
    ("ipv6:[fe80::1%eth0]:443", "ipv6:[fe80::1%eth0]"),
    ("unix:/run/tessera/agent.sock", "unix:/run/tessera/agent.sock"),
    ("", ""),
])
def test_peer_host_drops_the_port_only(peer: str, host: str) -> None:
    assert peer_host(peer) == host


def test_each_kind_has_its_own_bound_and_a_host_its_share() -> None:
    calls = OpenCalls(OpenCallBounds(max_unary=3, max_streams=1, per_peer=2))
    calls.take("a", stream=True)
    with pytest.raises(ResourceExhausted, match="limit of 1 open streams"):
        calls.take("b", stream=True)
    calls.take("b", stream=False)  # short calls are counted apart from streams
    calls.take("a", stream=False)
    with pytest.raises(ResourceExhausted, match="a already has 2 calls"):
        calls.take("a", stream=False)
    calls.take("c", stream=False)
    with pytest.raises(ResourceExhausted, match="limit of 3 short calls"):
        calls.take("d", stream=False)
    assert (calls.unary, calls.streams, dict(calls.by_peer)) == (3, 1, {"a": 2, "b": 1, "c": 1})


def test_a_refused_call_counts_nothing_and_an_ended_one_frees_its_place() -> None:
    calls = OpenCalls(OpenCallBounds(max_unary=1, max_streams=1, per_peer=1))
    calls.take("a", stream=False)
    with pytest.raises(ResourceExhausted):
        calls.take("a", stream=True)
    assert (calls.unary, calls.streams, dict(calls.by_peer)) == (1, 0, {"a": 1})
    calls.give("a", stream=False)
    assert (calls.unary, calls.streams, dict(calls.by_peer)) == (0, 0, {})
    calls.take("a", stream=True)
    assert (calls.unary, calls.streams, dict(calls.by_peer)) == (0, 1, {"a": 1})


@pytest.mark.parametrize(("host", "local"), [
    ("ipv4:127.0.0.1", True), ("ipv4:127.3.2.1", True), ("ipv6:%5B::1%5D", True), ("ipv6:[::1]", True),
    ("ipv6:%5B::ffff:127.0.0.1%5D", True), ("unix:/run/tessera/agent.sock", True),
    ("ipv4:10.0.0.5", False), ("ipv6:[fe80::1%eth0]", False), ("ipv6:%5B::ffff:10.0.0.5%5D", False),
    ("ipv4:not-an-address", False), ("", False),
])
def test_local_peers_are_loopback_and_unix_sockets(host: str, local: bool) -> None:
    assert is_local(host) is local


def test_remote_hosts_holding_every_place_leave_local_probes_their_reserve() -> None:
    """Before: 4 remote hosts x 16 held all 64 short-call places, and a local health probe (systemd,
    a node's monitor) was refused with them."""
    calls = OpenCalls(OpenCallBounds(max_unary=4, max_streams=1, per_peer=2, local_reserve=2))
    for host in ("ipv4:10.0.0.1", "ipv4:10.0.0.1", "ipv4:10.0.0.2", "ipv4:10.0.0.2"):
        calls.take(host, stream=False)
    with pytest.raises(ResourceExhausted, match="limit of 4 short calls"):
        calls.take("ipv4:10.0.0.3", stream=False)
    calls.take("ipv4:127.0.0.1", stream=False)
    calls.take("unix:/run/tessera/agent.sock", stream=False)
    with pytest.raises(ResourceExhausted, match="limit of 4 short calls"):  # the reserve is bounded too
        calls.take("ipv6:[::1]", stream=False)
