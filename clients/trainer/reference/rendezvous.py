"""torch.distributed's rendezvous with sealed store values (docs/security.md, "Rendezvous").

Rank 0's TCPStore takes connections from anyone who reaches its port, and torch.distributed trusts
what it reads there: the addresses through which gloo and NCCL connect the ranks, and NCCL's
bootstrap id (its address and the "magic" NCCL's bootstrap checks peers with). A process of another
tenant could read those, or put its own address under a rank's key and receive the job's gradients
or send it its own. With the attempt's key (TESSERA_RENDEZVOUS_KEY, from the controller through the
agent), every value is stored sealed: AES-SIV with the key name as associated data, so a value
cannot be read, forged or moved under another key, and the same value always seals the same way
(compare_set still works). A value that does not open fails the rendezvous, naming the key. What
stays open: anyone who reaches the port can delete or overwrite values, which fails the attempt;
counters (`add`) are not sealed; and gloo's own connections between ranks have no authentication.

A script of its own can use `init_process_group(ctx, backend, timeout)` as the reference trainer does.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch.distributed as dist
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESSIV

from tessera.clients.trainer.context import TrainerContext

# The prefix torch gives the default group's keys when it makes the store itself (env:// without a
# store): with it, a rank of an older agent (no key) and a rank with one read each other's keys and
# fail at once, rather than each waiting for keys the other never writes until the timeout.
DEFAULT_PG_PREFIX = "default_pg"
# The Python side of each store handed to torch: torch keeps only the C++ half, and a group made
# later (new_group, DeviceMesh) through a store whose Python object was collected fails in its
# first `set` with "Not implemented" (pybind finds no override to call). One per process group init.
_KEPT: list[SealedStore] = []


class ForgedValue(RuntimeError):
    """A rendezvous value that does not open with the attempt's key: another process wrote it, or
    it was damaged."""


class SealedStore(dist.Store):
    """A store whose values are sealed with AES-SIV under the attempt's key, the key name bound in."""

    def __init__(self, inner: dist.Store, key: bytes) -> None:
        super().__init__()
        self.inner, self.key = inner, key
        self._siv = AESSIV(key)

    def _seal(self, name: str, value: str | bytes) -> bytes:
        raw = value.encode() if isinstance(value, str) else bytes(value)
        return self._siv.encrypt(raw, [name.encode()])

    def _open(self, name: str, sealed: bytes) -> bytes:
        try:
            return self._siv.decrypt(sealed, [name.encode()])
        except InvalidTag:
            raise ForgedValue(f"rendezvous: the value of {name!r} is not sealed with this attempt's key "
                              "(another process wrote it to the store, or it was damaged)") from None

    def set(self, key: str, value: str | bytes) -> None:
        self.inner.set(key, self._seal(key, value))  # type: ignore[arg-type]  # (stubs say str; bytes work)

    def get(self, key: str) -> bytes:
        return self._open(key, self.inner.get(key))

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        # AES-SIV is deterministic, so the stored form of `expected` is known; b"" means "absent".
        want = self._seal(key, expected) if expected else b""
        got = self.inner.compare_set(key, want, self._seal(key, desired))  # type: ignore[arg-type]
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

    def clone(self) -> SealedStore:
        twin = SealedStore(self.inner.clone(), self.key)  # type: ignore[attr-defined]  # (not in the stubs)
        _KEPT.append(twin)
        return twin


def init_process_group(ctx: TrainerContext, backend: str, timeout: timedelta) -> None:
    """The default process group of this rank, from torch's env:// rendezvous (MASTER_ADDR and
    MASTER_PORT set): its store wrapped in a SealedStore when the agent gave the attempt a key."""
    if not ctx.rendezvous_key:
        dist.init_process_group(backend=backend, init_method="env://", rank=ctx.rank, world_size=ctx.world_size,
                                timeout=timeout)
        return
    # torch's own env:// store (under torchrun, its agent's store), under the default group's prefix.
    store, _, _ = next(dist.rendezvous("env://", rank=ctx.rank, world_size=ctx.world_size, timeout=timeout))
    sealed = SealedStore(dist.PrefixStore(DEFAULT_PG_PREFIX, store), ctx.rendezvous_key)
    _KEPT.append(sealed)
    dist.init_process_group(backend=backend, store=sealed, rank=ctx.rank, world_size=ctx.world_size,
                            timeout=timeout)
