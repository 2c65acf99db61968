"""The rank log's cap (nodeagent/logcap.py) on literal files: what is kept, the note, the count."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from tessera.nodeagent.logcap import MIN_MAX_BYTES, LogPump, compact


def _open(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)


def test_compact_keeps_the_tail_from_a_line_start_after_the_note(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"first\nsecond\nthird\nfourth\n")
    fd = _open(log)
    try:
        cut = compact(fd, 12, lambda dropped: f"[{dropped}]\n".encode())
        # The last 12 bytes start inside "third\n": the kept part begins at the next line.
        assert cut == 19  # "first\nsecond\nthird\n"
        assert log.read_bytes() == b"[19]\nfourth\n"
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND  # appending again afterwards
        os.write(fd, b"fifth\n")
        assert log.read_bytes() == b"[19]\nfourth\nfifth\n"
        assert compact(fd, 100, lambda d: b"never\n") == 0
    finally:
        os.close(fd)


def test_a_pump_keeps_the_log_under_its_cap_and_counts_what_it_dropped(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    fd = _open(log)
    pump = LogPump(fd, MIN_MAX_BYTES, "job/1/0")
    lines = [f"line {i:06d}\n".encode() for i in range(40_000)]  # 480,000 bytes
    try:
        for i in range(0, len(lines), 500):
            os.write(pump.write_fd, b"".join(lines[i:i + 500]))
            pump.pump(0)
        pump.close_writer()
        pump.drain()
        assert pump.eof
    finally:
        pump.close()
        os.close(fd)
    data = log.read_bytes()
    assert len(data) <= MIN_MAX_BYTES
    note, rest = data.split(b"\n", 1)
    assert note.startswith(b"tessera-keeper[job/1/0]: this log passed its cap of 65536 bytes;")
    kept = rest.splitlines(keepends=True)
    assert kept == lines[-len(kept):]  # whole lines, the newest, in order
    dropped = int(note.split(b";")[1].split()[0])
    assert dropped == sum(map(len, lines)) - len(rest) == pump.dropped


def test_a_cap_too_small_for_its_note_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        LogPump(0, MIN_MAX_BYTES - 1, "x")
