"""`tessctl submit`'s warning for a job that asks for GPU types no node of the cluster has: the job
is accepted (a node with them may join) but would wait with no word until `describe` showed its
reason, so tessctl says so at once, with the cluster's types closest to the names asked."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from difflib import get_close_matches
from typing import TextIO

from tessera.clients import output
from tessera.clients.sdk import Client, RpcError
from tessera.v1 import common_pb2, controller_pb2


def missing_types(spec: common_pb2.JobSpec, nodes: Sequence[controller_pb2.Node]) -> str:
    """The warning, or "" when the job names no type, the cluster has one of them, or no node is
    known yet (nothing to compare with)."""
    asked = list(spec.hint.gpu_types)
    have = sorted({g.model for n in nodes for g in n.inventory.gpus if g.model})
    if not asked or not nodes or any(t in have for t in asked):
        return ""
    close = list(dict.fromkeys(c for t in asked for c in get_close_matches(t, have, n=1, cutoff=0.6)))
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    return (f"no node has GPU type {' or '.join(asked)} (the cluster has {', '.join(have) or 'no GPUs'}): "
            f"the job waits until such a node joins{hint}")


def warn_missing_types(client: Client, spec: common_pb2.JobSpec, err: TextIO | None = None) -> None:
    """Print the warning on stderr; a failed ListNodes only leaves it out (submitting succeeded)."""
    if not spec.hint.gpu_types:
        return
    try:
        nodes = client.nodes()
    except RpcError:
        return
    text = missing_types(spec, nodes)
    if text:
        print(f"tessctl: warning: {output.one_line(text)}", file=err or sys.stderr)
