"""What a job of an unchanged training script is told (docs/opaque-jobs.md, a live audit of such
scripts): a torchrun job's failure names its node rank and the global rank torchrun found at fault,
with that rank's error line (not torchrun's `====` summary border); its processes are launchers, not
ranks; a script that reports no progress is not "training"; a rank SIGKILLed after the stop's grace is
said in the STOPPED event. Each test fails on the code before."""

from __future__ import annotations

from tessera.controller.core.snapshot import Slice
from tessera.controller.failure_line import failure_line
from tessera.v1 import common_pb2 as P
from tests.unit.test_engine import Harness, ScriptedMoves

# `python -m torch.distributed.run --nnodes=1 --node-rank=0 --nproc-per-node=2 ... crash.py` with torch
# 2.13.0+cpu, where crash.py's rank 1 raises after init_process_group("gloo") and rank 0 waits in a
# barrier: the log of the one torchrun process, as the agent keeps it.
TORCHRUN_LOG = """
*****************************************
Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. 
*****************************************
rank 0 up
rank 1 up
[rank1]: Traceback (most recent call last):
[rank1]:   File "/tmp/h11/scripttexts/crash.py", line 7, in <module>
[rank1]:     raise ValueError("bad batch shape in rank 1 (simulated)")
[rank1]: ValueError: bad batch shape in rank 1 (simulated)
[rank0]: Traceback (most recent call last):
[rank0]:   File "/tmp/h11/scripttexts/crash.py", line 8, in <module>
[rank0]:     dist.barrier()
[rank0]:   File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83, in wrapper
[rank0]:     return func(*args, **kwargs)
[rank0]:            ^^^^^^^^^^^^^^^^^^^^^
[rank0]:   File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 5356, in barrier
[rank0]:     work.wait()
[rank0]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:5287. This is typically caused by a remote worker crashing. Check the logs of the remote worker before reporting an error. GLHF! 🏖️
W1128 20:40:43.457000 20199 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 20228 closing signal SIGTERM
E1128 20:40:43.472000 20199 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 20229) of binary: /work/main/.venv/bin/python
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "<frozen runpy>", line 88, in _run_code
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367, in wrapper
    return f(*args, **kwargs)
           ^^^^^^^^^^^^^^^^^^
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1028, in main
    run(args)
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1019, in run
    elastic_launch(
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 194, in __call__
    return launch_agent(
           ^^^^^^^^^^^^^
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
crash.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-28_20:40:43
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 20228)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 20228
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-28_20:40:43
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 20229) 
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""
ROOT_CAUSE = "global rank 1: ValueError: bad batch shape in rank 1 (simulated)"


def torchrun_job(name: str, gpus: int = 2) -> P.JobSpec:
    return P.JobSpec(name=name, entrypoint=["crash.py"], launcher=P.Launcher(name="torchrun"),
                     hint=P.ResourceHint(gpus=gpus))


def script(name: str) -> P.JobSpec:
    return P.JobSpec(name=name, entrypoint=["{python}", "train.py"], hint=P.ResourceHint(gpus=1))


def test_the_line_of_a_torchrun_log_is_its_root_causes_error() -> None:
    assert TORCHRUN_LOG.rstrip().endswith("=" * 60)  # what was taken for the reason
    assert failure_line(TORCHRUN_LOG) == ROOT_CAUSE
    # Without the [rankN] prefixes (an error before init_process_group): the error said as the log's, the
    # rank as torchrun's summary names it.
    bare = "\n".join(ln.removeprefix("[rank1]: ").removeprefix("[rank0]: ") for ln in TORCHRUN_LOG.splitlines())
    assert failure_line(bare).startswith("global rank 1 failed first (exitcode 1); the log's last error before "
                                         "torchrun's summary: RuntimeError: ")
    # A program under torch's @record, whose own lines are not in this log (another node's): the
    # summary's traceback field (torch indents its lines by 2) ends with its error.
    recorded = "\n".join(ln for ln in TORCHRUN_LOG.splitlines() if not ln.startswith("[rank1]")).replace(
        "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        'Traceback (most recent call last):\n    File "crash.py", line 7, in <module>\n  ValueError: from @record\n  ')
    assert failure_line(recorded) == "global rank 1: ValueError: from @record"


def test_rules_and_borders_are_not_the_last_line() -> None:
    assert failure_line("step 3\nKeyError: 'x'\n" + "=" * 60 + "\n---- \n\n** **\n") == "KeyError: 'x'"
    assert failure_line("step 3\nRuntimeError: CUDA out of memory\n") == "RuntimeError: CUDA out of memory"
    assert failure_line("=====\n\n") == ""


async def test_a_torchrun_failure_names_its_node_rank_and_the_global_rank_at_fault() -> None:
    """`rank 0: exit code 1; last log line: ====...` named the launcher's index as the rank and
    torchrun's border as the error; its RUNNING event counted the launcher as its 1 rank."""
    h = Harness(nodes=("a",))
    await h.register("a")
    jid = await h.submit(torchrun_job("crash-ddp"))
    await h.round()
    await h.heartbeat("a")
    assert h.state(jid) == "RUNNING"
    assert h.store.events(jid)[-1].message == "its 1 torchrun launcher (2 ranks) running (attempt 1)"
    h.agents.log_lines[(jid, 0)] = TORCHRUN_LOG
    h.agents.exit(jid, 1, code=1)
    await h.heartbeat("a")
    assert h.state(jid) == "FAILED"
    assert h.job(jid).reason == f"attempt 1 failed: node rank 0 (torchrun on a): exit code 1; last log line: {ROOT_CAUSE}"


