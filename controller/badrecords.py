"""Records of the store that cannot be read: skipped, and said once, rather than fatal.

A record that does not parse (a garbled protobuf in a SQLite row, a JSON document someone else
wrote under the etcd prefix, text in a number column) used to fail every read that listed it: the
controller did not start (SQLite), or every controller of an HA cluster took the lead in turn and
died reading its jobs (etcd). Each record is now decoded on its own; one that fails is left out of
the answer, and logged as `unreadable_record` (once per record and process: rounds read the jobs
every few seconds) with what to do: the record is still in the store, for an operator to repair or
delete. Every other job is served.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import structlog
from google.protobuf.message import DecodeError

log = structlog.get_logger("controller")

T = TypeVar("T")
R = TypeVar("R")

# What decoding a record may raise when the record is bad (json.JSONDecodeError is a ValueError).
DECODE_ERRORS = (ValueError, TypeError, KeyError, AttributeError, DecodeError)
_MAX_SAID = 10_000
_said: set[str] = set()


class BadRecord(ValueError):
    """A record whose fields are not what the store writes."""


def readable(items: Iterable[T], decode: Callable[[T], R], kind: str, key: Callable[[T], str]) -> list[R]:
    """decode(item) of every item that decodes; the others said once (`key` names them)."""
    out = []
    for item in items:
        got = one(item, decode, kind, key)
        if got is not None:
            out.append(got)
    return out


def one(item: T, decode: Callable[[T], R], kind: str, key: Callable[[T], str]) -> R | None:
    try:
        return decode(item)
    except DECODE_ERRORS as exc:
        where = f"{kind} {key(item)[:200]}"
        if where not in _said and len(_said) < _MAX_SAID:
            _said.add(where)
            log.error("unreadable_record", record=where, error=f"{type(exc).__name__}: {str(exc)[:300]}",
                      detail="left out of every answer until it is repaired or deleted in the store")
        return None


def doc(raw: bytes | str) -> dict[str, Any]:
    """A JSON object; BadRecord for anything else."""
    d = json.loads(raw)
    if not isinstance(d, dict):
        raise BadRecord(f"a {type(d).__name__}, not an object")
    return d


def number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRecord(f"{name}: {value!r} is not a number")
    return value


def integer(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRecord(f"{name}: {value!r} is not an integer")
    return value


def text(value: object, name: str) -> str:
    if not isinstance(value, str):
        raise BadRecord(f"{name}: {value!r} is not text")
    return value
