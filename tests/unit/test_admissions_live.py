"""The live controller's record of admissions (controller/snapshots.py Admissions): a guaranteed
job's SLA clock starts the round it is first admitted, and the views of later rounds carry it."""

from __future__ import annotations

import dataclasses

from tessera.controller.core.snapshot import Cell, JobView, Priority, Promise, RunningView, Slice, Snapshot
from tessera.controller.snapshots import Admissions
from tessera.estimator.models import registered


def job(job_id: str) -> JobView:
    return JobView(job_id, 0.0, registered("gpt2-small"), 8, 1, tenant="a", priority=Priority.GUARANTEED,
                   promise=Promise(1))


def test_first_admission_sets_the_clock_and_later_rounds_keep_it() -> None:
    adm = Admissions()
    first = Snapshot((), (job("g1"), job("g2")), now=100.0)
    assert adm.apply(first) is first  # nothing recorded yet
    adm.record(["g1"], first)
    later = Snapshot((), (job("g1"), job("g2")), now=400.0)
    adm.record(["g1", "g2"], later)  # g1 again: its clock stays at its first admission
    views = {j.id: j.admitted_at for j in adm.apply(later).pending}
    assert views == {"g1": 100.0, "g2": 400.0}


def test_jobs_that_left_are_forgotten() -> None:
    adm = Admissions()
    adm.record(["g1"], Snapshot((), (job("g1"),), now=5.0))
    adm.record([], Snapshot((), (job("g2"),), now=10.0))  # g1 ended
    assert adm.at == {}


def test_a_job_first_seen_admitted_while_it_runs_counts_from_its_submission() -> None:
    # After a restart (or a failover) the record is empty while the job runs on: its SLA clock is its
    # submission, never the round that saw it first (that would owe it less progress than its promise).
    ran = dataclasses.replace(job("g1"), submit_time=40.0)
    running = RunningView(ran, Cell("A100-80GB", 1, 1), (Slice("n1", (0,)),))
    adm = Admissions()
    snap = Snapshot((), (job("g2"),), running=(running,), now=900.0)
    adm.record(["g1", "g2"], snap)
    assert adm.at == {"g1": 40.0, "g2": 900.0}
