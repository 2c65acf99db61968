"""Which controller an agent moves to after a standby's answer (nodeagent/controllers.py): the hint
names the leader's advertised client address (host:50051), the agent dials agent ports (host:50054)."""

from __future__ import annotations

import pytest

from tessera.nodeagent.controllers import hinted, split_addresses

AGENT_PORTS = split_addresses("ctl-1:50054,ctl-2:50054,ctl-3:50054")


@pytest.mark.parametrize(("hint", "addresses", "expected"), [
    ("ctl-2:50051", AGENT_PORTS, 1),  # the leader's client port: its host's agent address
    ("ctl-3:50054", AGENT_PORTS, 2),  # an exact match
    ("evil:50051", AGENT_PORTS, None),  # a host not configured: never followed
    (None, AGENT_PORTS, None),
    ("", AGENT_PORTS, None),
    # Controllers sharing a host (loopback tests): the host alone names none of them.
    ("127.0.0.1:6001", ["127.0.0.1:7001", "127.0.0.1:7002"], None),
    ("127.0.0.1:7002", ["127.0.0.1:7001", "127.0.0.1:7002"], 1),
    ("[::1]:50051", ["[::1]:50054", "ctl-2:50054"], 0),
])
def test_the_hint_names_one_configured_controller(hint: str | None, addresses: list[str], expected: int | None) -> None:
    assert hinted(hint, addresses) == expected
