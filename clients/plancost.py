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

The job file is read by the job-file parser `tessctl submit` uses (clients/jobfile.py, which applies
the controller's bounds, tessera.common.jobspec and tessera.common.objective) and a deadline already
past is refused as SubmitJob refuses it, so plan-cost and submit accept and refuse the same files with
the same field and reason; `--slo` stands in for the file's SLO (a file with `objective: cost` and no
`slo:` is read as if it said `slo: {iterations_within: <--slo>}`). The job's `gpu_types` limit the
types offered, as the controller limits them, and each must have a price (submit's rule); the prices
file needs a price for each type the job may use, not for the quota's others. The prices
file is read by the controller's --prices parser (tessera.common.objective.parse_prices: prices > 0,
at most its MAX_PRICE). Errors: one line, exit 2; a `-o jsonpath` that selects nothing is exit 1, as
for every command. Limits: `--max-stages` at most the cost tree's MAX_STAGES (16), the job file
(stdin too) at most common/yamlfile's MAX_BYTES, and the search its default budget (a search over it
is refused as "search too large").
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

from tessera.clients import argtypes, output, terminal
from tessera.clients.formats import FormatError
from tessera.common.errors import InvalidArgument, TesseraError
from tessera.common.gpus import UnknownGpuError, lookup
from tessera.common.objective import cost_text, deadline_passed, load_prices, parse_duration
from tessera.common.yamlfile import (
    MAX_BYTES,
    InputFileError,
    YamlMap,
    line_of,
    load_yaml,
    parse_with_lines,
    read_yaml,
    require_name_keys,
)
from tessera.v1 import common_pb2

# The cost tree's MAX_STAGES (checked here before any file is read; the tree checks it too).
MAX_STAGES = 16


class PlanCostFileError(InputFileError):
    """A quota file that cannot be used: the field and why (a prices file's is common.objective's
    PricesError, as the controller's --prices)."""


def add_arguments(sub: Any, command: Any) -> None:
    """The `plan-cost` command (command(parent, name, func, help)); it runs locally."""
    p = command(sub, "plan-cost", cmd_plan_cost,
                "the cheapest mix of GPU types (prices, quotas) that runs a job file within its SLO, no cluster "
                "needed (Espresso's cost tree)")
    p.set_defaults(local=True)
    p.add_argument("-f", "--filename", required=True, metavar="FILE", help="job YAML (docs/job-file.md); - = stdin")
    p.add_argument("--prices", required=True, metavar="FILE",
                   help="YAML/JSON {GPU type: price per GPU-hour > 0}, read as the controller's --prices")
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


def _slo_of(spec: common_pb2.JobSpec, now: float) -> float | None:
    """Seconds the job's iterations must run within, from its validated SLO (None when it has
    none): `iterations_within`, or a deadline's time left from `now`."""
    if not spec.HasField("slo"):
        return None
    if spec.slo.iterations_within_seconds:
        return spec.slo.iterations_within_seconds
    return spec.slo.deadline - now


def _prices(path: str) -> dict[str, float]:
    """The prices file, read as the controller reads its --prices (load_prices): its bound on a
    price (MAX_PRICE) also keeps every cost finite, so `-o json` never prints `Infinity`."""
    return load_prices(path)


def _quota(path: str) -> dict[str, int]:
    doc = read_yaml(path, PlanCostFileError)
    require_name_keys(doc, path, PlanCostFileError)

    def parse(d: Any) -> dict[str, int]:
        if not isinstance(d, Mapping) or not d:
            raise PlanCostFileError("", "must be a non-empty mapping {GPU type: GPUs}")
        out: dict[str, int] = {}
        for key, v in d.items():
            try:
                name = lookup(str(key)).name
            except UnknownGpuError as exc:
                raise PlanCostFileError(str(key), str(exc)) from None
            if name in out:
                raise PlanCostFileError(str(key), f"{name} is given twice")
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PlanCostFileError(str(key), f"must be a whole number of GPUs >= 1, got {v!r}")
            out[name] = v
        return out

    return parse_with_lines(doc, path, parse)


def _with_slo(doc: Any, slo: float | None) -> Any:
    """The job document with `--slo` (seconds) as its SLO where it says `objective: cost` and gives
    none: submit's check of such a file ("the cost objective needs exactly one of iterations_within
    and deadline") ran before `--slo` was read, so the flag could not give the SLO its help promised.
    A file's own `slo:` is checked as submit checks it, then `--slo` overrides it."""
    if slo is None or not isinstance(doc, Mapping) or doc.get("objective") != "cost" or doc.get("slo") is not None:
        return doc
    if not isinstance(doc, YamlMap):
        return {**doc, "slo": {"iterations_within": slo}}
    filled = YamlMap(doc)  # its errors keep the file's lines; an SLO's at `slo: ~`, else the top
    filled["slo"] = {"iterations_within": slo}
    filled.line = doc.line
    filled.key_lines = {**doc.key_lines, "slo": doc.key_lines.get("slo", doc.line)}
    return filled


