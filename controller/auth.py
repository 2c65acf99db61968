"""Authentication of Controller API calls: bearer tokens -> Principal, and the interceptor that
admits every call of the tessera.v1.Controller service (docs/auth.md).

The check reads only the call's metadata (`authorization: Bearer <token>`), never the transport,
so it holds the same over plaintext and over TLS. It runs in the interceptor, before gRPC receives
the request: a call refused on its metadata (no token, a malformed or unknown one, a role that may
not call the method) is answered without its request being received or parsed (an audit's 64
calls at once with 15 MiB requests and no token, each parsed before it was refused, took the
controller from 88 MB to 2.5 GB). Only the Controller service is checked here:
the AgentRegistry service that agents call is left to the transport's identities (node
certificates); with `certificates` a call of it that presents none at all is refused here the same
way, before its request is read (the handler checks whose certificate it is).

Tokens file reload: by modification check, not SIGHUP. At most once a second (RECHECK_S), a call
stats the file; when its inode, size or mtime changed it is read again. A file that became
malformed or unreadable fails closed: every call is answered UNAVAILABLE until it is fixed (a
revoked token must not stay valid because an edit went wrong), and the error is logged.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import grpc.aio
import structlog

from tessera.common.errors import TesseraError, Unauthenticated, Unavailable
from tessera.common.handlerwrap import read_after, refusal, rewrap
from tessera.common.tls import peer_identity
from tessera.common.tokens import (
    ANONYMOUS,
    MAX_TOKEN_CHARS,
    Principal,
    TokenEntry,
    match,
    read_tokens_file,
)
from tessera.controller.access import MUTATING, authorize

log = structlog.get_logger("tessera.controller.auth")

SERVICE = "/tessera.v1.Controller/"
REGISTRY = "/tessera.v1.AgentRegistry/"
# Word for word RegistryService's answer to a call without a certificate (controller/service.py).
NO_CERTIFICATE = ("AgentRegistry needs the node's client certificate: connect to the controller's agent port "
                  "(--agent-listen) with the agent's --tls-dir")
RECHECK_S = 1.0
Metadata = Sequence[tuple[str, str | bytes]]


class Authenticator(Protocol):
    def authenticate(self, metadata: Metadata) -> Principal:
        """The caller; Unauthenticated when it cannot be told."""
        ...

    def generation(self) -> int:
        """Changes whenever an authentication may answer otherwise than before (a reloaded or broken
        tokens file)."""
        ...


class InsecureAuthenticator:
    """No tokens file: every caller is ANONYMOUS, allowed everything (logged loudly at start)."""

    def authenticate(self, metadata: Metadata) -> Principal:
        return ANONYMOUS

    def generation(self) -> int:
        return 0


def bearer_token(metadata: Metadata) -> str:
    """The token of the call's one `authorization: Bearer <token>` entry; Unauthenticated otherwise."""
    values = [v for k, v in metadata if k.lower() == "authorization"]
    if not values:
        raise Unauthenticated("no credentials: send metadata 'authorization: Bearer <token>' "
                              "(tessctl: --token, $TESSERA_TOKEN or a config context)")
    if len(values) > 1:
        raise Unauthenticated("more than one authorization entry")
    value = values[0]
    scheme, _, token = value.partition(" ") if isinstance(value, str) else ("", "", "")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_CHARS or not token.isascii():
        raise Unauthenticated("malformed authorization: expected 'Bearer <token>'")
    return token


