"""The Morphling artifact's own simulator on the exact Morphling workloads and on the jittered ones
bench/morphling_jitter.py replays, so that Tessera's `morphling` and the artifact are compared on
the same arrivals rather than on one trace each was or was not tuned on
(docs/scheduler-morphling.md, "The artifact on the same jittered arrivals").

Tessera ships neither the artifact nor its dependencies. Give a clone of
AlibabaPAI/reconfigurable-dl-scheduler (the MLSys'25 artifact, whose simulator/simulator.py imports
sched/) and a Python with its requirements (numpy, pandas, scipy, autograd==1.5):

    .venv/bin/python bench/morphling_artifact.py --artifact DIR --artifact-python PYTHON \\
        [--seeds 6] [--width 300] [--workers 2]

Each jittered workload is the artifact's CSV with every job's `submission_time` replaced by the
time morphling_jitter.jitter gives it (same seeds, same width), rows in that order, every other
field byte for byte. The simulator runs with the settings of the artifact's README for its Table 4
(`morphling 60 8 8 96 1600 400 100 0`). Per run: the artifact's printed average JCT and makespan
(its clock at the end of the 60 s round in which the last job ended, from t=0), and the makespan
as Tessera counts it (last completion - first arrival), from the JCTs it prints. Tessera's own
figures come from bench/results/morphling_jitter.json when that exists. Writes
bench/results/morphling_artifact.json.
"""

from __future__ import annotations

import argparse
import ast
import csv
import io
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchio import write_result
from morphling_bounds import ARTIFACT
from morphling_jitter import jitter

from tessera.controller.sim import cli
from tessera.controller.sim.traces import TraceJob

SETTINGS = ["--policy", "morphling", "--interval", "60", "--num-nodes", "8", "--num-gpus", "8", "--num-cpus", "96",
            "--mem-per-node", "1600", "--intra-bandwidth", "400", "--inter-bandwidth", "100",
            "--online-model-fitting", "0"]


def tessera_jobs(trace: str) -> list[TraceJob]:
    """The trace as tessera-sim loads it (bench/morphling_bounds.py's replay)."""
    args = cli.build_parser().parse_args(["--trace", f"morphling-{trace}", "--cluster", "morphling-64",
                                          "--rules", "morphling", "--out", "unused"])
    return list(cli.load_inputs(args)[1])


def jittered_csv(text: str, jobs: Sequence[TraceJob], seed: int, width: float) -> str:
    """The artifact's workload CSV `text` with Tessera's jittered submission times; SystemExit when
    the CSV's rows are not `jobs` in the same order (the draws would go to other jobs)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    rows = list(csv.DictReader(io.StringIO(text)))
    if [r["name"] for r in rows] != [j.id for j in jobs] or any(
            float(r["submission_time"]) != j.submit_time for r, j in zip(rows, jobs, strict=True)):
        raise SystemExit("the artifact's workload rows are not the trace Tessera loads, in its order")
    col = lines[0].split(",").index("submission_time")
    by_name = dict(zip([r["name"] for r in rows], lines[1:], strict=True))
    out = [lines[0]]
    for j in jitter(jobs, seed, width):
        fields = by_name[j.id].split(",")
        fields[col] = repr(j.submit_time)
        out.append(",".join(fields))
    return "\n".join(out) + "\n"


def parse_output(text: str, workload: str) -> dict[str, Any]:
    """The artifact's last `Average JCT (s)` and `Makespan (s)`, and the JCT dict printed just before."""
    lines = text.splitlines()
    at = max((i for i, ln in enumerate(lines) if ln.startswith("Average JCT (s):")), default=None)
    makespans = [ln for ln in lines if ln.startswith("Makespan (s):")]
    if at is None or not makespans or at == 0:
        raise RuntimeError("no 'Average JCT (s)' and 'Makespan (s)' lines in the artifact's output")
    jcts: dict[str, float] = ast.literal_eval(lines[at - 1].strip())
    rows = list(csv.DictReader(io.StringIO(workload)))
    submit = {r["name"]: float(r["submission_time"]) for r in rows}
    ends = [submit[name] + jct for name, jct in jcts.items()]
    return {"jobs": len(rows), "finished": len(jcts), "jct_avg_s": float(lines[at].split(":", 1)[1]),
            "makespan_artifact_s": float(makespans[-1].split(":", 1)[1]),
            "makespan_s": max(ends) - min(submit.values())}


