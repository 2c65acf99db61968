"""`--plan` sets a field back to 0 or false over the job file's `plan:` (lora_rank=0, compile=false,
sequence_parallel=false, async_tp=false): proto3 drops a written 0/false, so the flag's keys travel
beside its message (PlanOverride) and merged_plan takes them. The loopback service: tests/integration/
test_tessctl_plan_override.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.clients import tessctl
from tessera.clients.estimate import plan_arg
from tessera.estimator.convert import execution_plan, merged_plan, plan_fields
from tessera.estimator.plans import PlanInputError

RECIPE = {"lora_rank": "16", "compile": "true", "sequence_parallel": "true", "async_tp": "true",
          "checkpointing": "full"}
ZEROS = "lora_rank=0,compile=false,sequence_parallel=false,async_tp=false"


def test_a_written_zero_or_false_replaces_the_base() -> None:
    base = plan_fields(RECIPE)
    flag = plan_arg(f"dp=8,micro_batch=1,{ZEROS}")
    merged = flag.on(base)
    assert (merged.dp, merged.micro_batch, merged.checkpointing) == (8, 1, base.checkpointing)  # the rest kept
    assert (merged.lora_rank, merged.compile, merged.sequence_parallel, merged.async_tp) == (0, False, False, False)
    assert execution_plan(merged).lora_rank == 0
    # without the keys a 0/false message still means "unset": a scheduler's plan under a job's recipe
    assert merged_plan(base, flag.plan).lora_rank == 16
    assert plan_arg("compile=false").given == frozenset({"compile"})
    with pytest.raises(PlanInputError, match="plan.bogus"):
        merged_plan(base, flag.plan, ("bogus",))


def _job(tmp_path: Path) -> Path:
    path = tmp_path / "ov.yaml"
    path.write_text("name: ov\nmodel: llama3.1-8b\nglobal_batch_size: 8\niterations: 10\n"
                    "plan: {lora_rank: 16, compile: true, checkpointing: full, loss: fp32, sharding: fsdp}\n")
    return path


@pytest.mark.parametrize("command", ["memory", "time"])
def test_estimate_takes_zero_and_false_from_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     command: str) -> None:
    path = _job(tmp_path)
    args = ["estimate", command, "-f", str(path), "--gpu", "h100", "-o", "json"]
    assert tessctl.main([*args, "--plan", "dp=8,micro_batch=1,lora_rank=0,compile=false"]) == 0
    zero = json.loads(capsys.readouterr().out)
    plan = zero["plan"]
    assert (plan["lora_rank"], plan["compile"], plan["checkpointing"], plan["sharding"]) == (0, False, "full", "fsdp")
    assert tessctl.main([*args, "--plan", "dp=8,micro_batch=1"]) == 0
    kept = json.loads(capsys.readouterr().out)
    assert (kept["plan"]["lora_rank"], kept["plan"]["compile"]) == (16, True)  # the job file's, when not given
    # full fine-tuning keeps gradients and optimizer states for every parameter; LoRA for its adapters
    assert zero["memory"]["optimizer"] > 100 * kept["memory"]["optimizer"]
