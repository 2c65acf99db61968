"""tessera-sim (and `tessctl simulate`): replay a trace on a simulated cluster under several policies,
side by side in one process, and write the metrics as JSON and CSV (and PNG plots) under --out.

    tessera-sim --trace arena-philly --cluster crius-1280 --oracle arena --rules arena \\
        --policies crius,fcfs,gavel,elasticflow-l --rounds 500 --out /tmp/sim
    tessera-sim --trace philly --cluster crius-1280 --policies crius,gavel,elasticflow-l,gandiva,sia,fcfs \\
        --hours 24 --seed 1 --out /tmp/philly
    tessera-sim --trace philly --oracle estimator --families bert,moe,gpt,llama --hours 24 --out /tmp/llm
    tessera-sim --trace morphling-base --cluster morphling-64 --rules morphling --out /tmp/morph

A policy may carry a mode: `crius@artifact`, `gavel@paper`. Exit status 0, 1 on a bad input (one
line on stderr with the file, line and field; also an --out that is no writable folder), 2 on a usage
error (a bad flag value too: every number is checked as it is parsed, finite and in its range).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from tessera.common.errors import InvalidInput
from tessera.common.objective import load_prices
from tessera.controller.core.policies import UnknownPolicy, make_policy, parse_mode, policy_names
from tessera.controller.core.policy import CachedEstimates, Estimates, Mode, RoundConfig
from tessera.controller.core.snapshot import JobView, TenantQuota
from tessera.controller.sim.clusters import ClusterError, builtin_names, load_cluster
from tessera.controller.sim.engine import RULES, ArenaTruth, Rules, SimResult, Simulator, Truth
from tessera.controller.sim.metrics import (
    busy_rounds_are,
    compare,
    summarize,
    timing,
    write_jobs_csv,
    write_rounds_csv,
    write_summary_csv,
)
from tessera.controller.sim.oracles import (
    ArenaOracle,
    MorphlingOracle,
    OracleError,
    arena_type,
    cell_estimator_oracle,
    load_estimator_oracle,
)
from tessera.controller.sim.tenants import morphling_mt
from tessera.controller.sim.traces import (
    ARTIFACT_FAMILIES,
    FAMILIES,
    MAX_ITER_S,
    TRANSFORMER_FAMILIES,
    PhillyOptions,
    TraceError,
    TraceJob,
    generate_philly,
    load_arena,
    load_morphling,
    philly_dims,
    split_philly_key,
)
from tessera.controller.sim.unstarted import warning as unstarted_warning

TRACES = ("arena-philly", "arena-venus", "arena-pai", "philly", "morphling-base", "morphling-bp", "morphling-mt")
ALIASES = {"arena-helios": "arena-venus", "helios": "arena-venus"}


class SimInputError(InvalidInput, ValueError):
    """A bad tessera-sim command line or input file; the message names the flag or file."""


def default_data_dir() -> Path:
    env = os.environ.get("TESSERA_DATA_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for base in [Path.cwd(), *Path.cwd().parents, *here.parents]:
        for cand in (base / "shared" / "data", base.parent / "shared" / "data"):
            if (cand / "arena").is_dir():
                return cand
    return Path("../shared/data")


# argparse value types: a bad value is a usage error (exit 2) that names the flag and the range,
# `tessera-sim: error: argument --load: must be a finite number > 0, got 'nan'`. (clients/argtypes.py
# has tessctl's, which the controller may not import.)


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def trace_flag(text: str) -> str:
    """--trace: a known trace or a CSV file (whether the file reads is a bad input, exit 1)."""
    name = _trace_name(text)
    if name not in TRACES and not name.endswith(".csv"):
        raise argparse.ArgumentTypeError(f"unknown trace {text!r}: use one of {', '.join(TRACES)} or a CSV file")
    return text


def cluster_flag(text: str) -> str:
    """--cluster: a built-in cluster or a file (load_cluster reads a name with a suffix, or one that
    exists, as a file: whether it reads is a bad input, exit 1)."""
    if not Path(text).suffix and not Path(text).exists() and text not in builtin_names():
        raise argparse.ArgumentTypeError(f"unknown cluster {text!r}: use a file or one of "
                                         f"{', '.join(builtin_names())}")
    return text


def policies_flag(text: str) -> str:
    """--policies: every name (and @mode) known; the modes that depend on --rules are set later."""
    names = [raw.strip() for raw in text.split(",") if raw.strip()]
    if not names:
        raise argparse.ArgumentTypeError("no policy given")
    for raw in names:
        name, _, mode = raw.partition("@")
        try:
            make_policy(name, mode or "paper")
        except UnknownPolicy as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return text


def rules_flag(text: str) -> str:
    if text and text not in RULES:
        raise argparse.ArgumentTypeError(f"unknown rules {text!r}: use one of {', '.join(RULES)}")
    return text


def positive_float(text: str) -> float:
    return _finite(text, ">")


def non_negative_float(text: str) -> float:
    return _finite(text, ">=")


def _finite(text: str, op: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and (value > 0 or (op == ">=" and value == 0))):
        raise argparse.ArgumentTypeError(f"must be a finite number {op} 0, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, type=trace_flag,
                   help=f"{', '.join(TRACES)} or a CSV file in the arena format")
    p.add_argument("--cluster", default="crius-1280", type=cluster_flag,
                   help=f"{', '.join(builtin_names())} or a JSON file")
    p.add_argument("--oracle", default="", help="arena | morphling | estimator | module:factory "
                   "(default: by trace)")
    p.add_argument("--rules", default="", type=rules_flag, metavar="{" + ",".join(RULES) + "}",
                   help="the simulation's rules (default: by trace: arena for arena-* and CSV traces, "
                        "morphling for morphling-*, fair for philly)")
    p.add_argument("--policies", default="crius,fcfs", type=policies_flag,
                   help=f"comma-separated, each optionally name@mode, of {', '.join(policy_names())}")
    p.add_argument("--mode", default="auto", choices=["auto", "paper", "artifact"],
                   help="mode of the baselines (auto: artifact under --rules arena, else paper); crius "
                        "runs its paper mode unless written crius@artifact")
    p.add_argument("--rounds", type=non_negative_int, default=0, help="rounds to simulate (default: 2,000 under arena "
                   "and fair rules, else until every job is done)")
    p.add_argument("--until-done", action="store_true", help="run until every job is done or none can "
                   "ever start (then --rounds, default 100,000, is only a cap)")
    p.add_argument("--hours", type=positive_float, default=24.0, help="philly: hours of trace (> 0)")
    p.add_argument("--start-hour", type=non_negative_float, default=0.0,
                   help="philly: hours skipped from the trace start (>= 0)")
    p.add_argument("--load", type=positive_float, default=1.0, help="philly: arrival rate multiplier (> 0)")
    p.add_argument("--seed", type=int, default=1, help="philly: seed of the generator")
    p.add_argument("--families", default="", help=f"philly: model families drawn, comma-separated, of "
                   f"{', '.join(FAMILIES)} (default: {','.join(ARTIFACT_FAMILIES)} under --oracle arena, "
                   f"{','.join(TRANSFORMER_FAMILIES)} under the estimator)")
    p.add_argument("--depth", type=non_negative_int, default=3, help="search depth of Crius (>= 0; 0: no "
                   "scaling of running jobs)")
    p.add_argument("--min-run", type=non_negative_float, default=0.0, metavar="SECONDS",
                   help="a best-effort job placed less than SECONDS ago is not restarted by a round, as the "
                        "controller's --min-run (default 0 = off)")
    p.add_argument("--restart-cost", type=non_negative_float, default=None,
                   help="fair/morphling: seconds per restart (>= 0)")
    p.add_argument("--data-dir", default="", help="the shared data folder (default: $TESSERA_DATA_DIR or "
                   "../shared/data)")
    p.add_argument("--prices", default="", help="YAML {GPU type: price per GPU-hour} for the trace's jobs with "
                   "objective cost (docs/cost-objective.md)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no table on stdout")


def _trace_name(t: str) -> str:
    return ALIASES.get(t, t)


def philly_families(spec: str, oracle: str) -> tuple[str, ...]:
    """The families `--trace philly` draws: `--families`, else the oracle's default. The arena
    oracle is a measured table of the artifact's three families; the controller's Cells cover
    transformers only (no Wide-ResNet: no worker plan); a `module:factory` oracle takes what it is given."""
    if not spec.strip():
        return ARTIFACT_FAMILIES if oracle == "arena" else TRANSFORMER_FAMILIES
    out: list[str] = []
    for raw in spec.split(","):
        f = raw.strip().lower()
        if not f:
            continue
        if f not in FAMILIES:
            raise SimInputError(f"--families: unknown family {f!r} (known: {', '.join(FAMILIES)})")
        if oracle == "arena" and f not in ARTIFACT_FAMILIES:
            raise SimInputError(f"--families: {f} is not in the arena oracle's measured table (it has "
                                f"{', '.join(ARTIFACT_FAMILIES)}); use --oracle estimator for {f}")
        if oracle == "estimator" and f not in TRANSFORMER_FAMILIES:
            raise SimInputError(f"--families: {f} is not covered by the estimator oracle (it estimates "
                                f"transformers: {', '.join(TRANSFORMER_FAMILIES)}); use --oracle arena for {f}")
        if f not in out:
            out.append(f)
    if not out:
        raise SimInputError(f"--families: no family given (known: {', '.join(FAMILIES)})")
    return tuple(out)


def load_inputs(args: argparse.Namespace) -> tuple[Any, list[TraceJob], Estimates, Truth, Rules, Any]:
    data = Path(args.data_dir) if args.data_dir else default_data_dir()
    cluster = load_cluster(args.cluster)
    trace = _trace_name(args.trace)
    morph = trace.startswith("morphling")
    oracle_name = args.oracle or ("morphling" if morph else "arena")
    rules_name = args.rules or ("arena" if trace.startswith("arena") or trace.endswith(".csv") else
                                "morphling" if morph else "fair")
    rules = RULES[rules_name]
    if args.restart_cost is not None:
        rules = Rules(**{**rules.__dict__, "fixed_cost": float(args.restart_cost)})
    types = cluster.gpu_types()
    est: Estimates
    truth: Truth
    arena: ArenaOracle | None = None
    if args.families.strip() and _trace_name(args.trace) != "philly":
        raise SimInputError("--families: only --trace philly draws model families")
    if trace == "philly" and oracle_name == "morphling":
        raise SimInputError("--trace philly: the morphling oracle has no Philly models; use --oracle arena "
                            "or estimator")
    families = philly_families(args.families, oracle_name) if trace == "philly" else ()
    if oracle_name == "arena":
        arena = ArenaOracle(data / "arena")
        est, truth = arena, ArenaTruth(arena)
    elif oracle_name == "morphling":
        m = MorphlingOracle(data / "morphling", cluster.per_node(types[0]) if types else 8)
        est, truth = m, Truth(m)
    elif oracle_name == "estimator":
        est = cell_estimator_oracle({t: (sum(g.count * g.gpus for g in cluster.groups if g.gpu_type == t),
                                         cluster.per_node(t),
                                         any(g.nvlink_islands for g in cluster.groups if g.gpu_type == t))
                                     for t in types})
        truth = Truth(est)
    else:
        est = load_estimator_oracle(oracle_name, types)
        truth = Truth(est)
    est = CachedEstimates(est)
    by_short = {arena_type(t): t for t in types}
    if trace.startswith("arena-") or trace.endswith(".csv"):
        path = Path(args.trace) if trace.endswith(".csv") else data / "arena" / f"trace_{trace[6:]}.csv"
        models = arena.models if arena else _arena_models(data)
        jobs = load_arena(path, models, known_types=list(by_short), estimator_dims=arena is None)
        if rules.iteration_divisor == 1 and rules.name != "morphling":
            rules = Rules(**{**rules.__dict__, "iteration_divisor": 5})
    elif trace == "philly":
        order = [by_short[s] for s in ("a100", "v100", "a40", "a10") if s in by_short] or types
        models = arena.models if arena else _arena_models(data)
        real = truth

        def feasible(key: str, t: str, n: int) -> float:
            cap = cluster.per_node(t)
            nodes = 1 if n <= cap else n // cap
            if arena is not None:
                return arena.iteration_time(key, t, n, nodes)
            # Other oracles: the best Cell's iteration time, over MAX_ITER_S infeasible (the artifact's rule).
            fam, size, batch = split_philly_key(key)
            view = JobView(key, 0.0, philly_dims(fam, size, models, estimator=True), batch, n,
                           estimate_key=key)
            it = real.iteration_s(view, t, n, nodes)
            return it if 0 < it <= MAX_ITER_S else 0.0

        opts = PhillyOptions(args.seed, args.hours, args.start_hour, args.load, families,
                             estimator_dims=arena is None)
        jobs = generate_philly(data / "traces" / "philly.csv", feasible, order, models, opts)
        jobs = [TraceJob(j.id, j.submit_time, j.iterations, j.model_key, j.model, j.global_batch_size, j.gpus,
                         arena_type(j.gpu_type), j.deadline) for j in jobs]
        rules = Rules(**{**rules.__dict__, "iteration_divisor": 1})
    elif morph:
        jobs = load_morphling(data / "morphling" / "workloads" / f"workload-{trace.split('-', 1)[1]}.csv")
    else:
        raise SimInputError(f"unknown trace {args.trace!r}: use one of {', '.join(TRACES)} or a CSV file")
    return cluster, jobs, est, truth, rules, by_short


def _arena_models(data: Path) -> dict[str, dict[str, dict[str, object]]]:
    path = data / "arena" / "models.json"
    try:
        out = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SimInputError(f"{path}: cannot read the artifact's model dimensions: {exc}") from None
    if not isinstance(out, dict):
        raise SimInputError(f"{path}: expected an object of model families, got {type(out).__name__}")
    return out


def parse_policies(spec: str, mode: str, rules: Rules) -> list[tuple[str, str, Mode]]:
    """(label, name, mode) per policy."""
    out = []
    for raw in spec.split(","):
        raw = raw.strip()
        if not raw:
            continue
        name, _, m = raw.partition("@")
        if not m:
            if name.startswith("crius"):
                m = "paper"
            elif mode == "auto":
                m = "artifact" if rules.name == "arena" else "paper"
            else:
                m = mode
        out.append((raw, name, parse_mode(m)))
    if not out:
        raise SimInputError("--policies: no policy given")
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    cluster, jobs, est, truth, rules, by_short = load_inputs(args)
    tenants: tuple[TenantQuota, ...] = ()
    if _trace_name(args.trace) == "morphling-mt":
        # Morphling Sec. 7's two tenants (controller/sim/tenants.py, docs/tenants.md).
        jobs, tenants = morphling_mt(jobs, cluster.gpu_types()[0])
    specs = parse_policies(args.policies, args.mode, rules)
    policies = [(label, make_policy(name, m), m) for label, name, m in specs]
    out = output_folder(args.out)
    cfg = RoundConfig(search_depth=args.depth, interval_s=rules.interval_s,
                      max_gpus_per_job=16 if rules.name in ("arena", "fair") else 0, min_run_s=args.min_run)
    try:
        prices = load_prices(args.prices) if args.prices else None
    except InvalidInput as exc:  # a bad --prices file: one line, exit 1, like a bad trace
        raise SimInputError(f"--prices: {exc}") from None
    sim = Simulator(cluster, jobs, est, truth, rules, args.trace, cfg,
                    type_of=lambda s: by_short.get(s, s), tenants=tenants, prices=prices)
    results: dict[str, SimResult] = {}
    for label, pol, m in policies:
        results[label] = sim.run(pol, m, rounds=args.rounds, until_done=args.until_done)
    summaries = {k: summarize(v) for k, v in results.items()}
    if line := no_arrivals_warning(args, len(jobs), summaries):
        print(line, file=sys.stderr)
    for label, summ in summaries.items():
        if line := unstarted_warning(label.replace("@", "_"), summ, until_done=args.until_done):
            print(line, file=sys.stderr)
    ref = next((k for k in results if k.split("@")[0] == "crius"), next(iter(results)))
    comp = compare(results, ref)
    doc = {
        "config": {"trace": args.trace, "cluster": cluster.name, "oracle": args.oracle or "default",
                   "rules": rules.name, "interval_s": rules.interval_s, "rounds": args.rounds,
                   "until_done": args.until_done,
                   "seed": args.seed, "hours": args.hours, "load": args.load, "depth": args.depth,
                   **({"min_run_s": args.min_run} if args.min_run else {}),
                   "jobs_in_trace": len(jobs),
                   **({"families": list(philly_families(args.families, args.oracle or "arena"))}
                      if _trace_name(args.trace) == "philly" else {})},
        "policies": summaries,
        "comparison": comp,
        "busy_rounds_are": busy_rounds_are(rules.name),
    }
    try:
        plots = write_outputs(out, doc, results, comp, rules.interval_s, plots=not args.no_plots)
    except OSError as e:  # the folder was writable when the run started (output_folder)
        raise SimInputError(f"--out: cannot write {e.filename or out}: {e.strerror or e}") from None
    return {**doc, "plots": plots, "timing": {k: timing(v) for k, v in results.items()}}


def no_arrivals_warning(args: argparse.Namespace, in_trace: int, summaries: dict[str, dict[str, Any]]) -> str:
    """A line for a run in which no job arrived (every figure 0); "" otherwise."""
    if any(s["jobs_submitted"] for s in summaries.values()):
        return ""
    if _trace_name(args.trace) == "philly":
        where = (f"philly from hour {args.start_hour:g} for {args.hours:g} h at load {args.load:g} gave "
                 f"{in_trace} jobs; try more --hours or another --start-hour")
    elif in_trace == 0:
        where = f"the trace {args.trace} has no jobs"
    else:
        where = f"{in_trace} jobs in the trace, none before the round limit; raise --rounds"
    return f"warning: the simulated window has no arrivals: every figure below is 0 ({where})"


def output_folder(path: str) -> Path:
    """--out, made if missing: a writable folder, checked before the run (a SimInputError, exit 1,
    like a bad --prices file), not after it."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise SimInputError(f"--out: {out}: not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SimInputError(f"--out: {out}: cannot make the folder: {e.strerror or e}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise SimInputError(f"--out: {out}: folder not writable")
    return out


def write_outputs(out: Path, doc: dict[str, Any], results: dict[str, SimResult], comp: dict[str, Any],
                  interval_s: float, plots: bool) -> list[str]:
    """metrics.json, timing.json, summary.csv, per policy rounds.csv and jobs.csv, and the plots;
    the plots' paths."""
    (out / "metrics.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    (out / "timing.json").write_text(json.dumps({k: timing(v) for k, v in results.items()}, indent=1,
                                                sort_keys=True) + "\n")
    write_summary_csv(doc["policies"], out / "summary.csv")
    for label, res in results.items():
        d = out / label.replace("@", "_")
        d.mkdir(exist_ok=True)
        write_rounds_csv(res, d / "rounds.csv")
        write_jobs_csv(res, d / "jobs.csv")
    if not plots:
        return []
    from tessera.controller.sim.plots import draw

    return draw(results, comp, out, interval_s)


