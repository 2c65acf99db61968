"""`tessctl estimate memory|cells|stages|time`: ask the estimator about a job file (docs/estimator-service.md).

The same request message goes either to the library in this process (tessera.estimator.service.handlers.Estimator,
the default: no server needed) or to a `tessera-estimator` (`--estimator HOST:PORT`); the answer is
the same response message, printed by the same functions, so both paths print the same output.
An input error of the library becomes the same INVALID_ARGUMENT "field: reason" the service sends.

Cluster files (`--cluster FILE`, repeatable, or FILE,FILE): YAML or JSON, one of
- ``{pools: [{gpu: A100-80GB, nodes: 2, gpus_per_node: 4, intra_link: nvlink, nic_gbps: 12.5}, ...]}``
  (``num_gpus`` may replace ``nodes``; ``intra_link``, ``nic_gbps``, ``pcie_gbps`` are optional);
- a declared node inventory (docs/inventory.md, examples/inventories/*.yaml): one node;
- a simulator cluster (controller/sim/clusters/*.json: ``node_groups``).
Each format has one parser, shared with the estimator library, the agent and the simulator
(tessera.estimator.clusterfile, tessera.common.inventoryfile): a bad file is a ClusterFileError
`FILE line N: field F: why`. Pools of the same GPU type, node size and links are merged (their GPUs
add up).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from tessera.clients import argtypes
from tessera.clients.estimate_checks import fits_figure, fits_term, marp_warning, require_transformer
from tessera.clients.sdk import RpcError
from tessera.common import tls
from tessera.common.errors import InvalidArgument, InvalidInput, TesseraError
from tessera.common.inventoryfile import InventoryError, parse_inventory
from tessera.common.rpc import check_address, sync_channel
from tessera.common.tls import TlsConfig
from tessera.common.yamlfile import parse_with_lines, read_yaml
from tessera.estimator.clusterfile import ClusterFileError, catalog_gpu, parse_node_groups, parse_pools
from tessera.estimator.convert import PlanOverride, execution_plan, model_spec
from tessera.v1 import common_pb2, estimator_pb2, estimator_pb2_grpc

MODES = {"formula": estimator_pb2.MEMORY_MODE_FORMULA, "marp": estimator_pb2.MEMORY_MODE_MARP,
         "traced": estimator_pb2.MEMORY_MODE_TRACED,
         "traced:torchtitan": estimator_pb2.MEMORY_MODE_TRACED_TORCHTITAN,
         "traced:transformers": estimator_pb2.MEMORY_MODE_TRACED_TRANSFORMERS}
ESTIMATOR_PORT = 50053  # tessera-estimator's default --listen port (estimator/service/main.py)
DEFAULT_TIMEOUT_S = 300.0  # a traced-mode estimate of a large model takes a while on a cold service
LINKS = {"": estimator_pb2.INTRA_LINK_UNSPECIFIED, "nvlink": estimator_pb2.INTRA_LINK_NVLINK,
         "pcie": estimator_pb2.INTRA_LINK_PCIE}
GB = 1e9
GIB = 1024**3


class EstimatorUnreachable(RpcError):
    def __init__(self, target: str, message: str) -> None:
        super().__init__("UNAVAILABLE", message)
        self.target = target


# -- arguments --------------------------------------------------------------------------------------


def plan_arg(text: str) -> PlanOverride:
    """argparse type of --plan: ``dp=2,tp=2,pp=1,micro_batch=4,sharding=zero2,...``, with the keys it
    writes, so ``lora_rank=0`` or ``compile=false`` overrides the job file's plan (merged_plan)."""
    pairs: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise argparse.ArgumentTypeError(f"--plan wants key=value pairs separated by commas, got {part!r}")
        if key.strip() in pairs:
            raise argparse.ArgumentTypeError(f"--plan gives {key.strip()} twice")
        pairs[key.strip()] = value
    from tessera.clients.jobfile import checked_plan_fields

    try:
        return PlanOverride(checked_plan_fields(pairs), frozenset(pairs))
    except ValueError as exc:  # PlanInputError "plan.KEY: why"; anything else must not be argparse's bare
        raise argparse.ArgumentTypeError(str(exc)) from None  # "invalid plan_arg value"


