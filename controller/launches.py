"""The Launch calls of an attempt: one per node of its placement, with the rendezvous port chosen.

Pure: the stored record (plan, placement, rendezvous, spec) in, the agent requests out. The engine
sends them only after the attempt is stored as STARTING, so a restarted controller resends the same
requests (same request ids), which the agents treat as no-ops.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection, Iterable, Mapping

from tessera.common.nodespec import RENDEZVOUS_KEY_FEATURE
from tessera.common.rpc import host_of
from tessera.controller.core import launchers
from tessera.controller.core.validate import resolve_model
from tessera.controller.store import JobRecord
from tessera.estimator.convert import model_spec
from tessera.v1 import agent_pb2, common_pb2


def rendezvous_port(job_id: str, attempt: int, node_id: str, active: Iterable[JobRecord], base: int,
                    count: int) -> int:
    """A rendezvous port on rank 0's node that no other active attempt there holds: a hash of
    (job, attempt) so a relaunch usually gets a fresh one, probing up from there."""
    used = set()
    for j in active:
        if j.placement and j.placement.slices and j.placement.slices[0].node_id == node_id:
            used.add(int(j.placement.rendezvous.rpartition(":")[2]))
    start = int(hashlib.sha256(f"{job_id}/{attempt}".encode()).hexdigest(), 16) % count
    for i in range(count):
        port = base + (start + i) % count
        if port not in used:
            return port
    raise RuntimeError("no free rendezvous port")


def rendezvous(agent_address: str, port: int) -> str:
    return f"{host_of(agent_address)}:{port}"


def model_pb(job: JobRecord) -> common_pb2.ModelSpec | None:
    """The model the workers build (TESSERA_MODEL): its dimensions (a registered name's filled in) and
    every family field (gated, kv heads, experts, ...). Before, only the six dimensions went out: a
    LLaMA or Mixtral job trained as a GPT-2 of those dimensions, and said `arch=gpt2` (a live audit)."""
    if not job.spec.HasField("model"):
        return None  # an opaque job (docs/opaque-jobs.md)
    m = model_spec(resolve_model(job.spec.model))
    if m.family != common_pb2.MODEL_FAMILY_MOE:  # the routing defaults say nothing of a dense model
        for f in ("top_k", "moe_every", "capacity_factor", "dropless"):
            m.ClearField(f)
    return m


def sealing_key(key: bytes, nodes: Iterable[str], features: Mapping[str, Collection[str]]) -> bytes:
    """`key` when every node of the attempt says its workers seal their rendezvous (NodeStatus.features),
    else b"": a rollout (docs/operations.md, "Upgrading") placed attempts over old agents, whose
    workers do not seal, and new ones, whose workers do, and every such attempt failed its rendezvous
    and spent a retry, until the job FAILED (a live audit)."""
    return key if all(RENDEZVOUS_KEY_FEATURE in features.get(n, ()) for n in nodes) else b""


def attempt_key(key: bytes, job_id: str, attempt: int) -> bytes:
    """The attempt's rendezvous key: HMAC-SHA256 of (job, attempt) under the controller's key, so
    every Launch of the attempt, resent or after a restart, carries the same one, and no two
    attempts share one. b"" without a key."""
    if not key:
        return b""
    return hmac.new(key, f"tessera rendezvous/{job_id}/{attempt}".encode(), hashlib.sha256).digest()


def launch_requests(job: JobRecord, epoch: int, checkpoint_root: str,
                    rendezvous_key: bytes = b"") -> list[tuple[str, agent_pb2.LaunchRequest]]:
    """One Launch per node of the placement: its ranks (or one process, for a per-node
    launcher) and the argv of the job's launcher template with the plan substituted; each carries
    the attempt's key for sealing its rendezvous store's values (derived from `rendezvous_key`)."""
    assert job.plan is not None and job.placement is not None
    spec, plan, slices = job.spec, job.plan, job.placement.slices
    tpl = launchers.template_of(spec.launcher)
    entry = list(spec.entrypoint) or list(tpl.default_entrypoint)
    world = plan.dp * plan.tp * plan.pp
    host, _, port = job.placement.rendezvous.rpartition(":")
    ckpt = f"{checkpoint_root}/{job.id}"
    values: dict[str, object] = {
        "nnodes": len(slices), "world_size": world, "master_addr": host, "master_port": port, "dp": plan.dp, "tp": plan.tp,
        "pp": plan.pp, "micro_batch": plan.micro_batch, "grad_accum": plan.grad_accum,
        "global_batch_size": spec.global_batch_size, "iterations": spec.iterations, "checkpoint_dir": ckpt,
        "world_info": launchers.world_info([(s.node_id, list(s.gpu_indices)) for s in slices])}
    out, rank = [], 0
    for node_rank, s in enumerate(slices):
        if tpl.per_node:
            ranks = [agent_pb2.RankAssignment(rank=node_rank, local_rank=0, gpu_indices=list(s.gpu_indices))]
        else:
            ranks = [agent_pb2.RankAssignment(rank=rank + i, local_rank=i, gpu_indices=[g])
                     for i, g in enumerate(s.gpu_indices)]
            rank += len(s.gpu_indices)
        argv = launchers.expand(tpl, entry, {**values, "node_rank": node_rank,
                                             "nproc_per_node": len(s.gpu_indices)}, head=node_rank == 0)
        req = agent_pb2.LaunchRequest(
            request_id=f"{job.id}/{job.attempt}/{s.node_id}", controller_epoch=epoch, job_id=job.id,
            attempt=job.attempt, world_size=world, ranks=ranks, rendezvous=job.placement.rendezvous,
            plan=plan, argv=argv, env=dict(spec.env), checkpoint_dir=ckpt, iterations=spec.iterations,
            global_batch_size=spec.global_batch_size, model=model_pb(job), checkpoint_every=spec.checkpoint_every,
            tenant=spec.tenant, workdir=spec.workdir,
            rendezvous_key=attempt_key(rendezvous_key, job.id, job.attempt))
        out.append((s.node_id, req))
    return out


def placed_on(job: JobRecord) -> set[str]:
    """The nodes of the job's current placement: its current attempt runs there and nowhere else."""
    return {s.node_id for s in job.placement.slices} if job.placement is not None else set()


def rank_node(job: JobRecord, rank: int) -> str | None:
    """The node running `rank` of the job's current placement (a per-node launcher runs one
    process, rank = node rank, per node); None when there is no such rank. Only the current
    attempt's (an earlier attempt's nodes: Placement.earlier, controller/logstream.py)."""
    if rank < 0 or job.placement is None:
        return None
    per_node = launchers.template_of(job.spec.launcher).per_node
    first = 0
    for s in job.placement.slices:
        n = 1 if per_node else len(s.gpu_indices)
        if first <= rank < first + n:
            return str(s.node_id)
        first += n
    return None
