"""`describe node`: the node's busy GPUs that no job the caller can list holds.

A user lists its own tenant's jobs only (controller/service.py ListJobs; another tenant's job is
NOT_FOUND, as a missing one), while a node's `busy_gpus` counts every job's GPUs. ListNodes names,
for a user, the busy GPUs held by jobs it may not list (`Node.hidden_gpus`); any other busy GPU no
listed job holds is held by workers an agent still reports (ending) or by a migration's target
(controller/snapshots.py busy_gpus). Describe says which, instead of showing GPUs busy with nothing
on them.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera.v1 import common_pb2, controller_pb2

# The states whose placement holds GPUs: a PENDING job keeps its last attempt's placement, whose
# GPUs may be another's by now (a review saw them counted as the pending job's).
HOLDING = frozenset((common_pb2.JOB_STATE_STARTING, common_pb2.JOB_STATE_RUNNING, common_pb2.JOB_STATE_MIGRATING))
HIDDEN = "(hidden: another tenant's job)"
NO_JOB = "(no job: workers ending, or a move's target)"


def on_node(node: controller_pb2.Node, jobs: Sequence[controller_pb2.Job]) -> list[controller_pb2.Job]:
    """The jobs of `jobs` that hold GPUs of `node` now."""
    return [j for j in jobs if j.state in HOLDING and any(s.node_id == node.id for s in j.placement.slices)]


def unlisted_rows(node: controller_pb2.Node, jobs: Sequence[controller_pb2.Job]) -> list[tuple[str, list[int]]]:
    """(label, GPU indices) for the node's busy GPUs that no job of `jobs` holds there; [] if none."""
    held = {g for j in on_node(node, jobs) for s in j.placement.slices if s.node_id == node.id for g in s.gpu_indices}
    rest = set(node.busy_gpus) - held
    hidden = sorted(rest & set(node.hidden_gpus))
    other = sorted(rest - set(node.hidden_gpus))
    return [(label, gpus) for label, gpus in ((HIDDEN, hidden), (NO_JOB, other)) if gpus]
