"""Encoder-decoder jobs in the live controller: a T5 job gets Cells (estimator/cell_encdec.py) and the
Crius policy places it; a T5 recipe the Cells cannot express waits naming the field."""

from __future__ import annotations

from tessera.v1 import common_pb2 as P
from tests.unit.test_engine import Harness


def _flan_large(name: str, plan: P.ExecutionPlan | None = None) -> P.JobSpec:
    spec = P.JobSpec(name=name, model=P.ModelSpec(name="flan-t5-large"), global_batch_size=16, iterations=10,
                     checkpoint_every=5)
    if plan is not None:
        spec.plan.CopyFrom(plan)
    return spec


async def test_a_flan_t5_large_job_is_placed_by_its_cells() -> None:
    # one node of 4 x A10 24 GB: 783 M parameters at 16 B each fit with room for the activations
    h = Harness(policy="crius", nodes=("a",))
    await h.register("a")
    jid = await h.submit(_flan_large("t5"))
    await h.round()
    assert h.state(jid) == "STARTING", h.job(jid).reason
    plan = h.job(jid).plan
    assert plan.dp * plan.tp * plan.pp >= 1 and plan.memory_source.startswith("formula:cells")
    assert 0 < plan.memory_per_gpu_bytes < 24 << 30


async def test_a_t5_recipe_the_cells_cannot_express_waits_naming_the_field() -> None:
    h = Harness(policy="crius", nodes=("a",))
    await h.register("a")
    jid = await h.submit(_flan_large("lora", P.ExecutionPlan(lora_rank=8)))
    await h.round()
    assert h.state(jid) == "PENDING"
    assert "the Cells cannot estimate the job: plan.lora_rank" in h.job(jid).reason
