"""How long one tenant's burst of large new models holds another tenant's job (controller/warming.py).

A real controller (crius, mTLS, tokens) and 12 declared agents: 8 nodes of 8 x A100-80GB and 4 of
4 x A40-48GB, bench/estimator_bounds.py's cluster (a job's Cells cost more the more nodes and types
there are: about 4 s each here on this machine). bob submits K jobs, each a different model at the job
spec's bounds (an encoder-decoder with the most layers and the largest vocabulary, its vocabulary
one less per job, so no estimate is shared: bench/estimator_bounds.py's slowest case; each asks
for more GPUs than there are, so none runs); then alice
submits a small job. The figure: seconds from alice's submission to her job's PLACED event, with
the controller's --estimate-budget (default 5 s) and without a budget (1e9 s: every new job is
estimated before each round plans, as before the budget).

    .venv/bin/python bench/estimate_burst.py [--jobs 8] [--budget 5] [--out bench/results]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchio import write_result

from tessera.clients.sdk import Client
from tessera.common import jobspec
from tessera.common.localcluster import kill_strays, start_agent, start_controller, wait_for
from tessera.v1 import common_pb2 as P

DIMS = dict(jobspec.MODEL_DIMS)
REFINE = dict(jobspec.MODEL_REFINEMENTS)


def big(i: int) -> P.JobSpec:
    model = P.ModelSpec(hidden_size=64, num_heads=4, seq_length=64, num_layers=DIMS["num_layers"],
                        vocab_size=DIMS["vocab_size"] - i, family=P.MODEL_FAMILY_ENCODER_DECODER,
                        num_decoder_layers=REFINE["num_decoder_layers"])
    # More GPUs than the cluster has: never placed, so no worker of it loads the machine; its Cells
    # are estimated all the same.
    return P.JobSpec(name=f"burst-{i}", model=model, global_batch_size=16, iterations=1,
                     hint=P.ResourceHint(gpus=1024))


def small() -> P.JobSpec:
    return P.JobSpec(name="small", model=P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256,
                                                     seq_length=64), global_batch_size=16, iterations=1000,
                     hint=P.ResourceHint(gpus=1))


def run(budget: float, jobs: int, root: Path) -> dict[str, Any]:
    ctl = start_controller(root / "state", "--policy", "crius", "--estimate-budget", str(budget),
                           "--round-interval", "300")
    daemons = [ctl]
    try:
        nodes = [(f"a100-{i}", "A100-80GB, count: 8") for i in range(8)] + [(f"a40-{i}", "A40-48GB, count: 4")
                                                                          for i in range(4)]
        for node, gpus in nodes:
            inv = root / f"{node}.yaml"
            inv.write_text(f"gpus:\n  - {{model: {gpus}}}\n")
            daemons.append(start_agent(ctl, node, inv, root / node))
        with Client(ctl.address, token=ctl.token) as admin:
            wait_for(lambda: sum(n.state == P.NODE_STATE_READY for n in admin.nodes()) == len(nodes), 60,
                     "every node READY")
        with Client(ctl.address, token=ctl.tokens["bob"]) as bob, Client(ctl.address, token=ctl.tokens["alice"]) as alice:
            for i in range(jobs):
                bob.submit(big(i))
            t0 = time.monotonic()
            mine = alice.submit(small())
            wait_for(lambda: any(e.kind == "PLACED" for e in alice.get(mine.id, with_events=True).events), 600,
                     "alice's job PLACED", interval=0.2)
            placed_s = time.monotonic() - t0
            alice.cancel(mine.id)  # its workers stop before the agents do
        return {"estimate_budget_s": budget, "burst_jobs": jobs, "alice_placed_after_s": round(placed_s, 2)}
    finally:
        for d in reversed(daemons):
            d.stop()
        kill_strays(root)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--budget", type=float, default=5.0)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    rows = []
    for budget in (args.budget, 1e9):
        with tempfile.TemporaryDirectory(prefix="tessera-burst-", ignore_cleanup_errors=True) as tmp:
            r = run(budget, args.jobs, Path(tmp))
        print(f"--estimate-budget {budget:g}: alice's job placed {r['alice_placed_after_s']} s after her submission, "
              f"behind {args.jobs} of bob's new models", flush=True)
        rows.append(r)
    write_result(args.out, "estimate_burst.json", {"rows": rows}, show=False)


if __name__ == "__main__":
    main()