def run_artifact(artifact: Path, python: str, workload: Path) -> dict[str, Any]:
    cp = subprocess.run([python, "simulator.py", str(workload), *SETTINGS], cwd=artifact / "simulator",
                        capture_output=True, text=True, check=False)
    if cp.returncode != 0:
        raise RuntimeError(f"{workload.name}: the artifact's simulator exited {cp.returncode}: {cp.stderr[-2000:]}")
    return parse_output(cp.stdout, workload.read_text())


def spread(rows: Sequence[dict[str, Any]], key: str) -> dict[str, float]:
    vals = [float(r[key]) for r in rows]
    return {"mean": statistics.fmean(vals), "min": min(vals), "max": max(vals)}


def tessera_figures(out: str) -> dict[str, Any]:
    path = Path(out) / "morphling_jitter.json"
    if not path.exists():
        return {}
    return dict(json.loads(path.read_text()).get("summary", {}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--artifact", required=True, type=Path, help="a clone of AlibabaPAI/reconfigurable-dl-scheduler")
    ap.add_argument("--artifact-python", required=True, help="a Python with the artifact's requirements")
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--width", type=float, default=300.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    if not (a.artifact / "simulator" / "simulator.py").is_file():
        raise SystemExit(f"--artifact: {a.artifact} has no simulator/simulator.py")
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="morphling-artifact-"))
    runs: list[tuple[str, int | None, Path]] = []
    for trace in ("base", "mt"):
        source = a.artifact / "simulator" / "workloads" / f"workload-{trace}.csv"
        runs.append((trace, None, source))
        jobs = tessera_jobs(trace)
        for seed in range(a.seeds):
            path = tmp / f"workload-{trace}-jitter{seed}.csv"
            path.write_text(jittered_csv(source.read_text(), jobs, seed, a.width))
            runs.append((trace, seed, path))
    with ThreadPoolExecutor(max_workers=max(1, a.workers)) as ex:
        results = list(ex.map(lambda r: run_artifact(a.artifact, a.artifact_python, r[2]), runs))
    rows = [{"trace": t, "seed": s, **res} for (t, s, _), res in zip(runs, results, strict=True)]
    ours = tessera_figures(a.out)
    summary: dict[str, Any] = {}
    for trace in ("base", "mt"):
        exact = next(r for r in rows if r["trace"] == trace and r["seed"] is None)
        jit = [r for r in rows if r["trace"] == trace and r["seed"] is not None]
        summary[trace] = {"exact": exact, "published": dict(zip(("jct_avg_s", "makespan_s"), ARTIFACT[trace]))}
        print(f"morphling-{trace}, the artifact: exact JCT {exact['jct_avg_s']:,.1f} s, makespan "
              f"{exact['makespan_artifact_s']:,.0f} s (published {ARTIFACT[trace][0]:,.0f} / {ARTIFACT[trace][1]:,.0f})")
        if not jit:
            continue
        agg = {k: spread(jit, k) for k in ("jct_avg_s", "makespan_artifact_s", "makespan_s")}
        summary[trace]["jittered"] = agg
        j, m = agg["jct_avg_s"], agg["makespan_s"]
        print(f"  jittered ({len(jit)} seeds): JCT mean {j['mean']:,.0f} s ({j['min']:,.0f}-{j['max']:,.0f}); "
              f"makespan from the first arrival mean {m['mean']:,.0f} s ({m['min']:,.0f}-{m['max']:,.0f})")
        theirs = ours.get(trace, {}).get("jittered")
        if theirs:
            tj, tm = theirs["jct_avg_s"]["mean"], theirs["makespan_s"]["mean"]
            summary[trace]["tessera_jittered"] = {"jct_avg_s": tj, "makespan_s": tm}
            print(f"  Tessera's morphling, jittered mean (bench/results/morphling_jitter.json): JCT {tj:,.0f} s "
                  f"({tj / j['mean'] - 1:+.1%}), makespan {tm:,.0f} s ({tm / m['mean'] - 1:+.1%})")
    wall = time.perf_counter() - t0
    write_result(a.out, "morphling_artifact.json", {"width_s": a.width, "seeds": a.seeds, "settings": SETTINGS,
                                                    "summary": summary, "rows": rows, "wall_s": wall}, show=False)
    print(f"wrote {a.out}/morphling_artifact.json ({wall:.0f} s)")


if __name__ == "__main__":
    main()
