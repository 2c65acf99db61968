"""The double-run window after an agent stall (issue 13, finding 4): how long a job's stale attempt
keeps training alongside the attempt that replaced it. Goal: zero.

A real cluster (controller with the test lease of 3 s, two agents with declared GPUs); one job of the
chaos trainer (tests/chaos/steptrainer.py: a step every 0.1 s, each logged with its wall time; like
any custom program it never stops itself when its agent is gone). Once it trains on the first node,
that node's agent is SIGSTOPped for --stall seconds: the controller loses the lease and starts the
job again on the second node while the first node's workers live on. Then SIGCONT, and the job runs
to its end. From the step log:

    overlap_s = last step of the stale attempt - first step of the new attempt   (if > 0)
    gap_s     = first step of the new attempt - last step of the stale attempt   (the margin, if > 0)

also the times from the SIGSTOP to the node UNREACHABLE, to the job's requeue (NODE_LOST), to the
stale attempt's last step and to the new attempt's first step, and checkpoints the stale attempt
wrote after the new one started.

    python bench/double_run.py --runs 3 --stall 20

Prints and writes OUT/double_run.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchio import write_result

from tessera.clients.sdk import Client
from tessera.common.localcluster import REPO, Daemon, kill_strays, start_agent, start_controller, wait_for
from tessera.v1 import common_pb2 as P

STEPTRAINER = REPO / "tests" / "chaos" / "steptrainer.py"
INVENTORIES = REPO / "examples" / "inventories"


def spec(step_log: Path, iterations: int) -> P.JobSpec:
    s = P.JobSpec(name="double-run", model=P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256,
                                                       seq_length=64),
                  global_batch_size=16, iterations=iterations, checkpoint_every=5,
                  entrypoint=["{python}", str(STEPTRAINER)], hint=P.ResourceHint(gpus=1))
    s.env.update({"CHAOS_STEP_LOG": str(step_log), "CHAOS_STEP_SECONDS": "0.1", "TESSERA_AGENT_LOSS_TIMEOUT": "0"})
    return s


def steps(step_log: Path, job_id: str) -> list[dict[str, Any]]:
    path = step_log / f"{job_id}.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def when(event: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(str(event["timestamp"])).timestamp()


def one_run(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    step_log = root / "steps"
    step_log.mkdir(parents=True)
    os.chmod(step_log, 0o1777)
    daemons: list[Daemon] = []
    try:
        ctl = start_controller(root / "state", "--policy", "frenzy")
        daemons.append(ctl)
        a = start_agent(ctl, "node-a", INVENTORIES / "a10-node.yaml", root / "node-a")
        daemons.append(a)
        with Client(ctl.address, token=ctl.token) as c:
            wait_for(lambda: any(n.state == P.NODE_STATE_READY for n in c.nodes()), 30, "node-a READY")
            jid = c.submit(spec(step_log, args.iterations)).id
            c.wait(jid, {"RUNNING"}, timeout=60)
            wait_for(lambda: c.get(jid).progress.checkpoint_iteration >= 5, 60, "a first checkpoint")
            b = start_agent(ctl, "node-b", INVENTORIES / "a40-node.yaml", root / "node-b")
            daemons.append(b)
            wait_for(lambda: sum(n.state == P.NODE_STATE_READY for n in c.nodes()) == 2, 30, "node-b READY")
            stopped_at = time.time()
            a.proc.send_signal(signal.SIGSTOP)
            try:
                time.sleep(args.stall)  # the fault is a duration: the agent stays stopped this long
            finally:
                a.proc.send_signal(signal.SIGCONT)
            done = c.wait(jid, {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=300)
        events = ctl.events()
    finally:
        for d in daemons:
            d.stop()
        kill_strays(root)
    lines = steps(step_log, jid)
    old = [s["t"] for s in lines if s["attempt"] == 1 and s["kind"] == "step"]
    new = [s["t"] for s in lines if s["attempt"] >= 2 and s["kind"] == "step"]
    new_start = min(new) if new else None
    stale_ckpts = [s for s in lines if s["attempt"] == 1 and s["kind"] == "checkpoint"
                   and new_start is not None and s["t"] > new_start]
    lost = [when(e) for e in events if e.get("event") == "job_event" and e.get("kind") == "NODE_LOST"]
    unreachable = [when(e) for e in events if e.get("event") == "node_liveness" and e.get("node_id") == "node-a"
                   and e.get("new") == "NODE_STATE_UNREACHABLE"]

    def since(t: float | None) -> float | None:
        return round(t - stopped_at, 3) if t is not None else None

    overlap = max(old) - new_start if old and new_start is not None else None
    return {
        "job_state": P.JobState.Name(done.state), "attempts": done.attempt,
        "overlap_s": round(max(0.0, overlap), 3) if overlap is not None else None,
        "gap_s": round(max(0.0, -overlap), 3) if overlap is not None else None,
        "stale_steps_after_new_start": sum(t > new_start for t in old) if new_start is not None else None,
        "stale_checkpoints_after_new_start": len(stale_ckpts),
        "after_sigstop_s": {"node_unreachable": since(min(unreachable) if unreachable else None),
                            "job_requeued": since(min(lost) if lost else None),
                            "stale_last_step": since(max(old) if old else None),
                            "new_first_step": since(new_start)},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--stall", type=float, default=20.0, help="seconds the agent stays SIGSTOPped")
    p.add_argument("--iterations", type=int, default=400, help="steps of 0.1 s: the job outlives the stall")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    runs = []
    for i in range(args.runs):
        root = Path(tempfile.mkdtemp(prefix=f"tessera-double-run-{i}-"))
        runs.append(one_run(root, args))
        print(json.dumps(runs[-1]), flush=True)
    overlaps = [r["overlap_s"] for r in runs if r["overlap_s"] is not None]
    result = {
        "runs": runs, "stall_s": args.stall, "lease_s": 3.0,
        "overlap_s": {"max": max(overlaps) if overlaps else None,
                      "median": statistics.median(overlaps) if overlaps else None},
        "goal": "overlap_s.max == 0 (the stale attempt stops before the new one starts)",
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
    }
    write_result(args.out, "double_run.json", result)


if __name__ == "__main__":
    main()
