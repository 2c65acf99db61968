"""Untrusted strings printed by tessctl: escape sequences, control characters, bidi overrides and
other invisible characters become visible escapes, in every table, describe and error line."""

from __future__ import annotations

import io
import unicodedata

import pytest

from tessera.clients import output
from tessera.clients.tessctl import _fail
from tessera.v1 import common_pb2 as S
from tessera.v1 import controller_pb2

NOW = 1_700_000_000.0
HOSTILE = "ok\x1b[2J\x1b]0;pwned\x07\u202egpj.exe\u200b\u2066x\u2069\x00\x7f\x9b\ufeff\U000e0041\u2028"


def invisible(text: str) -> list[str]:
    """Characters a terminal would act on or not show."""
    return [c for c in text if unicodedata.category(c) in {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"} and c != "\n"]


@pytest.mark.parametrize("raw, shown", [
    ("plain text-1.0", "plain text-1.0"),
    ("caf\u00e9 \u4e2d\u6587", "caf\u00e9 \u4e2d\u6587"),  # letters of any script are kept
    ("\x1b[31mred", "\\x1b[31mred"),
    ("a\u202eb", "a\\u202eb"),
    ("a\u200bb\ufeff", "a\\u200bb\\ufeff"),
    ("tag\U000e0041", "tag\\U000e0041"),
    ("nul\x00del\x7fcsi\x9b", "nul\\x00del\\x7fcsi\\x9b"),
    ("line\u2028sep", "line\\u2028sep"),
])
def test_safe(raw: str, shown: str) -> None:
    assert output.safe(raw) == shown
    assert output.safe(shown) == shown  # idempotent: escapes are plain text


def test_one_line_joins_whitespace_first() -> None:
    assert output.one_line("a\n\tb  \x1bc") == "a b \\x1bc"


def _job() -> controller_pb2.Job:
    return controller_pb2.Job(
        id="j-1", spec=S.JobSpec(name=HOSTILE, tenant=HOSTILE, entrypoint=["python", HOSTILE], env={"A": HOSTILE},
                                 model=S.ModelSpec(name=HOSTILE)),
        state=S.JOB_STATE_FAILED, reason=HOSTILE, submit_time=NOW - 5,
        plan=S.Plan(dp=1, tp=1, pp=1, gpu_model=HOSTILE),
        placement=S.Placement(slices=[S.NodeSlice(node_id=HOSTILE, gpu_indices=[0])], rendezvous=HOSTILE),
        events=[S.JobEvent(seq=1, job_id="j-1", time=NOW, kind=HOSTILE, message=HOSTILE)])


def _node() -> controller_pb2.Node:
    return controller_pb2.Node(
        id=HOSTILE, address=HOSTILE, state=S.NODE_STATE_READY, reason=HOSTILE,
        inventory=S.NodeInventory(hostname=HOSTILE, gpus=[S.Gpu(index=0, model=HOSTILE, uuid=HOSTILE)]))


@pytest.mark.parametrize("render", [
    lambda: output.jobs_table([_job()], NOW),
    lambda: output.jobs_table([_job()], NOW, wide=True, models={(HOSTILE, 0): HOSTILE}),
    lambda: output.describe_job(_job(), NOW),
    lambda: output.nodes_table([_node()], NOW, wide=True),
    lambda: output.describe_node(_node(), NOW, [_job()]),
    lambda: output.events_table(_job().events, NOW),
], ids=["jobs", "jobs-wide", "describe-job", "nodes-wide", "describe-node", "events"])
def test_every_printed_view_escapes(render: object) -> None:
    text = render()  # type: ignore[operator]
    assert invisible(text) == []
    assert "\\x1b[2J" in text or "\\x1b" in text


def test_error_lines_escape_what_the_server_echoes(capsys: pytest.CaptureFixture[str]) -> None:
    assert _fail(f"INVALID_ARGUMENT: env.{HOSTILE}: invalid name") == 1
    err = capsys.readouterr().err
    assert invisible(err) == [] and err.count("\n") == 1 and "\\u202e" in err


def test_json_is_escaped_by_json() -> None:
    text = output.dumps(output.to_dict(_job()))
    assert invisible(text.replace("\n", "")) == [] and "\\u001b" in text
    out = io.StringIO()
    out.write(output.dumps(output.jobs_json([_job()]), compact=True))
    assert "\u202e" not in out.getvalue()
