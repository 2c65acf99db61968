"""`-o name` where a command's output names no job or node is a bad option value: a usage error,
exit 2 (docs/cli.md, "Errors and exit status"), as `completion` and `simulate` refuse an -o. It
exited 1 (`tessctl whoami -o name`). `undrain` prints its node, so `-o name` gives `node/ID`."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from tessera.clients import tessctl
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2 as C

REPO = Path(__file__).resolve().parents[2]
REFUSAL = "tessctl: error: -o name: this command's output names no job or node (use -o json or yaml)\n"


class FakeClient:
    def whoami(self) -> C.WhoAmIResponse:
        return C.WhoAmIResponse(principal="ops", tenant="default", role="admin")

    def tenants(self) -> C.ListTenantsResponse:
        return C.ListTenantsResponse()

    def undrain(self, node_id: str, request_id: str | None = None) -> C.Node:
        return C.Node(id=node_id, inventory=P.NodeInventory())

    def close(self) -> None:
        pass


def _run(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    monkeypatch.setattr(tessctl, "connect", lambda *_a, **_k: FakeClient())
    out = io.StringIO()
    try:
        rc = tessctl.main(argv, out=out)
    except SystemExit as exc:
        rc = int(exc.code or 0)
    return rc, out.getvalue(), capsys.readouterr().err


@pytest.mark.parametrize("argv", [["whoami"], ["get", "tenants"]], ids=["whoami", "get-tenants"])
def test_o_name_for_output_without_names_is_a_usage_error(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert _run([*argv, "-o", "name"], monkeypatch, capsys) == (2, "", REFUSAL)


def test_a_jsonpath_that_selects_nothing_stays_exit_1(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(["whoami", "-o", "jsonpath={.nope}"], monkeypatch, capsys)
    assert (rc, out) == (1, "") and err.startswith("tessctl: error: jsonpath: .nope: no field 'nope'")


def test_undrain_names_its_node_and_the_docs_say_so(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(["undrain", "gpu-a1", "-o", "name"], monkeypatch, capsys)
    assert (rc, out) == (0, "node/gpu-a1\n")
    text = " ".join((REPO / "docs" / "cli.md").read_text().split())
    (listed,) = re.findall(r"`-o name` prints `job/ID` or `node/ID`, one per line \(([^)]*)\)", text)
    assert "`undrain`" in listed and "exit 2" in listed
