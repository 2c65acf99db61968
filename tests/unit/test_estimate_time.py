"""EstimateTime (estimator/service/time_handler.py) and `tessctl estimate time` in-process: the
request read as EstimateMemory reads it, handed to the plan-time function (a local fake here, to
see exactly what it is given, and the real tessera.estimator.plan_time), the answer mapped field by field."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from tessera.clients import tessctl
from tessera.estimator.convert import model_spec, plan_message
from tessera.estimator.errors import PlanInputError
from tessera.estimator.memory import estimate_memory
from tessera.estimator.models import ModelDims
from tessera.estimator.plan_time import PlanTime, estimate_plan_time
from tessera.estimator.plans import ExecutionPlan
from tessera.estimator.service.handlers import Estimator
from tessera.estimator.service.time_handler import estimate_time
from tessera.v1 import estimator_pb2 as pb
from tests.procs import REPO

MEDIUM = str(REPO / "examples" / "jobs" / "medium.yaml")
DIMS = ModelDims(1024, 8, 16, 32000, 1024, name="t")


def _plan(**kw: Any) -> Any:
    """The plan message with grad_accum unset (derived from the global batch)."""
    m = plan_message(ExecutionPlan(**kw))
    m.grad_accum = 0
    return m


def _req(**kw: Any) -> pb.EstimateTimeRequest:
    base: dict[str, Any] = {"model": model_spec(DIMS), "plan": _plan(dp=2, tp=2, micro_batch=2),
                            "gpu": "h100", "num_gpus": 4, "global_batch_size": 16}
    base.update(kw)
    return pb.EstimateTimeRequest(**base)


def test_the_request_reaches_the_plan_timer_as_estimate_memory_reads_it() -> None:
    seen: list[tuple[ModelDims, ExecutionPlan, str, int | None]] = []

    def fake(model: ModelDims, plan: ExecutionPlan, gpu: str, *, gpus_per_node: int | None = None) -> PlanTime:
        seen.append((model, plan, gpu, gpus_per_node))
        return PlanTime(2.0, {"compute": 1.5, "dp_comm": 0.5}, "fake:source", 8192.0)

    est = Estimator()
    resp = estimate_time(_req(gpus_per_node=2), est.estimate_memory, fake)
    (model, plan, gpu, per_node), = seen
    assert model.signature == DIMS.signature and gpu == "H100-80GB" and per_node == 2
    assert (plan.dp, plan.tp, plan.micro_batch, plan.grad_accum) == (2, 2, 2, 4)  # grad_accum from the batch
    assert (resp.iter_time_seconds, resp.source, resp.tokens_per_second) == (2.0, "fake:source", 8192.0)
    assert [(c.name, c.seconds, c.source) for c in resp.breakdown] == [("compute", 1.5, "fake:source"),
                                                                      ("dp_comm", 0.5, "fake:source")]
    mem = estimate_memory(DIMS, plan, gpu="H100-80GB")
    assert (resp.memory.total, resp.memory.capacity, resp.memory.fits) == (mem.total, 80_000_000_000, True)
    assert (resp.gpu, resp.num_gpus, resp.gpus_per_node, resp.model_signature) == ("H100-80GB", 4, 2, DIMS.signature)
    # no node size given: the timer gets None (its default) and the answer says what was used
    assert estimate_time(_req(), est.estimate_memory, fake).gpus_per_node == 4 and seen[-1][3] is None


@pytest.mark.parametrize(("kw", "field"), [
    ({"gpu": ""}, "gpu"), ({"gpus_per_node": -1}, "gpus_per_node"), ({"gpu": "Z9000"}, "gpu"),
    ({"num_gpus": 8}, "num_gpus"), ({"plan": _plan(tp=32), "num_gpus": 32}, "plan.tp"),
    ({"global_batch_size": 15}, "plan.grad_accum"), ({"gpus_per_node": 3}, "gpus_per_node"),
])
def test_bad_requests_name_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(PlanInputError) as err:
        Estimator().estimate_time(_req(**kw))
    assert err.value.field == field


def test_the_real_time_model_answers_and_its_breakdown_adds_up() -> None:
    resp = Estimator().estimate_time(_req())
    lib = estimate_plan_time(DIMS, ExecutionPlan(dp=2, tp=2, micro_batch=2, grad_accum=4), "H100-80GB")
    assert resp.iter_time_seconds == pytest.approx(lib.iter_time) and resp.iter_time_seconds > 0
    assert sum(c.seconds for c in resp.breakdown) == pytest.approx(resp.iter_time_seconds)
    assert resp.tokens_per_second == pytest.approx(16 * 1024 / resp.iter_time_seconds)


def _main(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    try:
        rc = tessctl.main(list(args), out=out)
    except SystemExit as exc:
        rc = int(exc.code or 0)
    return rc, out.getvalue()


def test_tessctl_estimate_time_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _main("estimate", "time", "-f", MEDIUM, "--gpu", "h100", "--plan", "dp=2,tp=2,micro_batch=2", "--gpus",
                    "4", "-o", "json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["plan"]["dp"] == 2 and doc["plan"]["grad_accum"] == 2 and doc["gpu"] == "H100-80GB"
    assert doc["iter_time_seconds"] > 0 and doc["memory"]["fits"] is True and doc["num_gpus"] == 4
    assert {c["name"] for c in doc["breakdown"]} >= {"compute", "tp_comm", "dp_comm", "optimizer"}
    rc, out = _main("estimate", "time", "-f", MEDIUM, "--gpu", "h100", "--plan", "dp=2,tp=2,micro_batch=2")
    lines = out.splitlines()
    assert rc == 0 and lines[2] == "GPU:       H100-80GB x 4 (4 per node)" and lines[4].startswith("Iteration: ")
    assert any(line.startswith("Memory:    ") and "(fits: yes)" in line for line in lines)
    capsys.readouterr()
    rc, out = _main("estimate", "time", "-f", MEDIUM, "--gpu", "h100", "--plan", "dp=4", "--gpus-per-node", "3")
    err = capsys.readouterr().err
    assert (rc, out) == (1, "") and err == ("tessctl: error: INVALID_ARGUMENT: gpus_per_node: the plan's 4 GPUs do "
                                            "not fill whole nodes of 3\n")


def test_the_memory_line_prints_the_figure_its_verdict_judges() -> None:
    """`fits` is reserved + other <= capacity; the line printed the tensors alone beside it
    ("44.26 of 80.00 GB (fits: yes)" where `estimate memory` says 52.34)."""
    from tessera.clients.estimate_time import time_table
    from tessera.v1 import estimator_pb2

    resp = estimator_pb2.EstimateTimeResponse(iter_time_seconds=1.0)
    resp.memory.total, resp.memory.reserved, resp.memory.other = 44_260_000_000, 51_270_000_000, 1_070_000_000
    resp.memory.capacity, resp.memory.fits = 80_000_000_000, True
    (line,) = [x for x in time_table("j", resp).splitlines() if x.startswith("Memory:")]
    assert line == ("Memory:    52.34 of 80.00 GB: reserved + other on the most loaded GPU, 44.26 of it tensors (fits: yes); "
                    "`tessctl estimate memory` for the categories")
