"""The worker supervisor with real child processes (`{python} -c ...`, each under its keeper).

Run as root, the workers run as nobody: in a folder every user can reach (`worker_dir`), with an
interpreter nobody can run (tests/workerenv.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tessera.nodeagent import process
from tessera.nodeagent.errors import FailedPrecondition, InvalidArgument, NotFound
from tessera.nodeagent.supervisor import EXIT_UNKNOWN, REASON_DOWN, Supervisor
from tessera.nodeagent.testing import launch_request, wait_until
from tessera.nodeagent.workers import Attempt, Worker, exit_reason
from tessera.v1 import common_pb2
from tests.workerenv import worker_python

RUNNING = common_pb2.WORKER_STATE_RUNNING
STOPPING = common_pb2.WORKER_STATE_STOPPING
EXITED = common_pb2.WORKER_STATE_EXITED
TIMEOUT = 10.0


def py(code: str) -> list[str]:
    return ["{python}", "-c", textwrap.dedent(code)]


# Waits for SIGTERM after saying it is ready (so the handler is installed before anyone signals it).
WAIT_FOR_TERM = py(
    """
    import signal, sys, pathlib, os
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    pathlib.Path(f"ready-{os.environ['RANK']}").touch()
    signal.pause()
    """
)


# Notes a SIGTERM and goes on: only a SIGKILL ends it.
IGNORES_SIGTERM = py(
    """
    import os, pathlib, signal
    signal.signal(signal.SIGTERM, lambda *a: pathlib.Path("got-sigterm").touch())
    pathlib.Path("ready-0").touch()
    while True:
        signal.pause()
    """
)


def make_supervisor(work_dir: Path, **kw: object) -> Supervisor:
    return Supervisor(
        work_dir, range(4), declared=True, agent_addr="127.0.0.1:5555", poll_interval=0.05,
        worker_python=worker_python(), **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
async def sup(worker_dir: Path) -> AsyncIterator[Supervisor]:
    s = make_supervisor(worker_dir)
    yield s
    await s.shutdown(kill_workers=True, grace=0.0)


def attempt_dir(sup: Supervisor, job: str = "job-1", attempt: int = 1) -> Path:
    return sup.work_dir / "jobs" / job / f"attempt-{attempt}"


async def ready(sup: Supervisor, ranks: int = 1, job: str = "job-1", attempt: int = 1) -> None:
    d = attempt_dir(sup, job, attempt)
    await wait_until(lambda: all((d / f"ready-{r}").exists() for r in range(ranks)), TIMEOUT, "workers ready")


async def test_launch_sets_the_env_contract(worker_dir: Path) -> None:
    sup = Supervisor(
        worker_dir,
        range(4),
        declared=False,
        agent_addr="127.0.0.1:5555",
        base_env={
            **os.environ,
            "OMP_NUM_THREADS": "64",
            "INHERITED_VAR": "yes",
            "NOTIFY_SOCKET": "/run/x",
        },
        poll_interval=0.05,
        omp_threads=3,
        worker_python=worker_python(),
    )
    argv = py(
        """
        import json, os, pathlib
        pathlib.Path(f"env-{os.environ['RANK']}.json").write_text(json.dumps({**os.environ, "CWD": os.getcwd()}))
        """
    )
    req = launch_request(argv=argv, gpus=[[0, 1], [3]], env={"JOB_VAR": "x"}, rendezvous="10.1.2.3:29401")
    started, statuses = await sup.launch(req)
    assert started and [s.rank for s in statuses] == [0, 1] and all(s.pid > 0 for s in statuses)
    assert await sup.wait_exited("job-1", 1, TIMEOUT)
    d = attempt_dir(sup)
    env0 = json.loads((d / "env-0.json").read_text())
    env1 = json.loads((d / "env-1.json").read_text())
    assert env0["CWD"] == str(d)
    assert (env0["CUDA_VISIBLE_DEVICES"], env1["CUDA_VISIBLE_DEVICES"]) == ("0,1", "3")
    assert (env0["RANK"], env1["RANK"], env1["LOCAL_RANK"], env1["WORLD_SIZE"], env1["LOCAL_WORLD_SIZE"]) == (
        "0",
        "1",
        "1",
        "2",
        "2",
    )
    assert (env1["MASTER_ADDR"], env1["MASTER_PORT"]) == ("10.1.2.3", "29401")
    assert env1["TESSERA_JOB_ID"] == "job-1" and env1["TESSERA_ATTEMPT"] == "1"
    assert env1["TESSERA_AGENT_ADDR"] == "127.0.0.1:5555"
    assert env1["TESSERA_INVENTORY_SOURCE"] == "nvml"
    assert env1["TESSERA_CHECKPOINT_DIR"] == str(worker_dir / "jobs" / "job-1" / "checkpoints")
    assert json.loads(env1["TESSERA_PLAN"])["dp"] == 2
    assert env1["JOB_VAR"] == "x" and env1["INHERITED_VAR"] == "yes" and "NOTIFY_SOCKET" not in env1
    assert env1["PATH"] == os.environ["PATH"]
    assert env0["OMP_NUM_THREADS"] == env1["OMP_NUM_THREADS"] == "3"
    assert [(s.state, s.exit_code) for s in sup.statuses()] == [(EXITED, 0), (EXITED, 0)]


def test_default_omp_threads_share_the_usable_cpus_per_gpu(tmp_path: Path) -> None:
    cpus = len(os.sched_getaffinity(0))
    assert Supervisor(tmp_path, range(4), declared=True).omp_threads == max(1, cpus // 4)
    assert Supervisor(tmp_path, [], declared=True).omp_threads == cpus


async def test_declared_node_gets_empty_cuda_visible_devices(sup: Supervisor) -> None:
    argv = py("import os, pathlib; pathlib.Path('cvd').write_text(repr(os.environ['CUDA_VISIBLE_DEVICES']))")
    await sup.launch(launch_request(argv=argv, gpus=[[2]]))
    assert await sup.wait_exited("job-1", 1, TIMEOUT)
    assert (attempt_dir(sup) / "cvd").read_text() == "''"


async def test_python_placeholder_runs_the_worker_interpreter(sup: Supervisor) -> None:
    argv = ["{python}", "-c", "import sys, pathlib; pathlib.Path('exe').write_text(sys.executable)"]
    await sup.launch(launch_request(argv=argv))
    assert await sup.wait_exited("job-1", 1, TIMEOUT)
    assert (attempt_dir(sup) / "exe").read_text() == worker_python()


async def test_relaunch_of_same_attempt_spawns_nothing(sup: Supervisor) -> None:
    argv = py(
        """
        import os, signal, sys
        with open("starts", "a") as f:  # the status's pid is the keeper's, the worker's parent
            f.write(f"{os.getppid()}\\n")
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
        open(f"ready-{os.environ['RANK']}", "w").close()
        signal.pause()
        """
    )
    req = launch_request(argv=argv, gpus=[[0], [1]])
    # Concurrent duplicates and a later retry: exactly one spawn per rank.
    (s1, w1), (s2, w2) = await asyncio.gather(sup.launch(req), sup.launch(req))
    await ready(sup, ranks=2)
    s3, w3 = await sup.launch(req)
    assert (s1, s2, s3) == (True, False, False)
    assert [w.pid for w in w1] == [w.pid for w in w2] == [w.pid for w in w3]
    await sup.stop("job-1", 1, grace=5.0, wait=True)
    starts = (attempt_dir(sup) / "starts").read_text().split()
    assert sorted(map(int, starts)) == sorted(w.pid for w in w1)
    # Still idempotent after the exit: the answer is the recorded outcome.
    s4, w4 = await sup.launch(req)
    assert not s4 and [w.state for w in w4] == [EXITED, EXITED]


async def test_stop_escalates_to_sigkill_for_a_worker_ignoring_sigterm(sup: Supervisor) -> None:
    await sup.launch(launch_request(argv=IGNORES_SIGTERM))
    await ready(sup)
    statuses = await sup.stop("job-1", 1, grace=0.3, reason="migrate")
    assert [s.state for s in statuses] == [STOPPING]
    assert await sup.wait_exited("job-1", 1, TIMEOUT)
    (st,) = sup.statuses()
    assert (st.state, st.exit_code) == (EXITED, -signal.SIGKILL)
    assert (attempt_dir(sup) / "got-sigterm").exists()
    assert st.reason == ("stopped by controller (migrate); did not exit within the 0.3 s grace after SIGTERM, "
                         "killed by SIGKILL")


async def test_evict_kills_at_once_and_its_reason_comes_first(sup: Supervisor) -> None:
    await sup.launch(launch_request(argv=IGNORES_SIGTERM, checkpoint_dir="/ckpt/job-1"))
    await sup.launch(launch_request(job_id="job-2", argv=WAIT_FOR_TERM, gpus=[[1]]))
    await ready(sup)
    await ready(sup, job="job-2")
    assert sup.live_jobs() == {"job-1": {"/ckpt/job-1"}, "job-2": {""}}
    sup.evict("job-1", "evicted by the agent: over its disk limit")
    await sup.stop("job-1", 1, grace=30.0, reason="cancel")  # the controller's stop after it changes no reason
    assert await sup.wait_exited("job-1", 1, TIMEOUT)
    st = next(s for s in sup.statuses() if s.job_id == "job-1")
    assert (st.exit_code, st.reason) == (-signal.SIGKILL, "evicted by the agent: over its disk limit, killed by SIGKILL")
    assert sup.live_jobs() == {"job-2": {""}}
    state = sup.export_state()
    restored = make_supervisor(sup.work_dir)
    restored.restore({**state, "workers": [w for w in state["workers"] if w["job_id"] == "job-1"]})
    (att,) = restored._attempts.values()
    assert (att.evicted, att.checkpoint_dir) == ("evicted by the agent: over its disk limit", "/ckpt/job-1")


async def test_cooperative_stop_exits_zero(sup: Supervisor) -> None:
    await sup.launch(launch_request(argv=WAIT_FOR_TERM, gpus=[[0], [1]]))
    await ready(sup, ranks=2)
    statuses = await sup.stop("job-1", 0, grace=10.0, reason="cancel", wait=True)
    assert [(s.state, s.exit_code) for s in statuses] == [(EXITED, 0), (EXITED, 0)]
    assert statuses[0].reason == "stopped by controller (cancel), exit code 0"
    # Idempotent: a second stop changes nothing and still answers.
    again = await sup.stop("job-1", 1, grace=10.0)
    assert [(s.state, s.exit_code) for s in again] == [(EXITED, 0), (EXITED, 0)]
    assert await sup.stop("unknown-job", 0, grace=1.0) == []


async def test_exit_codes_are_reported(sup: Supervisor) -> None:
    await sup.launch(launch_request("exit3", argv=py("import sys; sys.exit(3)"), gpus=[[0]]))
    await sup.launch(
        launch_request(
            "killed", argv=py("import os, signal; os.kill(os.getpid(), signal.SIGTERM)"), gpus=[[1]]
        )
    )
    assert await sup.wait_exited("exit3", 1, TIMEOUT) and await sup.wait_exited("killed", 1, TIMEOUT)
    by_job = {s.job_id: s for s in sup.statuses()}
    assert (by_job["exit3"].exit_code, by_job["exit3"].reason) == (3, "exit code 3")
    assert (by_job["killed"].exit_code, by_job["killed"].reason) == (-signal.SIGTERM, "killed by SIGTERM")
    # Exited workers release their GPUs.
    assert sup.held_gpus() == {} and sup.running_count() == 0


async def test_spawn_failure_is_an_exit_127(sup: Supervisor) -> None:
    started, _ = await sup.launch(launch_request(argv=["/nonexistent/trainer", "--x"]))
    assert started  # the keeper started; it reports that the worker could not
    assert await sup.wait_exited("job-1", 1, TIMEOUT)
    (st,) = sup.statuses()
    assert (st.state, st.exit_code) == (EXITED, 127)
    assert st.reason.startswith("spawn failed: ") and "/nonexistent/trainer" in st.reason
    _, data = sup.read_log("job-1", 1, 0, 0)
    assert b"spawn failed" in data
    assert sup.held_gpus() == {}


async def test_gpu_held_by_another_attempt_is_refused(sup: Supervisor) -> None:
    await sup.launch(launch_request("a", argv=WAIT_FOR_TERM, gpus=[[0, 1]]))
    with pytest.raises(FailedPrecondition, match="GPU 1 is held by job a attempt 1"):
        await sup.launch(launch_request("b", argv=["true"], gpus=[[2], [1]]))
    await ready(sup, job="a")
    await sup.stop("a", 1, grace=5.0, wait=True)
    started, _ = await sup.launch(launch_request("b", argv=["true"], gpus=[[2], [1]]))
    assert started


async def test_invalid_launches_are_rejected(sup: Supervisor) -> None:
    with pytest.raises(InvalidArgument, match=r"^env\.RANK: is set by the agent"):
        await sup.launch(launch_request(env={"RANK": "3"}))
    with pytest.raises(InvalidArgument, match=r"^job_id: "):
        await sup.launch(launch_request(job_id="../../etc"))
    with pytest.raises(InvalidArgument, match=r"^ranks\[0\]\.gpu_indices: GPU 9 does not exist"):
        await sup.launch(launch_request(gpus=[[9]]))
    assert sup.statuses() == []


async def test_older_or_stopped_attempts_are_refused(sup: Supervisor) -> None:
    await sup.launch(launch_request(attempt=3, argv=["true"]))
    assert await sup.wait_exited("job-1", 3, TIMEOUT)
    with pytest.raises(FailedPrecondition, match="attempt 2 of job job-1 is not newer than attempt 3"):
        await sup.launch(launch_request(attempt=2, argv=["true"]))
    # A Stop that overtook its Launch still wins.
    await sup.stop("job-1", 4, grace=1.0)
    with pytest.raises(FailedPrecondition, match="attempt 4 of job job-1 was already stopped"):
        await sup.launch(launch_request(attempt=4, argv=["true"]))
    started, _ = await sup.launch(launch_request(attempt=5, argv=["true"]))
    assert started


async def test_read_log_tail(sup: Supervisor) -> None:
    argv = py(
        "import sys; [print(f'line {i:04d}') for i in range(2000)]; print('to stderr', file=sys.stderr)"
    )
    await sup.launch(launch_request(argv=argv, gpus=[[0], [1]]))
    assert await sup.wait_exited("job-1", 1, TIMEOUT)
    await sup.launch(launch_request(attempt=2, argv=py("print('second attempt')")))
    assert await sup.wait_exited("job-1", 2, TIMEOUT)
    path, data = sup.read_log("job-1", 1, 1, 30)
    assert path == str(attempt_dir(sup) / "rank-1.log")
    whole_file = (attempt_dir(sup) / "rank-1.log").read_bytes()
    assert b"line 1999\n" in whole_file and b"to stderr\n" in whole_file  # stdout and stderr, one file
    assert data == whole_file[-30:]
    _, whole = sup.read_log("job-1", 1, 0, 0)
    assert whole.startswith(b"line ") and len(whole) <= 64 * 1024
    path, latest = sup.read_log("job-1", 0, 0, 100)
    assert latest == b"second attempt\n" and path.endswith("attempt-2/rank-0.log")
    with pytest.raises(NotFound):
        sup.read_log("job-1", 1, 7, 100)
    with pytest.raises(NotFound):
        sup.read_log("other-job", 0, 0, 100)
    with pytest.raises(InvalidArgument, match="^tail_bytes: "):
        sup.read_log("job-1", 1, 0, -1)
    with pytest.raises(InvalidArgument, match="^job_id: "):
        sup.read_log("..", 1, 0, 10)
    # From an offset (a follower's read): where the data starts and the log's size come back.
    size = len(whole_file)
    _, chunk, start, total = sup.read_log_chunk("job-1", 1, 1, 20, 100)
    assert (chunk, start, total) == (whole_file[100:120], 100, size)
    assert sup.read_log_chunk("job-1", 1, 1, 20, size + 5)[1:] == (b"", size, size)  # past the end: nothing
    assert sup.read_log_chunk("job-1", 1, 1, 30, None)[1:] == (whole_file[-30:], size - 30, size)
    with pytest.raises(InvalidArgument, match="^offset: "):
        sup.read_log_chunk("job-1", 1, 1, 20, -1)


async def test_read_log_refuses_a_path_outside_the_work_dir(sup: Supervisor, tmp_path: Path) -> None:
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    (outside / "attempt-1").mkdir(parents=True)
    (outside / "attempt-1" / "rank-0.log").write_text("secret")
    (sup.work_dir / "jobs").mkdir()
    (sup.work_dir / "jobs" / "evil").symlink_to(outside)
    with pytest.raises(FailedPrecondition, match="leaves the work dir"):
        sup.read_log("evil", 1, 0, 10)


async def test_progress_is_recorded_and_answers_stop(sup: Supervisor) -> None:
    await sup.launch(launch_request(argv=WAIT_FOR_TERM))
    await ready(sup)
    assert sup.report_progress("job-1", 1, 0, None) == (False, False)  # a report without progress
    assert not sup.statuses()[0].HasField("progress")
    assert sup.report_progress("job-1", 1, 0, common_pb2.Progress(iteration=5, loss=2.5)) == (False, False)
    (st,) = sup.statuses()
    assert (st.progress.iteration, st.progress.loss) == (5, 2.5)
    sup.report_progress("job-1", 1, 0, common_pb2.Progress(iteration=5, step_time_seconds=float("inf")))
    assert sup.statuses()[0].progress.step_time_seconds == 0.0  # the worker's own number: cleared
    assert sup.request_checkpoint("job-1", 1)
    assert sup.report_progress("job-1", 1, 0, common_pb2.Progress(iteration=6, checkpoint_iteration=-1)) == (
        True,
        False,
    )
    assert sup.report_progress("job-1", 1, 0, common_pb2.Progress(iteration=7, checkpoint_iteration=7)) == (
        False,
        False,
    )
    await sup.stop("job-1", 1, grace=10.0, wait=True)
    assert sup.report_progress("job-1", 1, 0, common_pb2.Progress(iteration=8))[1] is True
    with pytest.raises(NotFound):
        sup.report_progress("job-1", 1, 3, common_pb2.Progress())


async def test_leftover_processes_of_an_exited_worker_are_killed(sup: Supervisor) -> None:
    # The worker starts a grandchild in its process group and exits at once.
    argv = py(
        """
        import subprocess, sys, pathlib
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        pathlib.Path("grandchild").write_text(str(child.pid))
        """
    )
    await sup.launch(launch_request(argv=argv))
    assert await sup.wait_exited("job-1", 1, TIMEOUT)
    pid = int((attempt_dir(sup) / "grandchild").read_text())
    await wait_until(lambda: not process.is_alive(pid, None), TIMEOUT, "grandchild killed")


async def test_retention_forgets_old_exits(worker_dir: Path) -> None:
    now = [1000.0]
    sup = make_supervisor(worker_dir, clock=lambda: now[0], retention_seconds=60.0, max_exited=3)
    for job in ("a", "b"):
        await sup.launch(launch_request(job, argv=["true"], gpus=[[0]]))
        assert await sup.wait_exited(job, 1, TIMEOUT)
        now[0] += 10
    assert [s.job_id for s in sup.statuses()] == ["a", "b"]
    now[0] = 1000.0 + 65  # a exited at 1000, b at 1010
    assert [s.job_id for s in sup.statuses()] == ["b"]
    # The record cap drops the oldest finished attempts first (c has two ranks: 1 + 2 = 3 records kept).
    await sup.launch(launch_request("c", argv=["true"], gpus=[[0], [1]]))
    await sup.launch(launch_request("d", argv=["true"], gpus=[[2]]))
    assert await sup.wait_exited("c", 1, TIMEOUT) and await sup.wait_exited("d", 1, TIMEOUT)
    assert sorted({s.job_id for s in sup.statuses()}) == ["c", "d"]


async def test_shutdown_leaves_workers_running_and_a_new_supervisor_readopts_them(worker_dir: Path) -> None:
    first = make_supervisor(worker_dir)
    await first.launch(launch_request(argv=WAIT_FOR_TERM, gpus=[[0], [1]]))
    await ready(first, ranks=2)
    pids = [s.pid for s in first.statuses()]
    assert len(pids) == 2
    await first.shutdown()
    state = first.export_state()
    assert all(process.is_alive(pid, None) for pid in pids)

    second = make_supervisor(worker_dir)
    assert second.restore(state) == 2
    assert [(s.state, s.pid) for s in second.statuses()] == [(RUNNING, pids[0]), (RUNNING, pids[1])]
    with pytest.raises(FailedPrecondition, match="GPU 0 is held"):
        await second.launch(launch_request("other", argv=["true"], gpus=[[0]]))
    statuses = await second.stop("job-1", 1, grace=10.0, reason="cancel", wait=True)
    # Not our children, but their keepers recorded how they ended (finding 7 of issue 13).
    assert [(s.state, s.exit_code) for s in statuses] == [(EXITED, 0)] * 2
    assert statuses[0].reason == "stopped by controller (cancel), exit code 0"
    await second.shutdown()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


async def test_restore_reports_workers_that_died_while_the_agent_was_down(worker_dir: Path) -> None:
    dead_pid = _dead_pid()
    state = {
        "workers": [
            {
                "job_id": "j",
                "attempt": 2,
                "rank": 0,
                "local_rank": 0,
                "gpu_indices": [1],
                "state": int(RUNNING),
                "pid": dead_pid,
                "started": 1,
                "log_path": str(worker_dir / "x.log"),
            },
            {
                "job_id": "j",
                "attempt": 1,
                "rank": 0,
                "state": int(EXITED),
                "exit_code": 4,
                "reason": "exit code 4",
                "exited_at": 1e12,
                "log_path": str(worker_dir / "y.log"),
            },
            {"job_id": "broken"},
        ],
        "launched": {"j": 3},
    }
    sup = make_supervisor(worker_dir)
    assert sup.restore(state) == 0
    got = [(s.attempt, s.state, s.exit_code, s.reason) for s in sup.statuses()]
    assert got == [(1, EXITED, 4, "exit code 4"), (2, EXITED, EXIT_UNKNOWN, REASON_DOWN)]
    # A retried launch of a restored attempt answers with its record; an older unknown one is refused.
    started, (st,) = await sup.launch(launch_request("j", attempt=2, argv=["true"]))
    assert not started and st.exit_code == EXIT_UNKNOWN
    with pytest.raises(FailedPrecondition, match="not newer than attempt 3"):
        await sup.launch(launch_request("j", attempt=3, argv=["true"]))


async def test_shutdown_with_kill_workers_stops_them(sup: Supervisor) -> None:
    await sup.launch(launch_request(argv=WAIT_FOR_TERM))
    await ready(sup)
    await sup.shutdown(kill_workers=True, grace=5.0)
    assert [(s.state, s.exit_code) for s in sup.statuses()] == [(EXITED, 0)]
    with pytest.raises(FailedPrecondition, match="shutting down"):
        await sup.launch(launch_request("late", argv=["true"], gpus=[[3]]))


def test_a_fence_is_named_first_even_when_a_stop_arrives_after_it() -> None:
    # The agent was frozen (SIGSTOP) past its lease: the keeper fenced the worker, and the
    # controller's stop for the now stale attempt reached the agent only when it woke.
    w = Worker("job-1", 1, 0, 0, (), Path("rank-0.log"))
    att = Attempt("job-1", 1, 1, [w], stop_requested=True, stop_reason="stale attempt")
    fenced = "fenced: no lease renewal for 2.6 s"
    assert exit_reason(att, w, -signal.SIGKILL, fenced) == (
        "fenced: no lease renewal for 2.6 s, killed by SIGKILL"
        " (the controller had also asked it to stop: stale attempt)"
    )
    assert exit_reason(att, w, 0) == "stopped by controller (stale attempt), exit code 0"
    w.killed = True
    assert exit_reason(att, w, -signal.SIGKILL) == (
        "stopped by controller (stale attempt); did not exit within the grace period after SIGTERM, killed by SIGKILL"
    )
    att.stop_requested = False
    assert exit_reason(att, w, 0, fenced) == "fenced: no lease renewal for 2.6 s, exit code 0"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root switches users")
async def test_tenant_uids_run_each_tenant_as_its_own_uid(worker_dir: Path) -> None:
    """--tenant-uids: a tenant no --worker-user maps runs as the uid its name derives, and a second
    tenant that meets the first one's uid on this node is refused at Launch."""
    from tessera.nodeagent import users
    from tessera.nodeagent.keeperfiles import FENCE_FILE
    from tessera.nodeagent.keeping import Keepers

    small = (3_000_000_000, 3_000_000_000 + users.MIN_UID_RANGE - 1)
    firsts: dict[int, str] = {}
    for i in range(100_000):  # two tenant names that meet in this range
        name = f"t{i}"
        other = firsts.setdefault(users.derived_uid(name, small), name)
        if other != name:
            break
    umap = users.UserMap(default=users.resolve("nobody", "--x"), uid_range=small)
    s = make_supervisor(worker_dir, keepers=Keepers(worker_dir / FENCE_FILE, users=umap))
    try:
        argv = ["/bin/sh", "-c", "id -u > uid.txt"]
        started, _ = await s.launch(launch_request("j-a", argv=argv, tenant="team-a"))
        assert started
        d = attempt_dir(s, "j-a")
        await wait_until(lambda: s.statuses()[0].state == EXITED, TIMEOUT, "the worker's exit")
        uid = users.derived_uid("team-a", small)
        assert int((d / "uid.txt").read_text()) == uid and d.stat().st_uid == uid
        await s.launch(launch_request("j-1", argv=["true"], gpus=[[1]], tenant=other))
        with pytest.raises(FailedPrecondition, match=f"tenants '{other}' and '{name}' both derive uid"):
            await s.launch(launch_request("j-2", argv=["true"], gpus=[[2]], tenant=name))
    finally:
        await s.shutdown(kill_workers=True, grace=0.0)


