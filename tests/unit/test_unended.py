"""SubmitJob's caps on jobs not yet ended (controller/unended.py; docs/operations.md, "Limits"): the
pure rules, the store queries they ask (counted, never listed; the request id only at a cap), the
tenants file's per-tenant cap, the flags, the cap over all tenants (--max-unended-jobs-total), and
SubmitJob on an engine (no processes)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tessera.common.errors import Code, ResourceExhausted
from tessera.common.tokens import ADMIN, USER, Principal
from tessera.controller import unended
from tessera.controller.engine import Engine, EngineConfig
from tessera.controller.main import engine_config, parse_args
from tessera.controller.service import ControllerService
from tessera.controller.store import MemoryStore, SqliteStore, Store
from tessera.controller.tenantsfile import TenantsFileError, parse_tenants
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2 as C
from tests.fake_agent_calls import FakeAgents
from tests.unit.test_engine import tiny

FLAG = "the controller's --max-unended-jobs"


# ------------------------------------------------------------------ the rule


def test_within_the_cap_or_without_one_a_submit_goes_on() -> None:
    assert unended.refusal("team-a", 0, 3, FLAG) is None
    assert unended.refusal("team-a", 2, 3, FLAG) is None
    assert unended.refusal("team-a", 1_000_000, 0, FLAG) is None  # 0 = no cap


def test_at_or_over_the_cap_the_answer_names_tenant_count_cap_and_what_to_do() -> None:
    err = unended.refusal("team-a", 3, 3, FLAG)
    assert isinstance(err, ResourceExhausted) and err.code == Code.RESOURCE_EXHAUSTED
    assert str(err) == ("tenant team-a has 3 jobs not yet ended (pending or running), and may have at most 3 "
                        "(the controller's --max-unended-jobs): the job was not stored; cancel some of them or "
                        "wait for some to end, then submit it again")
    over = unended.refusal("team-a", 12_000, 10_000, "max_unended_jobs in the tenants file")
    assert over is not None and "has 12,000 jobs" in str(over) and "at most 10,000 (max_unended_jobs in the" in str(over)


def test_the_tenants_file_entry_wins_over_the_flag() -> None:
    cfg = parse_tenants({"tenants": {"team-a": {"max_unended_jobs": 5}, "team-b": {}, "team-c": {"max_unended_jobs": 0}}})
    assert unended.cap_of("team-a", 100, cfg) == (5, "max_unended_jobs in the tenants file")
    assert unended.cap_of("team-b", 100, cfg) == (100, FLAG)
    assert unended.cap_of("team-c", 100, cfg) == (0, "max_unended_jobs in the tenants file")  # none for team-c
    assert unended.cap_of("team-a", 100, None) == (100, FLAG)  # no tenants file


@dataclass
class View:
    """The two queries `check` may ask, recorded: `count` jobs of the tenant, `total` of all tenants."""

    count: int
    known: tuple[str, ...] = ()
    total: int = 0

    def __post_init__(self) -> None:
        self.asked: list[tuple[str, object]] = []

    def count_jobs(self, states: object = (), tenant: str = "") -> int:
        self.asked.append(("count", (frozenset(states), tenant)))  # type: ignore[arg-type]
        return self.count if tenant else self.total

    def has_request(self, key: str) -> bool:
        self.asked.append(("request", key))
        return key in self.known


def test_the_check_counts_the_tenants_unended_jobs_and_asks_for_the_request_id_only_at_the_cap() -> None:
    states = frozenset({P.JOB_STATE_PENDING, P.JOB_STATE_STARTING, P.JOB_STATE_RUNNING, P.JOB_STATE_MIGRATING})
    below = View(2)
    assert unended.check(below, "team-a", "r1", 3, None) is None  # type: ignore[arg-type]
    assert below.asked == [("count", (states, "team-a"))]
    at = View(3)
    err = unended.check(at, "team-a", "r1", 3, None)  # type: ignore[arg-type]
    assert err is not None and "tenant team-a has 3 jobs" in str(err)
    assert at.asked[1] == ("request", "team-a/r1")  # the store's key: tenant/request id
    retry = View(3, known=("team-a/r1",))
    assert unended.check(retry, "team-a", "r1", 3, None) is None  # type: ignore[arg-type]
    uncapped = View(10**9)
    assert unended.check(uncapped, "team-a", "r1", 0, None) is None and uncapped.asked == []  # type: ignore[arg-type]


TOTAL = ("the controller holds 5 jobs not yet ended (pending or running) over all tenants, and may hold at most 5 "
         "(the controller's --max-unended-jobs-total): the job was not stored; cancel some jobs or wait for some "
         "to end, then submit it again")


def test_the_total_cap_counts_every_tenant_and_names_total_cap_and_flag() -> None:
    assert unended.total_refusal(4, 5) is None and unended.total_refusal(10**9, 0) is None
    err = unended.total_refusal(5, 5)
    assert isinstance(err, ResourceExhausted) and str(err) == TOTAL
    assert "holds 1 job not yet" in str(unended.total_refusal(1, 1))
    assert "holds 120,000 jobs" in str(unended.total_refusal(120_000, 100_000))


def test_the_check_asks_the_total_after_the_tenants_own_cap_and_a_retry_still_passes() -> None:
    states = frozenset({P.JOB_STATE_PENDING, P.JOB_STATE_STARTING, P.JOB_STATE_RUNNING, P.JOB_STATE_MIGRATING})
    below = View(1, total=4)
    assert unended.check(below, "t7", "r1", 3, None, 5) is None  # type: ignore[arg-type]
    assert below.asked == [("count", (states, "t7")), ("count", (states, ""))]  # "" = every tenant
    full = View(1, total=5)
    assert str(unended.check(full, "t7", "r1", 3, None, 5)) == TOTAL  # type: ignore[arg-type]
    assert full.asked[-1] == ("request", "t7/r1")
    assert unended.check(View(1, known=("t7/r1",), total=5), "t7", "r1", 3, None, 5) is None  # type: ignore[arg-type]
    # the tenant's own cap speaks first; a tenant without one (0) is still under the total
    both = unended.check(View(3, total=5), "t7", "r1", 3, None, 5)  # type: ignore[arg-type]
    assert both is not None and str(both).startswith("tenant t7 has 3 jobs")
    assert str(unended.check(View(10**6, total=5), "t7", "r1", 0, None, 5)) == TOTAL  # type: ignore[arg-type]
    off = View(10**6, total=10**9)
    assert unended.check(off, "t7", "r1", 0, None, 0) is None and off.asked == []  # type: ignore[arg-type]


# ------------------------------------------------------------------ the tenants file and the flag


def test_the_tenants_file_takes_max_unended_jobs_and_refuses_a_bad_one() -> None:
    cfg = parse_tenants({"tenants": {"team-a": {"quota": {"A100-80GB": 2}, "max_unended_jobs": 50}, "team-b": None}})
    assert cfg.max_unended("team-a") == 50 and cfg.max_unended("team-b") is None
    assert cfg.get("team-a") is not None and cfg.get("team-a").gpus == (("A100-80GB", 2),)  # type: ignore[union-attr]
    for bad in (-1, True, "10", 1.5, 100_000_001):
        with pytest.raises(TenantsFileError) as ei:
            parse_tenants({"tenants": {"team-a": {"max_unended_jobs": bad}}})
        assert ei.value.field == "tenants.team-a.max_unended_jobs"
        assert "must be a number of jobs in 0..100,000,000 (0 = no cap)" in str(ei.value)


def _args(*argv: str) -> list[str]:
    return ["--insecure", "--state-dir", "/tmp/x", *argv]


def test_the_flag_reaches_the_engine_config_and_a_negative_one_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert engine_config(parse_args(_args()), Path("/tmp/x/ckpt")).max_unended_jobs == 10_000
    assert engine_config(parse_args(_args("--max-unended-jobs", "0")), Path("/tmp/x/ckpt")).max_unended_jobs == 0
    with pytest.raises(SystemExit) as exc:
        parse_args(_args("--max-unended-jobs", "-1"))
    assert exc.value.code == 2
    assert "--max-unended-jobs must be >= 0 (0 = no cap)" in capsys.readouterr().err
    assert engine_config(parse_args(_args()), Path("/tmp/x/ckpt")).max_unended_jobs_total == 100_000
    total = engine_config(parse_args(_args("--max-unended-jobs-total", "0")), Path("/tmp/x/ckpt"))
    assert total.max_unended_jobs_total == 0
    with pytest.raises(SystemExit) as exc:
        parse_args(_args("--max-unended-jobs-total", "-1"))
    assert exc.value.code == 2
    assert "--max-unended-jobs-total must be >= 0 (0 = no cap)" in capsys.readouterr().err


# ------------------------------------------------------------------ SubmitJob on an engine


@dataclass
class Context:
    principal: Principal


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "state.db")


async def test_submit_job_refuses_over_the_cap_and_stores_nothing(store: Store) -> None:
    engine = Engine(store, FakeAgents(store), EngineConfig(max_unended_jobs=2), store.next_epoch())  # type: ignore[arg-type]
    svc = ControllerService(engine)
    alice, bob = Context(Principal("alice", "team-a", USER)), Context(Principal("bob", "team-b", USER))

    async def submit(ctx: Context, rid: str) -> C.SubmitJobResponse:
        return await svc.SubmitJob(C.SubmitJobRequest(request_id=rid, spec=tiny(rid)), ctx)

    first = await submit(alice, "a1")
    await submit(alice, "a2")
    with pytest.raises(ResourceExhausted, match="tenant team-a has 2 jobs not yet ended .* at most 2 "):
        await submit(alice, "a3")
    assert len(store.list_jobs()) == 2 and not store.has_request("team-a/a3")
    again = await submit(alice, "a1")  # a retry at the cap: its job, not a refusal
    assert not again.created and again.job.id == first.job.id
    assert (await submit(bob, "b1")).created  # another tenant's cap is its own
    await engine.cancel(first.job.id)
    assert (await submit(alice, "a3")).created  # an ended job frees its place
    again = await submit(alice, "a1")  # a retry of an ended job, the tenant at its cap again
    assert not again.created and again.job.state == P.JOB_STATE_CANCELLED
    spec = tiny("x")
    spec.tenant = "team-a"  # an admin submitting for the tenant: the same cap
    with pytest.raises(ResourceExhausted, match="tenant team-a has 2 jobs"):
        await svc.SubmitJob(C.SubmitJobRequest(request_id="x", spec=spec), Context(Principal("ops", "default", ADMIN)))
    store.close()


async def test_rotating_free_form_tenants_stops_at_the_total_cap(store: Store) -> None:
    """No tenants file, an anonymous caller naming any spec.tenant: each tenant's cap of 1 is passed by
    naming a new tenant every time; the cap over all tenants is not (the audit's t0..t49 script)."""
    from tessera.common.tokens import ANONYMOUS

    config = EngineConfig(max_unended_jobs=1, max_unended_jobs_total=5)
    engine = Engine(store, FakeAgents(store), config, store.next_epoch())  # type: ignore[arg-type]
    svc = ControllerService(engine)
    made, refused = 0, []
    for i in range(50):
        spec = tiny(f"x{i}")
        spec.tenant = f"t{i}"
        try:
            made += (await svc.SubmitJob(C.SubmitJobRequest(request_id=f"r{i}", spec=spec), Context(ANONYMOUS))).created
        except ResourceExhausted as e:
            refused.append(str(e))
    assert made == 5 and len(store.list_jobs()) == 5 and len(refused) == 45
    assert refused[0].startswith("the controller holds 5 jobs not yet ended (pending or running) over all tenants, "
                                 "and may hold at most 5 (the controller's --max-unended-jobs-total)")
    spec = tiny("x0")
    spec.tenant = "t0"  # a retry of a stored job at the total cap: its job
    again = await svc.SubmitJob(C.SubmitJobRequest(request_id="r0", spec=spec), Context(ANONYMOUS))
    assert not again.created and again.job.spec.tenant == "t0"
    store.close()
