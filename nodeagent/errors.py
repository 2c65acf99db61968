"""Errors the agent's core raises; the gRPC servicer maps each to one status code.

The core (supervisor, contract, fencing) stays free of grpc: it raises these, and server.py turns
them into INVALID_ARGUMENT / FAILED_PRECONDITION / NOT_FOUND.
"""

from __future__ import annotations


class AgentError(Exception):
    """Base of the errors a caller can act on; `code` names the gRPC status code."""

    code = "INTERNAL"


class InvalidArgument(AgentError):
    """A request field is malformed. The message reads "field: reason"."""

    code = "INVALID_ARGUMENT"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class FailedPrecondition(AgentError):
    """The request is well formed but the node's state refuses it (GPU busy, draining, stale epoch)."""

    code = "FAILED_PRECONDITION"


class NotFound(AgentError):
    """The job, attempt, rank or log named by the request is not on this node."""

    code = "NOT_FOUND"
