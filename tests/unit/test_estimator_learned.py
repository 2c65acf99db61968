"""The estimator's learned state is bounded: fitted models and measured Cells keep the most recently
used entries, in memory and on disk alike; the Cell estimator's per-model caches start over past
MAX_CACHED_MODELS models; a FitPerformance request and a model key have a size limit.

Before, every distinct model key a caller sent stayed in memory and in the state database for good
(417 keys took the service from 78 to 92 MB), and one FitPerformance with 20,000 samples took 80 s
of CPU."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tessera.estimator import cells as cells_mod
from tessera.estimator import perf_model as pm
from tessera.estimator.cells import CellEstimator, CellModel, ClusterSpec, GpuPool
from tessera.estimator.plans import PlanInputError
from tessera.estimator.service.handlers import MAX_FIT_SAMPLES, Estimator
from tessera.estimator.service.learned import FittedModel, Learned
from tessera.estimator.service.state import EstimatorState
from tessera.v1 import common_pb2 as c
from tessera.v1 import estimator_pb2 as pb

MODEL = FittedModel(pm.DEFAULT_PARAMS, "tessera", pm.DEFAULT_ENV)
WORKLOAD = pb.PerfWorkload(name="gpt-1.3b", params=1.3e9, layers=24, hidden=2048, seq=1024, global_batch=64,
                           fwd_ref_time=0.06)
CONFIG = pb.PerfRunConfig(workload=WORKLOAD, plan=pb.PerfPlan(dp=4, tp=1, pp=1, ga_steps=1, micro_batches=1),
                          gpus_per_node=[4])
SMALL = c.ModelSpec(hidden_size=128, num_layers=4, num_heads=4, vocab_size=512, seq_length=64)


def test_fitted_models_keep_the_most_recently_used(tmp_path: Path) -> None:
    state = EstimatorState(tmp_path / "s.db")
    learned = Learned(state, max_fitted=2)
    learned.put_fitted(("a", ""), MODEL)
    learned.put_fitted(("b", ""), MODEL)
    assert learned.fitted(("a", "")) is MODEL  # a used: b is now the oldest
    learned.put_fitted(("c", ""), MODEL)
    assert [learned.fitted((k, "")) is not None for k in "abc"] == [True, False, True]
    assert learned.num_fitted() == 2
    state.close()
    # The database dropped b too: a restart brings back exactly a and c.
    again = Learned(EstimatorState(tmp_path / "s.db"), max_fitted=2)
    assert [again.fitted((k, "")) is not None for k in "abc"] == [True, False, True]


def test_measurements_report_what_they_drop_and_a_restart_keeps_the_newest(tmp_path: Path) -> None:
    state = EstimatorState(tmp_path / "s.db")
    learned = Learned(state, max_measured=3)
    keys = [(f"sig{i}", "A100-80GB", 4, 1) for i in range(5)]
    dropped = [learned.put_measured(k, 0.5 + i) for i, k in enumerate(keys)]
    assert dropped == [[], [], [], [keys[0]], [keys[1]]]
    assert learned.put_measured(keys[2], 9.0) == []  # rewritten: the newest now
    state.close()
    # Reopened under a tighter bound: the newest writes stay, the rest leave the database too.
    smaller = Learned(EstimatorState(tmp_path / "s.db"), max_measured=2)
    assert smaller.measured() == [(keys[4], 4.5), (keys[2], 9.0)]
    assert Learned(EstimatorState(tmp_path / "s.db"), max_measured=10).measured() == [(keys[4], 4.5), (keys[2], 9.0)]


def _report(model_key: str, seconds: float) -> pb.ReportStepTimesRequest:
    return pb.ReportStepTimesRequest(job_id="j", model_key=model_key, gpu_type="A100", config=CONFIG,
                                     steps=[pb.StepTime(seconds=seconds, time=1.0)], model=SMALL,
                                     global_batch_size=16)


def test_a_dropped_measurement_is_forgotten_by_the_cell_estimators_too() -> None:
    est = Estimator(max_measured=1)
    cells_req = pb.GetCellsRequest(model=SMALL, global_batch_size=16, cluster=pb.ClusterSpec(
        pools=[pb.GpuPool(gpu="A100-80GB", num_gpus=4, gpus_per_node=4)]))

    def four() -> pb.CellEstimate:
        return next(x for x in est.get_cells(cells_req).cells if (x.num_gpus, x.num_stages) == (4, 1))

    formula = four().iter_time_seconds
    est.report_step_times(_report("small", 0.5))
    assert (four().iter_time_seconds.value, four().iter_time_seconds.source) == (0.5, "measured")
    # Another Cell's measurement (2 stages) pushes it out: the 4-GPU Cell is estimated again.
    other = pb.PerfRunConfig(workload=WORKLOAD, plan=pb.PerfPlan(dp=2, tp=1, pp=2, ga_steps=1, micro_batches=4),
                             gpus_per_node=[4])
    req = _report("small", 0.7)
    req.config.CopyFrom(other)
    est.report_step_times(req)
    assert four().iter_time_seconds == formula
    assert est.health().fitted_models == 1


def test_the_controllers_cells_never_wait_for_another_callers_computation() -> None:
    """One GetCells within the bounds ran a minute under its estimator's lock, and the controller's
    GetCells and ReportStepTimes of the same configuration waited for it (an audit of 2026-11-27). The
    controller's calls have estimators of their own, and a measurement drops another caller's busy
    estimator (rebuilt, with it, by that caller's next call) instead of waiting for it."""
    est = Estimator()
    req = pb.GetCellsRequest(model=SMALL, global_batch_size=16, cluster=pb.ClusterSpec(
        pools=[pb.GpuPool(gpu="A100-80GB", num_gpus=4, gpus_per_node=4)]))
    est.get_cells(req, controller=False)
    config = next(c for ctl, c in est._cell_estimators if not ctl)
    busy, lock = est._cell_estimator(config, False)
    with lock:  # another caller's computation in progress
        done = threading.Event()

        def controller_calls() -> None:
            est.get_cells(pb.GetCellsRequest(model=SMALL, global_batch_size=32, cluster=req.cluster), controller=True)
            est.report_step_times(_report("small", 0.5))
            done.set()

        threading.Thread(target=controller_calls, daemon=True).start()
        assert done.wait(30)
    assert est._cell_estimator(config, False)[0] is not busy  # dropped, then built again
    four = next(x for x in est.get_cells(req, controller=False).cells if (x.num_gpus, x.num_stages) == (4, 1))
    assert (four.iter_time_seconds.value, four.iter_time_seconds.source) == (0.5, "measured")


def test_another_callers_cells_have_a_time_bound_and_the_controllers_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """The largest model on 8 pools ran a minute of the service for one caller: past
    OTHER_CALLER_CELLS_S a caller other than the controller gets RESOURCE_EXHAUSTED."""
    from tessera.common.errors import ResourceExhausted
    from tessera.estimator.service import handlers

    monkeypatch.setattr(handlers, "OTHER_CALLER_CELLS_S", -1.0)  # past the deadline before the first Cell
    est = Estimator()
    req = pb.GetCellsRequest(model=SMALL, global_batch_size=16, cluster=pb.ClusterSpec(
        pools=[pb.GpuPool(gpu="A100-80GB", num_gpus=4, gpus_per_node=4)]))
    with pytest.raises(ResourceExhausted, match="these Cells take over -1 s of the service, a bound on callers "
                                                "other than the controller; 0 were computed and kept"):
        est.get_cells(req, controller=False)
    assert est.get_cells(req, controller=True).cells


def test_fit_performance_refuses_too_many_samples_and_long_keys() -> None:
    est = Estimator()
    sample = pb.PerfSample(config=CONFIG, iter_time=0.3)
    with pytest.raises(PlanInputError) as err:
        est.fit_performance(pb.FitPerformanceRequest(model_key="m", samples=[sample] * (MAX_FIT_SAMPLES + 1)))
    assert (err.value.field, err.value.reason) == ("samples", "at most 4,096 samples, got 4,097")
    with pytest.raises(PlanInputError) as err:
        est.fit_performance(pb.FitPerformanceRequest(model_key="k" * 1025, samples=[sample]))
    assert (err.value.field, err.value.reason) == ("model_key", "at most 1024 characters, got 1,025")
    with pytest.raises(PlanInputError) as err:
        est.report_step_times(_report("k" * 5000, 0.5))
    assert err.value.field == "model_key"
    assert est.health().fitted_models == 0  # nothing kept of the refused requests


def test_cell_estimator_caches_start_over_past_their_model_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cells_mod, "MAX_CACHED_MODELS", 2)
    est = CellEstimator()
    cluster = ClusterSpec((GpuPool("A100-80GB", 4, 4),))
    models = [CellModel("gpt", 128, n, 4, 512, 64, global_batch=16) for n in (2, 3, 4)]
    first = est.cells(models[0], cluster)
    est.cells(models[1], cluster)
    assert {k[0] for k in est._cell_cache} == {models[0].signature, models[1].signature}
    est.record_measured(models[0].signature, "A100-80GB", 4, 1, 0.5)
    est.cells(models[2], cluster)  # the third model: the caches start over with it alone
    assert set(est._ops) == {models[2].signature}
    assert {k[0] for k in est._cell_cache} == {models[2].signature}
    again = {(x.num_gpus, x.num_stages): x for x in est.cells(models[0], cluster)}
    assert again[(4, 1)].iter_time.value == 0.5  # a measurement is not a cache: it stays
    assert [x for x in again.values() if (x.num_gpus, x.num_stages) != (4, 1)] == \
        [x for x in first if (x.num_gpus, x.num_stages) != (4, 1)]


def test_cell_estimator_caches_start_over_past_their_entry_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """One model on pool after pool of other shapes: the entries are bounded too, not only the models."""
    monkeypatch.setattr(cells_mod, "MAX_CACHED_ENTRIES", 5)
    est = CellEstimator()
    model = CellModel("gpt", 128, 2, 4, 512, 64, global_batch=16)
    for nic in (10.0, 20.0, 30.0, 40.0):
        est.cells(model, ClusterSpec((GpuPool("A100-80GB", 8, 4, nic_gbps=nic),)))
        assert len(est._cell_cache) <= 5 and len(est._stage_cache) <= 5
