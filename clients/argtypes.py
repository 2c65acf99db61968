"""argparse value types shared by tessctl's commands: each refuses a bad value with a one-line
usage error naming it."""

from __future__ import annotations

import argparse
import math
from typing import TypeVar

from tessera.common.durations import MAX_SECONDS, DurationError, parse_duration
from tessera.common.errors import InvalidInput

Num = TypeVar("Num", int, float)

# The largest count a flag takes: what every integer field of the API (int32) holds; a larger one
# would fail in protobuf ("Value out of range") after parsing instead of here.
MAX_INT = 2**31 - 1
# Certificates (admin pki --days): a century. More is a typo, and 100,000,000 days would overflow
# the certificate's dates (an OverflowError) instead of being refused here.
MAX_DAYS = 36_500


class UsageError(InvalidInput):
    """A tessctl usage problem found after parsing: exit 2 (tessctl's CliUsageError)."""


def positive_int(text: str) -> int:
    return _bounded(_number(text, int, "an integer"), text, 1)


def non_negative_int(text: str) -> int:
    return _bounded(_number(text, int, "an integer"), text, 0)


def days(text: str) -> int:
    """A validity in days: 1 to MAX_DAYS."""
    return _bounded(_number(text, int, "an integer"), text, 1, MAX_DAYS, " days")


def positive_float(text: str) -> float:
    value = _number(text, float, "a number")
    if not value > 0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number: {text!r}")
    return value


def seconds(text: str) -> float:
    """A positive number of seconds, or a duration: "90s", "10m", "1h30m", "2d" (tessera.common.durations);
    finite and at most MAX_SECONDS (about three years): a gRPC deadline holds it, where `inf` or 1e12
    would overflow into an immediate DEADLINE_EXCEEDED (or an OverflowError)."""
    try:
        value = float(text)
    except ValueError:
        try:
            return parse_duration(text)
        except DurationError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    if not 0 < value <= MAX_SECONDS:  # also refuses NaN and infinity
        raise argparse.ArgumentTypeError(
            f"must be > 0 and at most {MAX_SECONDS:,} seconds (about 3 years; or a duration such as 10m, 2d): "
            f"{text!r}")
    return value


def _number(text: str, kind: type[Num], what: str) -> Num:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None


def _bounded(value: int, text: str, low: int, high: int = MAX_INT, unit: str = "") -> int:
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}: {text!r}")
    if value > high:
        raise argparse.ArgumentTypeError(f"must be from {low} to {high:,}{unit}: {text!r}")
    return value


def jobfile_argument(p: argparse.ArgumentParser) -> None:
    """`submit FILE` as sbatch and `kubectl apply FILE` habits have it, and `-f FILE` as before."""
    p.add_argument("file", nargs="?", metavar="FILE", help="job YAML (docs/job-file.md); - = stdin")
    p.add_argument("-f", "--filename", metavar="FILE", default=None, help="the job YAML, as a flag")


def jobfile_path(args: argparse.Namespace) -> str:
    """The one job file of `submit` (positional or -f); a usage error for none or both."""
    if args.file is not None and args.filename is not None:
        raise UsageError("give the job file once: FILE or -f FILE, not both")
    path = args.file if args.file is not None else args.filename
    if path is None:
        raise UsageError("a job file is required: tessctl submit FILE (or -f FILE; - = stdin)")
    return str(path)


# Commands whose ID arguments name jobs or nodes (besides `get`/`describe`/`delete RESOURCE`).
_JOB_COMMANDS = frozenset({"cancel", "logs", "wait"})
_NODE_COMMANDS = frozenset({"drain", "undrain"})


def strip_kind_prefixes(args: argparse.Namespace) -> None:
    """Accept kubectl's `KIND/NAME` where an id is expected (`tessctl cancel job/j-1a2b`), as `-o name`
    prints it; a prefix of the other kind is a usage error. Ids hold no "/" (common/jobspec.py,
    nodespec.py), so the prefix is never part of one."""
    resource = getattr(args, "resource", "") or ""
    command = getattr(args, "command", "")
    kind = ("job" if command in _JOB_COMMANDS or resource in ("job", "jobs") else
            "node" if command in _NODE_COMMANDS or resource in ("node", "nodes") else "")
    if not kind:
        return
    other = "node" if kind == "job" else "job"

    def strip(value: str) -> str:
        head, slash, rest = value.partition("/")
        if not slash:
            return value
        if head in (kind, kind + "s"):
            return rest
        if head in (other, other + "s"):
            raise UsageError(f"{value!r} names a {other}; this command takes a {kind}")
        return value  # not a kind: left for the id's own check to refuse
    for attr in ("id", "ids", "node"):
        value = getattr(args, attr, None)
        if isinstance(value, str):
            setattr(args, attr, strip(value))
        elif isinstance(value, list):
            setattr(args, attr, [strip(v) if isinstance(v, str) else v for v in value])
