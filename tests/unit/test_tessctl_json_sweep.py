"""Every tessctl command, found by walking its argparse tree, either prints JSON with `-o json` or
refuses any -o but table with a usage error (exit 2) saying why (docs/cli.md, "JSON (-o json)").

Before: `config use-context NAME -o json` printed its sentence and `completion bash -o json` its
script, exit 0, and `tessctl -o json simulate ...` the simulator's table. A command added later
fails `test_every_command_is_classified` until it is put in one of the tables below.
"""

from __future__ import annotations

import argparse
import builtins
import io
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.clients import tessctl
from tessera.clients.sdk import SubmitResult
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2 as C

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "examples" / "jobs" / "tiny.yaml")
A100_NODE = str(REPO / "examples" / "inventories" / "a100-node.yaml")
CLI_DOC = REPO / "docs" / "cli.md"

Setup = Callable[[Path], list[str]]


def _files(tmp: Path, **files: str) -> dict[str, str]:
    for name, text in files.items():
        (tmp / name).write_text(text)
    return {name: str(tmp / name) for name in files}


def _plan_cost(tmp: Path) -> list[str]:
    f = _files(tmp, **{"job.yaml": Path(TINY).read_text()
                       + "objective: cost\nslo: {iterations_within: 1h}\n",
                       "prices.yaml": "{A6000: 6, A30: 4}\n", "quota.yaml": "{A6000: 2, A30: 2}\n"})
    return ["-f", f["job.yaml"], "--prices", f["prices.yaml"], "--quota", f["quota.yaml"],
            "--max-stages", "2"]


def _tokens(tmp: Path) -> str:
    path = str(tmp / "tokens.yaml")
    assert tessctl.main(["admin", "token", "create", "--tokens-file", path, "--name", "ci", "--tenant", "t",
                         "--role", "user"], out=io.StringIO()) == 0
    return path


def _pki(tmp: Path) -> str:
    assert tessctl.main(["admin", "pki", "init", "--dir", str(tmp / "pki")], out=io.StringIO()) == 0
    return str(tmp / "pki")


# Each command that prints one JSON object with -o json: the arguments after its name. A controller's
# answers come from StubClient.
JSON: dict[str, Setup] = {
    "submit": lambda tmp: ["-f", TINY],
    "get jobs": lambda tmp: [],
    "get tenants": lambda tmp: [],
    "get nodes": lambda tmp: [],
    "describe job": lambda tmp: ["j-1"],
    "describe node": lambda tmp: ["n1"],
    "cancel": lambda tmp: ["j-1"],
    "drain": lambda tmp: ["n1"],
    "undrain": lambda tmp: ["n1"],
    "delete node": lambda tmp: ["n1"],
    "wait": lambda tmp: ["j-1"],
    "whoami": lambda tmp: [],
    "version": lambda tmp: ["--client"],  # the server's half is one more key (test_tessctl_fake)
    "estimate memory": lambda tmp: ["-f", TINY, "--gpu", "A100-80GB"],
    "estimate time": lambda tmp: ["-f", TINY, "--gpu", "A100-80GB"],
    "estimate cells": lambda tmp: ["-f", TINY, "--cluster", A100_NODE],
    "estimate stages": lambda tmp: ["-f", TINY, "--stages", "A6000,A30"],
    "plan-cost": _plan_cost,
    "config view": lambda tmp: [],
    "config get-contexts": lambda tmp: [],
    "config use-context": lambda tmp: ["dev"],
    "admin token create": lambda tmp: ["--tokens-file", str(tmp / "t.yaml"), "--name", "a", "--tenant", "t",
                                       "--role", "user"],
    "admin token list": lambda tmp: ["--tokens-file", _tokens(tmp)],
    "admin token revoke": lambda tmp: ["--tokens-file", _tokens(tmp), "--name", "ci"],
    "admin pki init": lambda tmp: ["--dir", str(tmp / "pki")],
    "admin pki issue": lambda tmp: ["--dir", _pki(tmp), "--controller"],
}
# JSON Lines: one object a line (a stream).
LINES: dict[str, Setup] = {"logs": lambda tmp: ["j-1"]}
# Text by nature: every -o but table is a usage error naming why.
ONE_FORM: dict[str, tuple[Setup, str]] = {
    "completion": (lambda tmp: ["bash"], "prints a shell script to source"),
    "simulate": (lambda tmp: ["--trace", "philly", "--out", str(tmp / "sim")],
                 "its results as JSON are files"),
}


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[str]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(path)
        return
    seen: set[int] = set()
    for name, child in subs[0].choices.items():
        if id(child) not in seen:  # an alias (`get job`) is the same parser again
            seen.add(id(child))
            yield from _leaves(child, (*path, name))


def _job() -> C.Job:
    return C.Job(id="j-1", spec=P.JobSpec(name="tiny", tenant="t"), state=P.JOB_STATE_SUCCEEDED,
                 submit_time=time.time())


def _node() -> C.Node:
    return C.Node(id="n1", state=P.NODE_STATE_READY, last_heartbeat=time.time())


