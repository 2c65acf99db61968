"""The keeper as a real process: the user it runs a worker as, signals, fencing, its exit file.

Run as root (as here and in CI) the worker runs as nobody; as another user, as that user.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tessera.common.localcluster import wait_for
from tessera.nodeagent import keeperfiles, process
from tests.workerenv import worker_python

ROOT = os.geteuid() == 0
NOBODY = ["--uid", "65534", "--gid", "65534"] if ROOT else []
# Ignores SIGTERM, says it is ready, and runs until killed (a custom entrypoint that never stops itself).
STUBBORN = ["/bin/sh", "-c", "trap '' TERM; echo $$ > worker.pid; while :; do sleep 0.1; done"]


def attempt(root: Path) -> Path:
    d = root / "attempt-1"
    d.mkdir(mode=0o700)
    if ROOT:
        os.chown(d, 65534, 65534)
    return d


def start(root: Path, argv: list[str], *extra: str, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    d = root / "attempt-1"
    fd = os.memfd_create("spec")
    os.write(fd, json.dumps({"argv": argv, "env": env or {"PATH": os.defpath}, "cwd": str(cwd or d)}).encode())
    log = open(d / "rank-0.log", "ab+")  # noqa: SIM115 (the keeper holds it; read-write, as the agent opens it)
    try:
        return subprocess.Popen(
            [sys.executable, "-I", "-m", "tessera.nodeagent.keeper", "--spec-fd", str(fd),
             "--exit-file", str(keeperfiles.exit_path(d, 0)), "--fence-file", str(root / "fence.json"),
             "--label", "job/1/0", "--poll", "0.05", *NOBODY, *extra],
            pass_fds=(fd,), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        os.close(fd)
        log.close()


def worker_pid(d: Path) -> int:
    return int(wait_for(lambda: (d / "worker.pid").exists() and (d / "worker.pid").read_text().strip(), 10,
                        "the worker's pid"))


def test_the_worker_runs_unprivileged_and_cannot_read_shadow(worker_dir: Path) -> None:
    d = attempt(worker_dir)
    keeper = start(worker_dir, ["/bin/sh", "-c", "id -u; id -g; echo HOME=$HOME; head -1 /etc/shadow"],
                   env={"PATH": os.defpath, "HOME": str(d)})
    assert keeper.wait(30) == 1  # head's exit status, passed on
    log = (d / "rank-0.log").read_text()
    uid, gid = log.splitlines()[:2]
    assert int(uid) != 0 and int(gid) != 0
    if ROOT:
        assert (uid, gid) == ("65534", "65534")
        assert "cannot open '/etc/shadow' for reading: Permission denied" in log
    assert keeperfiles.read_exit(keeperfiles.exit_path(d, 0)) == (1, "")


def test_sigterm_is_forwarded_and_the_exit_recorded(worker_dir: Path) -> None:
    d = attempt(worker_dir)
    keeper = start(worker_dir, ["/bin/sh", "-c", "trap 'exit 7' TERM; echo $$ > worker.pid; while :; do sleep 0.1; done"])
    pid = worker_pid(d)
    assert os.getpgid(pid) == pid != keeper.pid  # its own process group
    keeper.send_signal(signal.SIGTERM)
    assert keeper.wait(10) == 7
    assert keeperfiles.read_exit(keeperfiles.exit_path(d, 0)) == (7, "")


def test_kill_now_sigkills_the_worker_group(worker_dir: Path) -> None:
    d = attempt(worker_dir)
    keeper = start(worker_dir, STUBBORN)
    pid = worker_pid(d)
    keeper.send_signal(signal.SIGTERM)  # ignored by the worker
    keeper.send_signal(keeperfiles.KILL_NOW)
    assert keeper.wait(10) == 128 + signal.SIGKILL
    assert keeperfiles.read_exit(keeperfiles.exit_path(d, 0)) == (-signal.SIGKILL, "")
    assert not process.is_alive(pid, None)


def test_a_lapsed_fence_stops_the_worker_and_kills_it_after_the_grace(worker_dir: Path) -> None:
    d = attempt(worker_dir)
    fence = worker_dir / keeperfiles.FENCE_FILE
    keeperfiles.write_fence(fence, time.monotonic(), 1.0)
    keeper = start(worker_dir, STUBBORN, "--grace", "0.5")
    pid = worker_pid(d)
    renewed = time.monotonic()
    keeperfiles.write_fence(fence, renewed, 1.0)  # renewals push the deadline
    assert keeper.wait(15) == 128 + signal.SIGKILL
    took = time.monotonic() - renewed
    print(f"fence 1.0 s + grace 0.5 s: the worker was dead {took:.2f} s after the last renewal")
    assert 1.5 <= took < 1.5 + 2.0  # the deadline, the grace, the keeper's poll and this machine's load
    code, reason = keeperfiles.read_exit(keeperfiles.exit_path(d, 0)) or (0, "")
    assert code == -signal.SIGKILL and reason.startswith("fenced: no lease renewal for 1.")
    assert not process.is_alive(pid, None)
    log = (d / "rank-0.log").read_text()
    assert "fenced: no lease renewal" in log and "grace period over; SIGKILL" in log


def test_an_expired_fence_starts_nothing(worker_dir: Path) -> None:
    d = attempt(worker_dir)
    keeperfiles.write_fence(worker_dir / keeperfiles.FENCE_FILE, time.monotonic() - 5, 1.0)
    keeper = start(worker_dir, ["/bin/sh", "-c", "touch started"])
    assert keeper.wait(10) == 127
    assert not (d / "started").exists()
    code, reason = keeperfiles.read_exit(keeperfiles.exit_path(d, 0)) or (0, "")
    assert code == 127 and reason.endswith("before the worker started")


def test_a_killed_keeper_takes_its_worker_with_it(worker_dir: Path) -> None:
    d = attempt(worker_dir)
    keeper = start(worker_dir, STUBBORN)
    pid = worker_pid(d)
    keeper.kill()
    keeper.wait(5)
    wait_for(lambda: not process.is_alive(pid, None), 10, "the worker killed by its parent-death signal")


def test_a_program_that_cannot_start_is_exit_127_with_the_reason(worker_dir: Path) -> None:
    d = attempt(worker_dir)
    assert start(worker_dir, ["/nonexistent/trainer"]).wait(10) == 127
    code, reason = keeperfiles.read_exit(keeperfiles.exit_path(d, 0)) or (0, "")
    assert code == 127 and reason.startswith("spawn failed: cannot run '/nonexistent/trainer'")
    assert "spawn failed" in (d / "rank-0.log").read_text()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"  # a zombie no one reaped yet
    except FileNotFoundError:
        return True


def test_processes_the_worker_left_outside_its_group_end_with_it(worker_dir: Path) -> None:
    """A daemon started with setsid and a fork (its own session, so out of the worker's process
    group) outlived a cancel, unfenced. The keeper is a child subreaper: it inherits such orphans
    and kills them when the worker has exited."""
    d = attempt(worker_dir)
    script = ("setsid -f sh -c 'echo $$ > escaped.pid; exec sleep 300'; "
              "while [ ! -s escaped.pid ]; do sleep 0.05; done; exit 0")
    assert start(worker_dir, ["/bin/sh", "-c", script]).wait(30) == 0
    escaped = int((d / "escaped.pid").read_text())
    assert _gone(escaped)
    assert "killed 1 process(es) the worker left outside its process group" in (d / "rank-0.log").read_text()


def test_the_workdir_is_entered_as_the_worker_user(worker_dir: Path, tmp_path: Path) -> None:
    """Popen's cwd= is entered before the uid change: a job's workdir reached folders its user could
    not (another tenant's checkpoint). The keeper enters it as the worker."""
    d = attempt(worker_dir)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "weights").write_text("someone else's")
    where, why = (private, "Permission denied") if ROOT else (tmp_path / "missing", "No such file or directory")
    assert start(worker_dir, ["/bin/cat", "weights"], cwd=where).wait(10) == 127
    code, reason = keeperfiles.read_exit(keeperfiles.exit_path(d, 0)) or (0, "")
    who = " as uid 65534" if ROOT else ""
    assert (code, reason) == (127, f"spawn failed: cannot enter workdir {where}{who}: {why}")
    assert "someone else's" not in (d / "rank-0.log").read_text()


