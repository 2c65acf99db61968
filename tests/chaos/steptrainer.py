"""A light stand-in for a training program (no torch), for the chaos tests and bench/double_run.py.

It behaves like a custom entrypoint: it reports progress and checkpoints through the trainer SDK
(tessera.clients.trainer), but it never stops itself when its agent is gone (the jobs set
TESSERA_AGENT_LOSS_TIMEOUT=0), so only Tessera's fencing can stop a stale copy.

Every step and every checkpoint it completes is appended, with the wall-clock time, to
`$CHAOS_STEP_LOG/<job>.jsonl` (one JSON object per line: job, attempt, rank, pid, kind "step" or
"checkpoint", iteration, t). The chaos invariants read these lines: two attempts of a job training
at once, or a checkpoint written by an attempt after a newer one started, show up there even when
the checkpoint folder no longer holds the evidence.

Run as `{python} /path/to/steptrainer.py` (a path, so the worker needs no PYTHONPATH).
Knobs: CHAOS_STEP_SECONDS (default 0.1) per step.
"""

from __future__ import annotations

import json
import os
import sys
import time

from tessera.clients.trainer import TrainerContext


def _log(path: str, ctx: TrainerContext, kind: str, iteration: int) -> None:
    if not path:
        return
    line = json.dumps({"job": ctx.job_id, "attempt": ctx.attempt, "rank": ctx.rank, "pid": os.getpid(),
                       "kind": kind, "iteration": iteration, "t": time.time()})
    # O_APPEND writes of one short line are atomic between the attempts that share the file.
    fd = os.open(os.path.join(path, f"{ctx.job_id}.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        # The worker's umask must not lock out a later attempt of the job that runs as another uid:
        # the creator opens the file to everyone.
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, 0o666)
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def main() -> int:
    ctx = TrainerContext.from_env()
    ctx.install_signal_handlers()
    step_s = float(os.environ.get("CHAOS_STEP_SECONDS", "0.1"))
    log_dir = os.environ.get("CHAOS_STEP_LOG", "")
    every = max(1, ctx.checkpoint_interval())
    ref = ctx.latest_checkpoint()
    it = ref.iteration if ref is not None else 0
    last_ckpt = it if ref is not None else -1
    print(f"{'resumed from step ' + str(it) if ref else 'fresh start'} attempt={ctx.attempt}", flush=True)
    while True:
        done = it >= ctx.iterations
        if ctx.is_rank0 and it > 0 and it != last_ckpt and (done or ctx.stop_requested or it % every == 0
                                                             or ctx.checkpoint_requested):
            with ctx.checkpoint_writer(it, meta={"attempt": ctx.attempt, "pid": os.getpid()}) as tmp:
                (tmp / "state.json").write_text(json.dumps({"iteration": it, "attempt": ctx.attempt}))
            last_ckpt = it
            ctx.checkpoint_requested = False
            _log(log_dir, ctx, "checkpoint", it)
        if done or ctx.stop_requested:
            break
        t0 = time.monotonic()
        time.sleep(step_s)
        it += 1
        _log(log_dir, ctx, "step", it)
        if ctx.is_rank0:
            ctx.report(it, 1.0 / it, 1.0 / step_s, time.monotonic() - t0, 0, last_ckpt)
    if ctx.is_rank0:
        for _ in range(3):
            if ctx.report(it, 1.0 / max(it, 1), 0.0, step_s, 0, last_ckpt, force=True) or not ctx.agent_addr:
                break
    print(f"{'done' if it >= ctx.iterations else 'stopped'} iteration={it} attempt={ctx.attempt}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
