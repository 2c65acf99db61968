"""argparse value types shared by tessctl's commands: each refuses a bad value with a one-line
usage error naming it."""

from __future__ import annotations

import argparse
from typing import TypeVar

from tessera.common.errors import InvalidInput

Num = TypeVar("Num", int, float)


class UsageError(InvalidInput):
    """A tessctl usage problem found after parsing: exit 2 (tessctl's CliUsageError)."""


def positive_int(text: str) -> int:
    return _bounded(_number(text, int, "an integer"), text, 1)


def non_negative_int(text: str) -> int:
    return _bounded(_number(text, int, "an integer"), text, 0)


def positive_float(text: str) -> float:
    value = _number(text, float, "a number")
    if not value > 0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def _number(text: str, kind: type[Num], what: str) -> Num:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None


def _bounded(value: int, text: str, low: int) -> int:
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}: {text!r}")
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
