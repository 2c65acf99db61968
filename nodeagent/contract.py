"""The worker contract as pure functions: request validation, worker paths and the worker environment.

docs/worker-contract.md is the specification. Nothing here spawns, reads the clock or touches the
file system, so every rule is unit-testable with literal inputs.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from google.protobuf import json_format

from tessera.common import envpolicy
from tessera.common.contract import CONTRACT_VARS, RENDEZVOUS_KEY_BYTES
from tessera.nodeagent.errors import InvalidArgument
from tessera.v1 import agent_pb2, common_pb2

__all__ = ["CONTRACT_VARS"]

JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
ENV_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")

# Inherited from the agent's own environment but meaningless (or harmful) for a worker: a worker
# must not ping the agent's systemd watchdog or claim its sockets, and the shell's PWD, OLDPWD and
# `_` describe the agent's start (an audit saw a worker told PWD=/tmp/... while it ran in its
# attempt folder).
NOT_INHERITED: frozenset[str] = frozenset(
    {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES",
     "PWD", "OLDPWD", "_"}
)

# The agent's own settings (TESSERA_TLS_DIR, TESSERA_CONTROLLER, a TESSERA_TOKEN an operator left in
# its environment file...) are its own: no worker of any tenant inherits them. A worker's TESSERA_*
# variables are the contract's and its job's.
AGENT_SETTINGS = "TESSERA_"

MAX_RANKS_PER_LAUNCH = 1024


def cpu_threads_per_gpu(cpus: int, gpus: int) -> int:
    """OMP_NUM_THREADS of a worker: the node's usable CPUs shared evenly by its GPUs, at least 1.

    torch sizes its OpenMP pool to every core, and torchrun caps it at 1 only when it starts more
    than one process itself. Several workers with a pool of every core each oversubscribe the host,
    and their CPU-side work slows down with the number of such workers on the node (docs/worker-
    contract.md, "CPU threads"). Shared per GPU rather than per rank of one job because other jobs'
    workers take the node's other GPUs.
    """
    return max(1, cpus // max(1, gpus))


def attempt_dir(work_dir: Path, job_id: str, attempt: int) -> Path:
    """The attempt's working directory: <work-dir>/jobs/<job_id>/attempt-<attempt>/."""
    return work_dir / "jobs" / job_id / f"attempt-{attempt}"


def log_path(work_dir: Path, job_id: str, attempt: int, rank: int) -> Path:
    """The rank's log: <work-dir>/jobs/<job_id>/attempt-<attempt>/rank-<rank>.log."""
    return attempt_dir(work_dir, job_id, attempt) / f"rank-{rank}.log"


def default_checkpoint_dir(work_dir: Path, job_id: str) -> Path:
    """Where checkpoints go when the Launch names no directory: shared by the job's attempts on this node."""
    return work_dir / "jobs" / job_id / "checkpoints"


def validate_job_id(job_id: str, field: str = "job_id") -> None:
    if not JOB_ID_RE.fullmatch(job_id):
        raise InvalidArgument(field, f"{job_id!r} does not match {JOB_ID_RE.pattern}")


def split_host_port(address: str, field: str) -> tuple[str, int]:
    """Split "host:port" or "[v6]:port"; port 1..65535."""
    host, sep, port_s = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_s.isdigit() or not 0 < int(port_s) < 65536:
        raise InvalidArgument(field, f"{address!r} is not host:port with a port in 1..65535")
    return host, int(port_s)


def _no_nul(value: str, field: str) -> None:
    # exec() refuses NUL bytes; say so as a field error instead of a spawn failure.
    if "\0" in value:
        raise InvalidArgument(field, "contains a NUL byte")


