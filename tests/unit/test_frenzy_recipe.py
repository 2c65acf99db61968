"""Frenzy's memory check with a job's recipe: MARP for a job without one (unchanged), the memory
formula of the recipe on MARP's plan for a job with one, and the placement it changes."""

from __future__ import annotations

from tessera.controller.core.frenzy import FrenzyConfig, plan_bytes, plan_round, resource_plans
from tessera.controller.core.snapshot import JobView, PendingKind, Snapshot
from tessera.estimator.cell_recipe import JobRecipe
from tessera.estimator.memory import estimate_memory, marp_memory
from tessera.estimator.models import REGISTERED
from tessera.estimator.plans import ExecutionPlan
from tests.unit.test_frenzy_policy import cluster, node

GPT2 = REGISTERED["gpt2-medium"]


def _job(jid: str, **given: object) -> JobView:
    recipe = JobRecipe(ExecutionPlan(**given), frozenset(given)) if given else None  # type: ignore[arg-type]
    return JobView(jid, 0.0, GPT2, 16, recipe=recipe)


def test_a_job_without_a_recipe_keeps_marp() -> None:
    assert plan_bytes(_job("a"), 2, 1, 8) == (marp_memory(GPT2, 8, 1).total_bytes, "formula:marp")


def test_a_recipe_is_costed_by_the_memory_formula_on_marps_plan() -> None:
    full = plan_bytes(_job("a", checkpointing="full"), 2, 1, 8)
    want = estimate_memory(GPT2, ExecutionPlan(dp=2, micro_batch=8, precision="megatron-fp16",
                                               checkpointing="full"), other_bytes=0).total
    assert full == (want, "formula")
    none = plan_bytes(_job("b", checkpointing="none"), 2, 1, 8)
    assert none is not None and none[0] > want
    # a recipe the plan cannot take (quantized base under TP with FSDP) drops that plan only
    assert plan_bytes(_job("c", lora_rank=8, base_quant="nf4", sharding="fsdp"), 1, 2, 16) is None


def test_the_recipe_changes_frenzys_placement() -> None:
    # one 16 GB GPU: GPT-2 medium at batch 16 needs MARP's 20 B/param plus unrecomputed activations;
    # with full recomputation and bf16 Adam (8 B/param) it fits
    nodes = (node("n", "V100-16GB", 16, 1),)
    snap = Snapshot(now=0.0, nodes=nodes, pending=(_job("plain"), _job("lean", checkpointing="full",
                                                                         precision="bf16")),
                    cluster_gpus=cluster(*nodes))
    plans = {j.id: resource_plans(j, 1, FrenzyConfig())[0] for j in snap.pending}
    assert plans["lean"].bytes_per_gpu < plans["plain"].bytes_per_gpu
    decisions = {d.job_id: d for d in plan_round(snap).decisions}
    assert decisions["plain"].pending is PendingKind.FITS_NOWHERE and "MARP" in decisions["plain"].reason
    assert decisions["lean"].action == "start" and "recipe formula" in decisions["lean"].reason
    assert decisions["lean"].plan is not None and decisions["lean"].plan.memory_source == "formula"


def test_a_job_asking_for_types_the_cluster_lacks_is_told_so_not_a_memory_figure() -> None:
    nodes = (node("n", "A100-80GB", 80, 4),)
    tiny = JobView("t", 0.0, REGISTERED["gpt2-small"], 8, gpu_types=("H100-80GB",))
    snap = Snapshot(nodes=nodes, pending=(tiny,), cluster_gpus=cluster(*nodes))
    d = plan_round(snap).decisions[0]
    assert d.pending is PendingKind.FITS_NOWHERE
    assert d.reason == ("fits nowhere: no GPU of type H100-80GB in the cluster (it has 4 x A100-80GB (74.5 GiB)); "
                        "did you mean A100-80GB?")
