"""`get jobs A B`, `get nodes A B`: the named items that exist, and one error line on stderr for each
name that does not, as `kubectl get` does with some names not found: the ones found are printed (in
the format asked for), the status is 1 when any was not (docs/cli.md)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeVar

from tessera.clients import output
from tessera.clients.sdk import RpcError

T = TypeVar("T")


class HasId(Protocol):
    @property
    def id(self) -> str: ...


Item = TypeVar("Item", bound=HasId)


def fetch_named(ids: Sequence[str], get_one: Callable[[str], T]) -> tuple[list[T], list[RpcError]]:
    """(the items of `ids` that exist, in order; the NOT_FOUND error of each that does not). Any other
    error (UNAVAILABLE, PERMISSION_DENIED) ends the command as before: it is not about one name."""
    found: list[T] = []
    missing: list[RpcError] = []
    for i in ids:
        try:
            found.append(get_one(i))
        except RpcError as exc:
            if exc.code != "NOT_FOUND":
                raise
            missing.append(exc)
    return found, missing


def lookup(items: Iterable[Item], kind: str) -> Callable[[str], Item]:
    """get_one over an already fetched list (ListNodes): NOT_FOUND in the controller's words."""
    by_id = {item.id: item for item in items}

    def get_one(item_id: str) -> Item:
        if item_id not in by_id:
            raise RpcError("NOT_FOUND", f"{kind} {item_id} not found")
        return by_id[item_id]
    return get_one


def report_missing(missing: Sequence[RpcError]) -> int:
    """One `tessctl: error:` line per name not found; the exit status (1 when any)."""
    for exc in missing:
        print(f"tessctl: error: {output.one_line(str(exc))}", file=sys.stderr)
    return 1 if missing else 0