def _job(filename: str, slo: float | None = None) -> tuple[common_pb2.JobSpec, float | None]:
    """The job file's JobSpec, accepted and refused as `tessctl submit` and SubmitJob accept and
    refuse it (with `slo`, `--slo`'s seconds, standing in for a missing SLO: `_with_slo`), and its
    SLO in seconds."""
    from tessera.clients.jobfile import JobFileError, job_spec_from_dict

    name = "<stdin>" if filename == "-" else filename
    if filename == "-":  # at most one byte over the limit, as read_yaml reads a file
        doc = load_yaml(getattr(sys.stdin, "buffer", sys.stdin).read(MAX_BYTES + 1), name, JobFileError)
    else:
        doc = read_yaml(filename, JobFileError)
    base = None if filename == "-" else Path(filename).parent  # a relative hf_config, as submit reads it
    spec = parse_with_lines(_with_slo(doc, slo), name, lambda d: job_spec_from_dict(d, base_dir=base))
    now = time.time()
    passed = deadline_passed(spec, now)
    if passed is not None:  # SubmitJob's refusal; the clock is this machine's, not a controller's
        raise JobFileError(passed.field, passed.reason.replace("the controller's clock", "the clock here"),
                           file=name, line=line_of(doc, "slo.deadline"))
    return spec, _slo_of(spec, now)


def _allowed_offers(spec: common_pb2.JobSpec, prices: Mapping[str, float], quota: Mapping[str, int]) -> list[str]:
    """The quota's types the job may use: its `gpu_types` (each priced, as submit requires of the
    controller's --prices), else every type."""
    allowed = [lookup(t).name for t in spec.hint.gpu_types]
    if not allowed:
        return sorted(quota)
    missing = [t for t in allowed if t not in prices]
    if missing:
        raise InvalidArgument("gpu_types", f"no price for {', '.join(missing)} in the prices file (--prices)")
    usable = sorted(t for t in quota if t in allowed)
    if not usable:
        raise InvalidArgument("gpu_types", f"the quota file offers none of the types the job may use "
                                           f"({', '.join(allowed)}); it offers {', '.join(sorted(quota))}")
    return usable


def cmd_plan_cost(client: Any, args: argparse.Namespace, out: Any) -> int:
    try:
        return _plan_cost(args, out)
    except FormatError:
        raise  # -o jsonpath selecting nothing (exit 1), -o name (a usage error, exit 2): as for every command (docs/cli.md)
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
    flag = None if args.slo is None else parse_duration(args.slo, "--slo")
    spec, slo = _job(args.filename, flag)
    if flag is not None:
        slo = flag
    if slo is None:
        raise InvalidArgument("slo", "the job file has no slo: {iterations_within: 6h}; give one or --slo")
    if why := link_gbps_refusal(args.nic_gbps):
        raise InvalidArgument("--nic-gbps", why)
    prices = _prices(args.prices)
    quota = _quota(args.quota)
    # Only the types the job may use need a price: one with `gpu_types: [A40]` was refused for the
    # quota's H100, which it never plans over.
    usable = _allowed_offers(spec, prices, quota)
    missing = [t for t in usable if t not in prices]
    if missing:
        raise InvalidArgument("prices", f"no price for {', '.join(missing)} (the quota file offers it)")
    have, shape = _cluster(args.cluster) if args.cluster else ({}, {})
    for t, n in quota.items():
        if args.cluster and n > have.get(t, 0):
            raise InvalidArgument(f"quota.{t}", f"{n} GPUs exceed the cluster's {have.get(t, 0)}")
    offers = [GpuOffer(t, prices[t], quota[t], *shape.get(t, (args.gpus_per_node, args.nic_gbps)))
              for t in usable]
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


def per_hour_text(x: float) -> str:
    """A price per hour in plain decimals, as the costs beside it (`4,000,000`, `2.5`; `:g` printed
    `4e+06`): four decimals at most, trailing zeros dropped, three figures for a price under that."""
    text = f"{x:,.4f}".rstrip("0").rstrip(".")
    return text if text != "0" else format(Decimal(f"{x:.3g}"), "f")


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
        gpus = f"{p.num_gpus} GPU{'' if p.num_gpus == 1 else 's'}"
        lines += [(f"{label}: {p.allocation()}  ({gpus}, {per_hour_text(p.price_per_hour)} per hour: the prices file's price "
                  "per GPU-hour x GPUs)"),
                  f"  Iteration:  {p.iter_time_s:.3f} s; {iterations} iterations: {_hours(p.total_time_s)}",
                  f"  Cost:       {cost_text(p.cost)} (price per GPU-hour x GPUs x hours, in the prices file's currency)",
                  (f"  Search:     {solve_s:.2f} s, {p.placed} allocations placed, {p.explored} nodes explored, "
                  f"{p.pruned} pruned"),
                  f"  {'STAGE':<6} {'GPU':<16} {'DP':>3}  LAYERS (first-last)"]
        lines += [f"  {i:<6} {s.gpu_type:<16} {s.dp:>3}  {s.first_layer}-{s.first_layer + s.layers - 1}"
                  for i, s in enumerate(p.stages)]
    return "\n".join(lines)
