"""`tessctl logs -f` resumed after a failover (clients/waiting.py LogPrinter): the new stream's tail
of each log is printed from after the last lines printed of it, and what cannot be matched is
said on stderr rather than printed twice or dropped in silence."""

from __future__ import annotations

import argparse
import io

import pytest

from tessera.clients import waiting
from tessera.v1 import controller_pb2


def _args(all_ranks: bool = False, output: str = "table") -> argparse.Namespace:
    return argparse.Namespace(raw=True, tail=0, all_ranks=all_ranks, output=output)


def _msg(lines: list[str], rank: int = 0, attempt: int = 1, cut: bool = False) -> controller_pb2.LogLines:
    return controller_pb2.LogLines(rank=rank, attempt=attempt, node_id="node-a", lines=[s.encode() for s in lines],
                                   cut=cut)


def _lines(n: int, start: int = 1) -> list[str]:
    return [f"step {i}" for i in range(start, start + n)]


def test_the_resumed_tail_is_printed_from_after_the_last_line_printed() -> None:
    out = io.StringIO()
    p = waiting.LogPrinter(_args(), out)
    p.add(_msg(_lines(40)))
    p.add(_msg(_lines(5, 41)))
    p.resume()
    p.add(_msg(_lines(30)))  # the new tail, in two messages, then a follow's
    p.add(_msg(_lines(20, 31)))
    p.add(_msg(_lines(2, 51)))
    p.end()
    assert out.getvalue().splitlines() == _lines(52)


def test_a_line_printed_again_in_the_log_does_not_confuse_the_match() -> None:
    out = io.StringIO()
    p = waiting.LogPrinter(_args(), out)
    p.add(_msg(["a", "b", "a"]))
    p.resume()
    p.add(_msg(["a", "b", "a", "b", "a", "c"]))
    assert out.getvalue().splitlines() == ["a", "b", "a", "b", "a", "c"]


def test_lines_not_found_again_are_said_and_printed(capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    p = waiting.LogPrinter(_args(), out)
    p.add(_msg(_lines(3)))
    p.resume()
    p.add(_msg(_lines(4, 100), cut=True))  # more than the controller's 4 MiB were written meanwhile
    p.add(_msg(["later"]))
    assert out.getvalue().splitlines() == [*_lines(3), *_lines(4, 100), "later"]
    assert "may be missing" in capsys.readouterr().err


def test_a_new_attempt_is_printed_from_its_start(capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    p = waiting.LogPrinter(_args(), out)
    p.add(_msg(_lines(3)))
    p.resume()
    p.add(_msg(_lines(2), attempt=2))
    assert out.getvalue().splitlines() == [*_lines(3), *_lines(2)]
    err = capsys.readouterr().err
    assert "attempt 2 started" in err


def test_all_ranks_each_matched_and_a_rank_whose_tail_ended_unmatched() -> None:
    out = io.StringIO()
    p = waiting.LogPrinter(_args(all_ranks=True), out)
    p.add(_msg(["r0 a", "r0 b"], rank=0))
    p.add(_msg(["r1 a"], rank=1))
    p.add(_msg(["r2 a"], rank=2))
    p.resume()
    p.add(_msg(["r0 a", "r0 b", "r0 c"], rank=0))
    p.add(_msg(["r1 x"], rank=1))  # rank 1's log was replaced: its tail ends when rank 2's begins
    p.add(_msg(["r2 a", "r2 b"], rank=2))
    p.add(_msg(["r1 y"], rank=1))
    assert out.getvalue().splitlines() == ["[rank 0] r0 a", "[rank 0] r0 b", "[rank 1] r1 a", "[rank 2] r2 a",
                                           "[rank 0] r0 c", "[rank 1] r1 x", "[rank 2] r2 b", "[rank 1] r1 y"]


def test_held_lines_are_printed_when_the_stream_ends() -> None:
    out = io.StringIO()
    p = waiting.LogPrinter(_args(output="json"), out)
    p.add(_msg(["a"]))
    p.resume()
    p.add(_msg(["z"]))
    assert out.getvalue().count("\n") == 1
    p.end()
    assert [line.split('"line": ')[1] for line in out.getvalue().splitlines()] == ['"a"}', '"z"}']
