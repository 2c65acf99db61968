"""Sealed rendezvous (clients/trainer/reference/rendezvous.py, controller/launches.py attempt_key):
the attempt's key from the controller to the worker's environment, and the store that seals and
opens every value, over torch's in-process HashStore and a real TCPStore on loopback with a
process of another tenant writing to it."""

from __future__ import annotations

import datetime
import socket

import pytest
import torch.distributed as dist

from tessera.clients.trainer import ContractError, TrainerContext
from tessera.clients.trainer.reference.rendezvous import ForgedValue, SealedStore
from tessera.common.nodespec import RENDEZVOUS_KEY_FEATURE
from tessera.controller.launches import attempt_key, launch_requests, sealing_key
from tessera.controller.store import JobRecord
from tessera.nodeagent import contract
from tessera.nodeagent.errors import InvalidArgument
from tessera.nodeagent.testing import launch_request
from tessera.v1 import common_pb2 as P

KEY = bytes(range(32))


def running_job() -> JobRecord:
    spec = P.JobSpec(name="r", entrypoint=["{python}", "-c", "print(1)"], global_batch_size=8, iterations=5)
    return JobRecord("j-1", "r", spec, P.JOB_STATE_STARTING, "", 0.0, attempt=3,
                     plan=P.Plan(dp=4, tp=1, pp=1, micro_batch=2, grad_accum=1, gpu_model="A40-48GB"),
                     placement=P.Placement(slices=[P.NodeSlice(node_id="a", gpu_indices=[0, 1]),
                                                   P.NodeSlice(node_id="b", gpu_indices=[0, 1])],
                                           rendezvous="10.0.0.1:29500"))


def test_an_attempt_over_an_agent_that_does_not_seal_gets_no_key() -> None:
    # A rollout (docs/operations.md, "Upgrading"): an attempt over an old agent, whose workers do not
    # seal, and a new one, whose workers do, failed its rendezvous on every retry until the job FAILED.
    new = {"a": [RENDEZVOUS_KEY_FEATURE], "b": [RENDEZVOUS_KEY_FEATURE, "later"], "old": []}
    assert sealing_key(KEY, ["a", "b"], new) == KEY
    assert sealing_key(KEY, ["a", "old"], new) == b"" and sealing_key(KEY, ["a", "gone"], new) == b""
    assert sealing_key(b"", ["a"], new) == b""


def test_the_attempts_key_is_derived_the_same_each_time_and_differs_per_attempt() -> None:
    k = attempt_key(KEY, "j-1", 2)
    assert len(k) == 32 and k == attempt_key(KEY, "j-1", 2)
    assert len({k, attempt_key(KEY, "j-1", 3), attempt_key(KEY, "j-2", 2), attempt_key(b"x" * 32, "j-1", 2)}) == 4
    assert attempt_key(b"", "j-1", 2) == b""
    job = running_job()
    reqs = launch_requests(job, 1, "/ckpt", KEY)
    assert reqs and {r.rendezvous_key for _, r in reqs} == {attempt_key(KEY, job.id, job.attempt)}
    assert {r.rendezvous_key for _, r in launch_requests(job, 1, "/ckpt")} == {b""}


def test_the_agent_hands_the_key_to_the_worker_in_hex_and_refuses_a_malformed_one() -> None:
    req = launch_request()
    req.rendezvous_key = KEY
    contract.validate_launch(req, range(4))
    env = contract.worker_env({}, req, req.ranks[0], agent_addr="a:1", declared=True, checkpoint_dir="/c",
                              omp_threads=1)
    assert env["TESSERA_RENDEZVOUS_KEY"] == KEY.hex()
    assert TrainerContext.from_env(env).rendezvous_key == KEY
    req.rendezvous_key = b"short"
    with pytest.raises(InvalidArgument, match="rendezvous_key: must be 32 bytes or empty, got 5"):
        contract.validate_launch(req, range(4))
    assert TrainerContext.from_env({"TESSERA_RENDEZVOUS_KEY": ""}).rendezvous_key == b""
    for bad in ("zz" * 32, "ab" * 31):
        with pytest.raises(ContractError, match="TESSERA_RENDEZVOUS_KEY must be 64 hex digits"):
            TrainerContext.from_env({"TESSERA_RENDEZVOUS_KEY": bad})


def test_values_are_sealed_unreadable_and_opened_only_under_their_own_key() -> None:
    inner = dist.HashStore()
    s = SealedStore(inner, KEY)
    s.set("addr/0", b"\x00\x01binary")
    s.set("addr/1", "text")
    assert s.get("addr/0") == b"\x00\x01binary" and s.get("addr/1") == b"text"
    assert b"text" not in inner.get("addr/1") and b"binary" not in inner.get("addr/0")  # unreadable in the store
    assert s.multi_get(["addr/0", "addr/1"]) == [b"\x00\x01binary", b"text"]
    inner.set("addr/2", inner.get("addr/0"))  # a sealed value moved under another key
    with pytest.raises(ForgedValue, match="the value of 'addr/2' is not sealed with this attempt's key"):
        s.get("addr/2")
    inner.set("addr/3", b"short")
    with pytest.raises(ForgedValue, match="'addr/3'"):
        s.get("addr/3")
    with pytest.raises(ForgedValue):
        SealedStore(inner, b"y" * 32).get("addr/0")  # another attempt's key
    assert s.compare_set("cas", "", "first") == b"first"  # absent: set
    assert s.compare_set("cas", "first", "second") == b"second"
    assert s.compare_set("cas", "nope", "third") == b"second"  # no match: the current value
    assert s.add("counter", 2) == 2 and s.check(["addr/0"]) and s.num_keys() >= 4
    s.multi_set(["m/0", "m/1"], [b"a", b"b"])
    assert s.get("m/1") == b"b"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_value_another_process_writes_to_the_tcp_store_fails_the_rendezvous() -> None:
    port, timeout = _port(), datetime.timedelta(seconds=10)
    master = dist.TCPStore("127.0.0.1", port, 3, True, timeout=timeout, wait_for_workers=False)
    rank = SealedStore(dist.TCPStore("127.0.0.1", port, 3, False, timeout=timeout), KEY)
    intruder = dist.TCPStore("127.0.0.1", port, 3, False, timeout=timeout)  # anyone who reaches the port
    rank.set("0//cpu//0/0", b"10.0.0.5:41234 seq 1")
    assert SealedStore(master, KEY).get("0//cpu//0/0") == b"10.0.0.5:41234 seq 1"
    intruder.set("0//cpu//0/1", b"10.9.9.9:4444 seq 1")  # its own address under a rank's key
    with pytest.raises(ForgedValue, match="'0//cpu//0/1'"):
        rank.get("0//cpu//0/1")