def stage_types(text: str) -> str:
    """argparse type of --stages: the catalog names of its types, comma-separated; an unknown type
    is a usage error (exit 2) naming its index in the list (--stages[1]) and the catalog's names."""
    from tessera.common.gpus import UnknownGpuError, lookup

    names = []
    for i, name in enumerate(t.strip() for t in text.split(",")):
        try:
            names.append(lookup(name).name)
        except UnknownGpuError as exc:
            raise argparse.ArgumentTypeError(f"--stages[{i}]: {exc}") from None  # as the later checks name it
    return ",".join(names)


def add_arguments(estimate: argparse.ArgumentParser, command: Any) -> Any:
    """The `estimate memory`, `cells` and `stages` subcommands (command(parent, name, func, help));
    returns the subparsers, for `estimate time` (clients/estimate_time.py)."""
    sub = estimate.add_subparsers(dest="what", metavar="WHAT", required=True)
    p = command(sub, "memory", cmd_memory, "peak memory per GPU of a job under a plan, by category")
    p.add_argument("-f", "--filename", required=True, metavar="FILE", help="job YAML (docs/job-file.md); - = stdin")
    _hf_config_option(p)
    p.add_argument("--gpu", required=True, metavar="TYPE", help="GPU type (catalog name or alias, e.g. a100-80gb)")
    p.add_argument("--plan", type=plan_arg, default=None, metavar="K=V[,K=V]",
                   help="execution plan: dp, tp, pp, cp, micro_batch, grad_accum, sharding (none|zero1|zero2|zero3|fsdp), "
                        "offload (none|optimizer|optimizer+params|frozen), checkpointing (none|selective|op|full), "
                        "checkpoint_every, reshard_after_forward (auto|always|never), loss (fused|fp32|chunked), "
                        "float8 (none|linear|linear+allgather), compile, async_tp, lora_rank, lora_targets "
                        "(qv|attention|all-linear), base_quant (none|nf4|int8), sequence_parallel, flash_attention, "
                        "precision, ep, virtual_stages, schedule (1f1b|gpipe); on top of the job file's plan: "
                        "(its recipe); unset sizes are 1 and grad_accum keeps the job's global batch (default: one GPU)")
    p.add_argument("--mode", choices=tuple(MODES), default="formula",
                   help="formula (default), marp (Frenzy), traced (a fake-tensor step of Tessera's own module: "
                        "needs torch), traced:torchtitan or traced:transformers (a fake-tensor step of the real "
                        "model code: torchtitan's Llama 3 or a transformers model)")
    p.add_argument("--gpus", type=argtypes.positive_int, default=None, metavar="N",
                   help="GPU count the plan must use (default: the job's gpus hint, if any)")
    p.add_argument("--traced-budget", type=argtypes.seconds, default=None, metavar="SECONDS",
                   help="wall-clock time a traced mode may take here (default 120 s; with --estimator the "
                        "service's own --traced-budget holds)")
    _estimator_option(p)
    p = command(sub, "cells", cmd_cells, "the Cells of a job on a cluster: best plan, iteration time, memory")
    p.add_argument("-f", "--filename", required=True, metavar="FILE", help="job YAML (docs/job-file.md); - = stdin")
    _hf_config_option(p)
    p.add_argument("--cluster", required=True, action="append", metavar="FILE[,FILE]",
                   help="cluster description: pools, declared node inventories or a simulator cluster "
                        "(repeatable; docs/estimator-service.md)")
    p.add_argument("--precision", choices=("mixed", "megatron-bf16", "megatron-fp16", "bf16", "fp32", "amp",
                                           "mixed-adafactor"), default=None,
                   help="recipe of the model-state bytes where the job file's plan: sets none (default: mixed)")
    p.add_argument("--max-gpus", type=argtypes.positive_int, default=0, metavar="N",
                   help="largest GPU count of a Cell (default 64)")
    p.add_argument("--best", action="store_true", help="only the fastest fitting Cell per GPU type and count")
    _estimator_option(p)
    p = command(sub, "stages", cmd_stages,
                "Espresso's stage placement of a job over pipeline stages of mixed GPU types")
    p.add_argument("-f", "--filename", required=True, metavar="FILE", help="job YAML (docs/job-file.md); - = stdin")
    _hf_config_option(p)
    p.add_argument("--stages", required=True, type=stage_types, metavar="TYPE[,TYPE]...",
                   help="the GPU type of each pipeline stage, in any order (a type may repeat)")
    p.add_argument("--dp", type=argtypes.positive_int, default=1, metavar="N", help="GPUs per stage (default 1)")
    p.add_argument("--cluster", action="append", metavar="FILE[,FILE]",
                   help="take each type's node size, links and price from these cluster files (default: one "
                        "node of dp GPUs per stage, 100 Gb/s between nodes)")
    p.add_argument("--microbatches", type=argtypes.positive_int, default=0, metavar="N",
                   help="pipeline micro-batches (default: 4 x stages, or the largest count under it that divides "
                        "the batch)")
    p.add_argument("--precision", choices=("mixed", "megatron-bf16", "megatron-fp16", "bf16", "fp32", "amp",
                                           "mixed-adafactor"), default=None,
                   help="recipe of the model-state bytes where the job file's plan: sets none (default: mixed)")
    p.add_argument("--exhaustive", action="store_true",
                   help="also search every order and split for the optimum under the same estimate")
    p.add_argument("--overlap-sync", action="store_true",
                   help="score plans with Espresso's Eq. 9: a stage's gradient sync overlaps the earlier stages' "
                        "backward passes")
    _estimator_option(p)
    return sub




