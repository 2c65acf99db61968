"""The performance model's messages: tessera.v1 Perf* messages to and from estimator/perf_model.py.

Pure conversions (no state): the Estimator's FitPerformance and ReportStepTimes handlers
(estimator/service/handlers.py) call them. Errors are the library's input errors, with the field
of the request (``samples[2].config.plan.dp``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import TypeVar

from tessera.common.errors import InvalidArgument, InvalidInput
from tessera.estimator import perf_model as pm
from tessera.estimator.cells import CellInputError
from tessera.estimator.plans import PlanInputError
from tessera.v1 import estimator_pb2 as pb

PERF_MODES: dict[int, pm.Mode] = {pb.PERF_MODE_UNSPECIFIED: "tessera", pb.PERF_MODE_MORPHLING: "morphling",
                                  pb.PERF_MODE_TESSERA: "tessera"}
PERF_MODE_VALUE = {"morphling": pb.PERF_MODE_MORPHLING, "tessera": pb.PERF_MODE_TESSERA}
ZEROS: dict[int, pm.Zero] = {pb.ZERO_KIND_UNSPECIFIED: "none", pb.ZERO_KIND_NONE: "none",
                             pb.ZERO_KIND_ZERO_DP: "zero-dp", pb.ZERO_KIND_OFFLOAD: "offload"}


def prefixed(prefix: str, exc: InvalidInput) -> PlanInputError:
    """`exc` with its field put under `prefix`; an error without a field (an unknown GPU name) is
    about the whole of `prefix`."""
    if isinstance(exc, InvalidArgument):
        # Fields the library already names from the same message ("env.intra_node_bw") once.
        last = prefix.rsplit(".", 1)[-1]
        field = exc.field[len(last) + 1:] if exc.field.startswith(f"{last}.") else exc.field
        return PlanInputError(f"{prefix}.{field}" if field else prefix, exc.reason)
    return PlanInputError(prefix, str(exc))


def perf_mode(value: int, field: str = "mode") -> pm.Mode:
    if value not in PERF_MODES:
        raise PlanInputError(field, f"unknown value {value}")
    return PERF_MODES[value]


def environment(e: pb.PerfEnvironment, base: pm.Environment = pm.DEFAULT_ENV) -> pm.Environment:
    """`base` with the message's non-zero fields; errors name ``env.FIELD``."""
    changes: dict[str, float | int] = {}
    for f in ("intra_node_bw", "inter_node_bw", "gpus_per_nic", "pcie_bw", "net_efficiency"):
        v = getattr(e, f)
        if v:
            changes[f] = v
    return replace(base, **changes) if changes else base  # type: ignore[arg-type]


def run_config(c: pb.PerfRunConfig) -> pm.RunConfig:
    """The library's RunConfig; PerfModelInputError names the field inside the config."""
    w = c.workload
    workload = pm.Workload(name=w.name, params=w.params, layers=w.layers, hidden=w.hidden, seq=w.seq,
                           global_batch=int(w.global_batch), fwd_ref_time=w.fwd_ref_time,
                           fwd_ref_batch=w.fwd_ref_batch or 1.0, fwd_exponent=w.fwd_exponent or 1.0)
    p = c.plan
    if p.zero not in ZEROS:
        raise PlanInputError("plan.zero", f"unknown value {p.zero}")
    plan = pm.Plan(dp=p.dp or 1, tp=p.tp or 1, pp=p.pp or 1, zero=ZEROS[p.zero], ga_steps=p.ga_steps or 1,
                   checkpointing=p.checkpointing, micro_batches=p.micro_batches or 1)
    if not c.gpus_per_node:
        raise PlanInputError("gpus_per_node", "required: GPUs per server, e.g. [8, 8]")
    try:
        placement = pm.Placement(tuple(c.gpus_per_node))
    except pm.PerfModelInputError as exc:  # the library's "placement.gpus_per_node[0]" is this message's field
        raise PlanInputError("gpus_per_node" + exc.field.removeprefix("placement").removeprefix(".gpus_per_node"),
                             exc.reason) from None
    return pm.RunConfig(workload, plan, placement, cpus=c.cpus or 1, fwd_time=c.fwd_time or None)


def sample(s: pb.PerfSample) -> pm.Sample:
    cfg = in_field("config", run_config, s.config)
    return pm.Sample(cfg, s.iter_time, t_cc=s.t_cc or None, t_oo=s.t_oo or None, time=s.time)


T = TypeVar("T")
M = TypeVar("M")


def in_field(prefix: str, fn: Callable[[M], T], arg: M) -> T:
    """fn(arg), with the field of an input error put under `prefix`."""
    try:
        return fn(arg)
    except (PlanInputError, pm.PerfModelInputError, CellInputError) as exc:
        raise prefixed(prefix, exc) from None


def params_message(p: pm.Params) -> pb.PerfParams:
    return pb.PerfParams(k_bwd=p.k_bwd, k_sync=p.k_sync, k_opt=p.k_opt, k_os_offload=p.k_os_offload,
                         k_const=p.k_const, k_off=p.k_off, k_swap=p.k_swap, k_host=p.k_host)


def params_of(m: pb.PerfParams) -> pm.Params:
    return pm.Params(m.k_bwd, m.k_sync, m.k_opt, m.k_os_offload, m.k_const, m.k_off, m.k_swap, m.k_host)


def config_key(c: pm.RunConfig) -> tuple[Hashable, ...]:
    p = c.plan
    return (p.dp, p.tp, p.pp, p.zero, p.ga_steps, p.checkpointing, p.micro_batches, c.placement.gpus_per_node,
            c.cpus)
