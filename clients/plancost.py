"""`tessctl plan-cost`: the cheapest mix of rented GPU types that runs a job within its SLO, without
a cluster (Espresso's provisioning question; estimator/cost_tree.py, docs/espresso.md).

    tessctl plan-cost -f job.yaml --prices prices.yaml --quota quota.yaml [-o json]

The job file is the usual one (docs/job-file.md): its model, global batch and iterations, plus the
cost objective's SLO, `slo: {iterations_within: 6h}` or `slo: {deadline: 2026-11-27T06:00:00Z}`
(`--slo 6h` instead or on top). The prices file maps GPU types to a price per GPU-hour, the quota
file GPU types to how many one may rent (YAML or JSON, `{A6000: 6, A30: 4}` and `{A6000: 8, A30:
16}`). The answer: the allocation (GPU types and counts), each stage's type, data-parallel GPUs and
layer range, the predicted iteration and total time, the cost (price x GPUs x time, in the prices'
currency) and how long the search took. Runs here; needs neither a controller nor an estimator.

The job file's `objective:` and `slo:` are checked here by the rules `tessctl submit` and the
controller apply (tessera.clients.jobfile_objective, tessera.common.objective): an objective other
than `default` or `cost` is refused with the same message. They are set aside before the rest goes to
the job-file parser, whose check of a cost job's SLO against the cluster's limits plan-cost does not
need. Errors: one line, exit 2; a `-o jsonpath` that selects nothing is exit 1, as for every command.
Limits: a price at most MAX_PRICE per GPU-hour, `--max-stages` at most the cost tree's MAX_STAGES (16),
the job file (stdin too) at most common/yamlfile's MAX_BYTES, and the search its default budget
(a search over it is refused as "search too large").
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Mapping
from typing import Any

from tessera.clients import argtypes, output, terminal
from tessera.clients.formats import FormatError
from tessera.clients.jobfile_objective import objective_fields
from tessera.common.errors import InvalidArgument, TesseraError
from tessera.common.gpus import UnknownGpuError, lookup
from tessera.common.objective import parse_duration, slo_from_mapping
from tessera.common.yamlfile import MAX_BYTES, InputFileError, line_of, load_yaml, parse_with_lines, read_yaml

_SET_ASIDE = ("slo", "objective")
# The most a GPU-hour may cost: far above any rental price, low enough that no cost overflows to
# infinity (which `-o json` would print as `Infinity`, not JSON).
MAX_PRICE = 1e6
# The cost tree's MAX_STAGES (checked here before any file is read; the tree checks it too).
MAX_STAGES = 16


class PlanCostFileError(InputFileError):
    """A prices or quota file (or the job file's SLO) that cannot be used: the field and why."""


def add_arguments(sub: Any, command: Any) -> None:
    """The `plan-cost` command (command(parent, name, func, help)); it runs locally."""
    p = command(sub, "plan-cost", cmd_plan_cost,
                "the cheapest mix of GPU types (prices, quotas) that runs a job file within its SLO, no cluster "
                "needed (Espresso's cost tree)")
    p.set_defaults(local=True)
    p.add_argument("-f", "--filename", required=True, metavar="FILE", help="job YAML (docs/job-file.md); - = stdin")
    p.add_argument("--prices", required=True, metavar="FILE", help="YAML/JSON {GPU type: price per GPU-hour}")
    p.add_argument("--quota", required=True, metavar="FILE", help="YAML/JSON {GPU type: GPUs one may rent}")
    p.add_argument("--slo", default=None, metavar="DURATION",
                   help="run all the job's iterations within this (90m, 6h, 1.5d, seconds); default: the job "
                        "file's slo")
    p.add_argument("--max-stages", type=argtypes.positive_int, default=8, metavar="K",
                   help=f"longest pipeline considered (default 8, at most {MAX_STAGES})")
    p.add_argument("--gpus-per-node", type=argtypes.positive_int, default=8, metavar="N",
                   help="GPUs per rented instance (default 8)")
    p.add_argument("--nic-gbps", type=float, default=12.5, metavar="GB/S",
                   help="network bandwidth between instances, GB/s per direction (default 12.5 = 100 Gb/s; "
                        "Espresso's 2.5 Gb/s is 0.3125)")
    p.add_argument("--cluster", action="append", default=[], metavar="FILE[,FILE]",
                   help="cluster files (the `pools:` format of `estimate cells`): the quotas may not exceed their "
                        "GPUs, and each type takes its pools' GPUs per node and network instead of the flags")
    p.add_argument("--placement", choices=("espresso", "best"), default="espresso",
                   help="stage placement at the tree's leaves: espresso (Alg. 2, the paper's; default) or best "
                        "(the best of Alg. 2's, Whale's and HPH's for each allocation: never dearer, slower to find)")
    p.add_argument("--baselines", action="store_true",
                   help="also answer as Sia+ (one type, 2^n GPUs), Whale+ and HPH+ (Espresso Sec. V)")


def slo_of(doc: Mapping[str, Any], now: float) -> float | None:
    """Seconds the job's iterations must run within, from its `slo:` (None when it has none), read
    as the controller reads job files (common/objective.py)."""
    if doc.get("slo") is None:
        return None
    slo = slo_from_mapping(doc["slo"])
    if slo.iterations_within_seconds:
        return slo.iterations_within_seconds
    left = slo.deadline - now
    if left <= 0:
        raise InvalidArgument("slo.deadline", f"{doc['slo']['deadline']} has passed")
    return left


def _by_type(path: str, what: str, integer: bool) -> dict[str, float]:
    doc = read_yaml(path, PlanCostFileError)

    def parse(d: Any) -> dict[str, float]:
        if not isinstance(d, Mapping) or not d:
            raise PlanCostFileError("", f"must be a non-empty mapping {{GPU type: {what}}}")
        out: dict[str, float] = {}
        for key, v in d.items():
            try:
                name = lookup(str(key)).name
            except UnknownGpuError as exc:
                raise PlanCostFileError(str(key), str(exc)) from None
            if name in out:
                raise PlanCostFileError(str(key), f"{name} is given twice")
            if integer:
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise PlanCostFileError(str(key), f"must be a whole number of GPUs >= 1, got {v!r}")
            elif isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
                raise PlanCostFileError(str(key), f"must be a price per GPU-hour >= 0, got {v!r}")
            elif v > MAX_PRICE:
                raise PlanCostFileError(str(key), f"must be a price per GPU-hour <= {MAX_PRICE:,.0f}, got {v!r}")
            out[name] = v
        return out

    return parse_with_lines(doc, path, parse)


def _job(filename: str) -> tuple[Any, float | None]:
    """The job file's JobSpec (checked as `tessctl submit` checks it) and its SLO in seconds."""
    from tessera.clients.jobfile import JobFileError, job_spec_from_dict

    name = "<stdin>" if filename == "-" else filename
    if filename == "-":  # at most one byte over the limit, as read_yaml reads a file
        doc = load_yaml(getattr(sys.stdin, "buffer", sys.stdin).read(MAX_BYTES + 1), name, JobFileError)
    else:
        doc = read_yaml(filename, JobFileError)
    if not isinstance(doc, Mapping):
        raise JobFileError("job", "the file must be a mapping of fields (name, model, ...)", file=name)
    rest = {k: v for k, v in doc.items() if k not in _SET_ASIDE}
    spec = parse_with_lines(doc, name, lambda _d: job_spec_from_dict(rest))
    try:
        objective_fields({"objective": doc.get("objective")}, spec)  # refused as submit refuses it
        slo = slo_of(doc, time.time())
    except InvalidArgument as exc:
        raise JobFileError(exc.field, exc.reason, file=name, line=line_of(doc, exc.field)) from None
    return spec, slo


def cmd_plan_cost(client: Any, args: argparse.Namespace, out: Any) -> int:
    try:
        return _plan_cost(args, out)
    except FormatError:
        raise  # -o jsonpath selecting nothing, -o name: exit 1 as for every command (docs/cli.md)
    except (TesseraError, OSError) as exc:
        text = str(exc) if isinstance(exc, TesseraError) else f"cannot read {exc.filename}: {exc.strerror or exc}"
        print(f"tessctl: error: {output.one_line(text)}", file=sys.stderr)
        return 2


def _plan_cost(args: argparse.Namespace, out: Any) -> int:
    from tessera.estimator.cells import CellInputError
    from tessera.estimator.clusterfile import link_gbps_refusal
    from tessera.estimator.cost_baselines import hph_plus, sia_plus, whale_plus
    from tessera.estimator.cost_tree import CostInputError, CostPlan, GpuOffer, NoFeasiblePlan, cheapest_plan
    from tessera.estimator.service.handlers import cell_model
    from tessera.v1 import estimator_pb2

    if args.max_stages > MAX_STAGES:
        raise InvalidArgument("--max-stages", f"must be at most {MAX_STAGES}, got {args.max_stages}")
    spec, slo = _job(args.filename)
    if args.slo is not None:
        slo = parse_duration(args.slo, "--slo")
    if slo is None:
        raise InvalidArgument("slo", "the job file has no slo: {iterations_within: 6h}; give one or --slo")
    if why := link_gbps_refusal(args.nic_gbps):
        raise InvalidArgument("--nic-gbps", why)
    prices = _by_type(args.prices, "price per GPU-hour", integer=False)
    quota = _by_type(args.quota, "GPUs", integer=True)
    missing = [t for t in quota if t not in prices]
    if missing:
        raise InvalidArgument("prices", f"no price for {', '.join(missing)} (the quota file offers it)")
    have, shape = _cluster(args.cluster) if args.cluster else ({}, {})
    for t, n in quota.items():
        if args.cluster and n > have.get(t, 0):
            raise InvalidArgument(f"quota.{t}", f"{n} GPUs exceed the cluster's {have.get(t, 0)}")
    offers = [GpuOffer(t, prices[t], int(n), *shape.get(t, (args.gpus_per_node, args.nic_gbps)))
              for t, n in sorted(quota.items())]
    model = cell_model(estimator_pb2.GetCellsRequest(model=spec.model, global_batch_size=spec.global_batch_size,
                                                     recipe=spec.plan if spec.HasField("plan") else None))
    def tree(*a: Any, **kw: Any) -> CostPlan:
        return cheapest_plan(*a, placement=args.placement, **kw)

    solvers: list[tuple[str, Any]] = [(args.placement, tree)]
    if args.baselines:
        solvers += [("sia+", sia_plus), ("whale+", whale_plus), ("hph+", hph_plus)]
    answers: list[tuple[str, CostPlan | NoFeasiblePlan, float]] = []
    for label, solve in solvers:
        t0 = time.perf_counter()
        try:
            got: CostPlan | NoFeasiblePlan = solve(model, offers, int(spec.iterations), slo, max_stages=args.max_stages)
        except NoFeasiblePlan as exc:
            if label == args.placement:
                raise
            got = exc
        except (CostInputError, CellInputError) as exc:
            raise InvalidArgument(exc.field, exc.reason) from None
        answers.append((label, got, time.perf_counter() - t0))
    if args.output == "json":
        terminal.println(out, output.dumps({"job": spec.name, "model": model.signature,
                                            "iterations": int(spec.iterations), "slo_s": slo,
                                            "plans": {label: _json(p, s) for label, p, s in answers}}))
    else:
        terminal.println(out, _table(spec.name, model.signature, int(spec.iterations), slo, answers))
    return 0


def _cluster(paths: list[str]) -> tuple[dict[str, int], dict[str, tuple[int, float]]]:
    """GPUs per type in the cluster files, and each type's (GPUs per node, NIC GB/s) from its first pool."""
    from tessera.clients.estimate import load_cluster

    have: dict[str, int] = {}
    shape: dict[str, tuple[int, float]] = {}
    for pool in load_cluster(paths).pools:
        name = lookup(pool.gpu).name
        have[name] = have.get(name, 0) + pool.num_gpus
        shape.setdefault(name, (pool.gpus_per_node, pool.nic_gbps or 12.5))
    return have, shape


def _json(p: Any, solve_s: float) -> dict[str, Any]:
    from tessera.estimator.cost_tree import NoFeasiblePlan

    if isinstance(p, NoFeasiblePlan):
        return {"feasible": False, "best_time_s": None if math.isinf(p.best_time_s) else p.best_time_s,
                "reason": p.reason, "solve_s": round(solve_s, 4)}
    return {
        "feasible": True,
        "allocation": {t: n for t, n in p.gpus}, "num_gpus": p.num_gpus, "dp": p.dp,
        "num_microbatches": p.num_microbatches,
        "stages": [{"gpu_type": s.gpu_type, "dp": s.dp, "layers": [s.first_layer, s.first_layer + s.layers]}
                   for s in p.stages],
        "iter_time_s": p.iter_time_s, "total_time_s": p.total_time_s, "cost": p.cost,
        "price_per_hour": p.price_per_hour, "solve_s": round(solve_s, 4),
        "search": {"explored": p.explored, "placed": p.placed, "pruned": p.pruned},
    }


def _hours(s: float) -> str:
    return f"{s:.0f} s ({s / 3600:.2f} h)"


def _table(job: str, model: str, iterations: int, slo: float, answers: list[tuple[str, Any, float]]) -> str:
    from tessera.estimator.cost_tree import NoFeasiblePlan

    lines = [f"Job:        {output.safe(job)}", f"Model:      {model}",
             f"SLO:        {iterations} iterations within {_hours(slo)}"]
    for label, p, solve_s in answers:
        lines.append("")
        if isinstance(p, NoFeasiblePlan):
            lines.append(f"{label}: no plan ({output.one_line(p.reason)})")
            continue
        lines += [f"{label}: {p.allocation()}  ({p.num_gpus} GPUs, {p.price_per_hour:g} per hour)",
                  f"  Iteration:  {p.iter_time_s:.3f} s; {iterations} iterations: {_hours(p.total_time_s)}",
                  f"  Cost:       {p.cost:.4f}",
                  (f"  Search:     {solve_s:.2f} s, {p.placed} allocations placed, {p.explored} nodes explored, "
                  f"{p.pruned} pruned"),
                  f"  {'STAGE':<6} {'GPU':<16} {'DP':>3}  LAYERS"]
        lines += [f"  {i:<6} {s.gpu_type:<16} {s.dp:>3}  {s.first_layer}-{s.first_layer + s.layers - 1}"
                  for i, s in enumerate(p.stages)]
    return "\n".join(lines)