def _hf_config_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hf-config", metavar="PATH", default=None,
                   help="take the model from a local Hugging Face config.json (or its directory) instead of the "
                        "job file's (seq_length: the job file's model.seq_length, else the config's, capped at "
                        "8192; docs/job-file.md); never downloads")


def estimator_address(text: str) -> str:
    """argparse type of --estimator: host:port, checked as --controller is (a usage error, exit 2):
    gRPC would only say "connection refused" for a host without a port."""
    try:
        return check_address(text, "--estimator", example_port=ESTIMATOR_PORT)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(exc.reason) from None


def _estimator_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--estimator", type=estimator_address, metavar="HOST:PORT", default=None,
                   help="ask this tessera-estimator instead of running the estimator in-process")
    p.add_argument("--tls-dir", metavar="DIR", default=None,
                   help="with --estimator: a certificate of the Tessera CA to present (ca.pem, cert.pem, "
                        "key.pem; the estimator requires one); --insecure for an --insecure estimator")


# -- backends ---------------------------------------------------------------------------------------


class EstimatorClient:
    """A blocking client of a tessera-estimator; failures are RpcError like the SDK's."""

    def __init__(self, target: str, timeout: float = DEFAULT_TIMEOUT_S, *, tls: TlsConfig | None = None,
                 insecure: bool = False) -> None:
        self.target = target
        self.timeout = timeout
        self._channel = sync_channel(target, tls=tls, insecure=insecure)
        self._stub = estimator_pb2_grpc.EstimatorStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def call(self, method: str, request: Message) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as exc:
            code = exc.code().name if hasattr(exc, "code") and exc.code() is not None else "UNKNOWN"
            details = (exc.details() if hasattr(exc, "details") else None) or str(exc)
            if code == "UNAVAILABLE":
                raise EstimatorUnreachable(self.target, details) from None
            raise RpcError(code, details) from None


class InProcess:
    """The library in this process, answering as the service does (errors included)."""

    def __init__(self, traced_budget_s: float | None = None) -> None:
        from tessera.estimator.service.handlers import Estimator
        from tessera.estimator.service.traced_child import TRACED_BUDGET_S

        self._est = Estimator(traced_budget_s=traced_budget_s or TRACED_BUDGET_S)

    def close(self) -> None:
        pass

    def call(self, method: str, request: Message) -> Any:
        fn = {"EstimateMemory": self._est.estimate_memory, "GetCells": self._est.get_cells,
              "PlaceStages": self._est.place_stages, "EstimateTime": self._est.estimate_time}[method]
        try:
            return fn(request)  # type: ignore[operator]
        except TesseraError as exc:  # the status the service would answer
            raise RpcError(exc.code, exc.message) from None


def _backend(args: argparse.Namespace) -> EstimatorClient | InProcess:
    if args.estimator and getattr(args, "traced_budget", None):
        raise InvalidInput("--traced-budget: only without --estimator (the service's own --traced-budget holds)")
    if args.estimator:
        target = args.estimator  # host:port, checked by its argparse type (estimator_address)
        timeout = getattr(args, "timeout", DEFAULT_TIMEOUT_S)
        if getattr(args, "insecure", False):
            return EstimatorClient(target, timeout, insecure=True)
        if args.tls_dir:
            return EstimatorClient(target, timeout, tls=tls.load_dir(args.tls_dir))
        ca = getattr(args, "ca", None) or os.environ.get("TESSERA_CA")
        return EstimatorClient(target, timeout, tls=tls.load(ca) if ca else tls.TlsConfig(ca=None))
    if args.tls_dir:
        raise InvalidInput("--tls-dir: only with --estimator")
    return InProcess(getattr(args, "traced_budget", None))


