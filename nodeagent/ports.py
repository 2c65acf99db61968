"""Whether a rendezvous port is already held on this node, checked before rank 0 starts.

The controller chooses rank 0's rendezvous port (controller/launches.py); any process on the node
may bind it first. Then rank 0 fails to bind, and the other ranks, started on their nodes, reach
whatever holds the port: a process of another tenant could act as the rendezvous store and learn,
or feed, what the job's ranks exchange. The agent of rank 0 refuses the Launch instead
(FAILED_PRECONDITION, before any other node launches: the controller launches rank 0's node
first), and the job's next attempt gets another port. A process binding the port between this
check and rank 0's own bind is not caught.
"""

from __future__ import annotations

import errno
import socket


def held(port: int) -> bool:
    """Whether a TCP socket on this host holds `port`: a wildcard bind of it (IPv6 dual-stack, else
    IPv4) fails with EADDRINUSE. SO_REUSEADDR on the probe lets a previous connection's TIME_WAIT
    pass, not a listener."""
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this host
        with s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            try:
                s.bind((host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
                continue  # EADDRNOTAVAIL and the like: try the other family
            return False
    return False
