"""tessctl says what happened, with the documented exit status (docs/cli.md): a controller never
reached is "cannot reach" (1), never a timeout (124); bad flag values are usage errors (2) in
argparse's words; a repeated request id and a cancel of an ended job are said on stderr; times of
`get tenants -o json` are RFC 3339; a job file's SLO error names its keys; a closed pipe ends logs
with 0."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.clients import output, tessctl, waiting
from tessera.clients.jobfile import JobFileError, parse_job_yaml
from tessera.clients.sdk import ControllerUnreachable, RpcError, SubmitResult
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2 as C

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "examples" / "jobs" / "tiny.yaml")


def _run(argv: list[str], capsys: pytest.CaptureFixture[str], out: io.StringIO | None = None
         ) -> tuple[int, str, str]:
    out = out if out is not None else io.StringIO()
    try:
        rc = tessctl.main(argv, out=out)
    except SystemExit as exc:  # argparse's usage errors
        rc = int(exc.code or 0)
    return rc, out.getvalue(), capsys.readouterr().err


class FakeClient:
    """What the commands under test call, answering from literals; watch_job plays `streams` in turn:
    an exception is a stream that fails, a list a stream of those updates."""

    def __init__(self, targets: tuple[str, ...] = ("10.0.0.1:50051",), streams: list[Any] | None = None,
                 job: C.Job | None = None, created: bool = True, tenants: C.ListTenantsResponse | None = None,
                 logs: list[C.LogLines] | None = None) -> None:
        self.targets = list(targets)
        self.target = self.targets[0]
        self.streams = list(streams or [])
        self.opened = 0
        self.job = job or C.Job(id="j-1", state=P.JOB_STATE_PENDING)
        self.created = created
        self.tenants_resp = tenants or C.ListTenantsResponse()
        self.log_lines = logs or []

    def watch_job(self, job_id: str, timeout: float | None = None) -> Iterator[C.JobUpdate]:
        self.opened += 1
        stream = self.streams.pop(0)
        if isinstance(stream, Exception):
            raise stream
        yield from stream

    def submit_ex(self, spec: P.JobSpec, request_id: str | None = None) -> SubmitResult:
        return SubmitResult(job=self.job, created=self.created)

    def cancel(self, job_id: str, request_id: str | None = None) -> C.Job:
        return self.job

    def nodes(self) -> list[C.Node]:
        return []

    def tenants(self) -> C.ListTenantsResponse:
        return self.tenants_resp

    def stream_logs(self, job_id: str, **_: Any) -> Iterator[C.LogLines]:
        yield from self.log_lines

    def close(self) -> None:
        pass


def _job(job_id: str, state: int) -> C.Job:
    return C.Job(id=job_id, spec=P.JobSpec(name="tiny"), state=state)  # type: ignore[arg-type]


def _use(monkeypatch: pytest.MonkeyPatch, client: FakeClient) -> None:
    monkeypatch.setattr(tessctl, "connect", lambda *_a, **_k: client)


def _refused(target: str) -> ControllerUnreachable:
    return ControllerUnreachable(target, f"failed to connect to all addresses; last error: {target}: Connection refused")


# -- 1. wait: a controller never reached is "cannot reach", 124 only for a job seen --------------------


def test_wait_on_a_controller_never_reached_cannot_reach_it(capsys: pytest.CaptureFixture[str]) -> None:
    """Not 124 ("timed out: job j-x is not ended"): the job was never seen."""
    rc, out, err = _run(["--controller", "127.0.0.1:1", "wait", "j-x", "--timeout", "2s"], capsys)
    assert (rc, out) == (1, "")
    assert err.startswith("tessctl: error: cannot reach controller at 127.0.0.1:1") and err.count("\n") == 1, err


def test_a_controller_not_reached_yet_gets_the_grace_then_cannot_be_reached() -> None:
    """A leader change as `wait` starts: the next address answers. None ever answering is
    "cannot reach" at the deadline, not a timeout of the job."""
    running = C.JobUpdate(job=C.Job(id="j-1", state=P.JOB_STATE_RUNNING))
    done = C.JobUpdate(job=C.Job(id="j-1", state=P.JOB_STATE_SUCCEEDED))
    fake = FakeClient(targets=("a:1", "b:1"), streams=[_refused("a:1"), [running, done]])
    assert waiting.follow_job(fake, "j-1", io.StringIO(), timeout=5) == 0  # type: ignore[arg-type]
    fake = FakeClient(targets=("a:1", "b:1"), streams=[_refused("a:1"), _refused("b:1")] * 10)
    with pytest.raises(ControllerUnreachable):
        waiting.follow_job(fake, "j-1", io.StringIO(), timeout=1)  # type: ignore[arg-type]
    assert fake.opened >= 2


def test_a_silent_controller_is_not_a_timeout_of_the_job(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeClient(streams=[RpcError("DEADLINE_EXCEEDED", "Deadline Exceeded")])
    with pytest.raises(ControllerUnreachable, match="no answer before the --timeout"):
        waiting.follow_job(fake, "j-1", io.StringIO(), timeout=5)  # type: ignore[arg-type]
    running = C.JobUpdate(job=C.Job(id="j-1", state=P.JOB_STATE_RUNNING))
    fake = FakeClient(streams=[_then_fail([running], RpcError("DEADLINE_EXCEEDED", "Deadline Exceeded"))])
    assert waiting.follow_job(fake, "j-1", io.StringIO(), timeout=5) == 124  # type: ignore[arg-type]
    assert capsys.readouterr().err == "tessctl: timed out after 5s: job j-1 is RUNNING\n"


def test_wait_prints_the_last_progress_then_the_end_once_and_no_eta_for_an_ended_job() -> None:
    """Before: the update that ended the job printed its SUCCEEDED event, then the last progress,
    then SUCCEEDED again from the state change; a cancelled job's last line had an ETA."""
    when = 1_700_000_000.0
    clock = time.strftime("%H:%M:%SZ", time.gmtime(when))
    spec = P.JobSpec(iterations=40)
    progress = P.Progress(iteration=40, loss=1.0, step_time_seconds=0.04)
    running = C.JobUpdate(job=C.Job(id="j-1", state=P.JOB_STATE_RUNNING, spec=spec))
    done = C.JobUpdate(job=C.Job(id="j-1", state=P.JOB_STATE_SUCCEEDED, reason="all 2 ranks exited 0", spec=spec,
                                 progress=progress),
                       events=[P.JobEvent(seq=1, time=when, kind="SUCCEEDED", message="all 2 ranks exited 0")])
    out = io.StringIO()
    assert waiting.follow_job(FakeClient(streams=[[running, done]]), "j-1", out, timeout=5) == 0  # type: ignore[arg-type]
    assert out.getvalue().splitlines() == ["j-1 RUNNING", "j-1 progress: 40/40 (100%)  loss 1  25 it/s",
                                           f"{clock} j-1 SUCCEEDED: all 2 ranks exited 0"]
    # A first update carries the job's history: an old PENDING event does not hide the state now.
    history = C.JobUpdate(job=C.Job(id="j-1", state=P.JOB_STATE_PENDING, reason="requeued: node a lost"),
                          events=[P.JobEvent(seq=1, time=when, kind="PENDING", message="submitted"),
                                  P.JobEvent(seq=2, time=when, kind="RUNNING", message="its 1 rank running"),
                                  P.JobEvent(seq=3, time=when, kind="REQUEUED", message="node a lost")])
    ended = C.JobUpdate(job=C.Job(id="j-1", state=P.JOB_STATE_CANCELLED))
    out = io.StringIO()
    assert waiting.follow_job(FakeClient(streams=[[history, ended]]), "j-1", out, timeout=5) == 4  # type: ignore[arg-type]
    assert out.getvalue().splitlines()[-2:] == ["j-1 PENDING: requeued: node a lost", "j-1 CANCELLED"]
    cancelled = C.Job(id="j-1", state=P.JOB_STATE_CANCELLED, spec=P.JobSpec(iterations=3000),
                      progress=P.Progress(iteration=288, step_time_seconds=0.25))
    assert waiting.progress_text(cancelled) == "288/3000 (10%)  4 it/s"
    cancelled.state = P.JOB_STATE_RUNNING
    assert waiting.progress_text(cancelled) == "288/3000 (10%)  4 it/s  ETA 11m18s"


