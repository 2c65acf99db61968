"""`tessctl estimate time`: the iteration time of one given plan of a job (docs/cli.md).

Like `estimate memory`: the job file's model and global batch, the GPU type, the plan (`--plan`,
the same vocabulary), the GPU count it must use; plus the node size its ranks are placed on. The
EstimateTime request goes to the library in this process or, with `--estimator`, to a
tessera-estimator; both answer the same message (iteration time, its breakdown and source, tokens
per second, and the memory estimate of the same plan), printed by the same functions.
"""

from __future__ import annotations

import argparse
from typing import Any

from tessera.clients import argtypes
from tessera.clients.estimate import (
    _estimator_option,
    _gb,
    _hf_config_option,
    _job,
    _plan_text,
    answer,
    plan_arg,
)
from tessera.clients.estimate_checks import fits_figure, fits_term, require_transformer
from tessera.estimator.convert import PlanOverride
from tessera.v1 import common_pb2, estimator_pb2


def add_time_command(sub: Any, command: Any) -> None:
    """The `estimate time` subcommand (command(parent, name, func, help))."""
    p = command(sub, "time", cmd_time, "seconds per iteration of a job under one given plan, with its memory")
    p.add_argument("-f", "--filename", required=True, metavar="FILE", help="job YAML (docs/job-file.md); - = stdin")
    p.add_argument("--gpu", required=True, metavar="TYPE", help="GPU type (catalog name or alias, e.g. h100-80gb)")
    p.add_argument("--plan", type=plan_arg, default=None, metavar="K=V[,K=V]",
                   help="execution plan, as for `estimate memory` (dp, tp, pp, cp, micro_batch, grad_accum, sharding, "
                        "checkpointing, ...); unset sizes are 1 and grad_accum keeps the job's global batch "
                        "(default: one GPU)")
    p.add_argument("--gpus", type=argtypes.positive_int, default=None, metavar="N",
                   help="GPU count the plan must use (default: the job's gpus hint, if any)")
    p.add_argument("--gpus-per-node", type=argtypes.positive_int, default=0, metavar="N",
                   help="GPUs per node the ranks are placed on (default 8, at most the plan's GPUs)")
    _hf_config_option(p)
    _estimator_option(p)


def time_request(spec: common_pb2.JobSpec, gpu: str, plan: PlanOverride | None, gpus: int | None,
                 gpus_per_node: int = 0) -> estimator_pb2.EstimateTimeRequest:
    """The EstimateTime request of a job file and the command's flags: the job file's `plan:` (its
    recipe) with `--plan` on top, as for `estimate memory`."""
    base = spec.plan if spec.HasField("plan") else common_pb2.ExecutionPlan()
    return estimator_pb2.EstimateTimeRequest(
        model=spec.model, plan=plan.on(base) if plan is not None else base, gpu=gpu,
        gpus_per_node=gpus_per_node,
        num_gpus=spec.hint.gpus if gpus is None else gpus, global_batch_size=spec.global_batch_size)


def time_table(job: str, resp: estimator_pb2.EstimateTimeResponse, wide: bool = False) -> str:
    source = resp.source if wide or len(resp.source) <= 60 else resp.source.split("(")[0]
    head = [("Job", job), ("Model", resp.model_signature),
            ("GPU", f"{resp.gpu} x {resp.num_gpus} ({resp.gpus_per_node} per node)"),
            ("Plan", _plan_text(resp.plan)), ("Iteration", f"{resp.iter_time_seconds:.4g} s"),
            ("Tokens/s", f"{resp.tokens_per_second:,.0f}"), ("Source", source)]
    lines = [f"{k + ':':<10} {v}" for k, v in head]
    total = resp.iter_time_seconds or 1.0
    width = max([len("COMPONENT")] + [len(c.name) for c in resp.breakdown])
    lines += ["", f"{'COMPONENT':<{width}}  {'SECONDS':>10}  {'SHARE':>6}"]
    lines += [f"{c.name:<{width}}  {c.seconds:>10.4g}  {100 * c.seconds / total:>5.1f}%" for c in resp.breakdown]
    m = resp.memory
    fits = "" if not m.HasField("fits") else f" (fits: {'yes' if m.fits else 'no'})"
    cap = f" of {_gb(m.capacity)}" if m.capacity else ""
    # The figure `fits` judges, as `estimate memory` prints and names it: what the allocator reserves
    # plus `other` (the context). The tensors alone (m.total) read "44 of 80 GB" beside a verdict made on 52.
    lines += ["", (f"Memory:    {fits_figure(m)}{cap} GB: {fits_term(m)} on the most loaded GPU, {_gb(m.total)} of "
                   f"it tensors{fits}; `tessctl estimate memory` for the categories")]
    return "\n".join(lines)


def cmd_time(client: Any, args: argparse.Namespace, out: Any) -> int:
    spec = _job(args.filename, args.hf_config)
    require_transformer(spec.model, "time")
    req = time_request(spec, args.gpu, args.plan, args.gpus, args.gpus_per_node)
    return answer(args, out, "EstimateTime", req, lambda resp, wide: time_table(spec.name, resp, wide=wide))
