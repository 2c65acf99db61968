"""The churn guard in the live controller (controller/core/churn.py; docs/tenants.md, "Churn guard"):
the engine's ledger of preemptor starts, churn events and cool-offs, fed from the store.

The ledger is stored (`Store.put_meta("churn", ...)`, one small JSON document, written after a
round that changed it), so a controller restart or a failover to a standby keeps it: before, it
was forgotten, and a churning tenant got `limit` more events each time. One that cannot be read is
logged and the guard starts afresh; one that cannot be written is logged and tried again after
the next round.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from tessera.controller.core.churn import ChurnConfig, Ledger, Seen, after_round, demote, dump, load, note
from tessera.controller.core.snapshot import RoundPlan, Snapshot
from tessera.controller.store import TERMINAL, JobRecord, Store

KEY = "churn"
from tessera.v1 import common_pb2

log = structlog.get_logger("controller")


def seen(rec: JobRecord | None) -> Seen | None:
    """What the ledger needs of a stored job: when it ended, whether it is pending, whether it succeeded."""
    if rec is None:
        return None
    return Seen(rec.end_time if rec.state in TERMINAL else None, rec.state == common_pb2.JOB_STATE_PENDING,
                rec.state == common_pb2.JOB_STATE_SUCCEEDED)


class ChurnGuard:
    """`apply` before a round's policy (the jobs it tracks read again from the store, the pending
    guaranteed jobs of cooling tenants shown as best-effort), `after_round` after it."""

    def __init__(self, cfg: ChurnConfig, store: Store | None = None) -> None:
        self.ledger = Ledger(cfg)
        self._notes: dict[str, str] = {}
        self._store = store
        self._saved = dump(self.ledger)
        text = None
        try:
            text = store.get_meta(KEY) if store is not None else None
            if text is not None:
                self.ledger, self._saved = load(cfg, text), text
        except Exception as exc:  # noqa: BLE001 - an unreadable ledger costs its memory, not the controller
            log.warning("churn_ledger_unreadable", error=str(exc)[:200], stored=(text or "")[:200])

    def apply(self, snap: Snapshot, lookup: Callable[[str], JobRecord | None]) -> Snapshot:
        self._notes = {}
        if not snap.tenants or not self.ledger.cfg.enabled:
            return snap
        before = dict(self.ledger.cooling_off)
        self.ledger.observe({j: seen(lookup(j)) for j in self.ledger.watched()}, snap.now)
        for tenant, c in self.ledger.cooling_off.items():
            if before.get(tenant) != c:
                log.warning("tenant_cooling_off", tenant=tenant, until=c.until, events=c.events, last_event=c.last)
        snap, self._notes = demote(snap, self.ledger)
        return snap

    def after_round(self, plan: RoundPlan, snap: Snapshot, wake_at: Callable[[float], None]) -> RoundPlan:
        """The round's starts recorded; the plan with the demoted jobs' reasons saying why. `wake_at`
        gets each cool-off's end: a round then, not up to a round interval later, lets its tenant's
        guaranteed jobs preempt again."""
        for c in self.ledger.cooling_off.values():
            wake_at(c.until)
        out = after_round(self.ledger, plan, snap, self._notes)
        self._save()
        return out

    def _save(self) -> None:
        text = dump(self.ledger)
        if self._store is None or text == self._saved:
            return
        try:
            self._store.put_meta(KEY, text)
        except Exception as exc:  # noqa: BLE001 - the next round writes it again
            log.warning("churn_ledger_not_saved", error=str(exc)[:200])
            return
        self._saved = text

    def cooling(self, tenant: str, now: float) -> tuple[float, str]:
        """Until when the tenant may not preempt, and why (ListTenants); (0.0, "") when it may."""
        c = self.ledger.cooling(tenant, now)
        return (c.until, note(c, self.ledger.cfg)) if c is not None else (0.0, "")
