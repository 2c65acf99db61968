"""What the chaos tests share: jobs that run the light chaos trainer (tests/chaos/steptrainer.py),
the cluster's invariant checker, and the guard that makes missing root or tools a failure under CI."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tessera.v1 import common_pb2 as P
from tests.chaos.invariants import Checker, step_log_dir
from tests.e2e.cluster import Cluster

STEPTRAINER = str(Path(__file__).resolve().parent / "steptrainer.py")


def chaos_job(name: str, step_log: Path, iterations: int = 30, gpus: int = 1, step_s: float = 0.1,
              checkpoint_every: int = 5) -> P.JobSpec:
    """A job of the chaos trainer. TESSERA_AGENT_LOSS_TIMEOUT=0: like any custom program, it never
    stops itself when its agent is gone; only Tessera's fencing may stop a stale copy."""
    spec = P.JobSpec(name=name, model=P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256,
                                                  seq_length=64),
                     global_batch_size=16, iterations=iterations, checkpoint_every=checkpoint_every,
                     entrypoint=["{python}", STEPTRAINER], hint=P.ResourceHint(gpus=gpus))
    spec.env.update({"CHAOS_STEP_LOG": str(step_log), "CHAOS_STEP_SECONDS": str(step_s),
                     "TESSERA_AGENT_LOSS_TIMEOUT": "0"})
    return spec


def checker(cl: Cluster, submitted: list[str], overlap_bound: float = 0.0) -> Checker:
    return Checker(cl.client, submitted, step_log=step_log_dir(cl.root),
                   checkpoint_root=cl.root / "state" / "checkpoints", agents=list(cl.agents.values()),
                   overlap_bound=overlap_bound)


def require_root_and(*tools: str) -> None:
    """Skip without root or a tool, except under CI=true, where that is a failure: CI must run it."""
    missing = [t for t in tools if shutil.which(t) is None]
    why = "needs root" if os.geteuid() != 0 else (f"needs {', '.join(missing)}" if missing else "")
    if not why:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} (CI=true: scripts/setup.sh installs iproute2 and iptables; CI runs as root)")
    pytest.skip(why)
