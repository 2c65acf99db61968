"""The etcd backend of the Store protocol (controller/store.py): the state of a highly available
controller (docs/ha.md). Same contract suite as SQLite (tests/unit/test_store_contract.py).

Keys under the prefix (default `/tessera/`):

    meta/store_id, meta/schema_version, meta/epoch    the store's identity, its schema, the epoch
    leader                                            the leader (controller/election.py)
    job/<id>       the job's mutable record (JSON)    spec/<id>   its JobSpec (written once)
    req/<request id> -> job id                        node/<id>   a node record (JSON)
    ev/<job id>/<write id>-<i>                        an event (JSON)
    jobidx/<submit time, 16 hex digits>/<id>          the page index (empty value; see below)
    rmreq/<request id> -> {node_id, time}             a RemoveNode request id (the newest 10,000)
    meta/jobidx                                       "1" once every job has its index key
    meta/page_key                                     the key of ListJobs continue tokens (shared_key)
    meta/rendezvous_key                               the key attempts' rendezvous keys derive from (shared_key)
    meta/doc:<name>                                   a document of the controller's (put_meta: the
                                                      churn guard's ledger, controller/churnguard.py)
    meta/settings                                     the settings of the last leader that every controller
                                                      must share (controller/ha_settings.py)

The page index: one key per job, made with the job and deleted with it, in the same transactions.
etcd ranges come back in key order, so `jobidx/` walks the jobs in (submit_time, id) order, as
SQLite's `jobs_page` index does: the time is the IEEE 754 bits of the float as an unsigned 64-bit
number (the sign bit flipped for positive times, every bit for negative ones), 16 hex digits, so
that byte order is numeric order, exactly (no rounding: a page's `after` key is the last job's own
float). A job's submit_time never changes after create_job (SQLite's UPDATE leaves it too), so the
key never moves. A store made before the index gets it at the first leader's open (meta/jobidx).

Every write is one transaction whose first compare is the leader's fence
(`Leadership.fence()`: the leader key still has the create_revision this controller gave it), so a
deposed leader cannot write: etcd refuses it, whatever that process believes. A refused write
raises NotLeader (UNAVAILABLE at the API).

Event sequence numbers need no counter: an event's seq is the revision of the transaction that wrote
it times 65,536 plus its index in that transaction, so seqs grow with every write, across jobs, as
SQLite's do. The spec lives apart from the job's record so that the writes of a round (every pending
job's reason) carry only the small mutable part. etcd limits a transaction to `--max-txn-ops` (128 by
default): `save_jobs` of more jobs than one transaction takes is stored in several, each all-or-nothing,
after one read has checked that every job exists (pending reasons are advisory: a round that stops
half-way leaves some of them older, which the next round replaces). The values' documents, and the
records read back from them: controller/etcddocs.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import uuid
from collections import Counter
from collections.abc import Coroutine, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from aetcd import rpc as etcdrpc

from tessera.controller import badrecords
from tessera.controller.election import Leadership, NotLeader, epoch_value
from tessera.controller.etcd import EtcdClient
from tessera.controller.etcddocs import (
    SEQ_SPAN,
    copy_job,
    event_record,
    job_doc,
    job_fields,
    job_records,
    node_doc,
    node_record,
)
from tessera.controller.store import (
    MAX_REMOVALS,
    SCHEMA_VERSION,
    TERMINAL,
    EventRecord,
    JobRecord,
    NodeRecord,
    RequestConflict,
    StaleWrite,
    StateError,
    _msg_bytes,
    _write_atomically,
    is_stale,
)

T = TypeVar("T")
MAX_TXN_OPS = 120  # below etcd's default --max-txn-ops of 128
# Keys per Range page: specs are at most 64 KiB (common/jobspec.py), so a page stays under 13 MiB,
# within the 16 MiB a gRPC message may carry.
RANGE_PAGE = 200


def _prefix_end(key: bytes) -> bytes:
    return key[:-1] + bytes([key[-1] + 1])


def sortable_time(t: float) -> str:
    """`t` as 16 hex digits whose byte order is the floats' numeric order (the page index's keys)."""
    bits = struct.unpack(">Q", struct.pack(">d", t + 0.0))[0]  # + 0.0: -0.0 sorts as 0.0
    return f"{bits ^ (0xFFFF_FFFF_FFFF_FFFF if bits >> 63 else 1 << 63):016x}"


def _put(key: bytes, value: bytes) -> Any:
    return etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key, value=value))


def _delete(key: bytes, prefix: bool = False) -> Any:
    return etcdrpc.RequestOp(request_delete_range=etcdrpc.DeleteRangeRequest(
        key=key, range_end=_prefix_end(key) if prefix else b""))


def _get(key: bytes, prefix: bool = False) -> Any:
    return etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=key, range_end=_prefix_end(key) if prefix else b""))


def _exists(key: bytes) -> Any:
    return etcdrpc.Compare(key=key, result=etcdrpc.Compare.GREATER, target=etcdrpc.Compare.CREATE, create_revision=0)


def _absent(key: bytes) -> Any:
    return etcdrpc.Compare(key=key, result=etcdrpc.Compare.EQUAL, target=etcdrpc.Compare.CREATE, create_revision=0)


class EtcdStore:
    """Store on etcd, writing only while `leadership` leads (its fence on every transaction)."""

    def __init__(self, client: EtcdClient, leadership: Leadership, marker: Path | None = None) -> None:
        self.c = client
        self.lead = leadership
        self.p = client.cfg.prefix.encode()
        # Job id -> (state, attempt), kept with every write this store makes (only the leader
        # writes: every transaction is fenced, and a new term builds a new store), so that
        # list_jobs(states) reads the matching records by key instead of every record (the liveness
        # tick, ListNodes and each round ask for the active jobs, and reading all of them cost an
        # idle leader 0.28 cores at 3,000 jobs), and save_current checks a write without a read.
        # None = unknown (not read yet, or a write whose outcome is not known): the next use reads all.
        self._states: dict[str, tuple[int, int]] | None = None
        # The records of the jobs not ended, kept with the index (the same writes, the same
        # reset): each round reads the pending jobs and each tick the active ones, and at 3,000
        # pending jobs that read took 157 ms from etcd. Handed out as copies (their messages are
        # mutable, and a caller's change must not reach the store without a write).
        self._open_jobs: dict[str, JobRecord] = {}
        self._open(marker)

    # ------------------------------------------------------------------ plumbing

    def _k(self, *parts: str) -> bytes:
        return self.p + "/".join(parts).encode()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """`coro` on the etcd loop, waited for at most until the lease deadline (and the client's
        timeout): the store is synchronous, so a stalled etcd blocked the controller's loop for the
        5 s timeout, past the deadline after which every call must be answered UNAVAILABLE, and
        clients got DEADLINE_EXCEEDED instead (docs/ha.md, "A leader that loses its lease")."""
        left = self.lead.time_left()
        if left <= 0 and not self.lead.is_leader():  # (the tests make a deposed leader believe it leads)
            coro.close()
            raise NotLeader(f"not the leader (epoch {self.lead.epoch}): its lease deadline passed")
        return self.c.call(coro, min(self.c.cfg.timeout_s, left) if left > 0 else None)

    def _range(self, key: bytes, prefix: bool = False, keys_only: bool = False) -> list[Any]:
        """The key, or every key under the prefix, read in pages of RANGE_PAGE keys at the first
        page's revision (one consistent snapshot): one Range of a whole prefix outgrew the client's
        16 MiB message limit (about 33,000 jobs' records, or 330 jobs' large specs), and then every
        round failed and every new leader crashed reading its jobs."""
        end = _prefix_end(key) if prefix else b""
        t = self.c.cfg.timeout_s
        out: list[Any] = []
        start, revision = key, 0
        while True:
            req = etcdrpc.RangeRequest(key=start, range_end=end, keys_only=keys_only, revision=revision,
                                       limit=RANGE_PAGE if prefix else 0)
            resp = self._call(self.c.rpc(lambda req=req: self.c.kv.Range(req, timeout=t)))  # type: ignore[misc]
            out += resp.kvs
            if not (prefix and resp.more and resp.kvs):
                return out
            start, revision = bytes(resp.kvs[-1].key) + b"\0", resp.header.revision

    def _value(self, key: bytes) -> bytes | None:
        kvs = self._range(key)
        return bytes(kvs[0].value) if kvs else None

    def _txn(self, compare: list[Any], success: list[Any], failure: Sequence[Any] = ()) -> Any:
        """One fenced transaction; NotLeader when the fence compare is what failed."""
        fence = self.lead.fence()
        req = etcdrpc.TxnRequest(compare=[fence, *compare], success=success,
                                 failure=[_get(self.lead.leader_key), *failure])
        t = self.c.cfg.timeout_s
        resp = self._call(self.c.rpc(lambda: self.c.kv.Txn(req, timeout=t)))
        if not resp.succeeded:
            leader = resp.responses[0].response_range.kvs
            if not leader or leader[0].create_revision != fence.create_revision:
                raise NotLeader(f"not the leader any more (epoch {self.lead.epoch}): the write was refused")
        return resp

    def _open(self, marker: Path | None) -> None:
        """The store's identity, as SqliteStore checks its own: an emptied or replaced etcd prefix is
        refused (StateError) when `marker` (a file in the state dir) names another store."""
        known = marker.read_text().strip() if marker is not None and marker.exists() else None
        where = f"etcd {','.join(self.c.cfg.endpoints)} prefix {self.c.cfg.prefix}"
        version = self._value(self._k("meta", "schema_version"))
        if version is not None and not version.strip().isdigit():
            raise StateError(f"{where}: meta/schema_version is {version[:40]!r}, not a number: not written by Tessera")
        if version is not None and int(version) > SCHEMA_VERSION:
            raise StateError(f"{where}: state was written by a newer Tessera (schema {int(version)} > "
                             f"{SCHEMA_VERSION})")
        got = self._value(self._k("meta", "store_id"))
        if got is not None:
            store_id = got.decode()
            if known is not None and store_id != known:
                raise StateError(f"{where} is store {store_id}, but {marker} names store {known}: the etcd "
                                 f"data was replaced; restore it, or remove {marker} to adopt this one")
        elif known is not None:
            raise StateError(f"{where} has no jobs, nodes or store id of store {known} ({marker}): it was "
                             f"emptied or etcd's data dir was lost; restore it from a snapshot, or remove "
                             f"{marker} to start afresh (every job is forgotten)")
        else:
            store_id = uuid.uuid4().hex
            key = self._k("meta", "store_id")
            resp = self._txn([_absent(key)], [_put(key, store_id.encode()),
                                              _put(self._k("meta", "schema_version"), str(SCHEMA_VERSION).encode()),
                                              _put(self._k("meta", "jobidx"), b"1")],
                             [_get(key)])
            if not resp.succeeded:
                store_id = bytes(resp.responses[1].response_range.kvs[0].value).decode()
        self.store_id = store_id
        if marker is not None and known != store_id:
            _write_atomically(marker, store_id + "\n")
        if self._value(self._k("meta", "jobidx")) is None:
            self._index_all()

    def _index_all(self) -> None:
        """Give every job its page index key (a store written before the index), then mark it done."""
        ops = [_put(self._idx(d["submit_time"], d["id"]), b"")
               for kv in self._range(self._k("job", ""), prefix=True) if (d := job_fields(kv.value))]
        for i in range(0, len(ops), MAX_TXN_OPS):
            self._txn([], ops[i:i + MAX_TXN_OPS])
        self._txn([], [_put(self._k("meta", "jobidx"), b"1")])

    def _idx(self, submit_time: float, job_id: str) -> bytes:
        return self._k("jobidx", sortable_time(submit_time), job_id)

    def _event_ops(self, job_id: str, time: float, events: Sequence[tuple[str, str]], start: int = 0) -> list[Any]:
        """Puts of `events`, numbered from `start` within their transaction (their seq's low bits)."""
        wid = uuid.uuid4().hex[:16]
        return [_put(self._k("ev", job_id, f"{wid}-{i:05d}"),
                     json.dumps({"job_id": job_id, "time": time, "kind": k, "message": m, "i": i}).encode())
                for i, (k, m) in enumerate(events, start)]

    @staticmethod
    def _records(revision: int, job_id: str, time: float, events: Sequence[tuple[str, str]]) -> list[EventRecord]:
        return [EventRecord(revision * SEQ_SPAN + i, job_id, time, k, m) for i, (k, m) in enumerate(events)]

    def _state_index(self) -> dict[str, tuple[int, int]]:
        if self._states is None:
            docs = [(d, bytes(kv.value)) for kv in self._range(self._k("job", ""), prefix=True)
                    if (d := job_fields(kv.value))]
            open_docs = [(d["id"], doc) for d, doc in docs if d["state"] not in TERMINAL]
            specs = self._read([self._k("spec", i) for i, _ in open_docs])
            self._open_jobs = {j.id: j for j in job_records((doc, spec) for (_, doc), spec in zip(open_docs, specs, strict=True)
                                                      if spec is not None)}
            self._states = {d["id"]: (d["state"], d["attempt"]) for d, _ in docs}
        return self._states

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """Around a job write: one that raises (a timeout after etcd may have applied it, NotLeader)
        leaves the index unknown."""
        try:
            yield
        except BaseException:
            self._states = None
            self._open_jobs = {}
            raise

    def _indexed(self, job_id: str, job: JobRecord | None) -> None:
        if self._states is not None:
            if job is None:
                self._states.pop(job_id, None)
            else:
                self._states[job_id] = (job.state, job.attempt)
            if job is None or job.state in TERMINAL:
                self._open_jobs.pop(job_id, None)
            else:
                self._open_jobs[job_id] = copy_job(job)

    # ------------------------------------------------------------------ the Store protocol

    def next_epoch(self) -> int:
        key = self._k("meta", "epoch")
        while True:
            kvs = self._range(key)
            old, mod = (epoch_value(kvs[0].value, key), kvs[0].mod_revision) if kvs else (0, 0)
            cmp = etcdrpc.Compare(key=key, result=etcdrpc.Compare.EQUAL, target=etcdrpc.Compare.MOD,
                                  mod_revision=mod)
            if self._txn([cmp], [_put(key, str(old + 1).encode())]).succeeded:
                return old + 1

    def get_meta(self, key: str) -> str | None:
        kvs = self._range(self._k("meta", f"doc:{key}"))
        return bytes(kvs[0].value).decode(errors="replace") if kvs else None

    def put_meta(self, key: str, value: str) -> None:
        self._txn([], [_put(self._k("meta", f"doc:{key}"), value.encode())])  # fenced: the leader's alone

    def create_job(self, job: JobRecord, event: tuple[str, str]) -> tuple[JobRecord, bool]:
        req, jkey = self._k("req", job.request_id), self._k("job", job.id)
        with self._writing():
            resp = self._txn(
                [_absent(req), _absent(jkey)],
                [_put(jkey, job_doc(job)), _put(self._k("spec", job.id), job.spec.SerializeToString(deterministic=True)),
                 _put(req, job.id.encode()), _put(self._idx(job.submit_time, job.id), b""),
                 *self._event_ops(job.id, job.submit_time, [event])],
                [_get(req)])
        if resp.succeeded:
            self._indexed(job.id, job)
            return job, True
        kvs = resp.responses[1].response_range.kvs
        if not kvs:
            raise KeyError(f"job id {job.id} exists")
        old = self.get_job(bytes(kvs[0].value).decode())
        if old is None or _msg_bytes(old.spec) != _msg_bytes(job.spec):
            raise RequestConflict(job.request_id)
        return old, False

    def _read(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Several keys, MAX_TXN_OPS to a round trip (a transaction of reads)."""
        out: list[bytes | None] = []
        t = self.c.cfg.timeout_s
        for i in range(0, len(keys), MAX_TXN_OPS):
            req = etcdrpc.TxnRequest(success=[_get(k) for k in keys[i:i + MAX_TXN_OPS]])
            resp = self._call(self.c.rpc(lambda req=req: self.c.kv.Txn(req, timeout=t)))  # type: ignore[misc]
            out += [bytes(r.response_range.kvs[0].value) if r.response_range.kvs else None for r in resp.responses]
        return out

    def get_job(self, job_id: str) -> JobRecord | None:
        if self._states is not None and job_id in self._open_jobs:
            return copy_job(self._open_jobs[job_id])
        doc, spec = self._read([self._k("job", job_id), self._k("spec", job_id)])
        return None if doc is None or spec is None else next(iter(job_records([(doc, spec)])), None)

    def list_jobs(self, states: Iterable[int] = (), tenant: str = "") -> list[JobRecord]:
        st = set(states)
        index = self._state_index() if st else {}
        if st and not st & TERMINAL:  # jobs not ended only: all in memory
            got = [copy_job(j) for j in self._open_jobs.values()
                   if j.state in st and (not tenant or j.spec.tenant == tenant)]
            return sorted(got, key=lambda j: (j.submit_time, j.id))
        ids = sorted(i for i, (state, _) in index.items() if state in st)
        if st and len(ids) * 2 <= len(index):  # a few of many: by key (each record checked again below)
            raw = [doc for doc in self._read([self._k("job", i) for i in ids]) if doc is not None]
        else:  # all, or most: the prefix, in pages
            raw = [bytes(kv.value) for kv in self._range(self._k("job", ""), prefix=True)]
        docs = [(d["id"], doc) for doc in raw
                if (d := job_fields(doc)) and (not st or d["state"] in st) and (not tenant or d["tenant"] == tenant)]
        # The specs of a few jobs (the active ones of a round, say) by key; of many, in one range.
        if len(docs) <= MAX_TXN_OPS // 2:
            specs = dict(zip((i for i, _ in docs), self._read([self._k("spec", i) for i, _ in docs]), strict=True))
        else:
            n = len(self._k("spec", ""))
            specs = {bytes(kv.key)[n:].decode(): bytes(kv.value) for kv in self._range(self._k("spec", ""), prefix=True)}
        out = job_records((doc, spec) for i, doc in docs if (spec := specs.get(i)) is not None)
        return sorted(out, key=lambda j: (j.submit_time, j.id))

    def count_jobs(self, states: Iterable[int] = (), tenant: str = "") -> int:
        """Jobs not ended: counted in memory, nothing copied or read (once the index is known)."""
        st = set(states)
        if not st or st & TERMINAL:
            return len(self.list_jobs(st, tenant))
        self._state_index()
        return sum(1 for j in self._open_jobs.values() if j.state in st and (not tenant or j.spec.tenant == tenant))

    def count_jobs_by_tenant(self, states: Iterable[int] = ()) -> dict[str, int]:
        """As count_jobs, per tenant. Jobs not ended: in memory. Ended ones: their records (no key
        holds a job's tenant or state: nothing cheaper to read), as count_jobs reads them."""
        st = set(states)
        if not st or st & TERMINAL:
            return dict(Counter(j.spec.tenant for j in self.list_jobs(st)))
        self._state_index()
        return dict(Counter(j.spec.tenant for j in self._open_jobs.values() if j.state in st))

    def has_request(self, request_id: str) -> bool:
        return self._value(self._k("req", request_id)) is not None

    def save_job(self, job: JobRecord, time: float, events: Sequence[tuple[str, str]] = ()) -> list[EventRecord]:
        jkey = self._k("job", job.id)
        with self._writing():
            resp = self._txn([_exists(jkey)], [_put(jkey, job_doc(job)), *self._event_ops(job.id, time, events)])
        if not resp.succeeded:
            raise KeyError(job.id)
        self._indexed(job.id, job)
        return self._records(resp.header.revision, job.id, time, events)

    def save_current(self, job: JobRecord, time: float, events: Sequence[tuple[str, str]] = ()) -> list[EventRecord]:
        cur = self._state_index().get(job.id)
        if cur is not None and is_stale(job, *cur):
            raise StaleWrite(job.id, *cur)
        return self.save_job(job, time, events)

    def save_jobs(self, updates: Sequence[tuple[JobRecord, Sequence[tuple[str, str]]]], time: float) -> None:
        """All stored or none when they fit one transaction (see the module's docstring)."""
        known = {self._k("job", i) for i in self._state_index()} if len(updates) > 1 else None
        chunks: list[list[tuple[JobRecord, Sequence[tuple[str, str]]]]] = [[]]
        ops = 0
        for job, events in updates:
            if known is not None and self._k("job", job.id) not in known:
                raise KeyError(job.id)
            n = 2 + len(events)
            if chunks[-1] and ops + n > MAX_TXN_OPS:
                chunks.append([])
                ops = 0
            chunks[-1].append((job, events))
            ops += n
        for chunk in chunks:
            if not chunk:
                continue
            compare = [_exists(self._k("job", j.id)) for j, _ in chunk]
            success, n = [], 0
            for j, evs in chunk:
                success += [_put(self._k("job", j.id), job_doc(j)), *self._event_ops(j.id, time, evs, n)]
                n += len(evs)
            with self._writing():
                resp = self._txn(compare, success)
            if resp.succeeded:
                for j, _ in chunk:
                    self._indexed(j.id, j)
            else:
                raise KeyError(next(j.id for j, _ in chunk if self._value(self._k("job", j.id)) is None))

    def events(self, job_id: str, after_seq: int = 0) -> list[EventRecord]:
        out = []
        for kv in self._range(self._k("ev", job_id, ""), prefix=True):
            ev = badrecords.one(kv, lambda kv: event_record(kv, job_id), "event", lambda kv: bytes(kv.key).decode(errors="replace"))
            if ev is not None and ev.seq > after_seq:
                out.append(ev)
        return sorted(out, key=lambda e: e.seq)

    def put_node(self, node: NodeRecord) -> None:
        self._txn([], [_put(self._k("node", node.id), node_doc(node))])

    def get_node(self, node_id: str) -> NodeRecord | None:
        doc = self._value(self._k("node", node_id))
        return None if doc is None else badrecords.one(doc, node_record, "node", lambda _: node_id)

    def list_nodes(self) -> list[NodeRecord]:
        return sorted(badrecords.readable((bytes(kv.value) for kv in self._range(self._k("node", ""), prefix=True)),
                                          node_record, "node", lambda d: d[:120].decode(errors="replace")), key=lambda n: n.id)

    def shared_key(self, name: str) -> bytes:
        """`meta/<name>`: 32 random bytes made by the first leader that asks (in a transaction: two
        leaders in turn cannot make two), the same for every controller after."""
        key = self._k("meta", name)
        got = self._value(key)
        if got is not None:
            return got
        new = os.urandom(32)
        resp = self._txn([_absent(key)], [_put(key, new)], [_get(key)])
        return new if resp.succeeded else bytes(resp.responses[1].response_range.kvs[0].value)

    # ------------------------------------------------------------------ pages, retention, node removal

    def list_jobs_page(self, states: Iterable[int] = (), tenant: str = "", after: tuple[float, str] | None = None,
                       limit: int = 500) -> list[JobRecord]:
        """Walk the page index from `after` in key order, reading the records of each batch of index
        keys and keeping those that match, until `limit` match (limit < 0: all) or the index ends."""
        st = set(states)
        base = self._k("jobidx", "")
        start, end = (self._idx(*after) + b"\0") if after is not None else base, _prefix_end(base)
        found: list[tuple[str, bytes]] = []
        t = self.c.cfg.timeout_s
        while limit < 0 or len(found) < limit:
            # Without filters every indexed job matches: read no more keys than the page needs.
            n = MAX_TXN_OPS if st or tenant or limit < 0 else min(MAX_TXN_OPS, limit - len(found))
            req = etcdrpc.RangeRequest(key=start, range_end=end, limit=n, keys_only=True)
            kvs = self._call(self.c.rpc(lambda req=req: self.c.kv.Range(req, timeout=t))).kvs  # type: ignore[misc]
            ids = [bytes(kv.key).rpartition(b"/")[2].decode() for kv in kvs]
            for job_id, doc in zip(ids, self._read([self._k("job", i) for i in ids]), strict=True):
                if doc is None:
                    continue  # deleted since the index was read
                d = job_fields(doc)
                if d is not None and (not st or d["state"] in st) and (not tenant or d["tenant"] == tenant):
                    found.append((job_id, doc))
            if len(kvs) < n:
                break
            start = bytes(kvs[-1].key) + b"\0"
        found = found if limit < 0 else found[:limit]
        specs = self._read([self._k("spec", i) for i, _ in found])
        return job_records((doc, spec) for (_, doc), spec in zip(found, specs, strict=True) if spec is not None)

    def delete_finished_jobs(self, ended_before: float, limit: int) -> list[str]:
        """As the protocol says, except that etcd's limit on a transaction's operations splits more
        than MAX_TXN_OPS / 5 jobs into several transactions: each job's keys (record, spec, request id,
        index, events) go together, always. A job changed since it was read is left for the next sweep."""
        old = []
        for kv in self._range(self._k("job", ""), prefix=True):
            d = job_fields(kv.value)
            if d is not None and d["state"] in TERMINAL and max(d["end_time"], d["submit_time"]) < ended_before:
                old.append((d["submit_time"], d["id"], d["request_id"], kv.mod_revision))
        old.sort()
        gone: list[str] = []
        per_txn = MAX_TXN_OPS // 5
        batch = old[:max(0, limit)]
        for i in range(0, len(batch), per_txn):
            chunk = batch[i:i + per_txn]
            compare = [etcdrpc.Compare(key=self._k("job", j), result=etcdrpc.Compare.EQUAL,
                                       target=etcdrpc.Compare.MOD, mod_revision=rev) for _, j, _, rev in chunk]
            success = [op for t, j, rid, _ in chunk
                       for op in (_delete(self._k("job", j)), _delete(self._k("spec", j)), _delete(self._k("req", rid)),
                                  _delete(self._idx(t, j)), _delete(self._k("ev", j, ""), prefix=True))]
            with self._writing():
                resp = self._txn(compare, success)
            if not resp.succeeded:
                break
            gone += [j for _, j, _, _ in chunk]
            for _, j, _, _ in chunk:
                self._indexed(j, None)
        return gone

    def remove_node(self, node_id: str, request_id: str, time: float) -> bool:
        rkey, nkey = self._k("rmreq", request_id), self._k("node", node_id)
        resp = self._txn([_absent(rkey), _exists(nkey)],
                         [_delete(nkey), _put(rkey, json.dumps({"node_id": node_id, "time": time}).encode())],
                         [_get(rkey)])
        if resp.succeeded:
            self._forget_old_removals()
            return True
        # The fence held (else NotLeader), so the request id was used or there is no such node.
        done = resp.responses[1].response_range.kvs
        if not done:
            return False
        if json.loads(done[0].value)["node_id"] != node_id:
            raise RequestConflict(request_id, "node removal")
        return True

    def _forget_old_removals(self) -> None:
        """Keep the newest MAX_REMOVALS request ids (by creation revision)."""
        base = self._k("rmreq", "")
        t = self.c.cfg.timeout_s
        count = etcdrpc.RangeRequest(key=base, range_end=_prefix_end(base), count_only=True)
        extra = self._call(self.c.rpc(lambda: self.c.kv.Range(count, timeout=t))).count - MAX_REMOVALS
        if extra <= 0:
            return
        oldest = etcdrpc.RangeRequest(key=base, range_end=_prefix_end(base), keys_only=True, limit=extra,
                                      sort_order=etcdrpc.RangeRequest.ASCEND, sort_target=etcdrpc.RangeRequest.CREATE)
        kvs = self._call(self.c.rpc(lambda: self.c.kv.Range(oldest, timeout=t))).kvs
        ops = [_delete(bytes(kv.key)) for kv in kvs]
        for i in range(0, len(ops), MAX_TXN_OPS):
            self._txn([], ops[i:i + MAX_TXN_OPS])

    def close(self) -> None:
        pass  # the client (and its thread) belongs to whoever made it