@pytest.mark.skipif(not ROOT, reason="only root can tell the keeper to switch users")
def test_the_job_environment_never_reaches_the_root_keeper(worker_dir: Path, tmp_path: Path) -> None:
    # LD_PRELOAD in the job's env (an operator allowed it) must act on the worker only: the keeper
    # reads it from its spec, its own environment is the agent's.
    d = attempt(worker_dir)
    env = {"PATH": os.defpath, "LD_PRELOAD": "/nonexistent/hook.so", "PYTHONPATH": str(tmp_path)}
    (tmp_path / "argparse.py").write_text("raise SystemExit('hijacked')\n")
    assert start(worker_dir, ["/bin/sh", "-c", "echo $LD_PRELOAD"], env=env).wait(10) == 0
    log = (d / "rank-0.log").read_text()
    assert "hijacked" not in log and "/nonexistent/hook.so" in log


def test_the_worker_python_runs_as_the_worker_user(worker_dir: Path) -> None:
    d = attempt(worker_dir)
    code = "import os, tessera.clients.trainer; print('uid', os.getuid())"
    assert start(worker_dir, [worker_python(), "-c", code]).wait(60) == 0
    assert ("uid 65534" if ROOT else f"uid {os.getuid()}") in (d / "rank-0.log").read_text()


