"""Telling builds apart during a rollout (docs/operations.md, "Upgrading"): the version has read 0.1.0
on every build so far, so `get nodes -o wide`'s VERSION and the daemons' --version add the commit
(an upgrade audit could not tell upgraded nodes from the others)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tessera.clients.output import wide_version
from tessera.common.buildinfo import build_info
from tessera.v1 import controller_pb2


def test_the_wide_version_column_names_the_commit() -> None:
    assert wide_version(controller_pb2.Node(agent_version="0.1.0", agent_commit="c093b2db3e22aa")) == "0.1.0+c093b2d"
    assert wide_version(controller_pb2.Node(agent_version="0.1.0")) == "0.1.0"
    assert wide_version(controller_pb2.Node()) == "-"


@pytest.mark.parametrize(("module", "prog"), [("tessera.controller.main", "tessera-controller"),
                                              ("tessera.estimator.service.main", "tessera-estimator"),
                                              ("tessera.nodeagent.main", "tessera-agent")])
def test_every_daemon_says_its_build(module: str, prog: str) -> None:
    out = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=60,
                         check=True).stdout.strip()
    info = build_info()
    want = f"{prog} {info.version}" + (f" (commit {info.git_commit[:12]})" if info.git_commit else "")
    assert out == want


def test_a_call_an_older_controller_does_not_serve_says_so() -> None:
    # tessctl printed gRPC's bare "UNIMPLEMENTED: Method not found!" against an older controller.
    from tessera.clients.sdk import RpcError
    from tessera.clients.tessctl import _retry_hint

    hint = _retry_hint(RpcError("UNIMPLEMENTED", "Method not found!"))
    assert "older than this tessctl" in hint and "tessctl version" in hint
    assert _retry_hint(RpcError("NOT_FOUND", "no job")) == ""
