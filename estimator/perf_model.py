"""Iteration-time model: Morphling's fitted performance model and Tessera's placement-aware extension.

Mode ``"morphling"`` is the model of the Morphling paper ("Morphling: Exploiting Job Reconfigurability
for Deep Learning Cluster Scheduling", MLSys 2025; Sec. 4 and Appendix A) as written there:

    T_iter = T_cc + T_oo + k_const                                             (A.3, Eq. 1)
    T_cc   = a*T_fwd + (a-1)*T_bwd + f^{k_sync}(T_bwd, T_comm_dp) + T_comm_tp + T_comm_pp   (A.1)
    T_oo   = T_opt, or with ZeRO-Offload
             f^{k_off}(T_comm_dp, T_off) + f^{k_swap}(T_opt, T_off)            (A.2)
    f^k(x, y) = (x^k + y^k)^(1/k)                                               (A.3)

with T_fwd scaled linearly to the per-GPU batch and tensor shard, the 1F1B pipeline form
T_fwd = t_p*g_p/p*(m+p-1), T_bwd = k_bwd*T_fwd (+ one more forward with checkpointing), the
communication volumes V_dp, V_tp, V_pp of A.1 over the bottleneck bandwidth (intra-node when the
job sits on one server, else inter-node), T_opt = k_opt*P/x and, with ZeRO-Offload,
T_opt = k_os_offload*P/(d*c) and T_off = P/(d*B_pcie).

Mode ``"tessera"`` keeps those equations and the seven parameters, and changes what the paper
leaves placement-blind (docs/estimator-perf-model.md has the equations and the measured accuracy):

* ranks are laid out on the placement in Megatron's order (TP fastest, then DP, then PP), so each
  DP, TP and PP group knows how many servers it spans and how many of its GPUs share a server;
* DP gradients are reduced hierarchically: a ring inside each server over NVLink, then a ring
  across the servers the group spans, over NICs that ``gpus_per_nic`` GPUs share and that all
  groups with members on that server share; TP all-reduces use NVLink unless a TP group spans
  servers; PP sends cross a server only where two consecutive stages do (1F1B critical path);
* ZeRO-DP exposes the parameter all-gather after the optimizer step (half the DP volume);
* ZeRO-Offload's transfers also load the host side of each server, shared by its GPUs: one more
  fitted coefficient, ``k_host`` (seconds per parameter), fitted with the seven;
* collectives get ``net_efficiency`` of a link's rate, plus a latency per ring step;
* the forward time follows the profiled power law T(b) = T_ref*(b/b_ref)^beta, applied to the work
  per GPU (a TP shard of batch b costs what batch b/t costs).

Units: seconds, bytes, bytes per second, parameter counts. Everything here is pure: no I/O, no
clock, no randomness; the fitting routines are deterministic.

Why one piece (about 880 lines): the model is its equations and the parameters fitted to them,
and the two halves change together. The parameters the fit searches, per mode, with their bounds and
prior (`FIT_NAMES`, `BOUNDS`, `DEFAULT_PARAMS`) are declared beside `Params`, which the prediction
reads; a term added to the prediction is a coefficient added to the fit (as `k_host` was). The
sections (parameters, inputs, prediction, fitting) follow Appendix A, and callers use the module as
one namespace (`perf_model.fit`, `perf_model.predict`, `perf_model.refit`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, cast

import numpy as np
import numpy.typing as npt

from tessera.common.errors import InvalidArgument
from tessera.common.jobspec import MAX_GLOBAL_BATCH
from tessera.estimator.clusterfile import MAX_GPUS_PER_NODE, MAX_NODES_PER_GROUP

Mode = Literal["morphling", "tessera"]
MODES: tuple[Mode, ...] = ("morphling", "tessera")
Zero = Literal["none", "zero-dp", "offload"]
ZEROS: tuple[Zero, ...] = ("none", "zero-dp", "offload")

FloatArray = npt.NDArray[np.float64]


class PerfModelInputError(InvalidArgument, ValueError):
    """Bad input to the performance model; ``field`` names the offending field, ``reason`` why."""


def _require(ok: bool, field_name: str, reason: str) -> None:
    if not ok:
        raise PerfModelInputError(field_name, reason)


def _positive(value: float, field_name: str) -> None:
    _require(
        isinstance(value, (int, float)) and math.isfinite(value) and value > 0,
        field_name,
        f"must be a finite number > 0, got {value!r}",
    )


# An input's magnitude: the fit multiplies and divides them, and at 1e308 (or 1e-308) it made NaN
# parameters, so the error named the answer's params.k_bwd rather than the input.
INPUT_RANGE = (1e-12, 1e18)


def _input(value: float, field_name: str) -> None:
    _positive(value, field_name)
    lo, hi = INPUT_RANGE
    _require(lo <= value <= hi, field_name, f"must be between {lo:g} and {hi:g}, got {value!r}")


# Bounds on what one run may describe: the model builds per-GPU and per-server tables, and a caller
# of the estimator service asking for 10^7 data-parallel ranks held 1.85 GB for 29 s. Servers and
# their GPUs as a cluster file's (clusterfile.py); accumulation steps and micro-batches as a job's
# global batch.
MAX_RUN_GPUS = 131_072


def _positive_int(value: int, field_name: str, most: int | None = None) -> None:
    _require(
        isinstance(value, int) and not isinstance(value, bool) and value >= 1,
        field_name,
        f"must be an integer >= 1, got {value!r}",
    )
    if most is not None:
        _require(value <= most, field_name, f"must be at most {most:,}, got {value:,}")


# --------------------------------------------------------------------------------------------------
# Parameters


@dataclass(frozen=True)
class Params:
    """The seven fittable parameters of Morphling's Table 5, plus Tessera's one extension.

    k_bwd: backward/forward time ratio. k_sync: overlap exponent of backward and DP sync.
    k_opt: GPU optimizer seconds per parameter. k_os_offload (the paper's k_opt_off): CPU optimizer
    seconds x threads per parameter under ZeRO-Offload. k_const: constant overhead, seconds.
    k_off, k_swap: overlap exponents of offload with DP sync and with the CPU optimizer step.
    k_host (mode "tessera" only; 0 = none): seconds per parameter of the offload traffic that the
    GPUs of one server share (host memory and PCIe root), see :func:`breakdown`.
    """

    k_bwd: float
    k_sync: float
    k_opt: float
    k_os_offload: float
    k_const: float
    k_off: float
    k_swap: float
    k_host: float = 0.0

    def __post_init__(self) -> None:
        for name in PARAM_NAMES:
            _positive(getattr(self, name), f"params.{name}")
        _require(
            isinstance(self.k_host, (int, float)) and math.isfinite(self.k_host) and self.k_host >= 0,
            "params.k_host",
            f"must be a finite number >= 0, got {self.k_host!r}",
        )

    def as_tuple(self) -> tuple[float, ...]:
        """The seven paper parameters, in Table 5's order."""
        return tuple(float(getattr(self, n)) for n in PARAM_NAMES)

    @classmethod
    def from_sequence(cls, values: Sequence[float]) -> Params:
        """From 7 values (the paper's, k_host = 0) or 8 (with k_host)."""
        _require(len(values) in (7, 8), "params", f"needs 7 or 8 values, got {len(values)}")
        return cls(*(float(v) for v in values))


PARAM_NAMES: tuple[str, ...] = ("k_bwd", "k_sync", "k_opt", "k_os_offload", "k_const", "k_off", "k_swap")
# What each mode fits: the paper's seven, and Tessera's extension term on top.
FIT_NAMES: dict[str, tuple[str, ...]] = {"morphling": PARAM_NAMES, "tessera": (*PARAM_NAMES, "k_host")}

# Box bounds used by the fit (the overlap exponents are >= 1: between "sum" and "max").
BOUNDS: dict[str, tuple[float, float]] = {
    "k_bwd": (0.5, 10.0),
    "k_sync": (1.0, 100.0),
    "k_opt": (1e-15, 1e-7),
    "k_os_offload": (1e-13, 1e-5),
    "k_const": (1e-6, 10.0),
    "k_off": (1.0, 100.0),
    "k_swap": (1.0, 100.0),
    "k_host": (1e-14, 1e-7),
}

# Weak prior (centre of the regulariser in log space): backward ~2x forward, moderate overlap,
# Adam at ~20 G params/s on a GPU, ~1 G params/s per CPU thread, 10 ms of fixed overhead.
# k_host: 4 bytes per parameter over ~20 GB/s of host bandwidth per server.
DEFAULT_PARAMS = Params(
    k_bwd=2.0, k_sync=1.0, k_opt=5e-11, k_os_offload=2e-9, k_const=0.01, k_off=2.0, k_swap=2.0, k_host=2e-10
)


# --------------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True)
class Environment:
    """Cluster constants, bandwidths one way (defaults: the Morphling cluster, 8 x 8 A800).

    ``intra_node_bw``: NVLink per GPU; the data README's 400 GB/s is the bidirectional figure, so
    200 GB/s each way. ``inter_node_bw``: one NIC's RDMA rate (the paper's B_inter); ``gpus_per_nic``:
    GPUs of a server behind one NIC (mode "tessera"). The README's "100 GB/s" between servers is not
    what the measured multi-node rows show: they fit 100 Gb/s = 12.5 GB/s NICs, one per pair of GPUs
    (docs/estimator-perf-model.md, "Bandwidths"). ``net_efficiency``: what collectives get of a link
    (mode "tessera"). ``grad_bytes``/``act_bytes``: bytes per gradient / activation element on the
    wire; ``offload_bytes``: bytes per parameter over PCIe under ZeRO-Offload (fp16 gradients down,
    fp16 parameters up). Latencies: per ring step / p2p send.
    """

    intra_node_bw: float = 200e9
    inter_node_bw: float = 12.5e9
    gpus_per_nic: int = 2
    pcie_bw: float = 32e9
    grad_bytes: float = 2.0
    act_bytes: float = 2.0
    offload_bytes: float = 4.0
    intra_latency: float = 8e-6
    inter_latency: float = 20e-6
    net_efficiency: float = 0.8

    def __post_init__(self) -> None:
        for name in ("intra_node_bw", "inter_node_bw", "pcie_bw", "grad_bytes", "act_bytes", "offload_bytes"):
            _input(getattr(self, name), f"env.{name}")
        _positive_int(self.gpus_per_nic, "env.gpus_per_nic")
        for name in ("intra_latency", "inter_latency"):
            v = getattr(self, name)
            _require(math.isfinite(v) and v >= 0, f"env.{name}", f"must be >= 0, got {v!r}")
        _require(
            math.isfinite(self.net_efficiency) and 0 < self.net_efficiency <= 1,
            "env.net_efficiency",
            f"must be in (0, 1], got {self.net_efficiency!r}",
        )

    @property
    def nic_bw(self) -> float:
        """What one NIC delivers to a collective (link rate x ``net_efficiency``)."""
        return self.inter_node_bw * self.net_efficiency

    @property
    def nvlink_bw(self) -> float:
        return self.intra_node_bw * self.net_efficiency


DEFAULT_ENV = Environment()


@dataclass(frozen=True)
class Workload:
    """A model and its global batch, with its profiled forward time.

    ``params``: parameter count. ``layers``, ``hidden``, ``seq``: transformer shape (TP/PP volumes).
    ``global_batch``: samples per iteration, kept across plans. The forward pass of one GPU holding
    the whole model takes ``fwd_ref_time`` seconds at ``fwd_ref_batch`` samples; mode "morphling"
    scales it linearly (Appendix A.1), mode "tessera" as (b/b_ref)^fwd_exponent.
    """

    name: str
    params: float
    layers: int
    hidden: int
    seq: int
    global_batch: int
    fwd_ref_time: float
    fwd_ref_batch: float = 1.0
    fwd_exponent: float = 1.0

    def __post_init__(self) -> None:
        _input(self.params, "workload.params")
        _positive_int(self.layers, "workload.layers")
        _positive_int(self.hidden, "workload.hidden")
        _positive_int(self.seq, "workload.seq")
        _positive_int(self.global_batch, "workload.global_batch")
        _input(self.fwd_ref_time, "workload.fwd_ref_time")
        _input(self.fwd_ref_batch, "workload.fwd_ref_batch")
        _require(
            math.isfinite(self.fwd_exponent) and 0.1 <= self.fwd_exponent <= 1.5,
            "workload.fwd_exponent",
            f"must be in [0.1, 1.5], got {self.fwd_exponent!r}",
        )

    def forward_time(self, batch: float, mode: Mode) -> float:
        """Forward seconds of ``batch`` samples through the whole model on one GPU."""
        exponent = 1.0 if mode == "morphling" else self.fwd_exponent
        return self.fwd_ref_time * float((batch / self.fwd_ref_batch) ** exponent)


@dataclass(frozen=True)
class Plan:
    """An execution plan: 3D sizes, ZeRO kind, gradient accumulation steps, checkpointing and the
    number of 1F1B micro-batches per replica (PP only)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: Zero = "none"
    ga_steps: int = 1
    checkpointing: bool = False
    micro_batches: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "ga_steps", "micro_batches"):
            _positive_int(getattr(self, name), f"plan.{name}", MAX_GLOBAL_BATCH)
        _require(self.gpus <= MAX_RUN_GPUS, "plan", f"dp*tp*pp = {self.gpus:,} GPUs, over {MAX_RUN_GPUS:,}")
        _require(self.zero in ZEROS, "plan.zero", f"must be one of {ZEROS}, got {self.zero!r}")

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def kind(self) -> str:
        """One of 3d, zero-offload, zero-dp, gc, ga, dp (the plan kinds of the Morphling data)."""
        if self.tp > 1 or self.pp > 1:
            return "3d"
        if self.zero == "offload":
            return "zero-offload"
        if self.zero == "zero-dp":
            return "zero-dp"
        if self.checkpointing:
            return "gc"
        return "ga" if self.ga_steps > 1 else "dp"


@dataclass(frozen=True)
class Placement:
    """GPUs per server, e.g. ``Placement.parse("88888888")`` = 8 servers x 8 GPUs."""

    gpus_per_node: tuple[int, ...]

    def __post_init__(self) -> None:
        _require(1 <= len(self.gpus_per_node) <= MAX_NODES_PER_GROUP, "placement",
                 f"needs 1..{MAX_NODES_PER_GROUP:,} servers, got {len(self.gpus_per_node):,}")
        for i, g in enumerate(self.gpus_per_node):
            _positive_int(g, f"placement.gpus_per_node[{i}]", MAX_GPUS_PER_NODE)

    @classmethod
    def parse(cls, text: str) -> Placement:
        """Digit string (one digit per server: ``"233"``) or comma list (``"8,8,16"``)."""
        s = str(text).strip()
        _require(bool(s), "placement", "is empty")
        parts = s.split(",") if "," in s else list(s)
        _require(
            all(p.strip().isdigit() for p in parts), "placement", f"expects digits per server, got {text!r}"
        )
        counts = tuple(int(p) for p in parts)
        _require(all(c > 0 for c in counts), "placement", f"a server with 0 GPUs in {text!r}")
        return cls(counts)

    @property
    def nodes(self) -> int:
        return len(self.gpus_per_node)

    @property
    def gpus(self) -> int:
        return sum(self.gpus_per_node)

    def node_of_rank(self) -> list[int]:
        out: list[int] = []
        for node, count in enumerate(self.gpus_per_node):
            out.extend([node] * count)
        return out

    def __str__(self) -> str:
        if all(g < 10 for g in self.gpus_per_node):
            return "".join(str(g) for g in self.gpus_per_node)
        return ",".join(str(g) for g in self.gpus_per_node)


@dataclass(frozen=True)
class RunConfig:
    """One training configuration to predict. ``cpus``: CPU threads per GPU process (ZeRO-Offload's
    optimizer). ``fwd_time``: a measured forward time of this run (seconds per iteration, all
    accumulation steps), which replaces the workload's forward model when given (profiled samples)."""

    workload: Workload
    plan: Plan
    placement: Placement
    cpus: int = 1
    fwd_time: float | None = None

    def __post_init__(self) -> None:
        _require(
            self.plan.gpus == self.placement.gpus,
            "plan",
            f"dp*tp*pp = {self.plan.gpus} does not match the {self.placement.gpus} GPUs of placement "
            f"{self.placement}",
        )
        _positive_int(self.cpus, "cpus")
        if self.fwd_time is not None:
            _positive(self.fwd_time, "fwd_time")


@dataclass(frozen=True)
class Sample:
    """A measured iteration (seconds). ``t_cc``/``t_oo`` are the measured parts when known; ``time``
    orders samples for the online refit (larger = more recent, any unit)."""

    config: RunConfig
    iter_time: float
    t_cc: float | None = None
    t_oo: float | None = None
    time: float = 0.0

    def __post_init__(self) -> None:
        _positive(self.iter_time, "iter_time")
        for name in ("t_cc", "t_oo"):
            v = getattr(self, name)
            if v is not None:
                _positive(v, name)
        _require(math.isfinite(self.time), "time", f"must be finite, got {self.time!r}")


@dataclass(frozen=True)
class Breakdown:
    """The parts of one prediction, in seconds (T_fwd and T_bwd are per accumulation step)."""

    t_fwd: float
    t_bwd: float
    t_comm_dp: float
    t_comm_tp: float
    t_comm_pp: float
    t_opt: float
    t_off: float
    t_cc: float
    t_oo: float
    k_const: float
    t_iter: float


# --------------------------------------------------------------------------------------------------
# The model


def overlap(k: float, x: float, y: float) -> float:
    """f^k(x, y) = (x^k + y^k)^(1/k): x + y at k = 1, tending to max(x, y) as k grows (A.3)."""
    if x <= 0.0:
        return max(y, 0.0)
    if y <= 0.0:
        return x
    hi = max(x, y)
    # Factor out the larger term: stable for large k.
    return hi * float(((x / hi) ** k + (y / hi) ** k) ** (1.0 / k))


@dataclass(frozen=True)
class _Group:
    nodes: int  # servers the group spans
    max_per_node: int  # most members on one server (the NVLink stage)
    nic_load: float  # worst server: groups of this kind sharing each of its NICs in use


def _nics(gpus_on_node: int, env: Environment) -> int:
    return max(1, -(-gpus_on_node // env.gpus_per_nic))


@functools.lru_cache(maxsize=4096)
def _groups(plan: Plan, placement: Placement, env: Environment) -> dict[str, _Group]:
    """Worst DP and TP groups and PP chain under Megatron's rank order (TP, then DP, then PP).

    A server holding ``k`` GPUs of the job uses ceil(k / gpus_per_nic) NICs; the groups of one kind
    with members there (k / members-of-one-group) share them. Cached: it only depends on its
    (frozen) arguments, and the simulator asks for the same shapes again and again.
    """
    d, t, p = plan.dp, plan.tp, plan.pp
    per_node = placement.gpus_per_node
    node_of = placement.node_of_rank()

    def rank(ti: int, di: int, pi: int) -> int:
        return ti + t * (di + d * pi)

    def worst(members: list[list[int]]) -> _Group:
        out = _Group(1, 1, 0.0)
        for ranks in members:
            counts: dict[int, int] = {}
            for r in ranks:
                counts[node_of[r]] = counts.get(node_of[r], 0) + 1
            load = max((per_node[n] / c) / _nics(per_node[n], env) for n, c in counts.items())
            g = _Group(len(counts), max(counts.values()), load if len(counts) > 1 else 0.0)
            if (g.nodes, g.nic_load, g.max_per_node) > (out.nodes, out.nic_load, out.max_per_node):
                out = g
        return out

    dp_groups = [[rank(ti, di, pi) for di in range(d)] for ti in range(t) for pi in range(p)]
    tp_groups = [[rank(ti, di, pi) for ti in range(t)] for di in range(d) for pi in range(p)]
    # PP: the boundaries between consecutive stages that cross a server, on the worst chain; all
    # GPUs of the sending server send at once, over its NICs.
    crossings, pp_load = 0, 0.0
    for ti in range(t):
        for di in range(d):
            c = 0
            for pi in range(p - 1):
                src, dst = node_of[rank(ti, di, pi)], node_of[rank(ti, di, pi + 1)]
                if src != dst:
                    c += 1
                    pp_load = max(pp_load, per_node[src] / _nics(per_node[src], env))
            crossings = max(crossings, c)
    return {"dp": worst(dp_groups), "tp": worst(tp_groups), "pp": _Group(crossings, 1, pp_load)}


def _allreduce_time(nbytes: float, group: _Group, size: int, env: Environment) -> float:
    """Hierarchical ring all-reduce of ``nbytes`` per GPU in a group of ``size`` GPUs: reduce inside
    each server over NVLink, ring across the servers over the NICs they share (``nic_load``)."""
    if size <= 1 or nbytes <= 0:
        return 0.0
    t = 0.0
    local = group.max_per_node
    if local > 1:
        t += 2.0 * (local - 1) / local * nbytes / env.nvlink_bw + 2 * (local - 1) * env.intra_latency
    n = group.nodes
    if n > 1:
        t += 2.0 * (n - 1) / n * nbytes * group.nic_load / env.nic_bw + 2 * (n - 1) * env.inter_latency
    return t


def breakdown(
    params: Params, config: RunConfig, mode: Mode = "tessera", env: Environment = DEFAULT_ENV
) -> Breakdown:
    """All parts of the predicted iteration time of ``config`` (see the module docstring)."""
    _require(mode in MODES, "mode", f"must be one of {MODES}, got {mode!r}")
    w, plan = config.workload, config.plan
    d, t, p = plan.dp, plan.tp, plan.pp
    a = plan.ga_steps
    m = plan.micro_batches if p > 1 else 1
    nodes = config.placement.nodes
    b_rep = w.global_batch / d  # samples per replica per iteration
    b_step = b_rep / a  # per accumulation step

    # ---- forward (A.1): per accumulation step, on one GPU of the replica
    if config.fwd_time is not None:
        t_fwd = config.fwd_time / a
    else:
        if mode == "morphling":
            unit = w.forward_time(b_step / m, mode) / t  # one micro-batch, whole model, sharded by t
        else:
            unit = w.forward_time(b_step / m / t, mode)  # work per GPU = b/t samples' worth
        t_fwd = unit / p * (m + p - 1)  # 1F1B: t_p*g_p/p*(m+p-1)
    t_bwd = params.k_bwd * t_fwd + (t_fwd if plan.checkpointing else 0.0)

    # ---- communication volumes (A.1), bytes per GPU
    grad_bytes = w.params * env.grad_bytes / (t * p)  # gradient shard of one GPU
    v_dp = grad_bytes * 2.0 * (d - 1) / d
    bsh = w.global_batch * w.seq * w.hidden * env.act_bytes
    v_tp = 4.0 * 2.0 * (t - 1) * bsh * w.layers / (d * t)
    v_pp = 2.0 * p * bsh / (d * t) if p > 1 else 0.0

    if mode == "morphling":
        # Bottleneck bandwidth of the GPUs involved: NVLink on one server, else inter-node (A.1);
        # TP stays inside a server.
        b_net = env.intra_node_bw if nodes == 1 else env.inter_node_bw
        t_dp = v_dp / b_net
        t_tp = v_tp / env.intra_node_bw
        t_pp = v_pp / b_net
    else:
        groups = _groups(config.plan, config.placement, env)
        t_dp = _allreduce_time(grad_bytes, groups["dp"], d, env)
        g_tp = groups["tp"]
        if t > 1:
            # On the critical path: Megatron's 4 all-reduces per layer, NVLink inside a server.
            if g_tp.nodes == 1:
                t_tp = v_tp / env.nvlink_bw + 4 * 2 * (t - 1) * w.layers * a * m * env.intra_latency
            else:
                t_tp = (
                    v_tp * g_tp.nic_load / env.nic_bw + 4 * 2 * (t - 1) * w.layers * a * m * env.inter_latency
                )
        else:
            t_tp = 0.0
        if p > 1:
            # Critical path of 1F1B: 2*(m+p-2) sends of one micro-batch's boundary activation
            # (split over the TP ranks); the crossing boundaries go through the servers' NICs.
            x_mb = bsh / (d * m * t)
            g_pp = groups["pp"]
            cross = g_pp.nodes
            inside = (p - 1) - cross
            per_crossing = x_mb * g_pp.nic_load / env.nic_bw + env.inter_latency
            per_inside = x_mb / env.nvlink_bw + env.intra_latency
            worst = per_crossing if cross > 0 else per_inside
            t_pp = a * (2.0 * (cross * per_crossing + inside * per_inside) + 2.0 * (m - 1) * worst)
        else:
            t_pp = 0.0

    # Mode "tessera": ZeRO-DP reduce-scatters gradients during the backward pass but all-gathers the
    # updated parameters after the optimizer step, so half of the DP volume is exposed. (ZeRO-Offload
    # keeps the paper's form, where the DP sync also meets the offload in T_oo.)
    sharded = mode == "tessera" and plan.zero == "zero-dp"
    t_sync = t_dp / 2 if sharded else t_dp
    t_gather = t_dp - t_sync
    t_cc = a * t_fwd + (a - 1) * t_bwd + overlap(params.k_sync, t_bwd, t_sync) + t_tp + t_pp

    # ---- optimizer and offload (A.2)
    t_off = 0.0
    if plan.zero == "offload":
        t_opt = params.k_os_offload * w.params / (d * t * p * config.cpus)
        t_off = w.params * env.offload_bytes / (d * t * p * env.pcie_bw)
        if mode == "tessera":
            # The GPUs of one server share its host side (memory, PCIe root): each moves P/(d*t*p),
            # so the busiest server carries (its GPUs) * P/(d*t*p).
            busiest = max(config.placement.gpus_per_node)
            t_off += params.k_host * w.params * busiest / (d * t * p)
        t_oo = overlap(params.k_off, t_dp, t_off) + overlap(params.k_swap, t_opt, t_off)
    else:
        shards = t * p * (d if plan.zero == "zero-dp" else 1)
        t_opt = params.k_opt * w.params / shards
        t_oo = t_opt + t_gather

    t_iter = t_cc + t_oo + params.k_const
    return Breakdown(
        t_fwd=t_fwd,
        t_bwd=t_bwd,
        t_comm_dp=t_dp,
        t_comm_tp=t_tp,
        t_comm_pp=t_pp,
        t_opt=t_opt,
        t_off=t_off,
        t_cc=t_cc,
        t_oo=t_oo,
        k_const=params.k_const,
        t_iter=t_iter,
    )


def predict(
    params: Params, config: RunConfig, mode: Mode = "tessera", env: Environment = DEFAULT_ENV
) -> float:
    """Predicted seconds per iteration of ``config``."""
    return breakdown(params, config, mode, env).t_iter


def throughput(
    params: Params, config: RunConfig, mode: Mode = "tessera", env: Environment = DEFAULT_ENV
) -> float:
    """Samples per second: global batch / T_iter (Sec. 4)."""
    return config.workload.global_batch / predict(params, config, mode, env)


# --------------------------------------------------------------------------------------------------
# Fitting


class _Space:
    """Unconstrained coordinates of the fitted parameters of one mode: log k mapped through a logit
    onto the box BOUNDS; the parameters a mode does not fit keep the base point's values."""

    def __init__(self, mode: Mode, base: Params) -> None:
        self.names = FIT_NAMES[mode]
        self.base = base
        self.lo = np.array([math.log(BOUNDS[n][0]) for n in self.names])
        self.hi = np.array([math.log(BOUNDS[n][1]) for n in self.names])

    def theta(self, params: Params) -> FloatArray:
        logs = np.array([math.log(max(getattr(params, n), BOUNDS[n][0])) for n in self.names])
        x = np.clip((logs - self.lo) / (self.hi - self.lo), 1e-9, 1 - 1e-9)
        return np.asarray(np.log(x / (1 - x)), dtype=float)

    def params(self, theta: FloatArray) -> Params:
        z = np.clip(theta, -40.0, 40.0)
        logs = self.lo + (self.hi - self.lo) / (1.0 + np.exp(-z))
        values = {n: float(math.exp(v)) for n, v in zip(self.names, logs, strict=True)}
        return replace(self.base, **values)

    def logs(self, params: Params) -> FloatArray:
        return np.array([math.log(max(getattr(params, n), BOUNDS[n][0])) for n in self.names])


# Width of the prior per parameter, in log units: k_bwd is ~2 for transformer layers (backward does
# twice the forward's matmuls), so it is held closer than the others.
PRIOR_SIGMA: dict[str, float] = {
    "k_bwd": 0.3,
    "k_sync": 2.0,
    "k_opt": 0.7,
    "k_os_offload": 3.0,
    "k_const": 3.0,
    "k_off": 2.0,
    "k_swap": 2.0,
    "k_host": 3.0,
}


@dataclass(frozen=True)
class FitOptions:
    """Knobs of :func:`fit` (documented defaults).

    ``prior``/``prior_weight``/``prior_sigma``: a weak ridge on log k toward ``prior`` (width
    ``prior_sigma`` per parameter, in log units) so that parameters the samples cannot identify (e.g.
    the offload parameters of a model profiled without offload) stay at sane values; the data term is
    the mean squared log error, so a weight of 1e-4 at one sigma costs what a 1% error does.
    ``parts_weight``: weight of the measured T_cc/T_oo parts in the objective (0 = iteration time only,
    as in Sec. A.3). ``starts``: starting points (default: a fixed list around the prior);
    ``max_iter``: Levenberg-Marquardt steps from each.
    """

    prior: Params = DEFAULT_PARAMS
    prior_weight: float = 1e-4
    prior_sigma: dict[str, float] = field(default_factory=lambda: dict(PRIOR_SIGMA))
    parts_weight: float = 0.0
    max_iter: int = 100
    starts: tuple[Params, ...] = ()


def _start_points(prior: Params) -> list[Params]:
    return [
        prior,
        replace(prior, k_bwd=1.5, k_sync=1.2, k_off=1.2, k_swap=1.2),
        replace(prior, k_bwd=2.5, k_sync=8.0, k_off=8.0, k_swap=8.0),
        replace(
            prior, k_opt=prior.k_opt * 10, k_os_offload=prior.k_os_offload * 10, k_const=prior.k_const / 5
        ),
    ]


def _levenberg_marquardt(
    residuals: Callable[[FloatArray], FloatArray], theta0: FloatArray, max_iter: int
) -> tuple[FloatArray, float]:
    """Minimise ||residuals(theta)||^2 by Levenberg-Marquardt with a forward-difference Jacobian."""
    theta = theta0.copy()
    r = residuals(theta)
    cost = float(r @ r)
    lam = 1e-2
    h = 1e-6
    for _ in range(max_iter):
        jac = np.empty((r.size, theta.size))
        for j in range(theta.size):
            step = np.zeros_like(theta)
            step[j] = h
            jac[:, j] = (residuals(theta + step) - r) / h
        g = jac.T @ r
        a = jac.T @ jac
        improved = False
        rel = 0.0
        while lam < 1e12:
            delta = np.linalg.solve(a + lam * np.diag(np.diag(a) + 1e-12), -g)
            cand = theta + delta
            rc = residuals(cand)
            cc = float(rc @ rc)
            if math.isfinite(cc) and cc < cost:
                rel = (cost - cc) / max(cost, 1e-300)
                theta, r, cost, improved = cand, rc, cc, True
                lam = max(lam / 3.0, 1e-12)
                break
            lam *= 4.0
        if not improved or rel < 1e-10:
            break
    return theta, cost


def _objective(
    samples: Sequence[Sample],
    weights: FloatArray,
    mode: Mode,
    env: Environment,
    space: _Space,
    anchor: Params,
    anchor_weight: float,
    sigma: dict[str, float],
    parts_weight: float,
) -> Callable[[FloatArray], FloatArray]:
    """Residuals: sqrt(w_i) * log error of sample i (w normalised to 1), the measured parts if asked,
    and the ridge toward ``anchor``."""
    y = np.log([s.iter_time for s in samples])
    sw = np.sqrt(weights / weights.sum())
    aw = math.sqrt(anchor_weight) / np.array([sigma.get(n, 1.0) for n in space.names])
    centre = space.logs(anchor)
    pw = math.sqrt(parts_weight)

    def residuals(theta: FloatArray) -> FloatArray:
        params = space.params(theta)
        parts: list[float] = []
        pred = np.empty(len(samples))
        for i, s in enumerate(samples):
            bd = breakdown(params, s.config, mode, env)
            pred[i] = math.log(max(bd.t_iter, 1e-12))
            if pw > 0:
                if s.t_cc is not None:
                    parts.append(sw[i] * pw * (math.log(max(bd.t_cc, 1e-12)) - math.log(s.t_cc)))
                if s.t_oo is not None:
                    parts.append(sw[i] * pw * (math.log(max(bd.t_oo, 1e-12)) - math.log(s.t_oo)))
        return np.concatenate(
            [sw * (pred - y), np.asarray(parts, dtype=float), aw * (space.logs(params) - centre)]
        )

    return residuals


def _check_samples(samples: Sequence[Sample], name: str) -> None:
    _require(len(samples) > 0, name, "needs at least one sample")
    for i, s in enumerate(samples):
        _require(isinstance(s, Sample), f"{name}[{i}]", f"must be a Sample, got {type(s).__name__}")


def fit(
    samples: Sequence[Sample],
    mode: Mode = "tessera",
    env: Environment = DEFAULT_ENV,
    options: FitOptions | None = None,
) -> Params:
    """Fit the parameters of ``mode`` to ``samples`` by minimising the RMSLE of T_iter (Sec. A.3).

    Mode "morphling" fits the paper's seven (k_host stays 0); mode "tessera" also fits k_host.
    Deterministic: Levenberg-Marquardt on log parameters bounded by ``BOUNDS``, from a fixed list of
    starting points, keeping the best; a weak ridge toward ``options.prior`` (see FitOptions).
    """
    _check_samples(samples, "samples")
    _require(mode in MODES, "mode", f"must be one of {MODES}, got {mode!r}")
    opts = options or FitOptions()
    base = opts.prior if mode == "tessera" else replace(opts.prior, k_host=0.0)
    space = _Space(mode, base)
    residuals = _objective(
        samples,
        np.ones(len(samples)),
        mode,
        env,
        space,
        base,
        opts.prior_weight,
        opts.prior_sigma,
        opts.parts_weight,
    )
    best: tuple[float, FloatArray] | None = None
    for start in list(opts.starts) or _start_points(base):
        theta, cost = _levenberg_marquardt(residuals, space.theta(start), opts.max_iter)
        if best is None or cost < best[0] - 1e-15:
            best = (cost, theta)
    assert best is not None
    return space.params(best[1])


def refit(
    params: Params,
    live_samples: Sequence[Sample],
    mode: Mode = "tessera",
    env: Environment = DEFAULT_ENV,
    *,
    half_life: float = 10.0,
    anchor_weight: float = 1e-3,
    base_samples: Sequence[Sample] = (),
    base_weight: float = 0.25,
    max_iter: int = 100,
) -> Params:
    """Online refit from the step times running jobs report (Sec. A.3, "continuous model fitting").

    Sample i weighs 0.5 ** ((newest.time - i.time) / half_life), so recent reports dominate; the
    optional ``base_samples`` (the profile the model was first fitted on) share ``base_weight`` of the
    total weight. A ridge of ``anchor_weight`` (per unit of PRIOR_SIGMA) on log k toward the current
    ``params`` keeps what the live samples cannot identify where it was, so one job's reports move the
    model toward them without unlearning the rest. Deterministic (Levenberg-Marquardt from ``params``).
    """
    _check_samples(live_samples, "live_samples")
    _require(mode in MODES, "mode", f"must be one of {MODES}, got {mode!r}")
    _positive(half_life, "half_life")
    _require(0 <= base_weight < 1, "base_weight", f"must be in [0, 1), got {base_weight!r}")
    newest = max(s.time for s in live_samples)
    live_w = np.array([0.5 ** ((newest - s.time) / half_life) for s in live_samples])
    live_w = live_w / live_w.sum()
    samples = list(live_samples)
    weights = live_w
    if base_samples:
        _check_samples(base_samples, "base_samples")
        samples += list(base_samples)
        weights = np.concatenate(
            [live_w * (1.0 - base_weight), np.full(len(base_samples), base_weight / len(base_samples))]
        )
    space = _Space(mode, params)
    residuals = _objective(samples, weights, mode, env, space, params, anchor_weight, PRIOR_SIGMA, 0.0)
    theta, _ = _levenberg_marquardt(residuals, space.theta(params), max_iter)
    return space.params(theta)


def rmsle(
    params: Params, samples: Sequence[Sample], mode: Mode = "tessera", env: Environment = DEFAULT_ENV
) -> float:
    """Root mean squared log error of the predicted iteration times."""
    _check_samples(samples, "samples")
    errs = [math.log(predict(params, s.config, mode, env)) - math.log(s.iter_time) for s in samples]
    return math.sqrt(sum(e * e for e in errs) / len(errs))


def forward_profile(points: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    """(fwd_ref_time, fwd_ref_batch, fwd_exponent) from measured (per-GPU batch, forward seconds).

    Robust to a bad point: the exponent is the median of the pairwise log-slopes (clipped to
    [0.5, 1]), the reference batch the geometric mean of the batches, and the reference time the
    median of the points moved to it along that power law.
    """
    _require(len(points) > 0, "points", "needs at least one (batch, seconds) point")
    for i, (b, s) in enumerate(points):
        _positive(b, f"points[{i}].batch")
        _positive(s, f"points[{i}].seconds")
    logs = [(math.log(b), math.log(s)) for b, s in points]
    slopes = [
        (ys - yr) / (xs - xr)
        for i, (xr, yr) in enumerate(logs)
        for xs, ys in logs[i + 1 :]
        if abs(xs - xr) > 1e-9
    ]
    exponent = float(np.clip(np.median(slopes), 0.5, 1.0)) if slopes else 1.0
    ref_log_b = float(np.mean([x for x, _ in logs]))
    ref_log_t = float(np.median([y - exponent * (x - ref_log_b) for x, y in logs]))
    return math.exp(ref_log_t), math.exp(ref_log_b), exponent


def relative_error(predicted: float, measured: float) -> float:
    """|predicted - measured| / measured."""
    _positive(measured, "measured")
    return abs(predicted - measured) / measured


def mode_of(text: str) -> Mode:
    """A mode name from text (a CLI flag, a request field), or an error naming ``mode``."""
    _require(text in MODES, "mode", f"must be one of {MODES}, got {text!r}")
    return cast(Mode, text)