def _ask(args: argparse.Namespace, method: str, request: Message) -> Any:
    backend = _backend(args)
    try:
        return backend.call(method, request)
    finally:
        backend.close()


# -- requests ---------------------------------------------------------------------------------------


def memory_request(spec: common_pb2.JobSpec, gpu: str, plan: PlanOverride | None, mode: str,
                   gpus: int | None) -> estimator_pb2.EstimateMemoryRequest:
    """The EstimateMemory request of a job file and the command's flags."""
    base = spec.plan if spec.HasField("plan") else common_pb2.ExecutionPlan()
    return estimator_pb2.EstimateMemoryRequest(
        model=spec.model, plan=plan.on(base) if plan is not None else base, gpu=gpu, mode=MODES[mode],
        num_gpus=spec.hint.gpus if gpus is None else gpus, global_batch_size=spec.global_batch_size)


def cells_request(spec: common_pb2.JobSpec, cluster: estimator_pb2.ClusterSpec, precision: str | None = None,
                  max_gpus: int = 0, best: bool = False) -> estimator_pb2.GetCellsRequest:
    from tessera.estimator.convert import PRECISION_VALUE

    return estimator_pb2.GetCellsRequest(
        model=spec.model, global_batch_size=spec.global_batch_size, cluster=cluster,
        precision=PRECISION_VALUE[precision] if precision else common_pb2.PRECISION_UNSPECIFIED,
        options=estimator_pb2.CellOptions(max_gpus=max_gpus), best_only=best,
        recipe=spec.plan if spec.HasField("plan") else None)


def stages_request(spec: common_pb2.JobSpec, types: str, dp: int, cluster: estimator_pb2.ClusterSpec | None,
                   microbatches: int = 0, precision: str | None = None,
                   exhaustive: bool = False, overlap_sync: bool = False) -> estimator_pb2.PlaceStagesRequest:
    """The PlaceStages request of a job file and the command's flags; ClusterFileError when a stage's
    type is not in the given cluster."""
    from tessera.common.gpus import UnknownGpuError, lookup
    from tessera.estimator.convert import PRECISION_VALUE

    names = []
    for i, name in enumerate(t.strip() for t in types.split(",")):
        try:
            names.append(lookup(name).name)
        except UnknownGpuError as exc:
            raise ClusterFileError(f"--stages[{i}]", str(exc)) from None
    stages = []
    for i, gpu in enumerate(names):
        if cluster is None:  # one node of dp GPUs per stage of this type
            stages.append(estimator_pb2.GpuPool(gpu=gpu, num_gpus=dp * names.count(gpu), gpus_per_node=dp))
            continue
        pool = next((p for p in cluster.pools if p.gpu == gpu), None)
        if pool is None:
            raise ClusterFileError(f"--stages[{i}]", f"{gpu} is not in the cluster files")
        stages.append(pool)
    return estimator_pb2.PlaceStagesRequest(
        model=spec.model, global_batch_size=spec.global_batch_size, stages=stages, dp=dp,
        num_microbatches=microbatches, exhaustive=exhaustive, overlap_sync=overlap_sync,
        precision=PRECISION_VALUE[precision] if precision else common_pb2.PRECISION_UNSPECIFIED,
        recipe=spec.plan if spec.HasField("plan") else None)


# -- cluster files ----------------------------------------------------------------------------------


def load_cluster(paths: Sequence[str]) -> estimator_pb2.ClusterSpec:
    """One ClusterSpec from cluster files (each FILE or FILE,FILE); ClusterFileError names the file,
    the line and the field."""
    files = [p.strip() for arg in paths for p in arg.split(",") if p.strip()]
    if not files:
        raise ClusterFileError("--cluster", "no file given")
    merged: dict[tuple[Any, ...], estimator_pb2.GpuPool] = {}
    for path in files:
        pools = parse_with_lines(read_yaml(path, ClusterFileError), path, cluster_pools)
        for pool in pools:
            price = pool.price_per_hour if pool.HasField("price_per_hour") else None
            key = (pool.gpu, pool.gpus_per_node, pool.intra_link, pool.nic_gbps, pool.pcie_gbps, price, pool.currency)
            if key in merged:
                merged[key].num_gpus += pool.num_gpus
            else:
                merged[key] = pool
    return estimator_pb2.ClusterSpec(pools=list(merged.values()))


