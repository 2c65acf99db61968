"""Throughput oracles: what the simulated jobs really achieve, and what policies are told.

- `ArenaOracle`: the Crius artifact's measured table (data/arena/iter_time_optimal.json: Alpa's best
  plan per model and resources), with the artifact's query rules (db_querier.py): an exact
  `<nodes>_<type>_<nodes>_n_<per node>_d` entry; else the entry at the best locality times 0.9 per
  halving of the per-node share; else the next larger model of the family at the same resources
  times 1.8 per size step; iteration times over 300 s or negative are infeasible. Its data-parallel
  memory filter (dp_mem.json: per-replica GB x 1.2 <= 0.8 x GPU memory) is `dp_fits`. Stage counts
  of the Cells come from iter_time_estimated.json where it has the resource.
- `MorphlingOracle`: the Morphling artifact's measured placements (data/morphling/placements): one
  Cell per execution plan measured for a model on a placement (GPUs per server), the plan named
  (`CellEstimate.plan_name`, `plan`); the truth and the other policies take the fastest.
- `load_estimator_oracle(spec)`: any object with the `Estimates` protocol, e.g. the Cell estimator,
  named as `module:factory` (the factory takes the cluster's GPU type names).

All are deterministic and implement tessera.controller.core.policy.Estimates.
"""

from __future__ import annotations

import csv
import importlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tessera.common.errors import InvalidInput
from tessera.controller.core.policy import CellEstimate, Estimates
from tessera.controller.core.snapshot import Cell, JobView, PlanChoice, Promise
from tessera.controller.sim.clusters import ARENA_TYPES
from tessera.estimator.plans import ExecutionPlan

SIZES = {"wide_resnet": ["500M", "1B", "2B", "4B", "6.8B", "13B"],
         "bert": ["760M", "1.3B", "2.6B", "6.7B", "15B", "39B"],
         "moe": ["690M", "1.3B", "2.4B", "10B", "27B", "70B"]}
LOCALITY_SCALE = 0.9
PARAM_SCALE = 1.8
MAX_ITER_S = 300.0
XLA_FRACTION = 0.8
COUNTS = (1, 2, 4, 8, 16)


class OracleError(InvalidInput, ValueError):
    """An oracle that cannot answer for a job or a table that cannot be read."""


