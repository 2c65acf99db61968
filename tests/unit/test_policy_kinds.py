"""Typed decisions: every pending decision carries a kind, the kind agrees with the reason text the
users read, and `finalize` refuses a plan that breaks the contract in the Policy docstring."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from tessera.controller.core.estimates import TableEstimates
from tessera.controller.core.policies import make_policy, policy_names
from tessera.controller.core.policy import RoundContext, RoundPlanError, plan_round
from tessera.controller.core.snapshot import (
    Action,
    Cell,
    Change,
    Decision,
    GpuView,
    JobView,
    NodeView,
    PendingKind,
    RunningView,
    Slice,
    Snapshot,
)
from tessera.estimator.models import ModelDims

GB = 1000**3
M = ModelDims(64, 2, 4, 256, 64, "m")
POLICIES = Path(__file__).resolve().parents[2] / "controller" / "core" / "policies"
W, ROOM, NOWHERE = PendingKind.WAITING, PendingKind.NO_ROOM_NOW, PendingKind.FITS_NOWHERE


def node(nid: str, n: int, busy: tuple[int, ...] = ()) -> NodeView:
    return NodeView(nid, tuple(GpuView(i, "X", 40 * GB) for i in range(n)), frozenset(busy))


def job(jid: str, key: str, t: float, n: int) -> JobView:
    return JobView(jid, t, M, 100, n, (), "X", 1000, estimate_key=key)


# Job "R" runs on all of x0; x1 has one GPU free. NOWHERE has no estimate at all (it fits nowhere),
# BIG asks for 8 (no room now), SMALL asks for 1 behind BIG.
EST = TableEstimates({("r", "X", 4): 1.0, ("r", "X", 2): 1.5, ("r", "X", 1): 2.5, ("a", "X", 8): 0.8,
                      ("a", "X", 4): 1.0, ("a", "X", 2): 1.6, ("a", "X", 1): 3.0})


def snapshot(arrivals: tuple[str, ...] | None) -> Snapshot:
    running = RunningView(job("R", "r", 0, 4), Cell("X", 4), (Slice("x0", (0, 1, 2, 3)),))
    pending = (job("NOWHERE", "zz", 1, 2), job("BIG", "a", 2, 8), job("SMALL", "a", 3, 1))
    return Snapshot((node("x0", 4, (0, 1, 2, 3)), node("x1", 4, (0, 1, 2))), pending, (("X", 40 * GB, 8),),
                    running=(running,), arrivals=arrivals)


def kinds(name: str, mode: str, arrivals: tuple[str, ...] | None = None) -> dict[str, PendingKind | None]:
    plan = plan_round(snapshot(arrivals), EST, make_policy(name, mode))
    return {d.job_id: d.pending for d in plan.decisions if d.job_id != "R"}


@pytest.mark.parametrize("arrivals", [None, ()])
@pytest.mark.parametrize("mode", ["paper", "artifact"])
@pytest.mark.parametrize("name", policy_names())
def test_every_pending_decision_has_a_kind_that_agrees_with_its_reason(
        name: str, mode: str, arrivals: tuple[str, ...] | None) -> None:
    plan = plan_round(snapshot(arrivals), EST, make_policy(name, mode))
    pending = [d for d in plan.decisions if d.action is Action.PENDING]
    assert pending  # the scenario leaves someone waiting under every policy
    for d in plan.decisions:
        assert (d.pending is not None) == (d.action is Action.PENDING), d
        # The engine reads the kind where it used to search the text (frenzy's own reasons are
        # MARP's and say more, see controller/core/frenzy.py).
        if name != "frenzy":
            assert ("fits nowhere" in d.reason) == (d.pending is NOWHERE), d


@pytest.mark.parametrize(("name", "mode", "want"), [
    ("fcfs", "paper", {"NOWHERE": NOWHERE, "BIG": ROOM, "SMALL": W}),
    ("fcfs", "artifact", {"NOWHERE": None, "BIG": ROOM, "SMALL": W}),  # dropped
    ("crius", "paper", {"NOWHERE": NOWHERE, "BIG": ROOM, "SMALL": None}),  # SMALL starts
    ("gandiva", "artifact", {"NOWHERE": NOWHERE, "BIG": ROOM, "SMALL": W}),
    ("gavel", "paper", {"NOWHERE": NOWHERE, "BIG": ROOM, "SMALL": None}),
    ("gavel", "artifact", {"NOWHERE": None, "BIG": ROOM, "SMALL": None}),
    ("sia", "paper", {"NOWHERE": NOWHERE, "BIG": None, "SMALL": ROOM}),
    ("sia", "artifact", {"NOWHERE": None, "BIG": ROOM, "SMALL": ROOM}),
    ("elasticflow-l", "paper", {"NOWHERE": None, "BIG": None, "SMALL": ROOM}),
    ("elasticflow-l", "artifact", {"NOWHERE": ROOM, "BIG": ROOM, "SMALL": ROOM}),
    ("frenzy", "paper", {"NOWHERE": ROOM, "BIG": ROOM, "SMALL": None}),  # MARP memory fits
    ("morphling", "paper", {"NOWHERE": NOWHERE, "BIG": None, "SMALL": ROOM}),  # BIG's slope is higher
])
def test_pending_kinds_per_policy(name: str, mode: str, want: dict[str, PendingKind | None]) -> None:
    assert kinds(name, mode) == want


def test_a_job_the_policy_does_not_reach_waits() -> None:
    # Artifact mode retries waiting jobs only after departures: none here, so nobody is decided.
    assert set(kinds("crius", "artifact", arrivals=()).values()) == {W}
    assert set(kinds("fcfs", "artifact", arrivals=()).values()) == {W}


def _pend_calls() -> list[tuple[str, int, str, str]]:
    """(file, line, kind, reason source) of every `.pend(job, kind, reason)` in the policies."""
    out = []
    for path in sorted(POLICIES.glob("*.py")):
        for call in ast.walk(ast.parse(path.read_text())):
            func = call.func if isinstance(call, ast.Call) else None
            if isinstance(call, ast.Call) and isinstance(func, ast.Attribute) and func.attr == "pend":
                assert len(call.args) == 3, f"{path.name}:{call.lineno}: pend(job, kind, reason)"
                kind = call.args[1]
                name = kind.attr if isinstance(kind, ast.Attribute) else ast.unparse(kind)
                out.append((path.name, call.lineno, name, ast.unparse(call.args[2])))
    return out


def test_every_pend_site_names_its_kind_and_fits_nowhere_texts_say_fits_nowhere() -> None:
    calls = _pend_calls()
    assert len(calls) >= 25  # all the policies' call sites were found
    for where, line, kind, reason in calls:
        if where == "common.py":
            continue  # Board.suspend passes its caller's kind on
        assert kind in PendingKind.__members__, f"{where}:{line}: kind {kind}"
        if "'" in reason or '"' in reason:  # a literal text (not a reason computed elsewhere)
            assert ("fits nowhere" in reason) == (kind == "FITS_NOWHERE"), f"{where}:{line}"
    nowhere = [c for c in calls if c[2] == "FITS_NOWHERE"]
    assert len(nowhere) == 9, nowhere  # fcfs: one site for every cause (why_not.py); gavel paper: no count


class _Fixed:
    name = "fixed"

    def __init__(self, decisions: list[Decision]) -> None:
        self.decisions = decisions

    def plan(self, ctx: RoundContext) -> list[Decision]:
        return self.decisions


def test_finalize_refuses_a_pending_decision_without_a_kind_and_a_kind_elsewhere() -> None:
    snap = Snapshot((node("a", 2),), (job("p", "a", 0, 1),))
    with pytest.raises(RoundPlanError, match="pending of p without a pending kind"):
        plan_round(snap, EST, _Fixed([Decision("p", Action.PENDING, "no room")]))
    start = Decision("p", Action.START, "", slices=(Slice("a", (0,)),), cell=Cell("X", 1), pending=ROOM)
    with pytest.raises(RoundPlanError, match="start of p with pending kind no_room_now"):
        plan_round(snap, EST, _Fixed([start]))
    with pytest.raises(RoundPlanError, match="drop of p with pending kind"):
        plan_round(snap, EST, _Fixed([Decision("p", Action.DROP, "", pending=NOWHERE)]))
    ok = plan_round(snap, EST, _Fixed([Decision("p", Action.PENDING, "no room", pending=ROOM)]))
    assert ok.decisions[0].pending is ROOM


def from_strings(job_id: str, action: str, change: str = "", pending: str | None = None) -> Decision:
    """A decision as an untyped caller (the engine today, a JSON reader) builds it."""
    fields: dict[str, Any] = {"action": action, "change": change, "pending": pending}
    return Decision(job_id, reason="", **fields)


def test_decisions_keep_their_plain_strings_and_refuse_unknown_ones() -> None:
    d = from_strings("j", "migrate", change="scale-up")
    assert d.action is Action.MIGRATE and d.change is Change.SCALE_UP and d.pending is None
    assert [d.action, d.change] == ["migrate", "scale-up"] and f"{d.action} {d.change}" == "migrate scale-up"
    assert from_strings("j", "pending", pending="fits_nowhere").pending is NOWHERE
    with pytest.raises(ValueError, match="strat"):
        from_strings("j", "strat")
    with pytest.raises(ValueError, match="grow"):
        from_strings("j", "migrate", change="grow")


def test_the_round_refuses_a_placement_on_a_type_the_job_does_not_name() -> None:
    # (gavel, elasticflow and sia once did so: the plan check now catches any policy that does.)
    snap = Snapshot((node("a", 2),), (JobView("p", 0.0, M, 100, 1, ("Y",), "Y", 1000, estimate_key="a"),))
    start = Decision("p", Action.START, "", slices=(Slice("a", (0,)),), cell=Cell("X", 1))
    with pytest.raises(RoundPlanError, match="p placed on X; it names Y"):
        plan_round(snap, EST, _Fixed([start]))
    snap = Snapshot((node("a", 2),), (JobView("p", 0.0, M, 100, 1, ("X", "Y"), "X", 1000, estimate_key="a"),))
    assert [d.action for d in plan_round(snap, EST, _Fixed([start])).decisions] == [Action.START]
