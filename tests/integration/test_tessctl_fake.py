"""tessctl and the SDK against a fake Controller servicer on loopback.

The fake (tests/fake_controller.py) is a small in-memory Controller (real gRPC on 127.0.0.1:0, on its
own event loop thread); tessctl runs as a real subprocess. Synchronisation is on process output
and on the fake's state, never on fixed sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.clients.jobfile import load_job_file
from tessera.clients.sdk import Client, ControllerUnreachable, TesseraError
from tessera.v1 import common_pb2, controller_pb2
from tests.fake_controller import JOBS, FakeController, FakeServer, running_job, seeded

REPO = Path(__file__).resolve().parents[2]
S = common_pb2


@pytest.fixture
def server() -> Iterator[FakeServer]:
    srv = seeded()
    yield srv
    srv.stop()


def tessctl(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "TESSERA_CONTROLLER"}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "tessera.clients.tessctl", *args], cwd=REPO, env=full_env, input=stdin,
        capture_output=True, text=True, timeout=60, check=False,
    )


def ok_json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    return json.loads(proc.stdout)  # the whole stdout is one JSON value


def one_line_error(proc: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("tessctl: error: ")
    assert "Traceback" not in proc.stderr
    return lines[0]


# -- submit -----------------------------------------------------------------------------------------


def test_submit_json_is_one_object_with_id_and_is_idempotent(server: FakeServer) -> None:
    path = str(JOBS / "tiny.yaml")
    out = ok_json(tessctl("--controller", server.address, "submit", "-f", path, "--request-id", "r1", "-o", "json"))
    assert out["id"].startswith("j-")
    assert out["created"] is True
    assert out["state"] == "JOB_STATE_PENDING"
    assert out["spec"]["name"] == "tiny"
    assert out["spec"]["model"]["hidden_size"] == 64
    assert out["spec"]["iterations"] == "40"  # int64: a string in the proto3 JSON mapping
    stored = server.call(lambda f: f.jobs[out["id"]].spec)
    assert stored == load_job_file(path)

    again = ok_json(tessctl("-o", "json", "--controller", server.address, "submit", "-f", path, "--request-id", "r1"))
    assert again["id"] == out["id"]
    assert again["created"] is False


def test_submit_table_and_stdin(server: FakeServer) -> None:
    text = (JOBS / "small.yaml").read_text()
    proc = tessctl("--controller", server.address, "submit", "-f", "-", stdin=text)
    assert proc.returncode == 0, proc.stderr
    header, row = proc.stdout.splitlines()
    assert header.split() == ["ID", "NAME", "TENANT", "STATE", "GPUS", "ITER", "AGE", "REASON"]
    assert row.split()[:6] == [row.split()[0], "small", "research", "PENDING", "-", "0/40"]


def test_submit_bad_file_is_one_line(server: FakeServer, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    tiny = (JOBS / "tiny.yaml").read_text()
    bad.write_text(tiny + "entrypoint: python train.py --fast\n")
    line = one_line_error(tessctl("--controller", server.address, "submit", "-f", str(bad)))
    assert line == (f"tessctl: error: {bad} line {tiny.count(chr(10)) + 1}: field entrypoint: must be a list of "
                    "arguments (argv), not a shell string")
    line = one_line_error(tessctl("--controller", server.address, "submit", "-f", str(tmp_path / "none.yaml")))
    assert "cannot read" in line and "No such file" in line


def test_submit_invalid_argument_from_controller(server: FakeServer, tmp_path: Path) -> None:
    # The fake rejects nothing the job file accepts, so drive INVALID_ARGUMENT through the SDK.
    with Client(server.address) as c, pytest.raises(TesseraError) as err:
        c.submit(common_pb2.JobSpec())
    assert err.value.code == "INVALID_ARGUMENT"
    assert str(err.value) == "INVALID_ARGUMENT: spec.name: required"


# -- get --------------------------------------------------------------------------------------------


def test_get_jobs_json_is_one_value(server: FakeServer) -> None:
    out = ok_json(tessctl("--controller", server.address, "get", "jobs", "-o", "json"))
    assert list(out) == ["jobs"]
    (job,) = out["jobs"]
    assert job["id"] == "j-run"
    assert job["state"] == "JOB_STATE_RUNNING"
    assert job["plan"]["gpu_model"] == "A100-80GB"
    assert job["placement"]["slices"] == [{"node_id": "node-a", "gpu_indices": [0, 1]}]
    assert job["events"] == []  # ListJobs carries no events

    empty = ok_json(tessctl("--controller", server.address, "get", "jobs", "--state", "pending,failed", "-o", "json"))
    assert empty == {"jobs": []}
    assert ok_json(tessctl("--controller", server.address, "-o", "json", "get", "jobs", "--tenant", "x")) == {"jobs": []}
    one = ok_json(tessctl("--controller", server.address, "-o", "json", "get", "job", "j-run", "--state", "RUNNING"))
    assert [j["id"] for j in one["jobs"]] == ["j-run"]


def test_get_jobs_table_and_wide(server: FakeServer) -> None:
    proc = tessctl("--controller", server.address, "get", "jobs")
    assert proc.returncode == 0, proc.stderr
    header, row = proc.stdout.splitlines()
    assert header.split() == ["ID", "NAME", "TENANT", "STATE", "GPUS", "ITER", "AGE", "REASON"]
    cells = row.split()
    assert cells[:6] == ["j-run", "tiny", "default", "RUNNING", "2xA100-80GB", "10/40"]

    proc = tessctl("-o", "wide", "--controller", server.address, "get", "jobs")
    header, row = proc.stdout.splitlines()
    assert header.split() == ["ID", "NAME", "TENANT", "STATE", "GPUS", "ITER", "AGE", "PLAN(dp/tp/pp/mb/ga)",
                              "NODES", "ATTEMPT", "LOSS", "START~", "END~", "REASON"]
    assert row.split()[7:11] == ["2/1/1/4/2", "node-a", "1", "2.5"]


def test_get_jobs_empty_table_says_so(server: FakeServer) -> None:
    proc = tessctl("--controller", server.address, "get", "jobs", "--state", "failed")
    assert proc.returncode == 0
    assert proc.stdout == ""
    assert proc.stderr.strip() == "No jobs found."


def test_get_nodes_json_and_table(server: FakeServer) -> None:
    out = ok_json(tessctl("--controller", server.address, "get", "nodes", "-o", "json"))
    assert [n["id"] for n in out["nodes"]] == ["node-a", "node-b"]
    assert out["nodes"][0]["inventory"]["source"] == "INVENTORY_SOURCE_DECLARED"
    assert out["nodes"][0]["busy_gpus"] == [0, 1]

    proc = tessctl("--controller", server.address, "get", "nodes")
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["NAME", "STATE", "GPUS", "FREE", "SOURCE", "HEARTBEAT", "ADDRESS"]
    a = lines[1].split()
    assert a[:5] == ["node-a", "READY", "4xA100-80GB", "2", "declared"]
    assert a[-1] == "10.0.0.1:50052"
    assert lines[2].split()[:5] == ["node-b", "READY", "2xA40-48GB", "2", "nvml"]

    proc = tessctl("--controller", server.address, "get", "nodes", "node-b", "-o", "wide")
    header, row = proc.stdout.splitlines()
    assert header.split()[-6:] == ["HOSTNAME", "CPUS", "MEMORY", "ISOLATION", "VERSION", "REASON"]
    assert row.split()[-6:] == ["b", "-", "-", "-", "-", "-"]  # an agent that has not said how it isolates
    line = one_line_error(tessctl("--controller", server.address, "get", "node", "node-z"))
    assert line == "tessctl: error: NOT_FOUND: node node-z not found"


# -- describe ---------------------------------------------------------------------------------------


def test_describe_job_json_includes_events(server: FakeServer) -> None:
    out = ok_json(tessctl("--controller", server.address, "describe", "job", "j-run", "-o", "json"))
    assert out["id"] == "j-run"
    assert [e["kind"] for e in out["events"]] == ["PLACED", "STARTED"]
    assert out["events"][0]["seq"] == "1"
    assert out["reason"] == "placed on 2xA100-80GB: best throughput"


def test_describe_job_table(server: FakeServer) -> None:
    proc = tessctl("--controller", server.address, "describe", "job", "j-run")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "State:" in text and "RUNNING" in text
    assert "Reason:" in text and "best throughput" in text
    assert "Events:" in text and "PLACED" in text and "attempt 1 started" in text
    assert "node-a" in text and "GPUs 0,1" in text


def test_describe_missing_job_is_not_found(server: FakeServer) -> None:
    line = one_line_error(tessctl("--controller", server.address, "describe", "job", "j-404"))
    assert line == "tessctl: error: NOT_FOUND: job j-404 not found"
    line = one_line_error(tessctl("--controller", server.address, "-o", "json", "describe", "job", "j-404"))
    assert line == "tessctl: error: NOT_FOUND: job j-404 not found"


def test_describe_node(server: FakeServer) -> None:
    proc = tessctl("--controller", server.address, "describe", "node", "node-a")
    assert proc.returncode == 0, proc.stderr
    assert "declared" in proc.stdout and "4xA100-80GB (2 free)" in proc.stdout
    assert "j-run" in proc.stdout  # the job placed on it
    out = ok_json(tessctl("--controller", server.address, "describe", "node", "node-a", "-o", "json"))
    assert out["id"] == "node-a" and len(out["inventory"]["gpus"]) == 4
    one_line_error(tessctl("--controller", server.address, "describe", "node", "nope"))


# -- cancel, drain, undrain -------------------------------------------------------------------------


def test_cancel(server: FakeServer) -> None:
    out = ok_json(tessctl("--controller", server.address, "cancel", "j-run", "-o", "json"))
    assert out["state"] == "JOB_STATE_CANCELLED"
    assert server.call(lambda f: f.jobs["j-run"].state) == S.JOB_STATE_CANCELLED
    proc = tessctl("--controller", server.address, "cancel", "j-run")
    assert proc.returncode == 0 and "CANCELLED" in proc.stdout
    line = one_line_error(tessctl("--controller", server.address, "cancel", "j-nope"))
    assert line == "tessctl: error: NOT_FOUND: job j-nope not found"


def test_drain_and_undrain(server: FakeServer) -> None:
    out = ok_json(tessctl("--controller", server.address, "drain", "node-a", "--reason", "disk swap", "-o", "json"))
    assert out["state"] == "NODE_STATE_DRAINING" and out["reason"] == "disk swap"
    proc = tessctl("--controller", server.address, "-o", "wide", "undrain", "node-a")
    assert proc.returncode == 0
    assert proc.stdout.splitlines()[1].split()[:2] == ["node-a", "READY"]
    line = one_line_error(tessctl("--controller", server.address, "drain", "node-z"))
    assert line == "tessctl: error: NOT_FOUND: node node-z not found"


def test_drain_the_agent_did_not_confirm_exits_3(server: FakeServer) -> None:
    """Finding 2: a drain the agent refused used to print DRAINING and exit 0."""
    why = "the agent did not confirm: FAILED_PRECONDITION: stale controller epoch"
    server.call(lambda f: setattr(f, "agent_unconfirmed", why))
    try:
        proc = tessctl("--controller", server.address, "drain", "node-a", "--reason", "r")
        assert proc.returncode == 3
        assert "DRAINING" in proc.stdout  # the controller's own state holds: it places nothing there
        assert proc.stderr.strip() == ("tessctl: warning: node node-a drained in the controller, but not confirmed "
                                       f"by its agent: {why}")
        proc = tessctl("--controller", server.address, "undrain", "node-a", "-o", "json")
        assert proc.returncode == 3 and json.loads(proc.stdout)["agent_unconfirmed"] == why
    finally:
        server.call(lambda f: setattr(f, "agent_unconfirmed", ""))


# -- logs -------------------------------------------------------------------------------------------


def test_logs(server: FakeServer) -> None:
    proc = tessctl("--controller", server.address, "logs", "j-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "step 1 loss 5.0\nstep 2 loss 4.0\n"
    proc = tessctl("--controller", server.address, "logs", "j-run", "--tail", "1", "--attempt", "1", "--all-ranks")
    assert proc.stdout == "[rank 0] step 2 loss 4.0\n"  # every rank's log, each line prefixed
    req = server.call(lambda f: f.log_requests[-1])
    assert (req.tail_lines, req.attempt, req.all_ranks) == (1, 1, True)
    out = tessctl("--controller", server.address, "logs", "j-run", "--rank", "0", "-o", "json").stdout
    first = json.loads(out.splitlines()[0])
    assert first == {"rank": 0, "attempt": 1, "node_id": "node-a", "line": "step 1 loss 5.0"}
    line = one_line_error(tessctl("--controller", server.address, "logs", "j-run", "--rank", "3"))
    assert line == "tessctl: error: NOT_FOUND: no log for rank 3 of job j-run"


def test_logs_follow_until_the_job_ends(server: FakeServer) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tessera.clients.tessctl", "--controller", server.address, "logs", "j-run", "-f"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "step 1 loss 5.0\n"
    assert proc.stdout.readline() == "step 2 loss 4.0\n"
    server.call(lambda f: f.logs.__setitem__(("j-run", 0), f.logs[("j-run", 0)] + b"step 3 loss 3.0\n"))
    assert proc.stdout.readline() == "step 3 loss 3.0\n"

    async def finish(f: FakeController) -> None:
        f.logs[("j-run", 0)] += b"step 4 loss 2.0\ndone\n"
        await f.event("j-run", "SUCCEEDED", "finished", state=S.JOB_STATE_SUCCEEDED)

    server.call(finish)
    rest, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert rest == "step 4 loss 2.0\ndone\n"


def _on_a_terminal(*argv: str) -> bytes:
    """tessctl's stdout on a pseudo-terminal, as an admin's shell has it; what the terminal got."""
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "tessera.clients.tessctl", *argv], cwd=REPO, stdout=slave,
                            stderr=subprocess.PIPE)
    os.close(slave)
    got = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        got += chunk
    os.close(master)
    assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
    return got


def test_logs_on_a_terminal_keep_colours_and_show_other_controls(server: FakeServer) -> None:
    """A worker's log is the job's program's output: on an admin's terminal its OSC 52 (clipboard
    write), window title and screen clear are shown, not obeyed; colours stay. --raw, or a pipe,
    gets the bytes as they are (test_logs_follow_until_the_job_ends)."""
    evil = b"\x1b[31mred\x1b[0m \x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;OWNED\x07\x1b[2J done\n"
    server.call(lambda f: f.logs.__setitem__(("j-run", 0), evil))
    shown = _on_a_terminal("--controller", server.address, "logs", "j-run")
    assert b"\x1b[31mred\x1b[0m" in shown
    assert b"\\x1b]52;c;cm0gLXJmIH4=\\x07\\x1b]0;OWNED\\x07\\x1b[2J done" in shown
    assert b"\x1b]" not in shown and b"\x07" not in shown and b"\x1b[2J" not in shown
    raw = _on_a_terminal("--controller", server.address, "logs", "j-run", "--raw")
    assert b"\x1b]52;c;cm0gLXJmIH4=\x07" in raw


# -- watch ------------------------------------------------------------------------------------------


def test_get_one_job_watch_follows_its_events_until_it_ends(server: FakeServer) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tessera.clients.tessctl", "--controller", server.address, "get", "jobs", "j-run",
         "--watch", "-o", "json"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    first = json.loads(proc.stdout.readline())
    assert first["jobs"][0]["progress"]["iteration"] == "10"

    def progress(job: controller_pb2.Job) -> None:
        job.progress.iteration = 20

    server.call(lambda f: f.event("j-run", "PROGRESS", "iteration 20", mutate=progress))
    second = json.loads(proc.stdout.readline())
    assert second["jobs"][0]["progress"]["iteration"] == "20"
    server.call(lambda f: f.event("j-run", "SUCCEEDED", "done", state=S.JOB_STATE_SUCCEEDED))
    rest, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    last = json.loads(rest.splitlines()[-1])
    assert last["jobs"][0]["state"] == "JOB_STATE_SUCCEEDED"


def test_get_one_job_watch_exits_1_when_the_job_fails(server: FakeServer) -> None:
    """Issue 16: `get jobs ID --watch` exited 0 on a FAILED job."""
    job = running_job()
    job.id = "j-doomed"
    server.call(lambda f: f.add_job(job))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tessera.clients.tessctl", "--controller", server.address, "get", "jobs", "j-doomed",
         "--watch", "-o", "json"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    assert json.loads(proc.stdout.readline())["jobs"][0]["state"] == "JOB_STATE_RUNNING"
    server.call(lambda f: f.event("j-doomed", "FAILED", "rank 0: exit code 1", state=S.JOB_STATE_FAILED))
    rest, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    assert json.loads(rest.splitlines()[-1])["jobs"][0]["state"] == "JOB_STATE_FAILED"


def test_get_nodes_watch_prints_changes_and_stops_on_interrupt(server: FakeServer) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tessera.clients.tessctl", "--controller", server.address, "-o", "json", "get", "nodes", "-w"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    first = json.loads(proc.stdout.readline())
    assert first["nodes"][1]["state"] == "NODE_STATE_READY"

    def down(f: FakeController) -> None:
        f.nodes["node-b"].state = S.NODE_STATE_UNREACHABLE

    server.call(down)
    second = json.loads(proc.stdout.readline())
    assert second["nodes"][1]["state"] == "NODE_STATE_UNREACHABLE"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert "Traceback" not in err


# -- errors and options -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_controller() -> None:
    target = f"127.0.0.1:{_free_port()}"
    line = one_line_error(tessctl("--controller", target, "get", "jobs"))
    assert line.startswith(f"tessctl: error: cannot reach controller at {target}")
    line = one_line_error(tessctl("get", "nodes", "-o", "json", env={"TESSERA_CONTROLLER": target}))
    assert line.startswith(f"tessctl: error: cannot reach controller at {target}")
    with Client(target, timeout=5) as c, pytest.raises(ControllerUnreachable) as err:
        c.nodes()
    assert err.value.code == "UNAVAILABLE" and err.value.target == target


def test_controller_from_environment(server: FakeServer) -> None:
    out = ok_json(tessctl("get", "jobs", "-o", "json", env={"TESSERA_CONTROLLER": server.address}))
    assert [j["id"] for j in out["jobs"]] == ["j-run"]


@pytest.mark.parametrize(
    "args",
    [
        ["get", "pods"],
        ["-o", "xml", "get", "jobs"],
        ["get", "jobs", "-o", "jsonpath={.jobs"],
        ["submit"],
        ["logs"],
        ["logs", "j-1", "--rank", "-1"],
        ["get", "jobs", "--state", "bogus"],
        ["frobnicate"],
        [],
        ["estimate"],
    ],
)
def test_usage_errors_exit_2_with_one_line(server: FakeServer, args: list[str]) -> None:
    proc = tessctl("--controller", server.address, *args)
    one_line_error(proc, code=2)


def test_version_and_console_script() -> None:
    script = Path(sys.executable).parent / "tessctl"
    if not script.exists():
        pytest.skip("the tessctl console script is not installed in this environment")
    proc = subprocess.run([str(script), "version", "--client"], capture_output=True, text=True, timeout=60,
                          check=True)
    assert proc.stdout.startswith("Client: tessctl ")
    proc = subprocess.run([str(script), "version", "--client", "-o", "json"], capture_output=True, text=True,
                          timeout=60, check=True)
    assert json.loads(proc.stdout)["client"]["component"] == "tessctl"


# -- SDK ----------------------------------------------------------------------------------------------


def test_sdk_submit_get_list_cancel(server: FakeServer) -> None:
    spec = load_job_file(JOBS / "medium.yaml")
    with Client(server.address) as c:
        res = c.submit_ex(spec, request_id="abc")
        assert res.created and res.job.spec == spec
        assert c.submit(spec, request_id="abc").id == res.job.id
        assert c.get(res.job.id, with_events=True).events[0].kind == "SUBMITTED"
        assert {j.id for j in c.list()} == {"j-run", res.job.id}
        assert [j.id for j in c.list(states=["pending"])] == [res.job.id]
        assert [j.id for j in c.list(states=[S.JOB_STATE_RUNNING], tenant="default")] == ["j-run"]
        assert c.cancel(res.job.id).state == S.JOB_STATE_CANCELLED
        with pytest.raises(TesseraError) as err:
            c.get("j-missing")
        assert err.value.code == "NOT_FOUND" and err.value.message == "job j-missing not found"
        assert [n.id for n in c.nodes()] == ["node-a", "node-b"]
        assert c.node("node-b").inventory.source == S.INVENTORY_SOURCE_NVML
        assert c.drain("node-b", reason="r").state == S.NODE_STATE_DRAINING
        assert c.undrain("node-b").state == S.NODE_STATE_READY
        assert c.logs("j-run", tail_bytes=5).data == b" 4.0\n"


def test_sdk_watch_replays_after_seq(server: FakeServer) -> None:
    with Client(server.address) as c:
        server.call(lambda f: f.event("j-run", "SUCCEEDED", "done", state=S.JOB_STATE_SUCCEEDED))
        assert [e.kind for e in c.watch("j-run")] == ["PLACED", "STARTED", "SUCCEEDED"]
        assert [e.kind for e in c.watch("j-run", after_seq=2)] == ["SUCCEEDED"]


def test_sdk_wait_is_driven_by_events(server: FakeServer) -> None:
    with Client(server.address) as c:
        result: dict[str, Any] = {}

        def waiter() -> None:
            try:
                result["job"] = c.wait("j-run", {"SUCCEEDED"}, timeout=30)
            except (TesseraError, ValueError) as exc:  # reported through result
                result["error"] = exc

        t = threading.Thread(target=waiter)
        t.start()
        # A PROGRESS event does not end the wait; SUCCEEDED does.
        server.call(lambda f: f.event("j-run", "PROGRESS", "iteration 30"))
        server.call(lambda f: f.event("j-run", "SUCCEEDED", "done", state=S.JOB_STATE_SUCCEEDED))
        t.join(timeout=30)
        assert "error" not in result, result
        assert result["job"].state == S.JOB_STATE_SUCCEEDED
        # Already there: returns at once.
        assert c.wait("j-run", ["succeeded"], timeout=5).state == S.JOB_STATE_SUCCEEDED


def test_sdk_wait_errors(server: FakeServer) -> None:
    with Client(server.address) as c:
        with pytest.raises(TesseraError) as err:
            c.wait("j-run", {"SUCCEEDED"}, timeout=0.5)
        assert err.value.code == "DEADLINE_EXCEEDED"
        server.call(lambda f: f.event("j-run", "FAILED", "exit 1", state=S.JOB_STATE_FAILED))
        with pytest.raises(TesseraError) as err:
            c.wait("j-run", {"SUCCEEDED"}, timeout=5)
        assert err.value.code == "FAILED_PRECONDITION" and "ended FAILED" in err.value.message
        with pytest.raises(TesseraError) as err:
            c.wait("j-missing", {"SUCCEEDED"}, timeout=5)
        assert err.value.code == "NOT_FOUND"
        with pytest.raises(ValueError, match="unknown job state"):
            c.wait("j-run", {"DONE"}, timeout=5)


def test_unresolvable_controller() -> None:
    line = one_line_error(tessctl("--controller", "nosuchhost.invalid:50051", "get", "jobs"))
    assert line.startswith("tessctl: error: cannot reach controller at nosuchhost.invalid:50051")


# -- what tessctl imports -----------------------------------------------------------------------------

# tessctl's main() in a fresh interpreter, then one last line: its exit status and every module loaded.
_MAIN_THEN_MODULES = ("import json, sys\nfrom tessera.clients.tessctl import main\nrc = main(sys.argv[1:])\n"
                      "print(json.dumps({'rc': rc, 'modules': sorted(sys.modules)}))")


def tessctl_modules(*args: str) -> tuple[int, list[str], subprocess.CompletedProcess[str]]:
    proc = subprocess.run([sys.executable, "-c", _MAIN_THEN_MODULES, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.stdout.strip(), proc.stderr
    last = json.loads(proc.stdout.splitlines()[-1])
    return last["rc"], last["modules"], proc


def _heavy(modules: list[str]) -> list[str]:
    """The controller's and the agent's packages (policies, simulator, engine) and torch."""
    return [m for m in modules
            if m.split(".")[0] == "torch" or m.startswith(("tessera.controller", "tessera.nodeagent"))]


def test_get_jobs_imports_no_policy_simulator_or_torch(server: FakeServer) -> None:
    rc, modules, proc = tessctl_modules("--controller", server.address, "get", "jobs", "-o", "json")
    assert rc == 0 and '"j-run"' in proc.stdout, proc.stderr
    assert "tessera.clients.tessctl" in modules and "grpc" in modules  # the list is the real one
    assert _heavy(modules) == []


def test_simulate_runs_the_simulator_as_a_process(tmp_path: Path) -> None:
    # --help and the simulator's own errors come from the child, under tessctl's name; this process
    # imports none of the simulator.
    rc, modules, proc = tessctl_modules("simulate", "--help")
    assert rc == 0 and "usage: tessctl simulate" in proc.stdout and "--policies" in proc.stdout, proc.stderr
    assert _heavy(modules) == []
    rc, modules, proc = tessctl_modules("simulate", "--trace", "arena-pai", "--cluster", "nope",
                                        "--out", str(tmp_path / "out"))
    assert rc == 2 and proc.stderr.startswith("tessctl simulate: error: ") and "unknown cluster 'nope'" in proc.stderr
    assert _heavy(modules) == []
    rc, _, proc = tessctl_modules("simulate", "--out", str(tmp_path / "out"))
    assert rc == 2 and "the following arguments are required: --trace" in proc.stderr
