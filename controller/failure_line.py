"""The line of a failed worker's log that says why it failed (controller/agents.py `last_log_line`).

The last non-empty line is the error of most programs. Two kinds of tail are not: a rule or a
banner's border (a line of `=`, `-`, `*` alone), and torchrun's summary, which closes every failed
torchrun log with a box naming the first rank that failed ("Root Cause (first observed failure):
... rank : 1 (local_rank: 1) exitcode : 1 ..."). A live audit read `rank 0: exit code 1; last log
line: ============================================================` for a torchrun job whose
global rank 1 had raised `ValueError`: here that rank's own error line is found instead
(`global rank 1: ValueError: ...`). Pure: text in, text out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_CHARS = 300
_DECORATION = re.compile(r"[\s=\-*_~#+]*")
_ROOT_CAUSE = "Root Cause (first observed failure):"
_SUMMARY_RANK = re.compile(r"\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_SUMMARY_EXIT = re.compile(r"\s*exitcode\s*:\s*(-?\d+)(?:\s*\(pid:[^)]*\))?\s*(\(\w+\))?")
_SUMMARY_TRACEBACK = re.compile(r"\s*traceback\s*:\s*(.*)")
_RANK_PREFIX = re.compile(r"\[rank(\d+)\]:\s?")
# torch's elastic agent's own log lines ("E1128 20:35:41.089000 13065 torch/distributed/...] ...").
_ELASTIC_LOG = re.compile(r"[IWEF]\d{4} [\d:.]+ +\d+ torch/distributed/")
# Where torchrun's own traceback (its ChildFailedError) starts: not the program's.
_LAUNCHER_ERROR = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
_NO_TRACEBACK = "To enable traceback see"


def decoration(line: str) -> bool:
    """A rule, a border, or blank: says nothing."""
    return _DECORATION.fullmatch(line) is not None


@dataclass(frozen=True)
class RootCause:
    """What torchrun's summary says of the first rank that failed."""
    start: int  # index of the summary's first line (its top border)
    rank: int
    exitcode: str
    message: str  # the last line of its `traceback :` field: the error when the program used @record


def torchrun_summary(lines: list[str]) -> RootCause | None:
    """The summary box torchrun prints when a rank failed (torch.distributed.elastic's
    ChildFailedError), the last one in `lines`; None when there is none (or it is cut)."""
    at = max((i for i, ln in enumerate(lines) if ln.strip() == _ROOT_CAUSE), default=-1)
    if at < 0:
        return None
    rank, exitcode, message, traceback = -1, "", "", False
    for ln in lines[at + 1:]:
        if decoration(ln) and ln.strip():
            break  # the box's bottom border
        if traceback:  # a traceback's lines, indented under the field: its last says the error
            message = ln.strip() or message
        elif (m := _SUMMARY_RANK.match(ln)) and rank < 0:
            rank = int(m.group(1))
        elif (m := _SUMMARY_EXIT.match(ln)) and not exitcode:
            exitcode = m.group(1) + (f" {m.group(2)}" if m.group(2) else "")
        elif m := _SUMMARY_TRACEBACK.match(ln):
            message, traceback = m.group(1).strip(), True
    if rank < 0:
        return None
    # The box's top border: the first line of `=` above its "Failures:" (torch's _MSG_FORMAT_TEMPLATE).
    start = at
    for i in range(at - 1, -1, -1):
        if lines[i].strip().startswith("=") and decoration(lines[i]):
            start = i
            break
    return RootCause(start, rank, exitcode, message)


def _said(line: str) -> bool:
    """A line of the program's own error: not a traceback's frame or source (indented), not empty."""
    return bool(line.strip()) and not line[:1].isspace() and not decoration(line)


def _program_lines(lines: list[str]) -> list[str]:
    """`lines` before torchrun's summary, less torchrun's own traceback and log lines."""
    cut = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith(_LAUNCHER_ERROR)), len(lines))
    if cut < len(lines):  # back to its "Traceback (most recent call last):"
        cut = next((i for i in range(cut, -1, -1) if lines[i].startswith("Traceback (most recent call last)")), cut)
    return [ln for ln in lines[:cut] if not _ELASTIC_LOG.match(ln)]


def _root_cause_text(lines: list[str], root: RootCause) -> str:
    before = _program_lines(lines[:root.start])
    tag = f"[rank{root.rank}]:"
    mine = [_RANK_PREFIX.sub("", ln, count=1) for ln in before if ln.startswith(tag)]
    said = [ln for ln in mine if _said(ln)]
    if said:
        return f"global rank {root.rank}: {said[-1].strip()}"
    if root.message and not root.message.startswith(_NO_TRACEBACK):
        return f"global rank {root.rank}: {root.message}"
    exit_text = f" (exitcode {root.exitcode})" if root.exitcode else ""
    # No line of its own: the last error the log shows before the summary (a rank's error before
    # init_process_group carries no [rankN] prefix), said as what it is.
    other = [ln for ln in before if _said(ln) and not _RANK_PREFIX.match(ln)]
    if other:
        return f"global rank {root.rank} failed first{exit_text}; the log's last error before torchrun's summary: " \
               f"{other[-1].strip()}"
    return f"global rank {root.rank} failed first{exit_text} (torchrun's summary; no error line of its own)"


def failure_line(text: str) -> str:
    """The line of a failed worker's log that says why, at most MAX_CHARS characters; "" when the
    log says nothing. For a torchrun log, its root cause's rank and that rank's error line."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    root = torchrun_summary(lines)
    if root is not None:
        return _root_cause_text(lines, root)[:MAX_CHARS]
    said = [ln.strip() for ln in lines if not decoration(ln)]
    return said[-1][:MAX_CHARS] if said else ""