def test_a_reported_reason_is_clipped_so_a_full_heartbeat_stays_under_the_controllers_limit() -> None:
    """2,000 exited workers with 4,096-character two-byte reasons made a 16.6 MB heartbeat, over the
    controller's 8 MiB: a worker writing such a reason would cost its node every heartbeat."""
    from tessera.controller.main import API_MESSAGE_BYTES
    from tessera.nodeagent.supervisor import MAX_EXITED_RECORDS
    from tessera.nodeagent.workers import MAX_REPORTED_REASON
    from tessera.v1 import agent_pb2

    long = "\U0001F600" * 5000
    w = Worker("j-aaaaaaaaaaaa", 99, 0, 0, tuple(range(8)), Path("/var/lib/tessera/agent/jobs/j/attempt-99/rank-0.log"),
               state=common_pb2.WORKER_STATE_EXITED, exit_code=-9, reason=long)
    st = w.status()
    assert len(st.reason) == MAX_REPORTED_REASON and st.reason.endswith(" [...]") and w.reason == long
    status = agent_pb2.NodeStatus(node_id="n" * 63, address="h" * 200, workers=[st] * MAX_EXITED_RECORDS)
    assert agent_pb2.HeartbeatRequest(status=status).ByteSize() < API_MESSAGE_BYTES
