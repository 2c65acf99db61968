"""The local demo: an estimator, a controller and four agents with declared heterogeneous GPUs on
loopback, the example jobs submitted with tessctl, trained for real on CPU, watched to the end.

    scripts/demo.sh            # set up, then run this
    .venv/bin/python scripts/demo.py [--keep] [--state DIR]

With --keep the cluster stays up after the jobs end (Ctrl-C stops it); the tessctl commands to try
are printed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tessera.clients.sdk import Client
from tessera.common.identity import CONTROLLER
from tessera.common.localcluster import (
    REPO,
    start_agent,
    start_controller,
    start_estimator,
    tessctl,
    use_pki,
    wait_for,
)
from tessera.v1 import common_pb2 as P

NODES = [("node-a100", "a100-node.yaml"), ("node-a40", "a40-node.yaml"), ("node-a10", "a10-node.yaml"),
         ("node-a10b", "a10-node.yaml")]
JOBS = ["tiny", "small", "medium", "wide", "llama-tiny", "moe-tiny", "huge"]
FINAL = {P.JOB_STATE_SUCCEEDED, P.JOB_STATE_FAILED, P.JOB_STATE_CANCELLED}


def show(ctl: str, *args: str) -> None:
    cp = tessctl(ctl, *args, check=False)
    print(f"\n$ tessctl {' '.join(args)}\n{cp.stdout}{cp.stderr}", end="", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state", default=str(REPO / "demo-state"), help="where the demo keeps state and logs")
    p.add_argument("--keep", action="store_true", help="leave the cluster running after the jobs end")
    p.add_argument("--timeout", type=float, default=600, help="seconds to wait for the jobs")
    p.add_argument("--policy", default="crius", help="the controller's scheduling policy (default crius)")
    args = p.parse_args()
    # SIGTERM (kill, a supervisor) stops the daemons too, as Ctrl-C does: by default it ended this
    # process alone and left the estimator, controller and agents running (a live audit).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = Path(args.state).resolve()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    daemons = []
    # Every daemon runs with mTLS from a dev PKI made here (docs/security.md); tessctl finds its
    # CA through TESSERA_CA, which use_pki sets for this process and its children.
    pki = use_pki(root / "pki")
    print(f"dev PKI in {pki.root} (CA {pki.ca_file})")
    try:
        est = start_estimator(root / "estimator.log")
        daemons.append(est)
        print(f"estimator on {est.address} (log {est.log_path})")
        # The controller forwards running jobs' step times to the estimator, but learns only from
        # NVML-probed nodes (docs/operations.md): these declared ones run their workers on CPU.
        ctl = start_controller(root / "controller", "--round-interval", "300", "--lease", "6",
                               "--heartbeat-interval", "1", "--debounce", "0.5", "--inspect-interval", "5",
                               "--policy", args.policy, "--estimator", est.address, fast=False)
        daemons.append(ctl)
        print(f"controller on {ctl.address} (state {root / 'controller'}, log {ctl.log_path})")
        for node_id, inv in NODES:
            a = start_agent(ctl, node_id, REPO / "examples/inventories" / inv, root / node_id)
            daemons.append(a)
            print(f"agent {node_id} on {a.address} with {inv} (declared inventory: no GPU probed, workers on CPU)")
        with Client(ctl.address, token=ctl.token) as c:
            wait_for(lambda: sum(n.state == P.NODE_STATE_READY for n in c.nodes()) == len(NODES), 30, "nodes READY")
            show(ctl.address, "get", "nodes")
            ids = {}
            for name in JOBS:
                out = tessctl(ctl.address, "submit", "-f", str(REPO / "examples/jobs" / f"{name}.yaml"), "-o", "json")
                ids[name] = json.loads(out.stdout)["id"]
                print(f"submitted examples/jobs/{name}.yaml as {ids[name]}")
            t0 = time.monotonic()
            running = [ids[n] for n in JOBS if n != "huge"]
            last = ""
            while time.monotonic() - t0 < args.timeout:
                jobs = {j.id: j for j in c.list()}
                line = "  ".join(f"{j.spec.name}={P.JobState.Name(j.state)[10:]}"
                                 f"({j.progress.iteration}/{j.spec.iterations})" for j in jobs.values())
                if line != last:
                    print(f"[{time.monotonic() - t0:5.1f}s] {line}", flush=True)
                    last = line
                if all(jobs[i].state in FINAL for i in running):
                    break
                time.sleep(1.0)  # a progress display, not synchronisation
            show(ctl.address, "get", "jobs", "-o", "wide")
            show(ctl.address, "describe", "job", ids["wide"])
            show(ctl.address, "describe", "job", ids["huge"])
            show(ctl.address, "logs", ids["tiny"], "--tail", "600")
            inventories = ",".join(str(REPO / "examples/inventories" / inv) for _, inv in NODES)
            show(ctl.address, "estimate", "cells", "-f", str(REPO / "examples/jobs/medium.yaml"), "--cluster",
                 inventories, "--best", "--estimator", est.address, "--tls-dir", str(pki.tls_dir(CONTROLLER)))
            ok = all(c.get(i).state == P.JOB_STATE_SUCCEEDED for i in running)
            huge = c.get(ids["huge"])
            print(f"\n{'OK' if ok else 'NOT OK'}: {sum(c.get(i).state == P.JOB_STATE_SUCCEEDED for i in running)}"
                  f"/{len(running)} jobs SUCCEEDED; huge is {P.JobState.Name(huge.state)[10:]}: {huge.reason}")
            if args.keep:
                creds = root / "controller-credentials.json"  # localcluster keeps the demo's tokens there
                print(f"\ncluster left running; its API needs a token (docs/auth.md). Try:\n"
                      f"  export TESSERA_TOKEN=$(.venv/bin/python -c 'import json; "
                      f"print(json.load(open(\"{creds}\"))[\"admin\"])')\n"
                      f"  .venv/bin/tessctl --controller {ctl.address} --ca {pki.ca_file} get jobs")
                print("Ctrl-C to stop it")
                try:
                    while True:
                        time.sleep(3600)
                except KeyboardInterrupt:
                    pass
            return 0 if ok else 1
    finally:
        for d in reversed(daemons):
            d.stop()


if __name__ == "__main__":
    sys.exit(main())
