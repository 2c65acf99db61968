"""A one-node cluster on a GPU machine: estimator, controller, and an agent that reads its inventory
from NVML (no --inventory); it submits examples/jobs/tiny.yaml and waits for it to end.

    python scripts/gpu_smoke.py [--state DIR] [--timeout 240] [--policy crius]

Runs the daemons through `sys.executable` (so it also works where the package is importable but its
console scripts are not installed). Prints the node, the job's description and its log; exits 0
when the job SUCCEEDED.
"""

from __future__ import annotations

import argparse
import json
import shutil
import stat
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tessera.clients.sdk import Client
from tessera.common import localcluster as lc
from tessera.v1 import common_pb2 as P

FINAL = {P.JOB_STATE_SUCCEEDED, P.JOB_STATE_FAILED, P.JOB_STATE_CANCELLED}
ENTRY_POINTS = {"tessera-controller": "tessera.controller.main", "tessera-agent": "tessera.nodeagent.main",
                "tessera-estimator": "tessera.estimator.service.main", "tessctl": "tessera.clients.tessctl"}


def wrappers(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, module in ENTRY_POINTS.items():
        p = bin_dir / name
        p.write_text(f"#!/bin/sh\nexec {sys.executable} -c "
                     f"'import sys; from {module} import main; sys.exit(main())' \"$@\"\n")
        p.chmod(p.stat().st_mode | stat.S_IEXEC)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", default="/tmp/tessera-gpu-smoke")
    ap.add_argument("--timeout", type=float, default=240.0)
    ap.add_argument("--policy", default="crius", help="the controller's --policy")
    args = ap.parse_args()
    root = Path(args.state)
    shutil.rmtree(root, ignore_errors=True)
    wrappers(root / "bin")
    lc.BIN = root / "bin"
    daemons: list[lc.Daemon] = []
    try:
        est = lc.start_estimator(root / "estimator.log")
        daemons.append(est)
        ctl = lc.start_controller(root / "controller", "--estimator", est.address, "--policy", args.policy)
        daemons.append(ctl)
        daemons.append(lc.start_agent(ctl, "gpu-node", None, root / "gpu-node"))  # NVML inventory
        print(lc.tessctl(ctl.address, "get", "nodes", "-o", "wide").stdout)
        print(lc.tessctl(ctl.address, "describe", "node", "gpu-node").stdout)  # CPUs, host memory, agent version
        out = lc.tessctl(ctl.address, "submit", "-f", str(REPO / "examples/jobs/tiny.yaml"), "-o", "json").stdout
        job = json.loads(out)["id"]
        state = P.JOB_STATE_UNSPECIFIED
        with Client(ctl.address, token=ctl.token) as c:
            t0 = time.monotonic()
            while time.monotonic() - t0 < args.timeout and state not in FINAL:
                state = c.get(job).state
                time.sleep(1.0)  # a poll of a job that takes seconds, not synchronisation between tests
        print(lc.tessctl(ctl.address, "describe", "job", job).stdout)
        print(lc.tessctl(ctl.address, "logs", job, "--tail", "2000").stdout)
        return 0 if state == P.JOB_STATE_SUCCEEDED else 1
    finally:
        for d in reversed(daemons):
            d.stop()


if __name__ == "__main__":
    raise SystemExit(main())