def _then_fail(updates: list[C.JobUpdate], exc: Exception) -> Iterator[C.JobUpdate]:
    yield from updates
    raise exc


# -- 2. bad flag values: exit 2, "argument --X:" ------------------------------------------------------


@pytest.mark.parametrize(("argv", "want"), [
    (["submit", TINY, "--guarantee", "gpus=x"],
     "tessctl: error: argument --guarantee: guarantee.gpus: must be an integer, got 'x' (see 'tessctl submit --help')\n"),
    (["estimate", "stages", "-f", TINY, "--stages", "A6000,Z9"],
     "tessctl: error: argument --stages: --stages[1]: unknown GPU model 'Z9'; known: "),
    (["logs", "j-1", "--rank", "1", "--all-ranks"],
     "tessctl: error: argument --all-ranks: not allowed with argument --rank (see 'tessctl logs --help')\n"),
    (["admin", "token", "create", "--tokens-file", "/nonexistent/tokens.yaml", "--name", "a", "--tenant", "Research",
      "--role", "user"],
     ("tessctl: error: argument --tenant: must match [a-z0-9][a-z0-9-]{0,62}: 'Research' "
      "(see 'tessctl admin token create --help')\n")),
    (["--controller", "localhost", "get", "jobs"],
     ("tessctl: error: argument --controller: 'localhost' has no port: expected host:port, e.g. localhost:50051 "
      "(see 'tessctl --help')\n")),
], ids=["guarantee", "stages", "rank-and-all-ranks", "tenant", "controller"])
def test_a_bad_flag_value_is_a_usage_error(argv: list[str], want: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(argv, capsys)
    assert (rc, out) == (2, "")
    assert err.startswith(want) and err.count("\n") == 1, err


# -- 3. a repeated request id is said on stderr whatever the format -----------------------------------


@pytest.mark.parametrize(("fmt", "stdout"), [
    ("name", "job/j-7\n"), ("yaml", "id: j-7\n"), ("jsonpath={.id}", "j-7\n"), ("table", "j-7"),
], ids=["name", "yaml", "jsonpath", "table"])
def test_a_repeated_request_id_is_said_on_stderr(fmt: str, stdout: str, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    _use(monkeypatch, FakeClient(job=_job("j-7", P.JOB_STATE_PENDING), created=False))
    rc, out, err = _run(["submit", TINY, "--request-id", "abc", "-o", fmt], capsys)
    assert rc == 0 and stdout in out
    assert err == "tessctl: request id seen before: job j-7 was not created again\n"


def test_json_says_it_in_created_alone(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _use(monkeypatch, FakeClient(job=_job("j-7", P.JOB_STATE_PENDING), created=False))
    rc, out, err = _run(["submit", TINY, "--request-id", "abc", "-o", "json"], capsys)
    assert (rc, err) == (0, "") and '"created": false' in out


def test_a_new_job_has_no_notice(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _use(monkeypatch, FakeClient(job=_job("j-7", P.JOB_STATE_PENDING), created=True))
    assert _run(["submit", TINY, "-o", "name"], capsys) == (0, "job/j-7\n", "")


# -- 4. points in time outside Job and Node: RFC 3339 --------------------------------------------------


def test_tenants_loaded_at_is_rfc3339_or_null(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    _use(monkeypatch, FakeClient())
    rc, out, _ = _run(["get", "tenants", "-o", "json"], capsys)
    assert rc == 0 and '"loaded_at": null' in out
    _use(monkeypatch, FakeClient(tenants=C.ListTenantsResponse(file="/etc/t.yaml", loaded_at=1_700_000_000.5)))
    rc, out, _ = _run(["get", "tenants", "-o", "json"], capsys)
    assert rc == 0 and '"loaded_at": "2023-11-14T22:13:20.5Z"' in out


def test_an_slo_deadline_is_a_time_and_its_window_a_duration() -> None:
    job = C.Job(id="j-1", spec=P.JobSpec(slo=P.Slo(deadline=1_700_000_000.0)))
    assert output.to_dict(job)["spec"]["slo"] == {"iterations_within_seconds": 0.0, "deadline": "2023-11-14T22:13:20Z"}
    job.spec.slo.Clear()
    job.spec.slo.iterations_within_seconds = 3600
    assert output.to_dict(job)["spec"]["slo"] == {"iterations_within_seconds": 3600.0, "deadline": None}


# -- 5. a job file's SLO error names the file's keys ---------------------------------------------------

COST_JOB = """name: c
model: {hidden_size: 64, num_layers: 2, num_heads: 4, vocab_size: 256, seq_length: 64}
global_batch_size: 8
iterations: 10
objective: cost
"""


def test_the_cost_objective_without_an_slo_names_the_job_files_keys() -> None:
    with pytest.raises(JobFileError) as err:
        parse_job_yaml(COST_JOB, "job.yaml")
    assert str(err.value) == ("job.yaml line 1: field slo: the cost objective needs exactly one of "
                              "iterations_within and deadline > 0")


# -- 6. cancel of an ended job ----------------------------------------------------------------------------


def test_cancel_of_an_ended_job_says_so(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _use(monkeypatch, FakeClient(job=_job("j-3", P.JOB_STATE_SUCCEEDED)))
    rc, out, err = _run(["cancel", "j-3", "-o", "name"], capsys)
    assert (rc, out, err) == (0, "job/j-3\n", "tessctl: job j-3 had already ended (SUCCEEDED): not cancelled\n")
    _use(monkeypatch, FakeClient(job=_job("j-3", P.JOB_STATE_CANCELLED)))
    assert _run(["cancel", "j-3", "-o", "name"], capsys) == (0, "job/j-3\n", "")


# -- 7. a closed pipe -------------------------------------------------------------------------------------


class ClosedAfterOneWrite(io.StringIO):
    """stdout whose reader went away after the first write (`| head -1`)."""

    def write(self, text: str) -> int:
        if self.getvalue():
            raise BrokenPipeError(32, "Broken pipe")
        return super().write(text)


def test_logs_into_a_closed_pipe_exits_0(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    silenced: list[bool] = []
    monkeypatch.setattr(tessctl, "_silence_stdout", lambda: silenced.append(True))  # not pytest's stdout
    lines = [C.LogLines(rank=0, attempt=1, lines=[b"step 1"]), C.LogLines(rank=0, attempt=1, lines=[b"step 2"])]
    _use(monkeypatch, FakeClient(logs=lines))
    rc, out, err = _run(["logs", "j-1"], capsys, out=ClosedAfterOneWrite())
    assert (rc, out, err, silenced) == (0, "step 1\n", "", [True])
    # wait's status is the job's end, which it did not see: not a success
    running = C.JobUpdate(job=C.Job(id="j-1", state=P.JOB_STATE_RUNNING), events=[
        P.JobEvent(seq=1, time=1.0, kind="PLACED", message="a"), P.JobEvent(seq=2, time=2.0, kind="STARTED")])
    _use(monkeypatch, FakeClient(streams=[[running]]))
    assert _run(["wait", "j-1"], capsys, out=ClosedAfterOneWrite())[0] == 1


def test_wait_prints_event_times_in_utc() -> None:
    # As describe's dates and the forecasts; it printed local time, unmarked.
    done = C.JobUpdate(job=C.Job(id="j-1", state=P.JOB_STATE_SUCCEEDED), events=[
        P.JobEvent(seq=1, time=1_700_000_003.0, kind="SUCCEEDED", message="all 2 ranks exited 0")])
    out = io.StringIO()
    assert waiting.follow_job(FakeClient(streams=[[done]]), "j-1", out, timeout=5) == 0  # type: ignore[arg-type]
    assert out.getvalue().splitlines()[0] == "22:13:23Z j-1 SUCCEEDED: all 2 ranks exited 0"
