"""The job's recipe changes the live controller's placement: its Cells (controller/cell_estimates.py)
and memory checks are estimated with the job's plan (estimator/cell_recipe.py)."""

from __future__ import annotations

from tessera.v1 import common_pb2 as P
from tests.unit.test_engine import Harness


def _llama8b(name: str, plan: P.ExecutionPlan | None = None) -> P.JobSpec:
    spec = P.JobSpec(name=name, model=P.ModelSpec(name="llama3.1-8b"), global_batch_size=8, iterations=10,
                     checkpoint_every=5)
    if plan is not None:
        spec.plan.CopyFrom(plan)
    return spec


async def test_a_lora_job_is_placed_on_24gb_gpus_where_its_full_fine_tune_waits() -> None:
    # one node of 4 x A10 24 GB: Llama 3.1 8B's full fine-tune needs 16 B/param of model state
    # (128 GB) whatever the layout of 4 GPUs; with LoRA the base is 2-byte weights only (16 GB)
    h = Harness(policy="crius", nodes=("a",))
    await h.register("a")
    full = await h.submit(_llama8b("full"))
    lora = await h.submit(_llama8b("lora", P.ExecutionPlan(lora_rank=16)))
    await h.round()
    assert h.state(full) == "PENDING" and "fits nowhere" in h.job(full).reason
    assert h.state(lora) == "STARTING"
    plan = h.job(lora).plan
    assert plan.options.lora_rank == 16  # the recipe runs on top of the Cell's plan
    assert plan.memory_per_gpu_bytes < 24 << 30 and plan.memory_source.startswith("formula:cells")


async def test_a_recipe_the_cells_cannot_express_waits_naming_the_field() -> None:
    h = Harness(policy="crius", nodes=("a",))
    await h.register("a")
    jid = await h.submit(_llama8b("zero2", P.ExecutionPlan(lora_rank=16, sharding=P.SHARDING_ZERO2)))
    await h.round()
    assert h.state(jid) == "PENDING"
    assert "the Cells cannot estimate the job: plan.sharding" in h.job(jid).reason


def test_job_recipe_reads_the_fields_a_job_sets_and_refuses_a_stale_plan_by_name() -> None:
    from tessera.controller.cell_estimates import recipe_refusal
    from tessera.controller.core.snapshot import JobView
    from tessera.controller.snapshots import job_recipe
    from tessera.estimator.models import registered

    assert job_recipe(_llama8b("plain")) is None
    got = job_recipe(_llama8b("lora", P.ExecutionPlan(lora_rank=16, checkpointing=P.CHECKPOINTING_OP)))
    assert got is not None and got.given == {"lora_rank", "checkpointing"} and got.plan.checkpointing == "op"
    # a stored plan the vocabulary no longer takes ('selective' under flash attention): refused by name
    stale = job_recipe(_llama8b("old", P.ExecutionPlan(checkpointing=P.CHECKPOINTING_SELECTIVE)))
    assert stale is not None and stale.refused is not None and stale.refused[0] == "plan.checkpointing"
    dims = registered("llama3.1-8b")
    assert dims is not None
    assert recipe_refusal(JobView("j", 0.0, dims, 8, recipe=stale)).startswith("plan.checkpointing: ")
    assert recipe_refusal(JobView("j", 0.0, dims, 8, recipe=got)) == ""
