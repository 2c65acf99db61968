"""Prometheus exposition for the daemons."""

from __future__ import annotations

from prometheus_client import start_http_server


def serve(listen: str | None) -> int | None:
    """Serve /metrics on host:port; returns the bound port, or None when listen is empty."""
    if not listen:
        return None
    host, _, port = listen.rpartition(":")
    server, _thread = start_http_server(int(port), addr=host.strip("[]") or "127.0.0.1")
    return int(server.server_port)