def cluster_pools(doc: Any) -> list[estimator_pb2.GpuPool]:
    """The GPU pools of one parsed cluster document (any of the three formats, each by its parser)."""
    if not isinstance(doc, Mapping):
        raise ClusterFileError("", "must be a mapping with 'pools', 'gpus' (a node inventory) or 'node_groups'")
    if "pools" in doc:
        return [estimator_pb2.GpuPool(gpu=p.gpu, num_gpus=p.num_gpus, gpus_per_node=p.gpus_per_node,
                                      intra_link=LINKS[p.intra_link], nic_gbps=p.nic_gbps or 0.0,
                                      pcie_gbps=p.pcie_gbps or 0.0, price_per_hour=p.price_per_hour,
                                      currency=p.currency)
                for p in parse_pools(doc)]
    if "gpus" in doc:
        return _inventory(doc)
    if "node_groups" in doc:
        return [estimator_pb2.GpuPool(gpu=g.gpu_type if g.in_catalog
                                      else catalog_gpu(g.gpu_type, f"node_groups[{i}].gpu_type"),
                                      num_gpus=g.count * g.gpus, gpus_per_node=g.gpus,
                                      intra_link=estimator_pb2.INTRA_LINK_NVLINK if g.nvlink_islands == 1
                                      else estimator_pb2.INTRA_LINK_PCIE)
                for i, g in enumerate(parse_node_groups(doc).groups)]
    raise ClusterFileError("", "must have 'pools', 'gpus' (a node inventory) or 'node_groups'")


def _inventory(doc: Mapping[str, Any]) -> list[estimator_pb2.GpuPool]:
    """A declared node inventory: one node; each GPU type of it a pool (NVLink where a group declares it
    and has a peer to link to)."""
    try:
        spec = parse_inventory(doc)
    except InventoryError as exc:
        raise ClusterFileError(exc.field, exc.reason) from None
    groups: dict[tuple[str, bool], int] = {}
    for g in spec.groups:
        k = (g.model, g.nvlink and g.count > 1)
        groups[k] = groups.get(k, 0) + g.count
    return [estimator_pb2.GpuPool(gpu=model, num_gpus=n, gpus_per_node=n,
                                  intra_link=estimator_pb2.INTRA_LINK_NVLINK if nv else estimator_pb2.INTRA_LINK_PCIE)
            for (model, nv), n in groups.items()]


# -- output -----------------------------------------------------------------------------------------


def to_json(message: Message) -> Any:
    """A response as JSON: the proto3 JSON mapping (snake_case, defaults present) with two changes
    for people and scripts: 64-bit integers are JSON numbers, and execution plans are written in the
    --plan vocabulary ({"dp": 2, "sharding": "zero2", ...})."""
    d = json_format.MessageToDict(message, preserving_proto_field_name=True,
                                  always_print_fields_with_no_presence=True)
    return _plain(message.DESCRIPTOR, d, message)


def _plain(desc: Any, d: dict[str, Any], msg: Message | None) -> dict[str, Any]:
    if desc.full_name == "tessera.v1.ExecutionPlan":
        assert msg is not None
        return execution_plan(msg).to_dict()  # type: ignore[arg-type]
    out: dict[str, Any] = {}
    for f in desc.fields:
        if f.name not in d:
            continue
        v = d[f.name]
        sub = getattr(msg, f.name) if msg is not None else None
        if f.message_type is not None and not f.message_type.GetOptions().map_entry:
            if isinstance(v, list):
                v = [_plain(f.message_type, x, m) for x, m in zip(v, sub or [])]
            else:
                v = _plain(f.message_type, v, sub)
        elif f.type in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
                        FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64):
            v = [int(x) for x in v] if isinstance(v, list) else int(v)
        out[f.name] = v
    return out


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2)


def _gb(n: float) -> str:
    return f"{n / GB:.2f}"