def _stamp(path: Path) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class TokenAuthenticator:
    """Tokens from a tokens file (tessera.common.tokens), re-read when it changes."""

    def __init__(self, path: str | Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self._clock = clock
        self._entries: tuple[TokenEntry, ...] = read_tokens_file(self.path)  # TokensFileError: refuse to start
        self._stamp = _stamp(self.path)
        self._broken = ""
        self._checked = clock()
        self._generation = 0

    @property
    def entries(self) -> tuple[TokenEntry, ...]:
        return self._entries

    def refresh(self, force: bool = False) -> None:
        now = self._clock()
        if not force and now - self._checked < RECHECK_S:
            return
        self._checked = now
        try:
            stamp = _stamp(self.path)
        except OSError as exc:
            self._fail(f"{self.path}: cannot read: {exc.strerror or exc}", None)
            return
        if stamp == self._stamp and not self._broken:
            return
        try:
            entries = read_tokens_file(self.path)
        except TesseraError as exc:
            self._fail(str(exc), stamp)
            return
        self._entries, self._stamp, self._broken = entries, stamp, ""
        self._generation += 1
        log.info("tokens_loaded", file=str(self.path), tokens=len(entries))

    def _fail(self, why: str, stamp: tuple[int, int, int, int] | None) -> None:
        if why != self._broken:
            log.error("tokens_file_broken", file=str(self.path), error=why,
                      effect="every Controller API call is refused until the file is fixed")
            self._generation += 1
        self._broken = why
        if stamp is not None:
            self._stamp = stamp

    def generation(self) -> int:
        self.refresh()
        return self._generation

    def authenticate(self, metadata: Metadata) -> Principal:
        token = bearer_token(metadata)
        self.refresh()
        if self._broken:
            raise Unavailable("the controller cannot read its tokens file; see the controller log")
        entry = match(self._entries, token)
        if entry is None:
            raise Unauthenticated("unknown token")
        return entry.principal()


class CallContext:
    """A call's grpc context, with the principal the AuthInterceptor admitted it as."""

    def __init__(self, context: Any, principal: Principal) -> None:
        self._context = context
        self.principal = principal

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def principal_of(context: Any) -> Principal:
    """The caller of a Controller handler; Unauthenticated (fail closed) when the call did not come
    through an AuthInterceptor."""
    principal = getattr(context, "principal", None)
    if not isinstance(principal, Principal):
        raise Unauthenticated("call was not authenticated")
    return principal


def _needs_certificate(context: Any) -> None:
    if peer_identity(context) is None:
        raise Unauthenticated(NO_CERTIFICATE)


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc.aio is untyped
    """Admit every call of tessera.v1.Controller: authenticate it, check METHOD_ROLES, and hand the
    Principal to the handler in its context (CallContext). Both checks read the metadata alone and
    run here, before gRPC receives the request: a refused call gets a handler that raises the error
    without reading the request (handlerwrap.refusal), so the outer ErrorInterceptor turns it into
    UNAUTHENTICATED / PERMISSION_DENIED / UNAVAILABLE with the same message as ever.

    `certificates` (the controller serves TLS, and RegistryService checks node certificates): an
    AgentRegistry call is read only once it showed a certificate naming a Tessera identity
    (handlerwrap.read_after); without one it is UNAUTHENTICATED, as RegistryService answers."""

    def __init__(self, authenticator: Authenticator, certificates: bool = False) -> None:
        self.authenticator = authenticator
        self.certificates = certificates

    async def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        if details.method.startswith(REGISTRY):
            return read_after(handler, _needs_certificate) if self.certificates else handler
        if not details.method.startswith(SERVICE):
            return handler
        method = details.method[len(SERVICE):]
        metadata = tuple(details.invocation_metadata or ())
        # Read before authenticating: a reload between the two makes the stream check again.
        try:
            seen = self.authenticator.generation() if handler.response_streaming else 0
            principal = self.authenticator.authenticate(metadata)
            authorize(method, principal)
        except Exception as exc:  # noqa: BLE001 - a TesseraError is the answer; anything else INTERNAL, as before
            return refusal(handler, exc)
        if method in MUTATING:
            log.info("rpc_call", method=method, principal=principal.name, tenant=principal.tenant,
                     role=principal.role)

        def unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
            async def call(request: Any, context: Any) -> Any:
                result = behavior(request, CallContext(context, principal))
                return await result if hasattr(result, "__await__") else result
            return call

        def stream(behavior: Callable[..., Any]) -> Callable[..., Any]:
            # A stream (WatchJobs, logs -f) may outlive its token: once the tokens file was reloaded
            # or broke, the call is admitted again before its next message goes out, so a revoked
            # token, a broken file or a changed tenant or role ends it with that status.
            async def call(request: Any, context: Any) -> AsyncIterator[Any]:
                last = seen
                async for response in behavior(request, CallContext(context, principal)):
                    if (now := self.authenticator.generation()) != last:
                        again = self.authenticator.authenticate(metadata)
                        authorize(method, again)
                        if again != principal:
                            raise Unauthenticated("the token now names another tenant or role: call again")
                        last = now
                    yield response
            return call

        return rewrap(handler, unary, stream)
