"""What the engine raises for an unknown job or node: NOT_FOUND errors of the one error model."""

from __future__ import annotations

from tessera.common.errors import NotFound


class JobNotFound(NotFound):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} not found")
        self.job_id = job_id


class NodeNotFound(NotFound):
    def __init__(self, node_id: str) -> None:
        super().__init__(f"node {node_id} not found")
        self.node_id = node_id
