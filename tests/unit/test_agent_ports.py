"""The agent's check that a rendezvous port is free before rank 0 starts (nodeagent/ports.py)."""

from __future__ import annotations

import socket

from tessera.nodeagent.ports import held


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_listener_on_any_address_holds_the_port() -> None:
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::1")):
        with socket.socket(family) as s:
            s.bind((host, 0))
            s.listen()
            assert held(int(s.getsockname()[1])), (family, host)


def test_a_free_port_and_one_left_in_time_wait_are_not_held() -> None:
    port = _free_port()
    assert not held(port)
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = int(server.getsockname()[1])
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = server.accept()
        conn.close()  # the server side closes first: its end waits in TIME_WAIT
        client.close()
    assert not held(port)
