"""The pure parts of the HA audit's fixes (docs/ha.md): the settings every controller must share,
another controller's --advertise, the standby's hint, the store's calls capped by the lease
deadline, and etcd's errors as one log line with the flags to check."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import grpc.aio
from structlog.testing import capture_logs

from tessera.controller import ha_settings as hs
from tessera.controller.election import Leadership, NotLeader
from tessera.controller.engine_config import EngineConfig
from tessera.controller.etcd import PLAINTEXT_HINT, TLS_HINT, EtcdConfig, error_fields
from tessera.controller.etcdstore import EtcdStore


def _client(prefix: str = "/t/", ca: str = "") -> Any:
    return SimpleNamespace(cfg=EtcdConfig(("127.0.0.1:1",), prefix=prefix, ca=ca))


# -- 1, 5: the settings the controllers share -----------------------------------------------------


def test_with_etcd_the_checkpoint_root_must_be_given() -> None:
    assert "--checkpoint-root" in hs.checkpoint_root_problem("etcd", "")
    assert hs.checkpoint_root_problem("etcd", "/mnt/shared/ckpt") == ""
    assert hs.checkpoint_root_problem("sqlite", "") == ""


def test_settings_of_a_config(tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text("tenants: {}\n")
    mine = hs.settings_of(EngineConfig(checkpoint_root="/mnt/c", policy=" EF ", policy_mode="artifact",
                                       tenants_file=str(tenants)))
    assert mine.policy == "elasticflow-l" and mine.policy_mode == "artifact" and mine.checkpoint_root == "/mnt/c"
    assert mine.tenants.startswith("sha256:") and len(mine.tenants) == 7 + 64
    assert hs.settings_of(EngineConfig(checkpoint_root="/mnt/c")).tenants == ""
    assert hs.Settings.parse(mine.to_json()) == mine
    assert hs.Settings.parse(b"[1]") is None and hs.Settings.parse(b"{") is None


def test_a_checkpoint_root_not_the_clusters_is_refused_in_one_line_naming_both() -> None:
    recorded = hs.Settings("/mnt/shared/ckpt", "crius", "paper")
    assert hs.root_refusal(None, recorded, "/t/") == ""
    assert hs.root_refusal(recorded, hs.Settings("/mnt/shared/ckpt", "fcfs", "paper"), "/t/") == ""
    line = hs.root_refusal(recorded, hs.Settings("/var/lib/c2/checkpoints", "crius", "paper"), "/t/")
    assert "\n" not in line and "/var/lib/c2/checkpoints" in line and "/mnt/shared/ckpt" in line
    assert "/t/meta/settings" in line


def test_other_differences_are_named() -> None:
    before = hs.Settings("/c", "crius", "paper", "")
    assert hs.differences(before, before) == []
    got = hs.differences(before, hs.Settings("/c", "fcfs", "paper", "sha256:ab"))
    assert got == [{"setting": "policy", "last_leader": "crius", "this": "fcfs"},
                   {"setting": "tenants", "last_leader": "", "this": "sha256:ab"}]


# -- 3, 4: whom a standby names, and another controller's --advertise -----------------------------


def _seen(lead: Leadership, address: str, epoch: int, instance: str) -> None:
    doc = {"address": address, "epoch": epoch} | ({"instance": instance} if instance else {})
    lead._record([SimpleNamespace(value=json.dumps(doc).encode())])


def test_a_leader_key_naming_this_address_from_another_process() -> None:
    lead = Leadership(_client(), "10.0.0.1:50051", instance="ctl-4:/var/lib/c4")
    _seen(lead, "10.0.0.2:50051", 7, "ctl-2:/var/lib/c")
    assert lead.leader_hint() == "10.0.0.2:50051" and not lead.address_taken()
    assert hs.advertise_refusal(lead) == ""
    _seen(lead, "10.0.0.1:50051", 7, "ctl-4:/var/lib/c4")  # its own earlier run, lease not expired yet
    assert lead.leader_hint() == "" and not lead.address_taken() and hs.advertise_refusal(lead) == ""
    _seen(lead, "10.0.0.1:50051", 7, "")  # written by an older Tessera: nothing to tell
    assert lead.leader_hint() == "" and not lead.address_taken()
    with capture_logs() as logs:
        _seen(lead, "10.0.0.1:50051", 8, "ctl-1:/var/lib/c")
        lead._say_if_taken()
        lead._say_if_taken()  # once per leader
    assert lead.address_taken() and lead.leader_hint() == "10.0.0.1:50051"  # the true situation
    assert [e["event"] for e in logs] == ["advertise_in_use"] and "its own --advertise" in logs[0]["detail"]
    line = hs.advertise_refusal(lead)
    assert "\n" not in line and "--advertise 10.0.0.1:50051" in line and "its own --advertise" in line


def test_the_leader_key_says_its_instance() -> None:
    lead = Leadership(_client(), "a:1", instance="h:/s")
    _seen(lead, "b:1", 3, "")
    assert lead.seen_leader == ("b:1", 3) and lead.seen_instance == ""
    lead._record([SimpleNamespace(value=b"not json")])
    assert lead.seen_leader == ("", 0) and lead.leader_hint() == ""
    lead._record([])
    assert lead.seen_leader is None


# -- 6: a store call never outlasts the lease deadline --------------------------------------------


class _Lead:
    def __init__(self, left: float, leading: bool) -> None:
        self.left, self.leading, self.epoch = left, leading, 3

    def time_left(self) -> float:
        return self.left

    def is_leader(self) -> bool:
        return self.leading


class _Calls:
    def __init__(self) -> None:
        self.cfg = EtcdConfig(("127.0.0.1:1",))
        self.timeouts: list[float | None] = []

    def call(self, coro: Any, timeout_s: float | None = None) -> Any:
        coro.close()
        self.timeouts.append(timeout_s)
        return "answer"


def _store(lead: _Lead) -> tuple[EtcdStore, _Calls]:
    store = EtcdStore.__new__(EtcdStore)
    calls = _Calls()
    store.c, store.lead = calls, lead  # type: ignore[assignment]
    return store, calls


async def _never() -> None:
    await asyncio.Event().wait()


def test_a_store_call_waits_at_most_until_the_lease_deadline() -> None:
    store, calls = _store(_Lead(1.25, True))
    assert store._call(_never()) == "answer"
    store.lead.left = 30.0  # type: ignore[attr-defined]
    store._call(_never())
    assert calls.timeouts == [1.25, 5.0]  # then the client's own timeout
    store, calls = _store(_Lead(0.0, False))
    try:
        store._call(_never())
        raise AssertionError("a call past the deadline went to etcd")
    except NotLeader:
        assert calls.timeouts == []


def test_the_time_left_of_a_leader() -> None:
    now = [100.0]
    lead = Leadership(_client(), "a:1", mono=lambda: now[0])
    assert lead.time_left() == 0.0  # never led
    lead.token, lead._valid_until = 42, 104.5
    assert lead.time_left() == 4.5
    lead._lost = True
    assert lead.time_left() == 0.0


# -- 7: etcd's errors, one line, with the flags to check ------------------------------------------


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details,
                                'UNKNOWN:Error received from peer {grpc_status:14,\n  created_time:"x"}')


def test_etcd_errors_are_one_line_with_their_code_and_a_tls_hint() -> None:
    wrong_ca = _rpc_error(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses; last error: UNKNOWN: "
                          "ipv4:127.0.0.1:2379: Tls handshake failed (TSI_PROTOCOL_FAILURE):\n SSL_ERROR_SSL")
    assert "\n" in str(wrong_ca)
    got = error_fields(wrong_ca, tls=True)
    assert got["code"] == "UNAVAILABLE" and "\n" not in got["error"] and "Tls handshake failed" in got["error"]
    assert got["hint"] == TLS_HINT and "--etcd-ca" in TLS_HINT and "--etcd-cert" in TLS_HINT and "--etcd-key" in TLS_HINT
    no_cert = error_fields(_rpc_error(grpc.StatusCode.UNAVAILABLE, "Unwrap failed (TSI_DATA_CORRUPTED)"), tls=True)
    assert no_cert["hint"] == TLS_HINT
    plain = error_fields(_rpc_error(grpc.StatusCode.UNAVAILABLE, "ipv4:127.0.0.1:2379: Socket closed"), tls=False)
    assert plain["hint"] == PLAINTEXT_HINT and "--etcd-ca" in PLAINTEXT_HINT
    assert "hint" not in error_fields(_rpc_error(grpc.StatusCode.UNAVAILABLE, "Connection refused"), tls=False)
    assert error_fields(NotLeader("not the\nleader"), tls=False) == {"code": "UNAVAILABLE", "error": "not the leader"}


class _Refusing:
    """An etcd client whose first Range fails as the audit's TLS mistakes did; the second waits."""

    def __init__(self, err: grpc.aio.AioRpcError) -> None:
        self.cfg = EtcdConfig(("127.0.0.1:1",), prefix="/t/", ca="ca.pem")
        self.err, self.asked_again, self.calls = err, asyncio.Event(), 0
        self.kv = SimpleNamespace(Range=self._range)

    async def _range(self, req: Any, timeout: float) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise self.err
        self.asked_again.set()
        await asyncio.Event().wait()

    async def rpc(self, fn: Any) -> Any:
        return await fn()


def test_the_campaign_logs_a_failure_as_one_line_with_the_flags_to_check() -> None:
    client = _Refusing(_rpc_error(grpc.StatusCode.UNKNOWN, "Tls handshake failed (TSI_PROTOCOL_FAILURE):\n"
                                  "SSL_ERROR_SSL: CERTIFICATE_VERIFY_FAILED"))
    lead = Leadership(client, "a:1", ttl_s=2)  # type: ignore[arg-type]

    async def go() -> None:
        task = asyncio.create_task(lead.campaign())
        await client.asked_again.wait()  # it logged the first failure and tried again
        task.cancel()

    with capture_logs() as logs:
        asyncio.run(go())
    retry = [e for e in logs if e["event"] == "campaign_retry"]
    assert len(retry) == 1 and retry[0]["code"] == "UNKNOWN" and retry[0]["hint"] == TLS_HINT
    assert "\n" not in retry[0]["error"] and "AioRpcError" not in retry[0]["error"]