def arena_type(name: str) -> str:
    """Cluster GPU type name -> the artifact's short name ("A100-40GB" -> "a100")."""
    for short, (full, _, _, _) in ARENA_TYPES.items():
        if full == name:
            return short
    return name.split("-")[0].lower()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise OracleError(f"{path}: cannot read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise OracleError(f"{path} line {e.lineno}: not valid JSON: {e.msg}") from None


class ArenaOracle:
    """The Crius artifact's throughput table behind the Estimates protocol."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir
        self.table: dict[str, dict[str, float]] = _read_json(data_dir / "iter_time_optimal.json")
        dp = _read_json(data_dir / "dp_mem.json")
        self.dp_mem: dict[str, list[float]] = dp[0] if isinstance(dp, list) else dp
        self.models: dict[str, dict[str, dict[str, object]]] = _read_json(data_dir / "models.json")
        self.stages: dict[tuple[str, str], int] = {}
        est_path = data_dir / "iter_time_estimated.json"
        if est_path.exists():
            est = _read_json(est_path)
            for m, res in est.items():
                for r, plans in res.items():
                    good = [p for p in plans if p.get("values") and p["values"][-1] > 0]
                    if good:
                        best = min(good, key=lambda p: p["values"][-1])
                        self.stages[(m, r)] = int(best["pp_dp_tp"][0])
        self._thr: dict[tuple[str, str, int, int], float] = {}

    # ------------------------------------------------------------------ the artifact's query

    def known_models(self) -> list[str]:
        return sorted({k.rsplit("_", 1)[0] for k in self.table})

    def throughput(self, key: str, gpu_type: str, gpus: int, nodes: int) -> float:
        """Samples/s of the optimal plan (the artifact's `query_db(only_opt=True)`); 0 = infeasible."""
        k = (key, gpu_type, gpus, nodes)
        got = self._thr.get(k)
        if got is None:
            got = self._query(key, arena_type(gpu_type), gpus, nodes)
            self._thr[k] = got
        return got

    def _query(self, key: str, t: str, gpus: int, nodes: int) -> float:
        if nodes <= 0 or gpus % nodes:
            return 0.0
        per = gpus // nodes
        fam, size, batch_s = _split_key(key)
        batch = int(batch_s)
        l2 = f"{nodes}_{t}_{nodes}_n_{per}_d"
        row = self.table.get(key)
        factor = 1.0
        it: float | None = None
        if row is not None and l2 in row:
            it = row[l2]
        else:
            cap = ARENA_TYPES[t][1] if t in ARENA_TYPES else per
            best = [gpus] if gpus <= cap else [cap] * (gpus // cap)
            l2b = f"{len(best)}_{t}_{len(best)}_n_{best[0]}_d"
            if row is not None and l2b in row:
                it = row[l2b]
                mf = int(math.log2(best[0] // per)) if best[0] // per >= 1 else 0
                if mf:
                    factor = LOCALITY_SCALE ** mf
            else:
                sizes = SIZES.get(fam, [])
                if size in sizes:
                    for i, s in enumerate(sizes):
                        if i <= sizes.index(size):
                            continue
                        g = self.table.get(f"{fam}_{s}_{batch}")
                        if g is not None and l2 in g:
                            it = g[l2]
                            factor = PARAM_SCALE ** (i - sizes.index(size))
                            break
        if it is None or not it or it > MAX_ITER_S:
            return 0.0
        thr = round(batch / float(it), 3) * factor
        return thr if thr > 0 else 0.0

    def iteration_time(self, key: str, gpu_type: str, gpus: int, nodes: int) -> float:
        """The artifact's `_get_iter_time(force_opt=True)`: round(batch / thr, 3); 0 if infeasible."""
        thr = self.throughput(key, gpu_type, gpus, nodes)
        if thr <= 0:
            return 0.0
        return round(int(_split_key(key)[2]) / thr, 3)

    def dp_fits(self, job: JobView, gpu_type: str, gpus: int) -> bool:
        t = arena_type(gpu_type)
        need_list = self.dp_mem.get(job.key)
        if need_list is None or gpus not in COUNTS:
            return False
        idx = COUNTS.index(gpus)
        if idx >= len(need_list):
            return False
        need = need_list[idx]
        mem = ARENA_TYPES[t][2] if t in ARENA_TYPES else 0
        return not (need != 0 and (need == -1 or need * 1.2 > mem * XLA_FRACTION))

    # ------------------------------------------------------------------ Estimates protocol

    def cells(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> Sequence[CellEstimate]:
        thr = self.throughput(job.key, gpu_type, gpus, nodes)
        if thr <= 0:
            return ()
        per = gpus // nodes
        st = self.stages.get((job.key, f"{nodes}_{arena_type(gpu_type)}_{nodes}_n_{per}_d"), 0)
        return (CellEstimate(Cell(gpu_type, gpus, st), job.global_batch_size / thr, source="table:arena"),)

    def gpu_counts(self, job: JobView, gpu_type: str) -> Sequence[int]:
        t = arena_type(gpu_type)
        cap = ARENA_TYPES[t][1] if t in ARENA_TYPES else 1
        return [n for n in COUNTS if self.throughput(job.key, gpu_type, n, 1 if n <= cap else n // cap) > 0]


def _split_key(key: str) -> tuple[str, str, str]:
    head, batch = key.rsplit("_", 1)
    fam, size = head.rsplit("_", 1)
    return fam, size, batch


class MorphlingOracle:
    """Measured iteration times of the Morphling artifact, by model and placement."""

    def __init__(self, data_dir: Path, per_node: int = 8) -> None:
        self.per_node = per_node
        root = data_dir / "placements"
        self.best: dict[tuple[str, str], tuple[float, str]] = {}
        self.plans: dict[tuple[str, str], dict[str, float]] = {}
        self._fallback: dict[tuple[str, str], float] = {}
        for model in ("vit", "roberta", "bert", "t5", "gpt2", "llama7", "llama30"):
            path = root / model / "placements.csv"
            try:
                text = path.read_text(encoding="utf-8-sig")
            except OSError as e:
                raise OracleError(f"{path}: cannot read: {e.strerror}") from None
            for ln, row in enumerate(csv.DictReader(text.splitlines()), start=2):
                try:
                    it = float(row["iter_time"])
                    place = "".join(sorted(row["placement"].strip(), reverse=True))
                except (KeyError, ValueError):
                    raise OracleError(f"{path} line {ln}: field iter_time or placement is not valid") from None
                if it <= 0 or not place.isdigit():
                    continue
                k = (model, place)
                plan = row.get("exec_plan", "").strip()
                if k not in self.best or it < self.best[k][0]:
                    self.best[k] = (it, plan)
                # Every measured plan, so that a policy can choose the plan (Morphling Sec. 5) and
                # a promised plan's time is known (the SLA's t_P).
                mine = self.plans.setdefault(k, {})
                if plan and (plan not in mine or it < mine[plan]):
                    mine[plan] = it

    def iteration_time(self, model: str, placement: str, plan: str = "") -> float:
        """Measured seconds per iteration of `plan` ("" = the best plan) on this placement. A plan
        not measured there answers as the best plan does (the workload names a few 3D plans the
        table lacks). A placement not measured takes the best measured one with the same GPUs on
        as many servers, else on more servers (more spread, slower), else on the most servers
        measured below, times 0.9 per extra server."""
        key = "".join(sorted(placement, reverse=True))
        if plan:
            got_plan = self.plans.get((model, key), {}).get(plan)
            if got_plan is not None:
                return got_plan
        got = self.best.get((model, key))
        if got:
            return got[0]
        memo = self._fallback.get((model, key))
        if memo is not None:
            return memo
        total, servers = sum(int(c) for c in key), len(key)
        same = [(v[0], len(p)) for (m, p), v in self.best.items() if m == model and sum(int(c) for c in p) == total]
        out = 0.0
        if same:
            eq = [t for t, k in same if k == servers]
            more = [t for t, k in same if k > servers]
            if eq:
                out = min(eq)
            elif more:
                out = min(more)
            else:  # only fewer servers measured: the closest count, 0.9x per extra server
                k = max(kk for _, kk in same)
                t = min(tt for tt, kk in same if kk == k)
                out = t / (0.9 ** (servers - k))
        self._fallback[(model, key)] = out
        return out

    def promise_time(self, job: JobView, promise: Promise) -> float:
        """t_P of the SLA (controller/core/guarantees.py `PromiseTimes`): the promised plan on the
        promised GPUs placed on the fewest servers; 0 = not measured."""
        g = promise.gpus
        if g <= 0:
            return 0.0
        k = -(-g // self.per_node)
        if g % k:
            return 0.0
        return self.iteration_time(job.key, str(g // k) * k, promise.plan)

    def cells(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> Sequence[CellEstimate]:
        if nodes <= 0 or gpus % nodes:
            return ()
        per = gpus // nodes
        if per > 9:
            return ()
        place = str(per) * nodes
        measured = self.plans.get((job.key, place))
        if measured:
            # One Cell per measured plan, fastest first, each naming its plan.
            return tuple(CellEstimate(Cell(gpu_type, gpus, plan_stages(p)), it, source="table:morphling",
                                      plan=plan_choice(p, gpus, gpu_type, job.global_batch_size), plan_name=p)
                         for p, it in sorted(measured.items(), key=lambda kv: (kv[1], kv[0])))
        it = self.iteration_time(job.key, place)
        if it <= 0:
            return ()
        return (CellEstimate(Cell(gpu_type, gpus, 0), it, source="table:morphling"),)

    def gpu_counts(self, job: JobView, gpu_type: str) -> Sequence[int]:
        out = set()
        for m, place in self.best:
            if m == job.key:
                out.add(sum(int(c) for c in place))
        return sorted(out)


def plan_stages(name: str) -> int:
    """Pipeline stages of a Morphling plan name: "248" (PP 2, TP 4, DP 8) -> 2; the DP family -> 1."""
    return int(name[0]) if len(name) == 3 and name.isdigit() and name[0] != "0" else 1


def plan_choice(name: str, gpus: int, gpu_type: str, batch: int) -> PlanChoice:
    """A Morphling plan name as a PlanChoice with its ExecutionPlan: three digits PP,TP,DP; "ga"
    gradient accumulation (2 steps: the table does not say how many); "gc" full activation
    checkpointing; "zero-dp" ZeRO-2 (the paper's default ZeRO, Sec. 2.1 footnote); "zero-offload"
    ZeRO-2 with the optimizer on the CPUs."""
    pp, tp, dp, ga = 1, 1, max(1, gpus), 1
    extra: dict[str, Any] = {}
    if len(name) == 3 and name.isdigit() and "0" not in name:
        pp, tp, dp = int(name[0]), int(name[1]), int(name[2])
    elif name == "ga":
        ga = 2
    elif name == "gc":
        extra["checkpointing"] = "full"
    elif name == "zero-dp":
        extra["sharding"] = "zero2"
    elif name == "zero-offload":
        extra.update(sharding="zero2", offload="optimizer")
    micro = max(1, batch // (dp * ga))
    execution = ExecutionPlan(dp=dp, tp=tp, pp=pp, micro_batch=micro, grad_accum=ga, **extra)
    return PlanChoice(dp, tp, pp, micro, ga, gpu_type, 0, "table:morphling", execution)


def cell_estimator_oracle(pools: dict[str, tuple[int, int, bool]]) -> Estimates:
    """The live controller's Cell estimates (controller/cell_estimates.py over estimator/cells.py)
    for the cluster's GPU pools {type: (GPUs, GPUs per node, NVLink)}."""
    try:
        from tessera.common.gpus import CATALOG
        from tessera.controller.cell_estimates import CellEstimates
    except ImportError as e:  # pragma: no cover - depends on the estimator being installed
        raise OracleError(f"oracle 'estimator': {e}") from None
    known = {t: v for t, v in pools.items() if t in CATALOG}
    if not known:
        raise OracleError(f"oracle 'estimator': no GPU type of the cluster is in the catalog ({', '.join(pools)})")
    # the artifact's jobs ran Alpa, without flash attention: their Cells stay timed as the arena's
    est: Estimates = CellEstimates(known, flash_attention=False)
    return est


def load_estimator_oracle(spec: str, gpu_types: Sequence[str]) -> Estimates:
    """`module:factory` -> factory(gpu_types), which must return an object with the Estimates
    protocol."""
    mod_name, _, attr = spec.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise OracleError(f"oracle {spec!r}: cannot import {mod_name}: {e}") from None
    factory = getattr(mod, attr or "tessera_estimates", None)
    if factory is None:
        raise OracleError(f"oracle {spec!r}: {mod_name} has no {attr or 'tessera_estimates'} "
                          f"(a factory taking the cluster's GPU types and returning Estimates)")
    est = factory(list(gpu_types))
    if not isinstance(est, Estimates):
        raise OracleError(f"oracle {spec!r}: {type(est).__name__} does not implement cells() and gpu_counts()")
    return est
