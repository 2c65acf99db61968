"""The reference trainer's LLaMA-style and Mixtral-style models under the plans it runs, as real processes
on CPU with gloo (forked ranks, as test_trainer_plans.py), against one process.

A gated dense model (4 heads sharing 2 kv heads, SwiGLU of width 48, q/k/v biases, untied head) follows
the one-process curve step by step within PLAN_RTOL on every plan, and across a migration (DP 2 ->
TP 2 x PP 2: each TP rank holds one kv head).

The MoE's balancing loss is a function of the tokens of one forward pass (f and P are means over a
micro-batch, as in Switch, Mixtral and Megatron-LM), so its gradient depends on how the global batch
is cut into micro-batches: the MoE plans here all cut it into the same micro-batches of 2 samples
(one process with accumulation 4, DP 2 with accumulation 2, TP 2, PP 2 with 4 pipeline micro-batches),
and then follow the one-process curve within PLAN_RTOL.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tessera.clients.trainer.reference.local import RankResult, launch, warm_forkserver

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BASE = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "vocab_size": 64, "seq_length": 16, "gated": True,
        "num_kv_heads": 2, "ffn_hidden": 48, "untied_embeddings": True}
DENSE = {"name": "tiny-llama", **BASE, "qkv_bias": True}
MOE = {"name": "tiny-mixtral", **BASE, "family": "MODEL_FAMILY_MOE", "num_experts": 4, "top_k": 2, "moe_every": 1,
       "dropless": True}
GLOBAL_BATCH = 8
STEPS = 4
MIGRATION_STEPS = 6
PLAN_RTOL = 1e-4
TIMEOUT = 300.0
STEP = re.compile(r"step iteration=(\d+)/\d+ loss=(\S+)")
PARAMS = re.compile(r"parameters local=(\d+) total=(\d+)")


def losses(out: str) -> dict[int, float]:
    return {int(m.group(1)): float(m.group(2)) for m in STEP.finditer(out)}


def run(model: dict[str, Any], plan: dict[str, Any], ckpt: Path, iterations: int,
        global_batch: int = GLOBAL_BATCH) -> list[RankResult]:
    results = launch(plan, model=model, checkpoint_dir=ckpt, iterations=iterations, global_batch=global_batch,
                     mode="fork", timeout=TIMEOUT, cwd=ckpt.parent)
    for r in results:
        assert r.rc == 0, f"rank {r.rank} exited {r.rc}:\n{r.out[-2000:]}\n{r.err[-4000:]}"
    return results


def assert_matches(curve: dict[int, float], ref: dict[int, float], steps: range) -> None:
    assert sorted(curve) == list(steps), curve
    for it in steps:
        assert curve[it] == pytest.approx(ref[it], rel=PLAN_RTOL), f"iteration {it}: {curve[it]} vs {ref[it]}"


def reference_curve(model: dict[str, Any], plan: dict[str, Any], tmp: Path) -> dict[int, float]:
    warm_forkserver()
    (single,) = run(model, plan, tmp / "ckpt", MIGRATION_STEPS)
    curve = losses(single.out)
    assert sorted(curve) == list(range(1, MIGRATION_STEPS + 1))
    assert curve[MIGRATION_STEPS] < curve[1] - 0.1, curve  # it learns (ln 64 = 4.16 at the start)
    return curve


@pytest.fixture(scope="module")
def dense_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    return reference_curve(DENSE, {"dp": 1, "micro_batch": 8}, tmp_path_factory.mktemp("dense"))


@pytest.fixture(scope="module")
def moe_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    return reference_curve(MOE, {"dp": 1, "micro_batch": 2, "grad_accum": 4}, tmp_path_factory.mktemp("moe"))


DENSE_PLANS: dict[str, dict[str, Any]] = {
    "dp2-ddp": {"dp": 2, "micro_batch": 4},
    "dp2-zero3": {"dp": 2, "micro_batch": 4, "zero_stage": 3},
    "tp2": {"dp": 1, "tp": 2, "micro_batch": 8},
    "pp2-1f1b": {"dp": 1, "pp": 2, "micro_batch": 2, "grad_accum": 4},
    "tp2-selective-checkpointing": {"dp": 1, "tp": 2, "micro_batch": 8, "checkpointing": "selective",
                                    "flash_attention": False},
}
MOE_PLANS: dict[str, dict[str, Any]] = {
    "dp2-ddp": {"dp": 2, "micro_batch": 2, "grad_accum": 2},
    "dp2-zero2": {"dp": 2, "micro_batch": 2, "grad_accum": 2, "zero_stage": 2},
    "dp2-zero3-full-checkpointing": {"dp": 2, "micro_batch": 2, "grad_accum": 2, "zero_stage": 3,
                                     "activation_checkpointing": "full"},
    "tp2": {"dp": 1, "tp": 2, "micro_batch": 2, "grad_accum": 4},
    "pp2-1f1b": {"dp": 1, "pp": 2, "micro_batch": 2, "grad_accum": 4},
    # the Cells' plan for a MoE on 2 GPUs (ep = dp): run with every expert on both ranks (it exited 3)
    "dp2-ep2-zero1": {"dp": 2, "micro_batch": 2, "grad_accum": 2, "zero_stage": 1, "ep": 2},
}


def _check_plan(model: dict[str, Any], plan: dict[str, Any], ref: dict[int, float], tmp_path: Path) -> None:
    results = run(model, plan, tmp_path / "ckpt", STEPS)
    totals = set()
    sharded = plan.get("tp", 1) > 1 or plan.get("pp", 1) > 1 or plan.get("zero_stage", 0) >= 1  # ZeRO-1 runs as ZeRO-2
    for r in results:
        assert " arch=llama-kv2-d8-f48-" in r.out, r.out[:600]
        assert_matches(losses(r.out), ref, range(1, STEPS + 1))
        local, total = map(int, PARAMS.search(r.out).groups())  # type: ignore[union-attr]
        assert (local < total) == sharded, (local, total)
        totals.add(total)
    assert len(totals) == 1


@pytest.mark.parametrize("name", list(DENSE_PLANS))
def test_gated_dense_plan_matches_one_process(name: str, dense_reference: dict[int, float], tmp_path: Path) -> None:
    _check_plan(DENSE, DENSE_PLANS[name], dense_reference, tmp_path)


@pytest.mark.parametrize("name", list(MOE_PLANS))
def test_moe_plan_matches_one_process(name: str, moe_reference: dict[int, float], tmp_path: Path) -> None:
    _check_plan(MOE, MOE_PLANS[name], moe_reference, tmp_path)


def _migrate(model: dict[str, Any], plans: list[tuple[dict[str, Any], int]], ref: dict[int, float],
             tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    curve: dict[int, float] = {}
    start = 0
    for plan, until in plans:
        out = run(model, plan, ckpt, until)[0].out
        assert ("fresh start" if start == 0 else f"resumed from step {start} ") in out, out[:800]
        curve.update(losses(out))
        start = until
    assert_matches(curve, ref, range(1, plans[-1][1] + 1))


def test_gated_checkpoint_reshards_from_dp2_to_tp2xpp2(dense_reference: dict[int, float], tmp_path: Path) -> None:
    """3 steps on DP 2, then 3 on TP 2 x PP 2 (each TP rank one kv head, the untied head on the last
    stage): the uninterrupted curve."""
    _migrate(DENSE, [({"dp": 2, "micro_batch": 4}, 3),
                     ({"dp": 1, "tp": 2, "pp": 2, "micro_batch": 4, "grad_accum": 2}, 6)], dense_reference, tmp_path)


def test_moe_checkpoint_reshards_from_zero3_to_pp2(moe_reference: dict[int, float], tmp_path: Path) -> None:
    """The experts' weights and Adam moments, sharded by ZeRO-3 over DP 2, resume on PP 2 (each stage
    its layers' experts whole)."""
    _migrate(MOE, [({"dp": 2, "micro_batch": 2, "grad_accum": 2, "zero_stage": 3}, 3),
                   ({"dp": 1, "pp": 2, "micro_batch": 2, "grad_accum": 4}, 6)], moe_reference, tmp_path)


