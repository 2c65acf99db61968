"""What the estimator's warm spare saves on a traced EstimateMemory (estimator/service/traced_child.py).

Each traced estimate runs in a child process. Without a spare (tessctl's in-process runs) every
estimate pays the interpreter's start, torch's import and a first trace's warm-up before its own
trace; with one (the estimator service) the child of the next estimate has done all of that while
the service waited. The figure: wall seconds of `TracedRunner.run` per estimate, for a few models,
`--gap` seconds of idle time between estimates (the time a spare has to warm up; a busier service
hands a still-warming spare over and waits for the rest). Each model's first estimate with a spare
has none yet and is reported apart. No gRPC: the runner is what differs.

    .venv/bin/python bench/traced_spare.py [--repeat 3] [--gap 10] [--out bench/results]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchio import write_result

from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan
from tessera.estimator.service.traced_child import TracedJob, TracedRunner

JOBS = {
    "tiny (2 layers, hidden 256)": TracedJob(ModelDims(256, 2, 4, 1000, 128, "tiny"), ExecutionPlan()),
    "small (4 layers, hidden 1024, dp2 tp2 zero2, recompute)": TracedJob(
        ModelDims(1024, 4, 8, 32000, 512, "small"),
        ExecutionPlan(dp=2, tp=2, sharding="zero2", checkpointing="full"), gpu="A100-80GB"),
}


def timed(runner: TracedRunner, job: TracedJob) -> float:
    t = time.perf_counter()
    runner.run(job, "traced")
    return time.perf_counter() - t


def measure(spare: bool, job: TracedJob, repeat: int, gap: float) -> dict[str, Any]:
    runner = TracedRunner(spare=spare)
    try:
        first = timed(runner, job)
        times = []
        for _ in range(repeat):
            time.sleep(gap)
            times.append(timed(runner, job))
    finally:
        runner.close()
    return {"first_s": round(first, 3), "then_s": [round(t, 3) for t in times],
            "then_median_s": round(statistics.median(times), 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--gap", type=float, default=10.0, help="idle seconds before each timed estimate")
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    a = p.parse_args()
    rows = {name: {"fresh child each time": measure(False, job, a.repeat, a.gap),
                   "warm spare": measure(True, job, a.repeat, a.gap)} for name, job in JOBS.items()}
    for name, r in rows.items():
        print(f"{name}: fresh child {r['fresh child each time']['then_median_s']:.2f} s, "
              f"warm spare {r['warm spare']['then_median_s']:.2f} s (median of {a.repeat}, {a.gap:g} s apart)",
              file=sys.stderr)
    write_result(a.out, "traced_spare.json", {"repeat": a.repeat, "gap_s": a.gap, "models": rows})


if __name__ == "__main__":
    main()
