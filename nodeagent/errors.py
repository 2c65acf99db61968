"""The errors the agent's core raises: those of tessera.common.errors, under the agent's names.

The core (supervisor, contract, fencing) stays free of grpc: it raises these, and the server's
ErrorInterceptor (tessera.common.rpc) turns them into INVALID_ARGUMENT / FAILED_PRECONDITION /
NOT_FOUND. They are the common classes themselves, so one name means one thing everywhere.
"""

from __future__ import annotations

from tessera.common.errors import FailedPrecondition, InvalidArgument, NotFound, TesseraError

__all__ = ["FailedPrecondition", "InvalidArgument", "NotFound", "TesseraError"]