def validate_launch(
    req: agent_pb2.LaunchRequest, gpu_indices: Iterable[int], allowed_env: frozenset[str] = frozenset()
) -> None:
    """Check a LaunchRequest against the contract and this node's GPU indices; `allowed_env` are
    the names the agent's --allow-env lets through the environment policy (common/envpolicy.py).

    Raises InvalidArgument("field: reason") for the first problem. GPU *availability* (another
    attempt holding a GPU) is state, not shape, and is the supervisor's FAILED_PRECONDITION.
    """
    validate_job_id(req.job_id)
    if req.attempt < 1:
        raise InvalidArgument("attempt", f"must be >= 1 (1 is the first launch), got {req.attempt}")
    if not req.argv:
        raise InvalidArgument("argv", "must not be empty")
    if not req.argv[0]:
        raise InvalidArgument("argv[0]", "must not be empty")
    for i, arg in enumerate(req.argv):
        _no_nul(arg, f"argv[{i}]")
    if req.world_size < 1:
        raise InvalidArgument("world_size", f"must be >= 1, got {req.world_size}")
    if not req.ranks:
        raise InvalidArgument("ranks", "must list at least one rank")
    if len(req.ranks) > min(req.world_size, MAX_RANKS_PER_LAUNCH):
        raise InvalidArgument("ranks", f"{len(req.ranks)} ranks for world_size {req.world_size}")
    split_host_port(req.rendezvous, "rendezvous")
    if len(req.rendezvous_key) not in (0, RENDEZVOUS_KEY_BYTES):
        raise InvalidArgument("rendezvous_key", f"must be {RENDEZVOUS_KEY_BYTES} bytes or empty, got "
                                                f"{len(req.rendezvous_key)}")
    known = set(gpu_indices)
    seen_ranks: set[int] = set()
    seen_local: set[int] = set()
    gpu_owner: dict[int, int] = {}
    for i, r in enumerate(req.ranks):
        field = f"ranks[{i}]"
        if not 0 <= r.rank < req.world_size:
            raise InvalidArgument(f"{field}.rank", f"{r.rank} is outside 0..{req.world_size - 1}")
        if r.rank in seen_ranks:
            raise InvalidArgument(f"{field}.rank", f"rank {r.rank} is listed twice")
        seen_ranks.add(r.rank)
        if not 0 <= r.local_rank < len(req.ranks):
            raise InvalidArgument(f"{field}.local_rank", f"{r.local_rank} is outside 0..{len(req.ranks) - 1}")
        if r.local_rank in seen_local:
            raise InvalidArgument(f"{field}.local_rank", f"local rank {r.local_rank} is listed twice")
        seen_local.add(r.local_rank)
        for g in r.gpu_indices:
            if g not in known:
                raise InvalidArgument(
                    f"{field}.gpu_indices", f"GPU {g} does not exist on this node (have {sorted(known)})"
                )
            if g in gpu_owner:
                raise InvalidArgument(
                    f"{field}.gpu_indices", f"GPU {g} is given to both rank {gpu_owner[g]} and rank {r.rank}"
                )
            gpu_owner[g] = r.rank
    for name, value in req.env.items():
        if not ENV_NAME_RE.fullmatch(name):
            raise InvalidArgument(f"env.{name}", f"name does not match {ENV_NAME_RE.pattern}")
        if name in CONTRACT_VARS:
            raise InvalidArgument(
                f"env.{name}", "is set by the agent (worker contract) and cannot be overridden"
            )
        why = envpolicy.refusal(name, allowed_env)
        if why is not None:
            raise InvalidArgument(f"env.{name}", why)
        _no_nul(value, f"env.{name}")
    if req.checkpoint_dir:
        _no_nul(req.checkpoint_dir, "checkpoint_dir")
        # A relative directory would resolve against each attempt's own cwd, so attempts would not
        # find each other's checkpoints.
        if not req.checkpoint_dir.startswith("/"):
            raise InvalidArgument("checkpoint_dir", f"{req.checkpoint_dir!r} must be an absolute path")
    if req.workdir:
        _no_nul(req.workdir, "workdir")
        if not req.workdir.startswith("/"):
            raise InvalidArgument("workdir", f"{req.workdir!r} must be an absolute path")
    for name in ("iterations", "global_batch_size", "checkpoint_every"):
        if getattr(req, name) < 0:
            raise InvalidArgument(name, f"must be >= 0, got {getattr(req, name)}")


def validate_stop(job_id: str, attempt: int, grace_seconds: float) -> None:
    validate_job_id(job_id)
    if attempt < 0:
        raise InvalidArgument("attempt", f"must be >= 0 (0 = every attempt), got {attempt}")
    if not math.isfinite(grace_seconds) or grace_seconds < 0:
        raise InvalidArgument("grace_seconds", f"must be a finite number >= 0, got {grace_seconds}")


def plan_json(plan: common_pb2.Plan) -> str:
    """TESSERA_PLAN: fixed keys in the contract's order, then the options of the whole execution
    plan (sharding, offload, checkpointing, schedule, ...) as protobuf's JSON names them, when set."""
    out: dict[str, object] = {
        "dp": plan.dp,
        "tp": plan.tp,
        "pp": plan.pp,
        "micro_batch": plan.micro_batch,
        "grad_accum": plan.grad_accum,
        "gpu_model": plan.gpu_model,
        "memory_per_gpu_bytes": plan.memory_per_gpu_bytes,
        "memory_source": plan.memory_source,
    }
    if plan.HasField("options"):
        opts = json_format.MessageToDict(plan.options, preserving_proto_field_name=True)
        for key in ("dp", "tp", "pp", "micro_batch", "grad_accum"):
            opts.pop(key, None)  # the plan's own sizes are authoritative
        out.update(opts)
    if plan.stages:  # a pipeline over mixed GPU types: each stage's layer range (docs/worker-contract.md)
        out["stages"] = [{"gpu_model": s.gpu_model, "gpus": s.gpus, "layer_start": s.layer_start,
                          "layer_end": s.layer_end} for s in plan.stages]
    return json.dumps(out)


def model_json(model: common_pb2.ModelSpec) -> str:
    """TESSERA_MODEL: fixed keys in the contract's order, then the family fields the spec sets (family,
    gated, num_kv_heads, kv_channels, ...) as protobuf's JSON names them, so a trainer can refuse a model
    it does not build instead of training another one under its name."""
    out: dict[str, object] = {
        "name": model.name,
        "hidden_size": model.hidden_size,
        "num_layers": model.num_layers,
        "num_heads": model.num_heads,
        "vocab_size": model.vocab_size,
        "seq_length": model.seq_length,
    }
    refinements = json_format.MessageToDict(model, preserving_proto_field_name=True)
    out.update({k: v for k, v in refinements.items() if k not in out})
    return json.dumps(out)