def test_a_capped_log_keeps_its_newest_part(worker_dir: Path) -> None:
    """A worker (and a child it starts) print 3 MB; with a 256 KiB cap the log holds the note and
    the newest whole lines, ending with the worker's last line, and the exit is the worker's."""
    d = attempt(worker_dir)
    script = "seq 1 200000 | sed 's/^/out /'; (seq 200001 300000 | sed 's/^/child /' >&2); echo done"
    keeper = start(worker_dir, ["/bin/sh", "-c", script], "--log-max-bytes", str(256 * 1024))
    assert keeper.wait(60) == 0
    data = (d / "rank-0.log").read_bytes()
    assert len(data) <= 256 * 1024
    note, *lines = data.decode().splitlines()
    assert note.startswith("tessera-keeper[job/1/0]: this log passed its cap of 262144 bytes;")
    assert lines[-1] == "done"
    assert lines[-2] == "child 300000"
    numbers = [int(ln.split()[1]) for ln in lines[:-1]]
    assert numbers == list(range(numbers[0], 300001))  # nothing lost or torn inside the kept part
    assert keeperfiles.read_exit(keeperfiles.exit_path(d, 0)) == (0, "")


def test_a_capped_log_does_not_hold_up_signals(worker_dir: Path) -> None:
    """A worker that prints without end is still stopped by SIGTERM, its log under the cap."""
    d = attempt(worker_dir)
    keeper = start(worker_dir, ["/bin/sh", "-c", "echo $$ > worker.pid; exec yes 'a long line of output'"],
                   "--log-max-bytes", str(128 * 1024))
    worker_pid(d)
    wait_for(lambda: (d / "rank-0.log").stat().st_size > 64 * 1024, 10, "output in the log")
    keeper.send_signal(signal.SIGTERM)
    assert keeper.wait(10) == 128 + signal.SIGTERM
    assert (d / "rank-0.log").stat().st_size <= 128 * 1024 + 512  # the keeper's own last line may follow


def test_a_log_cap_under_the_minimum_is_a_usage_error(worker_dir: Path) -> None:
    attempt(worker_dir)
    keeper = start(worker_dir, ["/bin/true"], "--log-max-bytes", "100")
    assert keeper.wait(10) == 2
    assert "--log-max-bytes must be 0 (no cap) or at least 65536" in (worker_dir / "attempt-1" / "rank-0.log").read_text()
