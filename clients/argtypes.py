"""argparse value types shared by tessctl's commands: each refuses a bad value with a one-line
usage error naming it."""

from __future__ import annotations

import argparse
from typing import TypeVar

from tessera.common.durations import DurationError, parse_duration

Num = TypeVar("Num", int, float)


def positive_int(text: str) -> int:
    return _bounded(_number(text, int, "an integer"), text, 1)


def non_negative_int(text: str) -> int:
    return _bounded(_number(text, int, "an integer"), text, 0)


def positive_float(text: str) -> float:
    value = _number(text, float, "a number")
    if not value > 0:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


def seconds(text: str) -> float:
    """A positive number of seconds, or a duration: "90s", "10m", "1h30m" (tessera.common.durations)."""
    try:
        return positive_float(text)
    except argparse.ArgumentTypeError as first:
        try:
            return parse_duration(text)
        except DurationError:
            raise first from None


def _number(text: str, kind: type[Num], what: str) -> Num:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None


def _bounded(value: int, text: str, low: int) -> int:
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}: {text!r}")
    return value