async def test_a_torchrun_success_counts_launchers_and_ranks() -> None:
    h = Harness(nodes=("a",))
    await h.register("a")
    jid = await h.submit(torchrun_job("ok", gpus=4))
    await h.round()
    await h.heartbeat("a")
    h.agents.exit(jid, 1, code=0)
    await h.heartbeat("a")
    assert h.state(jid) == "SUCCEEDED" and h.job(jid).reason == "its 1 torchrun launcher (4 ranks) exited 0"


async def test_a_script_that_reports_nothing_is_running_not_training() -> None:
    h = Harness(nodes=("a",))
    await h.register("a")
    jid = await h.submit(script("quiet"))
    await h.round()
    await h.heartbeat("a")
    assert h.state(jid) == "RUNNING" and h.job(jid).reason == "running (the program reports no progress)"
    assert h.store.events(jid)[-1].message == "its 1 rank running (attempt 1)"
    # Once the program reports, the inspection that stores its progress says it trains (the
    # no-progress reason stayed for good).
    h.agents.report(jid, h.job(jid).attempt, iteration=3)
    await h.heartbeat("a")
    await h.inspect()
    assert h.job(jid).progress is not None and h.job(jid).progress.iteration == 3
    assert h.job(jid).reason == "training"


async def test_a_rank_killed_after_the_grace_is_said_when_the_job_is_requeued() -> None:
    """A drain's STOPPED read `node a is draining: ...` only; the agent had SIGKILLed a program that
    ignored its SIGTERM, and only its own log said so."""
    h = Harness(nodes=("a", "b"))
    await h.register("a", "b")
    jid = await h.submit(script("deaf"))
    await h.round()
    await h.heartbeat(*h.nodes_of(jid))
    node = h.nodes_of(jid)[0]
    h.agents.stop_exit_code = -9
    await h.engine.drain(node, "maintenance")
    h.check()
    for _, w in h.agents.workers(jid, 1):
        w.reason = (f"stopped by controller (node {node} is draining: maintenance); did not exit within the 10 s "
                    "grace after SIGTERM, killed by SIGKILL")
    await h.heartbeat(node)
    assert h.state(jid) == "PENDING" and h.kinds(jid)[-1] == "STOPPED"
    said = (f"node {node} is draining: maintenance; rank 0 did not exit within the 10 s grace after SIGTERM, "
            "killed by SIGKILL")
    assert h.store.events(jid)[-1].message == said and h.job(jid).reason == f"requeued: {said}"


async def test_an_older_agents_words_for_the_kill_are_said_too() -> None:
    h = Harness(nodes=("a",))
    await h.register("a")
    jid = await h.submit(torchrun_job("deaf-launcher"))
    await h.round()
    await h.heartbeat("a")
    h.agents.stop_exit_code = -9
    await h.engine.drain("a", "maintenance")
    for _, w in h.agents.workers(jid, 1):
        w.reason = "stopped by controller (x), SIGKILL after the grace period, killed by SIGKILL"
    await h.heartbeat("a")
    assert h.store.events(jid)[-1].message == (
        "node a is draining: maintenance; node rank 0 (torchrun on a) did not exit within the grace period after "
        "SIGTERM, killed by SIGKILL")


async def test_a_rank_killed_after_the_grace_is_said_when_the_job_migrates() -> None:
    """A move's MIGRATED read `... (attempt 1 stopped in 12.0s)` only: that the old attempt was
    SIGKILLed (so its checkpoint may be older than its last step) was in the agent's log alone."""
    h = Harness(scripted=True)
    await h.register("a", "b")
    jid = await h.submit(script("deaf-mover"))
    await h.round()
    await h.heartbeat("a", "b")
    h.agents.report(jid, 1, iteration=20)
    assert isinstance(h.policy, ScriptedMoves)
    h.policy.move[jid] = (Slice("b", (2,)),)
    await h.round()
    assert h.state(jid) == "MIGRATING"
    h.agents.stop_exit_code = -9
    for _, w in h.agents.workers(jid, 1):
        w.reason = ("stopped by controller (migrate); did not exit within the 10 s grace after SIGTERM, "
                    "killed by SIGKILL")
    h.clock.advance(12)
    await h.heartbeat("a")
    assert h.state(jid) == "STARTING" and h.kinds(jid)[-1] == "MIGRATED"
    assert h.job(jid).reason.endswith(
        "(attempt 1 stopped in 12.0s; rank 0 did not exit within the 10 s grace after SIGTERM, killed by SIGKILL)")
