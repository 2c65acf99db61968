"""What StreamJobLogs and GetJobLogs say when a rank's log cannot be read (controller/logstream.py):
a Gap per rank, and the one error that names them after the lines of the logs that were read.
NOT_FOUND when a log is not there; FAILED_PRECONDITION when the node that has it could not be asked
(it may answer later) rather than UNAVAILABLE, which the SDK takes for its own controller's failure
and tries another controller."""

from __future__ import annotations

from dataclasses import dataclass

from tessera.common.errors import FailedPrecondition, NotFound, TesseraError
from tessera.controller.errors import NodeNotFound
from tessera.controller.view import EngineView
from tessera.v1 import common_pb2

P = common_pb2

SHOWN = 8  # ranks named in one message at most


@dataclass(frozen=True)
class Gap:
    """A rank whose log was not read, and why; `unreachable`: its node could not be asked."""

    rank: int
    why: str
    unreachable: bool = False


def node_words(view: EngineView, node_id: str) -> str:
    """The node's state for a message: `UNREACHABLE (no heartbeat for 20s)`, `READY`."""
    try:
        info = view.node(node_id)
    except NodeNotFound:
        return "no longer known to the controller (removed)"
    state = P.NodeState.Name(info.state).removeprefix("NODE_STATE_")
    return f"{state} ({info.reason})" if info.reason else state


def unread(job_id: str, attempt: int, gaps: list[Gap], read: int) -> TesseraError:
    """The error that ends a stream that did not read every log it was asked for. `read`: how many
    ranks' logs were sent before it."""
    gaps = sorted(gaps, key=lambda g: g.rank)
    text = "; ".join(g.why for g in gaps[:SHOWN]) + (f"; and {len(gaps) - SHOWN} more" if len(gaps) > SHOWN else "")
    if read:
        ranks = ", ".join(str(g.rank) for g in gaps[:SHOWN]) + (", ..." if len(gaps) > SHOWN else "")
        text = f"job {job_id} attempt {attempt}: {read} rank log(s) read, not rank {ranks}: {text}"
    elif len(gaps) > 1:
        text = f"job {job_id} attempt {attempt}: no rank's log could be read: {text}"
    return FailedPrecondition(text) if any(g.unreachable for g in gaps) else NotFound(text)