class StubClient:
    """The SDK's Client, answering every call tessctl's commands make from literals."""

    def submit_ex(self, spec: P.JobSpec, request_id: str | None = None) -> SubmitResult:
        return SubmitResult(_job(), True)

    def list(self, **_: Any) -> list[C.Job]:
        return [_job()]

    def get(self, job_id: str, with_events: bool = False) -> C.Job:
        return _job()

    def cancel(self, job_id: str, request_id: str | None = None) -> C.Job:
        return _job()

    def nodes(self) -> builtins.list[C.Node]:  # `list` here is the method above
        return [_node()]

    def node(self, node_id: str) -> C.Node:
        return _node()

    def drain(self, node_id: str, reason: str = "", request_id: str | None = None) -> C.Node:
        return _node()

    undrain = drain

    def remove_node(self, node_id: str, force: bool = False, request_id: str | None = None) -> bool:
        return True

    def tenants(self) -> C.ListTenantsResponse:
        return C.ListTenantsResponse(tenants=[C.Tenant(name="t")])

    def whoami(self) -> C.WhoAmIResponse:
        return C.WhoAmIResponse(principal="ci", tenant="t", role="user")

    def watch_job(self, job_id: str, timeout: float | None = None) -> Iterator[C.JobUpdate]:
        yield C.JobUpdate(job=_job())

    def stream_logs(self, job_id: str, **_: Any) -> Iterator[C.LogLines]:
        yield C.LogLines(rank=0, attempt=1, node_id="n1", lines=[b"step 1", b"step 2"])

    def close(self) -> None:
        pass


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("current-context: prod\ncontexts:\n  prod: {controller: ctl:50051}\n  dev: {}\n")
    cfg.chmod(0o600)
    monkeypatch.setenv("TESSERA_CONFIG", str(cfg))
    for var in ("TESSERA_CONTROLLER", "TESSERA_TOKEN", "TESSERA_CA"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(tessctl, "connect", lambda *a, **kw: StubClient())
    return tmp_path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    try:
        rc = tessctl.main(argv, out=out)
    except SystemExit as exc:
        rc = int(exc.code or 0)
    return rc, out.getvalue(), capsys.readouterr().err


def test_every_command_is_classified() -> None:
    found = sorted(_leaves(tessctl.build_parser()))
    assert found == sorted([*JSON, *LINES, *ONE_FORM])


@pytest.mark.parametrize("command", sorted(JSON))
def test_json_is_one_object(command: str, env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*command.split(), *JSON[command](env), "-o", "json"]
    rc, out, err = _run(argv, capsys)
    assert rc == 0, err
    assert isinstance(json.loads(out), dict), out  # the whole of stdout: one object


def test_use_context_json(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `current context is now dev (...)` under -o json."""
    rc, out, _ = _run(["config", "use-context", "dev", "-o", "json"], capsys)
    assert rc == 0 and json.loads(out) == {"current-context": "dev", "file": str(env / "config.yaml")}
    rc, out, _ = _run(["config", "use-context", "prod", "-o", "jsonpath={.current-context}"], capsys)
    assert (rc, out) == (0, "prod\n")  # jsonpath: the key, through the one JSON document
    rc, out, _ = _run(["config", "use-context", "dev"], capsys)
    assert (rc, out) == (0, f"current context is now dev ({env / 'config.yaml'})\n")


@pytest.mark.parametrize("command", sorted(LINES))
def test_json_lines(command: str, env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run([*command.split(), *LINES[command](env), "-o", "json"], capsys)
    assert rc == 0, err
    assert [json.loads(line) for line in out.splitlines()] == [
        {"rank": 0, "attempt": 1, "node_id": "n1", "line": "step 1"},
        {"rank": 0, "attempt": 1, "node_id": "n1", "line": "step 2"}]


@pytest.mark.parametrize("command", sorted(ONE_FORM))
@pytest.mark.parametrize("where", ["before", "after"])
@pytest.mark.parametrize("fmt", ["json", "yaml", "wide", "jsonpath={.x}"])
def test_a_text_only_command_refuses_other_forms(command: str, where: str, fmt: str, env: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    setup, why = ONE_FORM[command]
    args = [*command.split(), *setup(env)]
    argv = ["-o", fmt, *args] if where == "before" else [*args, "-o", fmt]
    rc, out, err = _run(argv, capsys)
    assert (rc, out) == (2, "")
    assert err.startswith(f"tessctl: error: argument -o/--output: -o {fmt}: `tessctl {command}` ")
    assert why in err and err.count("\n") == 1
    assert not (env / "sim").exists()  # the simulator did not run


def test_completion_still_prints_its_script(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["completion", "bash"], ["completion", "bash", "-o", "table"]):
        rc, out, _ = _run(argv, capsys)
        assert rc == 0 and "tessctl" in out and not out.lstrip().startswith("{")


def test_the_docs_name_each_commands_json() -> None:
    """docs/cli.md's table of -o json values has a row for each command that has one, and says which
    refuse -o."""
    text = CLI_DOC.read_text()
    table = text[text.index("| command | JSON value |"):]
    table = table[:table.index("\n\n")]
    rows = [line.split("|")[1] for line in table.splitlines()[2:]]
    for command in [*JSON, *LINES, *ONE_FORM]:
        assert any(f"`{command}`" in row or f"`{command} " in row for row in rows), command