def worker_env(
    base: Mapping[str, str],
    req: agent_pb2.LaunchRequest,
    rank: agent_pb2.RankAssignment,
    *,
    agent_addr: str,
    declared: bool,
    checkpoint_dir: str,
    omp_threads: int,
    user: str = "",
    home: str = "",
    tmpdir: str = "",
    confined: bool = False,
) -> dict[str, str]:
    """The whole environment of one worker.

    The agent's own environment first (PATH, PYTHONPATH, proxies...), minus systemd's per-service
    variables and the agent's own Tessera settings (TESSERA_*), then the worker's identity (USER, LOGNAME, HOME and TMPDIR in its attempt folder, when
    given), then the job's env, then the contract variables, which always win. OMP_NUM_THREADS is
    `omp_threads` and PYTHONUNBUFFERED is 1 unless the job's env sets them (the agent's own values
    are not passed on).
    `confined`: the worker may open only its attempt's GPUs on this node (device cgroups), so CUDA
    sees those alone, numbered from 0 in PCI order, and CUDA_VISIBLE_DEVICES names the rank's so.
    """
    env = {k: v for k, v in base.items() if k not in NOT_INHERITED and not k.startswith(AGENT_SETTINGS)}
    env["OMP_NUM_THREADS"] = str(omp_threads)
    # A Python worker's stdout into its log pipe is block-buffered: `tessctl logs -f` showed nothing
    # for minutes, and a worker SIGKILLed (the OOM killer) lost its last lines, which its failure
    # reason quotes. torchrun and deepspeed run theirs with `python -u`; this covers `direct`.
    env["PYTHONUNBUFFERED"] = "1"
    for name, value in (("USER", user), ("LOGNAME", user), ("HOME", home), ("TMPDIR", tmpdir)):
        if value:
            env[name] = value
    env.update(req.env)
    master_addr, master_port = split_host_port(req.rendezvous, "rendezvous")
    env.update(
        {
            "TESSERA_JOB_ID": req.job_id,
            "TESSERA_ATTEMPT": str(req.attempt),
            "RANK": str(rank.rank),
            "LOCAL_RANK": str(rank.local_rank),
            "WORLD_SIZE": str(req.world_size),
            "LOCAL_WORLD_SIZE": str(len(req.ranks)),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "TESSERA_RENDEZVOUS": req.rendezvous,
            "TESSERA_RENDEZVOUS_KEY": req.rendezvous_key.hex(),
            "TESSERA_PLAN": plan_json(req.plan),
            "TESSERA_MODEL": model_json(req.model),
            "TESSERA_ITERATIONS": str(req.iterations),
            "TESSERA_GLOBAL_BATCH_SIZE": str(req.global_batch_size),
            "TESSERA_CHECKPOINT_DIR": checkpoint_dir,
            "TESSERA_CHECKPOINT_EVERY": str(req.checkpoint_every),
            "TESSERA_AGENT_ADDR": agent_addr,
            # Declared GPUs do not exist: an empty list hides any real GPU so the worker runs on CPU.
            "CUDA_VISIBLE_DEVICES": "" if declared else visible_devices(rank.gpu_indices,
                                                                        node_gpus(req) if confined else None),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "TESSERA_INVENTORY_SOURCE": "declared" if declared else "nvml",
        }
    )
    return env


def node_gpus(req: agent_pb2.LaunchRequest) -> list[int]:
    """The GPUs of all the attempt's ranks on this node: what each of its workers may open under
    device isolation (NCCL's peer-to-peer copies between local ranks open the peer's GPU too)."""
    return sorted({g for r in req.ranks for g in r.gpu_indices})


def visible_devices(gpus: Iterable[int], confined_to: Iterable[int] | None = None) -> str:
    """CUDA_VISIBLE_DEVICES for a rank's GPUs (NVML indices, PCI order). Without device cgroups CUDA
    enumerates every GPU of the node, so the indices are named as they are. In a device cgroup that
    lets it open `confined_to` only, CUDA enumerates those alone, from 0 (as under Slurm's
    ConstrainDevices or LSF's GPU enforcement): each GPU is named by its place among them, the
    rank's order kept."""
    given = list(gpus)
    if confined_to is None:
        return ",".join(map(str, given))
    place = {g: i for i, g in enumerate(sorted(set(confined_to)))}
    return ",".join(str(place[g]) for g in given)


# "The Python this agent runs on", so the controller's default entrypoint (the reference trainer)
# and a template such as `/usr/bin/env {python} {entrypoint}` need no knowledge of each node's
# interpreter path.
PYTHON_PLACEHOLDER = "{python}"


def worker_argv(argv: Iterable[str], python: str) -> list[str]:
    """The argv to exec: every argument that is exactly the placeholder becomes the agent's
    interpreter, wherever it stands (docs/launchers.md); one that merely contains it is literal."""
    return [python if a == PYTHON_PLACEHOLDER else a for a in argv]
