"""Where an earlier attempt's rank logs are, for StreamJobLogs (controller/logstream.py), and what to
say when a rank's log cannot be read.

The store keeps only the current attempt's placement (JobRecord.placement, whose ranks
launches.rank_node maps), and a job's events say why an attempt started, not on which nodes. So an
earlier attempt's ranks are found by asking the agents: an agent's ReadLog answers NOT_FOUND for a
(job, attempt, rank) that did not run on its node (nodeagent/worklogs.py), and the node that ran it
keeps the log for the agent's --attempt-ttl. The current placement's nodes are asked first (an
attempt often ran where the next one runs), then every other node the controller knows, PROBE_WIDTH
at once. Outside the current placement a node UNREACHABLE or DOWN is not asked (each would cost a
call's deadline; the current placement's nodes are asked as a read of the current attempt asks
them): it is named when no node asked has the log, since the log may be there. All ranks are ranks
0, 1, ... up to the first that no node has; rank r + 1 is asked first of rank r's node (a node runs
consecutive ranks), so finding them costs about one call per rank plus one per node for each node
of the attempt (a launcher of one process per node: one per node for each rank).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tessera.common.errors import FailedPrecondition, NotFound, TesseraError
from tessera.controller.errors import NodeNotFound
from tessera.controller.view import EngineView
from tessera.v1 import common_pb2

P = common_pb2

PROBE_WIDTH = 16  # agents asked at once for a rank
SHOWN = 8  # ranks or nodes named in one message at most
DEAD = (P.NODE_STATE_UNREACHABLE, P.NODE_STATE_DOWN)


@dataclass(frozen=True)
class Gap:
    """A rank whose log was not read, and why; `unreachable`: a node that has it, or may have it,
    could not be asked (FAILED_PRECONDITION: it may work later), else there is none (NOT_FOUND)."""

    rank: int
    why: str
    unreachable: bool = False


@dataclass(frozen=True)
class Reply:
    """A node's answer to "do you have this log?": `failed` says why it could not be asked, as
    words after its name (`is DOWN (...)`, `did not answer (UNAVAILABLE)`)."""

    has: bool = False
    failed: str = ""


# (node id, rank) -> whether that node has the rank's log of the attempt looked for.
Ask = Callable[[str, int], Awaitable[Reply]]


def node_words(view: EngineView, node_id: str) -> str:
    """The node's state for a message: `UNREACHABLE (no heartbeat for 20s)`, `READY`."""
    try:
        info = view.node(node_id)
    except NodeNotFound:
        return "no longer known to the controller (removed)"
    state = P.NodeState.Name(info.state).removeprefix("NODE_STATE_")
    return f"{state} ({info.reason})" if info.reason else state


def _names(nodes: dict[str, str]) -> str:
    shown = [f"{n} {words}" for n, words in list(nodes.items())[:SHOWN]]
    return ", ".join(shown) + (f" and {len(nodes) - SHOWN} more" if len(nodes) > SHOWN else "")


class Locator:
    """Finds the node of each rank of one earlier attempt (one StreamJobLogs call's)."""

    def __init__(self, view: EngineView, ask: Ask, current: list[str]) -> None:
        self.view, self.ask = view, ask
        self.current = list(dict.fromkeys(current))
        self._others: list[str] | None = None
        self._dead: dict[str, str] = {}  # node -> its state, not asked

    def others(self) -> list[str]:
        """The nodes outside the current placement that can be asked (read once, when needed)."""
        if self._others is None:
            self._others = []
            for n in self.view.node_ids():
                if n in self.current:
                    continue
                try:
                    state = self.view.node(n).state
                except NodeNotFound:  # removed meanwhile
                    continue
                if state in DEAD:
                    self._dead[n] = f"is {node_words(self.view, n)}"
                else:
                    self._others.append(n)
        return self._others

    async def _first_with(self, rank: int, nodes: list[str], failed: dict[str, str]) -> str | None:
        for i in range(0, len(nodes), PROBE_WIDTH):
            group = nodes[i:i + PROBE_WIDTH]
            replies = await asyncio.gather(*(self.ask(n, rank) for n in group))
            for n, reply in zip(group, replies, strict=True):
                if reply.failed:
                    failed[n] = reply.failed
            found = [n for n, reply in zip(group, replies, strict=True) if reply.has]
            if found:
                return found[0]
        return None

    async def find(self, rank: int, what: str, hint: str = "", more: bool = False) -> tuple[str | None, Gap | None]:
        """The node that has the rank's log, or why none was found (`what`: the log looked for, in
        words). `hint`: asked first (the node of rank - 1: a node runs consecutive ranks). `more`: the
        ranks before were found, so a rank no node has is no gap (the attempt had no more ranks)
        unless a node could not be asked."""
        failed: dict[str, str] = {}
        first = [hint] if hint else []
        for nodes in (first, [n for n in self.current if n != hint]):
            if (node := await self._first_with(rank, nodes, failed)) is not None:
                return node, None
        rest = [n for n in self.others() if n != hint]
        if (node := await self._first_with(rank, rest, failed)) is not None:
            return node, None
        unasked = {**failed, **self._dead}
        asked = len(set(first + self.current + rest) - failed.keys())
        if unasked:
            return None, Gap(rank, f"{what} is on none of the {asked} node(s) asked; not asked: "
                                   f"{_names(unasked)}", unreachable=True)
        if more:
            return None, None
        return None, Gap(rank, f"{what} is on none of the {asked} node(s) (all asked: the attempt had no such "
                               "rank, or the agent removed its folder after its --attempt-ttl)")


def unread(job_id: str, attempt: int, gaps: list[Gap], read: int) -> TesseraError:
    """The error that ends a stream that did not read every log it was asked for: NOT_FOUND when
    the logs are not there, FAILED_PRECONDITION when a node that has (or may have) one could not be
    asked. `read`: how many ranks' logs were sent before it."""
    gaps = sorted(gaps, key=lambda g: g.rank)
    text = "; ".join(g.why for g in gaps[:SHOWN]) + (f"; and {len(gaps) - SHOWN} more" if len(gaps) > SHOWN else "")
    if read:
        ranks = ", ".join(str(g.rank) for g in gaps[:SHOWN]) + (", ..." if len(gaps) > SHOWN else "")
        text = f"job {job_id} attempt {attempt}: {read} rank log(s) read, not rank {ranks}: {text}"
    elif len(gaps) > 1:
        text = f"job {job_id} attempt {attempt}: no rank's log could be read: {text}"
    return FailedPrecondition(text) if any(g.unreachable for g in gaps) else NotFound(text)
