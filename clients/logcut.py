"""What `tessctl logs` says on stderr when a log's tail is not the whole log (or the --tail) asked
for: the controller sends at most the last 4 MiB of a log (controller/logstream.py TAIL_READS) and
marks the last message of such a tail (LogLines.cut, with the agent's path). A live audit's `logs J`,
`logs J --tail 100000` and `logs J -f` of a 400,001-line log printed its last 37,118 lines and
nothing on stderr."""

from __future__ import annotations

from tessera.clients.output import safe
from tessera.v1 import controller_pb2

CAP_MIB = 4  # the controller's largest tail read of a log


class TailCount:
    """The lines and bytes each log's tail brought, until its cut message says how many were shown."""

    def __init__(self, tail_lines: int) -> None:
        self.tail_lines = tail_lines
        self.seen: dict[tuple[int, int], tuple[int, int]] = {}

    def add(self, msg: controller_pb2.LogLines) -> str:
        """The notice for stderr once `msg` ends a cut tail; "" otherwise."""
        key = (msg.rank, msg.attempt)
        lines, size = self.seen.get(key, (0, 0))
        lines, size = lines + len(msg.lines), size + sum(len(line) + 1 for line in msg.lines)
        self.seen[key] = (lines, size)
        if not msg.cut:
            return ""
        shown = f"{lines:,} of the {self.tail_lines:,} lines asked" if self.tail_lines else f"its last {lines:,} lines"
        return (f"tessctl: rank {msg.rank}'s log (attempt {msg.attempt}): showing {shown} "
                f"({size / (1024 * 1024):.1f} MiB): the controller sends only the last {CAP_MIB} MiB of a log, so its "
                f"earlier lines are not shown; the agent's file is {safe(msg.path)} on node {safe(msg.node_id)}")
