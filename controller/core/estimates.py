"""Estimates from a literal table, for tests, examples and small what-ifs.

`TableEstimates` answers the `Estimates` protocol (controller/core/policy.py) from a mapping
(estimate key, GPU type, GPUs) -> seconds per iteration, with an optional slowdown per extra node
the gang spans. The simulator's oracles (controller/sim/oracles.py) follow the same protocol.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tessera.controller.core.policy import CellEstimate
from tessera.controller.core.snapshot import Cell, JobView


class TableEstimates:
    def __init__(self, table: Mapping[tuple[str, str, int], float], node_slowdown: float = 0.0,
                 stages: Mapping[tuple[str, str, int], int] | None = None,
                 dp_ok: Mapping[tuple[str, str, int], bool] | None = None) -> None:
        self.table = dict(table)
        self.node_slowdown = node_slowdown
        self.stages = dict(stages or {})
        self._dp = dict(dp_ok or {})

    def cells(self, job: JobView, gpu_type: str, gpus: int, nodes: int) -> Sequence[CellEstimate]:
        it = self.table.get((job.key, gpu_type, gpus))
        if it is None or it <= 0:
            return ()
        it *= 1.0 + self.node_slowdown * max(0, nodes - 1)
        st = self.stages.get((job.key, gpu_type, gpus), 0)
        return (CellEstimate(Cell(gpu_type, gpus, st), it, source="table"),)

    def gpu_counts(self, job: JobView, gpu_type: str) -> Sequence[int]:
        return sorted(n for (k, t, n), v in self.table.items() if k == job.key and t == gpu_type and v > 0)

    def dp_fits(self, job: JobView, gpu_type: str, gpus: int) -> bool:
        return self._dp.get((job.key, gpu_type, gpus), True)