def _plan_text(plan: common_pb2.ExecutionPlan) -> str:
    d = execution_plan(plan).to_dict()
    shown = [f"{k}={d[k]}" for k in ("dp", "tp", "pp", "micro_batch", "grad_accum")]
    from tessera.estimator.plans import ExecutionPlan

    defaults = ExecutionPlan().to_dict()
    shown += [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in d.items()
              if k not in ("dp", "tp", "pp", "micro_batch", "grad_accum") and v != defaults[k]]
    return ",".join(shown)


def memory_table(job: str, resp: estimator_pb2.EstimateMemoryResponse, wide: bool = False) -> str:
    m = resp.memory
    head = [("Job", job), ("Model", resp.model_signature), ("GPU", resp.gpu or "-"),
            ("Plan", _plan_text(resp.plan)), ("GPUs", str(resp.num_gpus)), ("Source", m.source),
            ("Stage", f"{m.stage} (the most loaded pipeline stage)")]
    lines = [f"{k + ':':<9} {v}" for k, v in head]
    rows = [(name, getattr(m, name)) for name in ("parameters", "gradients", "optimizer", "activations", "other",
                                                  "total")]
    if m.capacity:
        rows.append(("capacity", m.capacity))
    if m.cpu_bytes:
        rows.append(("cpu (offloaded)", m.cpu_bytes))
    width = max(len(r[0]) for r in rows)
    lines += ["", f"{'CATEGORY':<{width}}  {'BYTES':>15}  {'GB':>9}  {'GIB':>9}"]
    lines += [f"{name:<{width}}  {n:>15}  {_gb(n):>9}  {n / GIB:>9.2f}" for name, n in rows]
    if m.reserved:
        lines += [f"Reserved: {_gb(m.reserved)} GB (caching allocator, predicted)"]
    if m.HasField("fits"):
        lines += ["", f"Fits:     {'yes' if m.fits else 'no'} ({fits_figure(m)} of {_gb(m.capacity)} GB: {fits_term(m)})"]
    for w in m.warnings:
        lines += [f"Warning:  {w}"]
    if wide and m.notes:
        lines += ["", "Notes:"] + [f"  {n}" for n in m.notes]
    return "\n".join(lines)


CELL_COLUMNS = ("GPU", "GPUS", "STAGES", "NODES", "FITS", "ITER(s)", "MEM/GPU(GB)", "PLAN", "SOURCE", "REASON")
COST_COLUMNS = ("COST/h", "COST(job)")


def _money(value: float, currency: str) -> str:
    return f"{value:.4g} {currency}".rstrip()


