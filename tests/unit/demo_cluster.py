"""The demo cluster of the live audits (scripts/demo.py: one node of 4 x A100-80GB, one of
2 x A40-48GB, two of 4 x A10-24GB) as literal views, and the tables of a llama2-7b-like model
("llama": 2 or 4 x A100, 8 x A10, no A40 count) and a small one, for the policies' tests."""

from __future__ import annotations

from tessera.controller.core.snapshot import GpuView, NodeView

GB = 1000**3
A100, A40, A10 = "A100-80GB", "A40-48GB", "A10-24GB"
# Seconds per iteration by (key, GPU type, GPUs), for TableEstimates.
LLAMA_AND_SMALL = ({("llama", A100, 2): 1.0, ("llama", A100, 4): 0.6, ("llama", A10, 8): 1.5}
                   | {("small", t, n): 1.0 / n for t, ns in ((A100, (1, 2, 4)), (A10, (1, 2, 4, 8)), (A40, (1, 2)))
                      for n in ns})


def node(nid: str, model: str, n: int, mem_gb: int, busy: tuple[int, ...] = ()) -> NodeView:
    return NodeView(nid, tuple(GpuView(i, model, mem_gb * GB) for i in range(n)), frozenset(busy))


def cluster(a10_busy: tuple[int, ...] = (), a100_busy: tuple[int, ...] = ()) -> tuple[NodeView, ...]:
    """Every node READY; the busy GPUs of the A100 node and of each A10 node."""
    return (node("a100", A100, 4, 80, a100_busy), node("a40", A40, 2, 48),
            node("a10", A10, 4, 24, a10_busy), node("a10b", A10, 4, 24, a10_busy))
