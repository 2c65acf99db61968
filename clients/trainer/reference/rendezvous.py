"""torch.distributed's rendezvous with signed store values (docs/security.md, "Rendezvous").

Rank 0's TCPStore takes connections from anyone who reaches its port, and torch.distributed trusts
what it reads there: the addresses gloo and NCCL connect their ranks through. A process of another
tenant could put its own address under a rank's key, and receive the job's gradients or send it
its own. With the attempt's key (TESSERA_RENDEZVOUS_KEY, from the controller through the agent,
readable only by the job's own user), every value is stored with an HMAC-SHA256 of the key name and
the value, and a value read without a valid one fails the rendezvous, naming the key. What stays
open: anyone who reaches the port can read the values (the ranks' addresses) and delete or
overwrite them, which fails the attempt; counters (`add`) are not signed; and gloo's own
connections between ranks, which the addresses lead to, have no authentication.

A script of its own can use `init_process_group(ctx, backend, timeout)` as the reference trainer does.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from datetime import timedelta

import torch.distributed as dist

from tessera.clients.trainer.context import TrainerContext

MAC_BYTES = 32
# The Python side of each store handed to torch: torch keeps only the C++ half, and a group made
# later (new_group, DeviceMesh) through a store whose Python object was collected fails in its
# first `set` with "Not implemented" (pybind finds no override to call).
_KEPT: list[SignedStore] = []


class ForgedValue(RuntimeError):
    """A rendezvous value without a valid signature: another process wrote it, or it was damaged."""


class SignedStore(dist.Store):
    """A store whose `set` values carry an HMAC of (key, value) that `get` checks."""

    def __init__(self, inner: dist.Store, key: bytes) -> None:
        super().__init__()
        self.inner, self.key = inner, key

    def _mac(self, name: str, value: bytes) -> bytes:
        return hmac.new(self.key, name.encode() + b"\0" + value, hashlib.sha256).digest()

    def _sign(self, name: str, value: str | bytes) -> bytes:
        raw = value.encode() if isinstance(value, str) else bytes(value)
        return self._mac(name, raw) + raw

    def _open(self, name: str, signed: bytes) -> bytes:
        mac, value = signed[:MAC_BYTES], signed[MAC_BYTES:]
        if len(mac) != MAC_BYTES or not hmac.compare_digest(mac, self._mac(name, value)):
            raise ForgedValue(f"rendezvous: the value of {name!r} is not signed with this attempt's key "
                              "(another process wrote it to the store, or it was damaged)")
        return value

    def set(self, key: str, value: str | bytes) -> None:
        self.inner.set(key, self._sign(key, value))  # type: ignore[arg-type]  # (stubs say str; bytes work)

    def get(self, key: str) -> bytes:
        return self._open(key, self.inner.get(key))

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        # HMACs are deterministic, so the stored form of `expected` is known; b"" means "absent".
        want = self._sign(key, expected) if expected else b""
        got = self.inner.compare_set(key, want, self._sign(key, desired))  # type: ignore[arg-type]
        return self._open(key, got) if got else got

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        return [self.get(k) for k in keys]

    def multi_set(self, keys: Sequence[str], values: Sequence[str | bytes]) -> None:
        for k, v in zip(keys, values, strict=True):
            self.set(k, v)

    def add(self, key: str, value: int) -> int:
        return self.inner.add(key, value)

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        if timeout is None:
            self.inner.wait(list(keys))
        else:
            self.inner.wait(list(keys), timeout)

    def check(self, keys: Sequence[str]) -> bool:
        return self.inner.check(list(keys))

    def delete_key(self, key: str) -> bool:
        return self.inner.delete_key(key)

    def num_keys(self) -> int:
        return self.inner.num_keys()

    def set_timeout(self, timeout: timedelta) -> None:
        self.inner.set_timeout(timeout)

    def clone(self) -> SignedStore:
        twin = SignedStore(self.inner.clone(), self.key)  # type: ignore[attr-defined]  # (not in the stubs)
        _KEPT.append(twin)
        return twin


def init_process_group(ctx: TrainerContext, backend: str, timeout: timedelta) -> None:
    """The default process group of this rank, from torch's env:// rendezvous (MASTER_ADDR and
    MASTER_PORT set): its store wrapped in a SignedStore when the agent gave the attempt a key."""
    if not ctx.rendezvous_key:
        dist.init_process_group(backend=backend, init_method="env://", rank=ctx.rank, world_size=ctx.world_size,
                                timeout=timeout)
        return
    # torch's own env:// store (MASTER_ADDR, MASTER_PORT; under torchrun, its agent's store), signed.
    store, _, _ = next(dist.rendezvous("env://", rank=ctx.rank, world_size=ctx.world_size, timeout=timeout))
    signed = SignedStore(store, ctx.rendezvous_key)
    _KEPT.append(signed)
    dist.init_process_group(backend=backend, store=signed, rank=ctx.rank, world_size=ctx.world_size,
                            timeout=timeout)
