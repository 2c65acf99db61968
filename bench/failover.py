"""Leader failover: the leading controller is killed (SIGKILL), how long until a new leader serves?

One real etcd and two real controllers (`--store etcd`) on loopback. Each run: the leader is killed,
and the clock runs from the kill to the first SubmitJob (a fresh request id, so it needs the leader)
that a client configured with both addresses gets answered with `created`; the killed controller is
then started again on its port as the standby for the next run. The client retries as a user would
(the SDK moves between the addresses itself; between its tries the bench polls every 50 ms).

    python bench/failover.py --runs 20 --ttl 5 --out bench/results

Prints one JSON object (p50 and max over the runs, every run's seconds and epochs; `leading_*`: from
the kill to the standby's `controller_leading` log line, the etcd side alone) and writes it to
OUT/failover.json. The bound (docs/ha.md): ttl + 0.5 s (etcd's expiry sweep) + a watch event and a
campaign transaction + loading the state.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchio import write_result

from tessera.clients.sdk import Client, RpcError
from tessera.common.localcluster import Daemon, local_tokens, start_controller, start_etcd
from tessera.v1 import common_pb2


def spec(i: int) -> common_pb2.JobSpec:
    # A GPU type no node has: the job stays PENDING, no agent is needed.
    return common_pb2.JobSpec(name=f"failover-{i}", model=common_pb2.ModelSpec(name="gpt2-small"),
                              global_batch_size=8, iterations=10,
                              hint=common_pb2.ResourceHint(gpu_types=["H100"]))


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def first_submit(c: Client, i: int, give_up_s: float) -> float:
    """Seconds until SubmitJob (one fresh request id, retried) is answered; raises after give_up_s."""
    t0 = time.monotonic()
    rid = f"failover-{uuid.uuid4().hex}"
    while True:
        try:
            c.submit_ex(spec(i), request_id=rid)
            return time.monotonic() - t0
        except RpcError as exc:
            if exc.code != "UNAVAILABLE" or time.monotonic() - t0 > give_up_s:
                raise
            time.sleep(0.05)


def run(args: argparse.Namespace) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="tessera-failover-"))
    etcd = start_etcd(tmp)
    # One tokens file for both controllers: the client's token must hold at whichever leads.
    tokens_file, tokens = local_tokens(tmp / "cluster")
    ha = ["--checkpoint-root", str(tmp / "ckpt"),
          "--store", "etcd", "--etcd-endpoints", etcd.address, "--etcd-lease-ttl", str(args.ttl),
          "--round-interval", "300", "--tokens", str(tokens_file)]
    ctl: dict[str, Daemon] = {}
    try:
        for name in ("a", "b"):
            ctl[name] = start_controller(tmp / name, *ha, fast=False)
        ports = {n: d.address for n, d in ctl.items()}
        ctl["a"].wait_event("controller_leading", 30)
        leader = "a"
        seconds, leading, epochs = [], [], []
        with Client([ports["a"], ports["b"]], token=tokens["admin"], timeout=2) as c:
            c.submit(spec(-1))
            for i in range(args.runs):
                standby = "b" if leader == "a" else "a"
                led_before = sum(1 for e in ctl[standby].events() if e.get("event") == "controller_leading")
                t0, wall0 = time.monotonic(), time.time()
                ctl[leader].kill9()
                elapsed = first_submit(c, i, give_up_s=60)
                took = time.monotonic() - t0
                ev = ctl[standby].wait_event("controller_leading", 30, skip=led_before)
                # When the standby logged that it leads (its log's wall clock, same machine).
                led = datetime.fromisoformat(ev["timestamp"]).timestamp() - wall0
                seconds.append(round(took, 3))
                leading.append(round(led, 3))
                epochs.append(ev["epoch"])
                print(f"run {i + 1}: {took:.2f}s (standby led after {led:.2f}s, epoch {ev['epoch']}; "
                      f"submit retried for {elapsed:.2f}s)", file=sys.stderr, flush=True)
                ctl[leader] = start_controller(tmp / leader, *ha, listen=ports[leader], agent_listen="127.0.0.1:0", fast=False)
                leader = standby
        return {
            "benchmark": "failover", "runs": args.runs, "lease_ttl_s": args.ttl,
            "p50_s": round(statistics.median(seconds), 3), "p90_s": round(pct(seconds, 90), 3),
            "max_s": max(seconds), "min_s": min(seconds), "goal_s": 10.0, "seconds": seconds,
            "leading_p50_s": round(statistics.median(leading), 3), "leading_max_s": max(leading),
            "leading_seconds": leading, "epochs": epochs,
            "epochs_increase": all(b > a for a, b in itertools.pairwise(epochs)),
            "measures": "SIGKILL of the leader -> first SubmitJob (fresh request id) answered by the new leader",
        }
    finally:
        for d in ctl.values():
            d.stop()
        etcd.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--ttl", type=int, default=5, help="--etcd-lease-ttl of the controllers (their default: 5)")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    result = run(args)
    write_result(args.out, "failover.json", result)


if __name__ == "__main__":
    main()
