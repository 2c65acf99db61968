"""Leader election on an etcd lease; the epoch comes from etcd with the leadership.

One key, `<prefix>leader`, attached to the leader's lease, names the leader (its address, epoch and
instance: the host and state dir of the process, which tells a controller's own earlier run, whose
lease has not expired yet, from another controller given the same --advertise).
A candidate takes it in one transaction that also raises `<prefix>meta/epoch` by one:

    compare: create_revision(leader) == 0            (nobody leads)
             mod_revision(meta/epoch) == the one read (nobody else raised it meanwhile)
    success: put leader {address, epoch} with the lease; put meta/epoch = epoch + 1

so every leader has a higher epoch than every one before it. The revision of that transaction is
the leader key's create_revision: the fencing token. Every store write compares it
(`Leadership.fence()`), so a deposed leader's write is refused by etcd itself, whatever the deposed
process believes.

The lease is kept alive from the etcd client's own loop (controller/etcd.py) every ttl/4 seconds.
Locally, leadership is valid until `sent + ttl` of the last keep-alive etcd confirmed: etcd cannot
expire the lease before that (its clock started when it received the request, after `sent`), so a
leader that stops being renewed (partition, stall, etcd down) stops believing it leads before any
other controller can take over. `is_leader()` reads that deadline; losing it calls `on_lost` once.

Standbys wait on a watch of the leader key and campaign when it is deleted (the lease expired or
was revoked by a leader that stopped cleanly). Every read of the leader key is kept (`seen_leader`):
a standby names that leader in its answers without asking etcd per call.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import grpc
import grpc.aio
import structlog
from aetcd import rpc as etcdrpc

from tessera.common.errors import Unavailable
from tessera.controller.etcd import EtcdClient, error_fields
from tessera.controller.store import StateError

log = structlog.get_logger("tessera.controller.election")



def epoch_value(raw: bytes, key: bytes) -> int:
    """The epoch stored at `key`; StateError (one line at start, no retry) for a value Tessera never
    writes: guessing one could hand agents an epoch they already saw, and they refuse it."""
    text = bytes(raw).strip()
    if not text.isdigit() or len(text) > 18:
        raise StateError(f"etcd key {key.decode(errors='replace')} holds {bytes(raw)[:40]!r}, not an epoch: "
                         "not written by Tessera; put the highest epoch any controller used there (or above)")
    return int(text)

class NotLeader(Unavailable):
    """This controller does not lead (any more): the call or write is refused."""


def _put(key: bytes, value: bytes, lease: int = 0) -> Any:
    return etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key, value=value, lease=lease))


class Leadership:
    """Campaign, keep-alive and the fencing token of one controller."""

    def __init__(self, client: EtcdClient, address: str, ttl_s: int = 5,
                 mono: Callable[[], float] = time.monotonic, instance: str = "") -> None:
        self.client = client
        self.address = address
        self.instance = instance  # this process's host and state dir ("": not said)
        self._said_leaseless = False
        self.ttl_s = max(2, int(ttl_s))
        self.mono = mono
        p = client.cfg.prefix.encode()
        self.leader_key = p + b"leader"
        self.epoch_key = p + b"meta/epoch"
        self.lease_id = 0
        self.token = 0  # create_revision of our leader key; 0 = not leading
        self.epoch = 0
        self._valid_until = 0.0
        self._lost = False
        self._keepalive: asyncio.Task[None] | None = None
        # (address, epoch) of the leader as last read by the campaign (no I/O to ask it), and its
        # instance ("" when its key names none: written by an older Tessera).
        self.seen_leader: tuple[str, int] | None = None
        self.seen_instance = ""
        self._said_taken = -1  # the epoch of the last leader logged as holding our --advertise
        self.on_lost: Callable[[str], None] = lambda why: None

    # ------------------------------------------------------------------ reading

    def is_leader(self) -> bool:
        return self.token != 0 and not self._lost and self.mono() < self._valid_until

    def fence(self) -> Any:
        """The compare every store write carries: our leader key, as we created it, still exists.
        NotLeader when this controller knows it does not lead."""
        if not self.is_leader():
            raise NotLeader(f"not the leader (epoch {self.epoch}); writes are refused")
        return etcdrpc.Compare(key=self.leader_key, result=etcdrpc.Compare.EQUAL, target=etcdrpc.Compare.CREATE,
                               create_revision=self.token)

    def time_left(self) -> float:
        """Seconds until the local lease deadline (<= 0: this controller does not lead)."""
        return self._valid_until - self.mono() if self.token and not self._lost else 0.0

    def address_taken(self) -> bool:
        """The leader key names this controller's --advertise, written by another process: two
        controllers were given the same --advertise."""
        seen = self.seen_leader
        return (seen is not None and seen[0] == self.address and bool(self.instance) and bool(self.seen_instance)
                and self.seen_instance != self.instance)

    def leader_hint(self) -> str:
        """The leader's address for a standby's answers: "" when unknown, or when the key names this
        controller itself (a lease of its own that lapsed, or of its earlier run, not expired yet)."""
        seen = self.seen_leader
        if not seen or not seen[0] or (seen[0] == self.address and not self.address_taken()):
            return ""
        return seen[0]

    def current_leader(self) -> tuple[str, int] | None:
        """(address, epoch) of whoever leads now, from etcd; None when nobody does."""
        return self.client.call(self._read_leader())

    async def _read_leader(self) -> tuple[str, int] | None:
        resp = await self.client.rpc(lambda: self.client.kv.Range(etcdrpc.RangeRequest(key=self.leader_key),
                                                                  timeout=self.client.cfg.timeout_s))
        return self._record(resp.kvs)

    def _record(self, kvs: Any) -> tuple[str, int] | None:
        """Keep the leader key as read. Every read: a standby that read the key to watch it and kept
        nothing said "no leader elected yet" for up to a TTL while a leader served (an audit)."""
        if not kvs:
            self.seen_leader, self.seen_instance = None, ""
            return None
        try:
            doc = json.loads(kvs[0].value)
            self.seen_leader = str(doc["address"]), int(doc["epoch"])
            self.seen_instance = str(doc.get("instance", ""))
        except (ValueError, KeyError, TypeError, AttributeError):
            self.seen_leader, self.seen_instance = ("", 0), ""
        return self.seen_leader

    def _say_if_taken(self) -> None:
        """Log, once per leader, a leader key naming this --advertise written by another controller
        (at start, ha_settings refuses it instead)."""
        if self.address_taken() and self.seen_leader and self._said_taken != self.seen_leader[1]:
            self._said_taken = self.seen_leader[1]
            log.error("advertise_in_use", address=self.address, leader_epoch=self.seen_leader[1],
                      leader_instance=self.seen_instance, instance=self.instance,
                      detail="another controller leads under this controller's --advertise: clients and agents "
                      "sent there reach only one of them; each controller needs its own --advertise (docs/ha.md)")

    # ------------------------------------------------------------------ campaign (on the etcd loop)

    async def campaign(self) -> int:
        """Wait until this controller leads; returns its epoch. Runs on the etcd client's loop."""
        while True:
            try:
                epoch = await self._try_take()
                if epoch:
                    return epoch
                await self._wait_leader_gone()
            except (Unavailable, grpc.aio.AioRpcError) as exc:
                log.warning("campaign_retry", **error_fields(exc, tls=bool(self.client.cfg.ca)))
                await asyncio.sleep(min(1.0, self.ttl_s / 4))

    async def _try_take(self) -> int:
        kv, t = self.client.kv, self.client.cfg.timeout_s
        if await self._read_leader() is not None:
            self._say_if_taken()
            return 0
        cur = await self.client.rpc(lambda: kv.Range(etcdrpc.RangeRequest(key=self.epoch_key), timeout=t))
        old = epoch_value(cur.kvs[0].value, self.epoch_key) if cur.kvs else 0
        mod = cur.kvs[0].mod_revision if cur.kvs else 0
        sent = self.mono()  # before the grant: etcd's clock for the lease starts after this
        lease = await self.client.rpc(lambda: self.client.lease.LeaseGrant(
            etcdrpc.LeaseGrantRequest(TTL=self.ttl_s), timeout=t))
        epoch = old + 1
        doc: dict[str, Any] = {"address": self.address, "epoch": epoch}
        if self.instance:
            doc["instance"] = self.instance
        value = json.dumps(doc).encode()
        txn = etcdrpc.TxnRequest(
            compare=[etcdrpc.Compare(key=self.leader_key, result=etcdrpc.Compare.EQUAL,
                                     target=etcdrpc.Compare.CREATE, create_revision=0),
                     etcdrpc.Compare(key=self.epoch_key, result=etcdrpc.Compare.EQUAL,
                                     target=etcdrpc.Compare.MOD, mod_revision=mod)],
            success=[_put(self.leader_key, value, lease.ID), _put(self.epoch_key, str(epoch).encode())])
        resp = await self.client.rpc(lambda: kv.Txn(txn, timeout=t))
        if not resp.succeeded:
            await self._revoke(lease.ID)
            return 0
        self.lease_id, self.token, self.epoch = lease.ID, resp.header.revision, epoch
        self._valid_until = sent + lease.TTL
        self._lost = False
        self._keepalive = asyncio.get_running_loop().create_task(self._keep_alive(lease.TTL))
        self.seen_leader, self.seen_instance = (self.address, epoch), self.instance
        log.info("leadership_taken", epoch=epoch, token=self.token, lease_ttl=lease.TTL, address=self.address)
        return epoch

    async def _wait_leader_gone(self) -> None:
        """Return once the leader key is deleted (or after a ttl, to look again)."""
        kv, t = self.client.kv, self.client.cfg.timeout_s
        now = await self.client.rpc(lambda: kv.Range(etcdrpc.RangeRequest(key=self.leader_key), timeout=t))
        self._record(now.kvs)  # the leader that won, when this campaign's transaction lost
        self._say_if_taken()
        if not now.kvs:
            return
        if not now.kvs[0].lease and not self._said_leaseless:
            # A controller's key always has its lease: this one never expires, and nobody leads
            # until it is deleted (an audit's standby waited in silence).
            self._said_leaseless = True
            log.error("leader_key_without_lease", key=self.leader_key.decode(errors="replace"),
                      detail="no controller can lead until it is deleted (etcdctl del KEY): not written by Tessera")
        # From the revision read on: a deletion between the read and the watch is not missed.
        req = etcdrpc.WatchRequest(create_request=etcdrpc.WatchCreateRequest(
            key=self.leader_key, start_revision=now.header.revision + 1))

        async def requests() -> Any:
            yield req
            await asyncio.Event().wait()  # keep the stream open: a closed send side may end the watch

        call = self.client.watch.Watch(requests())

        async def deleted() -> None:
            async for resp in call:
                if any(ev.type == ev.DELETE for ev in resp.events):
                    return

        try:
            await asyncio.wait_for(deleted(), self.ttl_s)
        except TimeoutError:
            pass
        finally:
            call.cancel()

    # ------------------------------------------------------------------ keep-alive

    async def _keep_alive(self, ttl: int) -> None:
        period = max(0.2, ttl / 4)
        while True:
            sent = self.mono()
            try:
                async for reply in self.client.lease.LeaseKeepAlive(
                        iter([etcdrpc.LeaseKeepAliveRequest(ID=self.lease_id)]), timeout=period):
                    if reply.TTL <= 0:
                        self._lose("etcd says the lease expired")
                        return
                    self._valid_until = sent + reply.TTL
                    break
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:  # revoked, or expired and swept
                    self._lose("etcd says the lease is gone")
                    return
                log.warning("lease_keepalive_failed", code=exc.code().name)
            remaining = self._valid_until - self.mono()
            if remaining <= 0:
                self._lose(f"lease not renewed for {ttl}s")
                return
            await asyncio.sleep(min(period, remaining))

    def _lose(self, why: str) -> None:
        if self._lost:
            return
        self._lost = True
        log.error("leadership_lost", epoch=self.epoch, reason=why)
        self.on_lost(why)

    async def _revoke(self, lease_id: int) -> None:
        try:
            await self.client.lease.LeaseRevoke(etcdrpc.LeaseRevokeRequest(ID=lease_id),
                                                timeout=self.client.cfg.timeout_s)
        except grpc.aio.AioRpcError:
            pass  # it expires by itself

    async def _resign(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
        self._lost = True
        if self.lease_id:
            await self._revoke(self.lease_id)

    def resign(self) -> None:
        """Stop leading now (a clean stop): the lease is revoked, a standby takes over at once."""
        self.client.call(self._resign())
