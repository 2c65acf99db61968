"""The one error model of Tessera: every error raised on purpose is a `TesseraError` with a `code`.

    TesseraError                         code INTERNAL unless a subclass says otherwise
    ├── InvalidInput                     INVALID_ARGUMENT: a file, a command line, a name
    │   └── InvalidArgument(field, reason)    one named field; the message reads "field: reason"
    ├── NotFound                         NOT_FOUND: the job, node, attempt, rank or log is not there
    ├── AlreadyExists                    ALREADY_EXISTS: a request id reused for something else
    ├── FailedPrecondition               FAILED_PRECONDITION: well formed, but the state refuses it
    ├── Unavailable                      UNAVAILABLE: a peer that cannot be reached
    ├── Unauthenticated                  UNAUTHENTICATED: no credentials (no client certificate, no token), or ones nobody issued
    ├── PermissionDenied                 PERMISSION_DENIED: a known caller asking what its certificate or role forbids
    └── (tessera.clients.sdk.RpcError)   a failed call as a client sees it; code from the status

Libraries raise these (or their own subclasses, which also stay ValueError where callers catch
ValueError); the gRPC servers turn them into a status in one place, the interceptor of
tessera.common.rpc, so a servicer never maps an error by hand. `Code` names a status code without
importing grpc: the pure cores (the estimator library, the policies, the agent's supervisor) stay
free of it, and rpc.py maps a Code to a grpc.StatusCode by name.
"""

from __future__ import annotations

import enum


class Code(enum.StrEnum):
    """A gRPC status code by name; a str, so ``err.code == "NOT_FOUND"`` holds (the SDK's contract)."""

    OK = "OK"
    CANCELLED = "CANCELLED"
    UNKNOWN = "UNKNOWN"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ABORTED = "ABORTED"
    OUT_OF_RANGE = "OUT_OF_RANGE"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    INTERNAL = "INTERNAL"
    UNAVAILABLE = "UNAVAILABLE"
    DATA_LOSS = "DATA_LOSS"
    UNAUTHENTICATED = "UNAUTHENTICATED"


class TesseraError(Exception):
    """Root of the errors Tessera raises on purpose; `code` is the status a server answers with.

    `message` is what the peer sees (the status details), the same text as ``str(err)``.
    """

    code: Code = Code.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidInput(TesseraError):
    """Bad input that is not one request field: a file (the message names it), a command line."""

    code = Code.INVALID_ARGUMENT


class InvalidArgument(InvalidInput):
    """A request field is malformed: `field` is its path (``plan.tp``, ``samples[2].config``)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason

    def __reduce__(self) -> tuple[type[InvalidArgument], tuple[str, str]]:
        # Subclasses keep the (field, reason) signature, so a copy (pickle, a process pool) rebuilds.
        return type(self), (self.field, self.reason)


class NotFound(TesseraError):
    """The job, node, attempt, rank or log named by a request does not exist (here)."""

    code = Code.NOT_FOUND


class AlreadyExists(TesseraError):
    """The request names something that exists already, differently (a reused request id)."""

    code = Code.ALREADY_EXISTS


class FailedPrecondition(TesseraError):
    """The request is well formed but the state refuses it (GPU busy, draining, stale epoch, no torch)."""

    code = Code.FAILED_PRECONDITION


class Unavailable(TesseraError):
    """A peer the request needs cannot be reached now; retrying later may succeed."""

    code = Code.UNAVAILABLE


class ResourceExhausted(TesseraError):
    """A bound is reached: the server is too busy with calls of this kind now (a bounded lane is full),
    or a tenant holds as many jobs not yet ended as it may (controller/unended.py); retry later."""

    code = Code.RESOURCE_EXHAUSTED


class DeadlineExceeded(TesseraError):
    """The call took longer than the server allows it (a request that did not arrive in time)."""

    code = Code.DEADLINE_EXCEEDED


class Unauthenticated(TesseraError):
    """The caller presented no credentials the call needs (a client certificate, a token), or ones
    the server does not know (never says which token, so a peer learns nothing about those that exist)."""

    code = Code.UNAUTHENTICATED


class PermissionDenied(TesseraError):
    """The caller is known, and may not make this call (another node's certificate, a user's role or
    tenant)."""

    code = Code.PERMISSION_DENIED
