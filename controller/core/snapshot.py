"""What a scheduling round sees and what it decides.

Everything here is a frozen value. The live controller and the simulator build a `Snapshot`; a policy
(controller/core/policy.py) turns it into a `RoundPlan`. Fields added after the first policy (Frenzy)
all have defaults, so a snapshot of pending jobs and node occupancy alone stays valid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

from tessera.estimator.cell_recipe import JobRecipe
from tessera.estimator.models import ModelDims
from tessera.estimator.plans import ExecutionPlan


@dataclass(frozen=True)
class GpuView:
    index: int
    model: str
    memory_bytes: int
    foreign_used_bytes: int = 0
    # NVLink island inside the node (GPUs with the same number talk over NVLink); -1 = unknown/PCIe.
    island: int = -1


@dataclass(frozen=True)
class NodeView:
    """A node that may receive work this round (READY), with the GPU indices already held."""

    id: str
    gpus: tuple[GpuView, ...]
    busy: frozenset[int] = frozenset()
    # Host resources (Morphling treats CPUs and host memory as resources next to GPUs: ZeRO-Offload
    # needs host memory and CPU threads). 0 = not reported (the node is not limited by them).
    cpus: int = 0
    host_memory_bytes: int = 0
    busy_cpus: int = 0
    busy_host_memory_bytes: int = 0
    # Of `busy`, the GPUs of jobs checkpointing to stop (a preemption, a move's old place): free
    # once their workers exit. Policies see them free (policy.py `releasing_free`); the guarantee
    # layer gives them to a guaranteed job first (controller/core/guarantees.py, preplace.py). A
    # job started on them starts when they are free.
    releasing: frozenset[int] = frozenset()

    def idle(self) -> tuple[GpuView, ...]:
        return tuple(g for g in self.gpus if g.index not in self.busy)

    # Derived once per view: the simulator keeps a node's view from round to round until its
    # occupancy changes, and every round's placement and plan check read these for all nodes.
    @cached_property
    def models(self) -> dict[int, str]:
        """GPU index -> model."""
        return {g.index: g.model for g in self.gpus}

    @cached_property
    def by_model(self) -> tuple[tuple[str, int, tuple[int, ...], dict[int, int]], ...]:
        """Per GPU model, in model order: (model, GPU count, idle indices sorted, index -> NVLink
        island for the GPUs whose island is known)."""
        out = []
        for model in sorted({g.model for g in self.gpus}):
            mine = [g for g in self.gpus if g.model == model]
            out.append((model, len(mine), tuple(sorted(g.index for g in mine if g.index not in self.busy)),
                        {g.index: g.island for g in mine if g.island >= 0}))
        return tuple(out)


class Priority(StrEnum):
    GUARANTEED = "guaranteed"
    BEST_EFFORT = "best-effort"


class Objective(StrEnum):
    DEFAULT = ""  # the policy's own objective (throughput, deadlines)
    COST = "cost"  # Espresso: the cheapest allocation that meets the job's SLO


@dataclass(frozen=True)
class Promise:
    """What a guaranteed job was promised (Morphling Sec. 4; the workload's num_gpus, num_cpus,
    exec_plan columns): its progress must never fall behind what this gives. `gpu_type` "" = the
    type the job runs on; `plan` is the plan's name in the estimates' own vocabulary ("zero-dp",
    "ga", "248", an ExecutionPlan key...), "" = the best plan on those resources."""

    gpus: int
    cpus: int = 0
    plan: str = ""
    gpu_type: str = ""


@dataclass(frozen=True)
class TenantQuota:
    """A tenant and its guaranteed GPUs per type (controller configuration). Guaranteed jobs of the
    tenant whose promises fit in what is left of its quota are admitted at once, preempting
    best-effort work; best-effort jobs may borrow idle quota and are the first shrunk or preempted."""

    name: str
    gpus: tuple[tuple[str, int], ...] = ()  # (GPU type, GPUs), sorted by type

    def quota(self, gpu_type: str) -> int:
        return dict(self.gpus).get(gpu_type, 0)


@dataclass(frozen=True)
class JobView:
    id: str
    submit_time: float
    model: ModelDims
    global_batch_size: int
    gpus_hint: int = 0
    # Allowed GPU types (a restriction): empty = any.
    gpu_types: tuple[str, ...] = ()
    # The GPU type the user asked for (a preference the Crius policy may change; FCFS keeps it).
    gpu_type_hint: str = ""
    iterations: int = 0
    done_iterations: float = 0.0
    # Absolute time (same clock as Snapshot.now) by which the job must finish; 0 = none.
    deadline: float = 0.0
    restarts: int = 0
    # Cache key of the estimates (same key, same Cells); "" = model signature + global batch + recipe
    # + tenant.
    estimate_key: str = ""
    # The job's recipe (JobSpec.plan: precision, checkpointing, LoRA, ...; estimator/cell_recipe.py):
    # its Cells and memory are estimated with it. None = the Cells' own recipe.
    recipe: JobRecipe | None = None
    # Multi-tenancy (Morphling Sec. 4): the job's tenant and class. A guaranteed job may hold the
    # promise it was given; its progress must never fall behind what the promise gives.
    tenant: str = ""
    priority: Priority = field(default_factory=lambda: Priority.BEST_EFFORT)
    promise: Promise | None = None
    # Espresso: the objective the job asks for ("" = the policy's, "cost" = cheapest allocation
    # meeting the SLO) and its SLO: seconds within which its remaining iterations must run (0 = none,
    # < 0 = its deadline has passed; common/objective.py slo_seconds).
    objective: Objective = field(default_factory=lambda: Objective.DEFAULT)
    slo_s: float = 0.0
    # An opaque job (docs/opaque-jobs.md): no model dims, so no estimator. It runs exactly
    # `gpus_hint` GPUs of one of `gpu_types` (any type when empty); `model` is a placeholder and
    # controller/core/opaque.py answers its one Cell (no memory check, no learned times).
    opaque: bool = False
    # Guaranteed jobs: when the tenants' admission (controller/core/quotas.py) first admitted it
    # within its tenant's quota (same clock as Snapshot.now; the caller's record of
    # RoundPlan.admitted): its SLA clock s_j. None = not recorded: a running guaranteed job then
    # counts as admitted unless its RunningView is opportunistic (a borrower over quota), and
    # its slack is counted from submit_time (docs/tenants.md).
    admitted_at: float | None = None

    @property
    def key(self) -> str:
        if self.estimate_key:
            return self.estimate_key
        base = f"{self.model.signature}-b{self.global_batch_size}"
        if self.recipe is not None and self.recipe.given:
            base = f"{base}-{self.recipe.key}"
        # A tenant's measured iteration times are its own (controller/learning.py): so are its Cells.
        return f"{base}@{self.tenant}" if self.tenant else base

    @property
    def remaining_iterations(self) -> float:
        return max(0.0, self.iterations - self.done_iterations)

    def may_use(self, gpu_type: str) -> bool:
        """Whether the job may run on GPUs of this type: one it names in `gpu_types`, any if none."""
        return not self.gpu_types or gpu_type in self.gpu_types


@dataclass(frozen=True)
class Cell:
    """Crius's scheduling candidate: a job on `gpus` GPUs of one type with `stages` pipeline stages
    (0 = the estimator's best stage count, not stated)."""

    gpu_type: str
    gpus: int
    stages: int = 0

    def __str__(self) -> str:
        st = f", {self.stages} stage{'s' if self.stages != 1 else ''}" if self.stages else ""
        return f"{self.gpus} x {self.gpu_type}{st}"


@dataclass(frozen=True)
class StageAssignment:
    """One stage of a pipeline over mixed GPU types (the cost objective): `gpus` (= the plan's dp)
    GPUs of `gpu_type` holding the transformer layers [layer_start, layer_end)."""

    gpu_type: str
    gpus: int
    layer_start: int
    layer_end: int


@dataclass(frozen=True)
class CostPrediction:
    """What the cost objective predicted for a placement: seconds per iteration and for the
    iterations left, the price of that time, the allocation stage by stage (for people)."""

    iteration_s: float
    total_s: float
    cost: float
    allocation: str


@dataclass(frozen=True)
class PlanChoice:
    dp: int
    tp: int
    pp: int
    micro_batch: int
    grad_accum: int
    gpu_model: str
    memory_per_gpu_bytes: int
    memory_source: str
    # The estimator's whole plan (sharding, checkpointing, schedule) when it gave one.
    execution: ExecutionPlan | None = None
    # A pipeline over mixed GPU types, stage by stage in pipeline order (pp entries, dp GPUs each;
    # the placement's GPUs in slice order are stage 0's, then stage 1's, ...); empty = pp stages of
    # gpu_model, layers split evenly. `gpu_model` is then the stages' types joined by "+".
    stages: tuple[StageAssignment, ...] = ()
    prediction: CostPrediction | None = None

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp


@dataclass(frozen=True)
class CellEstimate:
    """One Cell of a job with its estimated iteration time (seconds per global batch)."""

    cell: Cell
    iteration_s: float
    memory_per_gpu_bytes: int = 0
    plan: PlanChoice | None = None
    # Where the number comes from: "table:arena", "formula", "profiled", "measured", "fitted"...
    source: str = ""
    # The plan's name in the estimates' own vocabulary ("zero-dp", "248", ...; a Promise's plan):
    # "" = not named. Morphling's tables give one Cell per plan and name it here.
    plan_name: str = ""


@dataclass(frozen=True)
class Slice:
    node_id: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class RunningView:
    """A job that holds GPUs now: its Cell, plan and placement as the last round decided them."""

    job: JobView
    cell: Cell
    slices: tuple[Slice, ...]
    plan: PlanChoice | None = None
    # Started by opportunistic execution ahead of an earlier job still pending: it may be suspended
    # when that job can start (Crius Sec. 6.1).
    opportunistic: bool = False
    # The job's first start (wall seconds): the admission order of running guaranteed jobs.
    since: float = 0.0
    # When its present placement was made (started or moved; Placement.placed_at), None = unknown:
    # the minimum run time before a round may restart it (controller/core/minrun.py).
    placed_at: float | None = None


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[NodeView, ...]
    # Jobs waiting for a placement, in no particular order (the policy orders them).
    pending: tuple[JobView, ...]
    # GPU models that exist in the cluster at all, READY or not: a pending reason names them.
    cluster_gpus: tuple[tuple[str, int, int], ...] = ()  # (model, memory_bytes, count)
    # Jobs holding GPUs. Their GPUs are also in NodeView.busy; busy GPUs no running job claims are
    # held by something the policy may not touch.
    running: tuple[RunningView, ...] = ()
    now: float = 0.0
    # Ids of pending jobs that arrived since the last round; None = treat every pending job as new.
    arrivals: tuple[str, ...] | None = None
    # Jobs that left (finished, failed, cancelled) since the last round.
    departures: int = 0
    # Tenants with quotas (controller configuration); empty = no quotas, every job best-effort.
    tenants: tuple[TenantQuota, ...] = ()
    # Seconds one reconfiguration (checkpoint, stop, restart) costs a job, as the caller measures or
    # assumes it: policies that reconfigure count it (Morphling's 260 s in its artifact).
    restart_cost_s: float = 0.0
    # Price per GPU-hour of each GPU type (controller configuration, --prices), sorted by type: the
    # cost objective's input. Empty = no prices, no job with the cost objective is placed.
    prices: tuple[tuple[str, float], ...] = ()


class Action(StrEnum):
    """What a round does with one job. A StrEnum: `Action.START == "start"`, and stored, logged and
    printed values are the plain strings."""

    START = "start"  # place a pending job now
    PENDING = "pending"  # leave it waiting; the decision's reason and `pending` kind say why
    KEEP = "keep"  # a running job stays as it is
    # A running job restarts from its checkpoint in a new Cell or placement (`Change` says how).
    MIGRATE = "migrate"
    STOP = "stop"  # a running job is suspended back to pending (its checkpoint kept)
    DROP = "drop"  # the job cannot run (infeasible, deadline missed)


# The actions whose job holds GPUs after the round.
PLACED = (Action.START, Action.MIGRATE, Action.KEEP)


class Change(StrEnum):
    """How a migration changes a job's Cell; NONE ("") for every other action."""

    NONE = ""
    SCALE_UP = "scale-up"
    SCALE_DOWN = "scale-down"
    TYPE_CHANGE = "type-change"
    MOVE = "move"  # same GPU type and count, other GPUs


class PendingKind(StrEnum):
    """Why a job is left pending, for code to act on (the reason text is for people)."""

    WAITING = "waiting"  # queued behind others, or not its turn this round
    NO_ROOM_NOW = "no_room_now"  # fits the cluster, not what is free now
    FITS_NOWHERE = "fits_nowhere"  # no GPU type in the cluster can ever run it


@dataclass(frozen=True)
class Decision:
    job_id: str
    action: Action
    reason: str
    plan: PlanChoice | None = None
    slices: tuple[Slice, ...] = ()
    cell: Cell | None = None
    previous: Cell | None = None
    change: Change = Change.NONE
    iteration_s: float = 0.0
    opportunistic: bool = False
    # Set on every pending decision a policy returns (`finalize` enforces it), None otherwise.
    pending: PendingKind | None = None

    def __post_init__(self) -> None:
        # Callers outside the typed core may pass the plain strings: normalise them to the members
        # (a misspelt action fails here, not later in the engine).
        if type(self.action) is not Action:
            object.__setattr__(self, "action", Action(self.action))
        if type(self.change) is not Change:
            object.__setattr__(self, "change", Change(self.change))
        if self.pending is not None and type(self.pending) is not PendingKind:
            object.__setattr__(self, "pending", PendingKind(self.pending))


@dataclass(frozen=True)
class RoundStats:
    """Cost and outcome of one round, deterministic (no wall-clock time)."""

    estimate_calls: int = 0
    choices_evaluated: int = 0
    budget_exhausted: bool = False
    estimated_throughput: float = 0.0  # samples/s of every job placed after this round, by the estimates


@dataclass(frozen=True)
class RoundPlan:
    decisions: tuple[Decision, ...] = field(default_factory=tuple)
    stats: RoundStats = field(default_factory=RoundStats)
    policy: str = ""
    # Guaranteed jobs admitted within their tenant's quota this round (running or pending), sorted;
    # empty without tenants. A guarantee's clock starts the first round that admits it
    # (docs/tenants.md, the SLA).
    admitted: tuple[str, ...] = ()
    # Wall times at which the plan may change by itself with nothing else changing (a minimum run
    # time ending under a guaranteed job that waits): the live engine plans a round then.
    wakes: tuple[float, ...] = ()

    def starts(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.action is Action.START)

    def migrations(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.action is Action.MIGRATE)

    def of(self, action: str) -> tuple[Decision, ...]:
        """The decisions of one action (an `Action`, or its plain string)."""
        return tuple(d for d in self.decisions if d.action == action)
