"""The values the etcd store (controller/etcdstore.py) writes and reads back: a job's mutable record
and a node as JSON documents (messages in them base64), a job record made of its document and its
spec, an event's document with its seq, and copies of records that no caller can change in place.

A value no Tessera wrote raises BadRecord (controller/badrecords.py) or json's error; `job_fields`
and the store's readers leave such a record out, said once, never fatal.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any

from tessera.controller import badrecords
from tessera.controller.store import EventRecord, JobRecord, NodeRecord, _msg_bytes
from tessera.v1 import common_pb2

# Events one transaction may write: an event's seq is its transaction's revision times SEQ_SPAN
# plus its index in that transaction (see controller/etcdstore.py).
SEQ_SPAN = 1 << 16


def b64(m: Any | None) -> str | None:
    b = _msg_bytes(m)
    return None if b is None else base64.b64encode(b).decode()


def unb64(cls: type, s: str | None) -> Any:
    if s is None:
        return None
    msg = cls()
    msg.ParseFromString(base64.b64decode(s))
    return msg


def job_doc(job: JobRecord) -> bytes:
    return json.dumps({
        "id": job.id, "request_id": job.request_id, "tenant": job.spec.tenant, "state": job.state,
        "reason": job.reason, "submit_time": job.submit_time, "attempt": job.attempt, "plan": b64(job.plan),
        "placement": b64(job.placement), "progress": b64(job.progress), "start_time": job.start_time,
        "end_time": job.end_time, "restarts": job.restarts, "retries": job.retries,
        "stop_requested": job.stop_requested, "launch_failures": job.launch_failures,
        "next_launch_time": job.next_launch_time}).encode()


def checked_doc(raw: bytes) -> dict[str, Any]:
    """A job's JSON document, its index fields checked; BadRecord (or json's error) otherwise."""
    d = badrecords.doc(raw)
    badrecords.text(d.get("id"), "id"), badrecords.text(d.get("tenant"), "tenant")
    badrecords.integer(d.get("state"), "state"), badrecords.integer(d.get("attempt"), "attempt")
    badrecords.number(d.get("submit_time"), "submit_time"), badrecords.number(d.get("end_time"), "end_time")
    return d


def job_fields(raw: bytes) -> dict[str, Any] | None:
    """`checked_doc`, or None (said once) for a record no Tessera wrote: left out, never fatal."""
    return badrecords.one(raw, checked_doc, "job", lambda r: bytes(r[:120]).decode(errors="replace"))


def job_records(pairs: Iterable[tuple[bytes, bytes]]) -> list[JobRecord]:
    return badrecords.readable(pairs, lambda p: job_record(*p), "job", lambda p: bytes(p[0][:120]).decode(errors="replace"))


def job_record(doc: bytes, spec: bytes) -> JobRecord:
    d = checked_doc(doc)
    s = common_pb2.JobSpec()
    s.ParseFromString(spec)
    return JobRecord(
        id=d["id"], request_id=d["request_id"], spec=s, state=d["state"], reason=d["reason"],
        submit_time=d["submit_time"], attempt=d["attempt"], plan=unb64(common_pb2.Plan, d["plan"]),
        placement=unb64(common_pb2.Placement, d["placement"]), progress=unb64(common_pb2.Progress, d["progress"]),
        start_time=d["start_time"], end_time=d["end_time"], restarts=d["restarts"], retries=d["retries"],
        stop_requested=d["stop_requested"], launch_failures=d.get("launch_failures", 0),
        next_launch_time=d.get("next_launch_time", 0.0))


def event_record(kv: Any, job_id: str) -> EventRecord:
    d = badrecords.doc(kv.value)
    return EventRecord(kv.create_revision * SEQ_SPAN + badrecords.integer(d["i"], "i"), job_id,
                       badrecords.number(d["time"], "time"), badrecords.text(d["kind"], "kind"),
                       badrecords.text(d["message"], "message"))


def copy_job(job: JobRecord) -> JobRecord:
    def fresh(m: Any) -> Any:
        if m is None:
            return None
        out = type(m)()
        out.CopyFrom(m)
        return out

    return job.with_(spec=fresh(job.spec), plan=fresh(job.plan), placement=fresh(job.placement),
                     progress=fresh(job.progress))


def node_doc(n: NodeRecord) -> bytes:
    return json.dumps({"id": n.id, "address": n.address, "inventory": b64(n.inventory), "drained": n.drained,
                       "drain_reason": n.drain_reason, "launch_failures": n.launch_failures,
                       "unhealthy_until": n.unhealthy_until}).encode()


def node_record(doc: bytes) -> NodeRecord:
    d = badrecords.doc(doc)
    return NodeRecord(badrecords.text(d["id"], "id"), badrecords.text(d["address"], "address"), unb64(common_pb2.NodeInventory, d["inventory"]), d["drained"],
                      d["drain_reason"], d.get("launch_failures", 0), d.get("unhealthy_until", 0.0))
