"""tessctl's terminal plumbing: writing text and bytes in order with a child's, redrawing a table
while watching a list, and the overlap of re-read log tails. (Watching jobs and following logs:
tessera.clients.waiting, over the controller's streams.)"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from tessera.clients import output

WATCH_POLL_S = 2.0  # table refresh of the lists that have no watch stream (all jobs, nodes)


def fd_or_pipe(stream: TextIO) -> int:
    """The file descriptor behind `stream` for a child to write to directly (ordered with ours), or
    subprocess.PIPE when it has none (a StringIO, pytest's capture)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return subprocess.PIPE
    stream.flush()
    return fd


def println(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()


# What a worker's log may do to a terminal, and what not: text, tab, newline and carriage return
# (progress bars) and SGR colour sequences (ESC [ ... m) are kept; every other control byte is
# shown as a visible \xNN, and a UTF-8 C1 control as \uNNNN. So an OSC (ESC ]: window titles,
# OSC 52 clipboard writes), a DCS or APC string, a CSI other than SGR (ESC [2J clears the screen,
# cursor moves, device reports that type into the terminal) reaches it as plain text.
_SGR = re.compile(rb"\x1b\[[0-9;:]*m")
_CONTROL = re.compile(rb"\x1b\[[0-9;:]*m|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\xc2[\x80-\x9f]")


def _visible(m: re.Match[bytes]) -> bytes:
    seq = m.group(0)
    if _SGR.fullmatch(seq):
        return seq
    if seq[0] == 0xC2:
        return b"\\u%04x" % seq[1]
    return b"\\x%02x" % seq[0]


def terminal_safe(data: bytes) -> bytes:
    """A worker's log bytes as a terminal may show them (see `_CONTROL`)."""
    return _CONTROL.sub(_visible, data)


def write_bytes(out: TextIO, data: bytes) -> None:
    if not data:
        return
    buf = getattr(out, "buffer", None)
    if buf is not None:
        out.flush()
        buf.write(data)
        buf.flush()
    else:
        out.write(data.decode("utf-8", errors="replace"))
        out.flush()


def renderer(
    out: TextIO, fmt: str, as_json: Callable[[Any], dict[str, Any]], as_table: Callable[..., str], what: str
) -> Callable[..., None]:
    """A function that prints one snapshot of a list: JSON (indented once, one line per snapshot
    when watching) or a table (redrawn in place on a terminal, appended otherwise)."""
    tty = out.isatty()

    def render(items: Sequence[Any], first: bool = False, watching: bool = False) -> None:
        if fmt == "json":
            println(out, output.dumps(as_json(items), compact=watching))
            return
        if not items:
            if first:
                print(f"No {what} found.", file=sys.stderr)
            if not watching:
                return
        text = as_table(items, time.time(), wide=fmt == "wide")
        if watching and tty:
            out.write("\x1b[H\x1b[2J")  # home + clear: redraw in place
        elif watching and not first:
            out.write("\n")
        println(out, text)

    return render


def poll(fetch: Callable[[], list[Any]], render: Callable[..., None], key: Callable[[list[Any]], Any]) -> int:
    """--watch of a list with no watch stream: fetch every WATCH_POLL_S, print when it changed."""
    items = fetch()
    last = key(items)
    render(items, first=True, watching=True)
    while True:
        time.sleep(WATCH_POLL_S)
        items = fetch()
        k = key(items)
        if k != last:
            last = k
            render(items, watching=True)


def overlap(prev: bytes, new: bytes) -> int:
    """Length of the longest suffix of `prev` that is a prefix of `new`: the part of a re-read log
    tail that was already printed (logs --follow)."""
    if not prev or not new:
        return 0
    if new.startswith(prev):
        return len(prev)
    anchor = prev[-256:]
    end = len(new)
    while (pos := new.rfind(anchor, 0, end)) >= 0:
        n = pos + len(anchor)
        if prev.endswith(new[:n]):
            return n
        end = n - 1
    for n in range(min(len(anchor), len(new)) - 1, 0, -1):  # an overlap shorter than the anchor
        if prev.endswith(new[:n]):
            return n
    return 0