def cells_table(resp: estimator_pb2.GetCellsResponse, wide: bool = False, iterations: int = 0) -> str:
    """The Cells as a table; the cost columns only when some pool has a price (COST(job): the job's
    iterations x the cost of one)."""
    priced = any(c.HasField("cost_per_hour") for c in resp.cells)
    rows = []
    for c in resp.cells:
        it = c.iter_time_seconds
        src = it.source if c.HasField("iter_time_seconds") else "-"
        if not wide:
            src = src.split("(")[0] if len(src) > 40 else src
        reason = c.reason if wide or len(c.reason) <= 40 else c.reason[:39] + "…"
        rows.append([
            c.gpu_type, str(c.num_gpus), str(c.num_stages), f"{c.nodes}x{c.gpus_per_node}", "yes" if c.fits else "no",
            f"{it.value:.4g}" if c.HasField("iter_time_seconds") else "-",
            _gb(c.memory_per_gpu_bytes.value) if c.HasField("memory_per_gpu_bytes") else "-",
            c.plan.description if c.HasField("plan") else "-", src, reason or "-",
        ])
        if priced:
            per_hour = _money(c.cost_per_hour.value, c.currency) if c.HasField("cost_per_hour") else "-"
            job = (_money(c.cost_per_iteration.value * iterations, c.currency)
                   if c.HasField("cost_per_iteration") and iterations > 0 else "-")
            rows[-1][-2:-2] = [per_hour, job]
    headers = list(CELL_COLUMNS)
    if priced:
        headers[-2:-2] = COST_COLUMNS
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    out = ["   ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    out += ["   ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    fits = sum(c.fits for c in resp.cells)
    out.append(f"\n{len(resp.cells)} Cells, {fits} fit; model {resp.model_signature}")
    return "\n".join(out)


def placement_table(title: str, p: estimator_pb2.StagePlacement, wide: bool = False) -> str:
    it = p.iter_time_seconds
    source = it.source if wide else it.source.split("(")[0]
    lines = [f"{title}: {p.description}",
             (f"  iteration {it.value:.4g} s ({source}); memory {_gb(p.memory_per_gpu_bytes)} GB on the fullest "
              f"GPU; fits: {'yes' if p.fits else 'no'}")]
    head = ("STAGE", "GPU", "LAYERS", "COMPUTE(s/mb)", "INTRA(s/mb)", "INTER(s/mb)", "SYNC(s)", "MEM/GPU(GB)", "FITS")
    rows = [(str(i), s.gpu_type, str(s.layers), f"{s.stage.compute_seconds:.4g}", f"{s.stage.intra_comm_seconds:.3g}",
             f"{s.stage.inter_comm_seconds:.3g}", f"{s.stage.sync_seconds:.3g}", _gb(s.stage.memory_bytes),
             "yes" if s.fits else "no") for i, s in enumerate(p.stages)]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines.append("  " + "   ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip())
    lines += ["  " + "   ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


# -- commands ---------------------------------------------------------------------------------------


def _job(filename: str, hf_config: str | None = None) -> common_pb2.JobSpec:
    """The job file (`-` = stdin), checked as `tessctl submit` checks it; with `hf_config`, its model
    replaced by that local config.json's (PlanInputError naming model.hf_config, as in a job file)."""
    import sys

    from tessera.clients.jobfile import load_job_file, parse_job_yaml

    spec = parse_job_yaml(sys.stdin.read(), "<stdin>") if filename == "-" else load_job_file(filename)
    if hf_config is not None:
        from tessera.estimator.hfconfig import load_hf_config

        given = spec.model.seq_length if spec.model.hidden_size else 0
        dims = load_hf_config(hf_config, seq_length=given,
                              decoder_seq_length=spec.model.decoder_seq_length if given else 0)
        spec.model.CopyFrom(model_spec(dims))
    return spec


def _recipe_warnings(warnings: Sequence[str]) -> None:
    """What the Cells estimate of the job's recipe only in part, on stderr (the table stays clean)."""
    import sys

    for w in warnings:
        sys.stderr.write(f"tessctl: warning: {w}\n")


def answer(args: argparse.Namespace, out: Any, method: str, req: Any, table: Callable[[Any, bool], str],
           warnings: bool = False, note: Callable[[Any], str] | None = None) -> int:
    """Ask `method` (in-process or of the service) and print its answer: the whole message as JSON
    with `-o json`, else `table(response, wide)`; with `warnings`, the response's on stderr first,
    and `note(response)` if it says anything."""
    resp = _ask(args, method, req)
    if warnings:
        _recipe_warnings(resp.warnings)
    if note is not None and (line := note(resp)):
        _recipe_warnings([line])
    if args.output == "json":
        out.write(dumps(to_json(resp)) + "\n")
    else:
        out.write(table(resp, args.output == "wide") + "\n")
    return 0


def cmd_memory(client: Any, args: argparse.Namespace, out: Any) -> int:
    spec = _job(args.filename, args.hf_config)
    require_transformer(spec.model, "memory")
    req = memory_request(spec, args.gpu, args.plan, args.mode, args.gpus)
    return answer(args, out, "EstimateMemory", req, lambda resp, wide: memory_table(spec.name, resp, wide=wide),
                  note=(lambda resp: marp_warning(resp.plan)) if args.mode == "marp" else None)


def cmd_cells(client: Any, args: argparse.Namespace, out: Any) -> int:
    spec = _job(args.filename, args.hf_config)
    cluster = load_cluster(args.cluster)
    req = cells_request(spec, cluster, args.precision, args.max_gpus, args.best)
    return answer(args, out, "GetCells", req,
                  lambda resp, wide: cells_table(resp, wide=wide, iterations=spec.iterations), warnings=True)


def cmd_stages(client: Any, args: argparse.Namespace, out: Any) -> int:
    spec = _job(args.filename, args.hf_config)
    cluster = load_cluster(args.cluster) if args.cluster else None
    req = stages_request(spec, args.stages, args.dp, cluster, args.microbatches, args.precision, args.exhaustive,
                         args.overlap_sync)

    def table(resp: Any, wide: bool) -> str:
        text = [f"Model:     {resp.model_signature}", placement_table("Espresso", resp.placement, wide)]
        if resp.HasField("optimum"):
            text.append(placement_table("Optimum", resp.optimum, wide))
        return "\n".join(text)

    return answer(args, out, "PlaceStages", req, table, warnings=True)