def test_a_checkpoint_of_another_structure_exits_3(tmp_path: Path) -> None:
    """A GPT-2-style checkpoint of the same dimensions is not resumed as the gated model (nor set aside as
    damaged): the job stops with the reason."""
    ckpt = tmp_path / "ckpt"
    gpt = {k: v for k, v in BASE.items() if k in ("hidden_size", "num_layers", "num_heads", "vocab_size",
                                                  "seq_length")}
    run(gpt, {"dp": 1, "micro_batch": 8}, ckpt, 1)
    (r,) = launch({"dp": 1, "micro_batch": 8}, model=DENSE, checkpoint_dir=ckpt, iterations=2,
                  global_batch=GLOBAL_BATCH, mode="fork", timeout=TIMEOUT, cwd=tmp_path)
    assert r.rc == 3, r.err[-2000:]
    assert "was written for a model built as" in r.err.strip().splitlines()[-1]
    assert (ckpt / "step-1").is_dir()


@pytest.mark.parametrize("example", ["llama-tiny.yaml", "moe-tiny.yaml"])
def test_example_job_trains_as_the_agent_launches_it(example: str, tmp_path: Path) -> None:
    """examples/jobs/<example> through the job-file parser and the agent's TESSERA_MODEL: the trainer
    builds it with the estimator's parameter count and trains it."""
    from tessera.clients.jobfile import load_job_file
    from tessera.estimator.convert import model_dims
    from tessera.estimator.memory import num_params
    from tessera.nodeagent.contract import model_json

    spec = load_job_file(REPO / "examples" / "jobs" / example)
    model = json.loads(model_json(spec.model))
    (r,) = run(model, {"dp": 1, "micro_batch": 4}, tmp_path / "ckpt", 2, global_batch=4)
    total = int(PARAMS.search(r.out).group(2))  # type: ignore[union-attr]
    assert total == num_params(model_dims(spec.model))
    assert sorted(losses(r.out)) == [1, 2]
    shutil.rmtree(tmp_path / "ckpt")