def table(doc: dict[str, Any]) -> str:
    """The summary printed on stdout: one row per policy, the comparisons, what "busy" is."""
    rows = [("policy", "finished", "JCT avg", "JCT p50", "JCT p99", "queue", "thr avg", "thr busy", "thr peak",
             "restarts", "SLA viol", "round s")]
    for label, s in doc["policies"].items():
        t = doc.get("timing", {}).get(label, {})
        rows.append((label, f"{s['jobs_finished']}/{s['jobs_submitted']}", f"{s['jct_avg_s']:.0f}",
                     f"{s['jct_median_s']:.0f}", f"{s['jct_p99_s']:.0f}", f"{s['queue_avg_s']:.0f}",
                     f"{s['throughput_avg']:.0f}", f"{s['throughput_avg_busy']:.0f}", f"{s['throughput_peak']:.0f}",
                     f"{s['restarts_per_job']:.2f}", f"{s['sla_violations']}/{s['guaranteed_jobs']}",
                     f"{t.get('round_s_avg', 0):.4f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    comp = doc.get("comparison", {})
    ref = comp.get("reference")
    for k, c in comp.items():
        if isinstance(c, dict):
            lines.append(f"{ref} vs {k}: JCT {-100 * c['jct_reduction_finished']:+.1f}% (finished jobs), "
                         f"{-100 * c['jct_reduction_padded']:+.1f}% (artifact padding); throughput "
                         f"{c['throughput_ratio']:.2f}x (all rounds), {c['throughput_ratio_busy']:.2f}x (busy rounds)")
    lines.append(f"thr busy: the average over busy rounds ({doc.get('busy_rounds_are', '?')})")
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line, like the input errors (exit 2 still): the usage block above it
    buried the line that says what was wrong."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser(prog: str = "tessera-sim") -> argparse.ArgumentParser:
    p = _Parser(prog=prog, description="Replay a trace under several scheduling policies.",
                                allow_abbrev=False)
    add_arguments(p)
    return p


def main(argv: Sequence[str] | None = None, prog: str = "tessera-sim") -> int:
    args = build_parser(prog).parse_args(argv)
    return run_and_report(args, prog)


def run_and_report(args: argparse.Namespace, prog: str = "tessera-sim") -> int:
    try:
        doc = run(args)
    except (TraceError, ClusterError, OracleError, SimInputError, UnknownPolicy) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(table(doc))
        print(f"metrics: {Path(args.out) / 'metrics.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
