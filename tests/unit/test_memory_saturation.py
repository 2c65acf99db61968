"""A memory figure past int64 is saturated and said (estimator/service/memory_message.py): the answer
warns which fields hold int64's largest and what the estimate was, in the table and in JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.clients import tessctl
from tessera.estimator.memory_terms import MemoryBreakdown
from tessera.estimator.service.handlers import Estimator
from tessera.estimator.service.memory_message import INT64_MAX, memory_message
from tessera.v1 import common_pb2 as c
from tessera.v1 import estimator_pb2 as pb

HUGE = c.ModelSpec(name="x", hidden_size=65536, num_layers=1024, num_heads=1024, vocab_size=4_000_000,
                   seq_length=1_048_576)


def test_a_saturated_figure_is_warned_of_with_the_estimate() -> None:
    req = pb.EstimateMemoryRequest(model=HUGE, plan=c.ExecutionPlan(micro_batch=1_048_576), gpu="h100",
                                   global_batch_size=1_048_576)
    m = Estimator().estimate_memory(req).memory
    assert m.activations == m.total == m.reserved == INT64_MAX and not m.fits
    assert m.parameters < INT64_MAX  # the figures that fit are as they were
    (why,) = [w for w in m.warnings if "saturated" in w]
    assert why.startswith("memory.activations, memory.total, memory.reserved: saturated at int64's largest "
                          "(9,223,372,036,854,775,807 B); the estimate is larger (activations 2.54e+21 B, ")


def test_no_warning_when_every_figure_fits() -> None:
    est = MemoryBreakdown(parameters=10, gradients=10, optimizer=20, activations=30, other=5, source="formula",
                          warnings=("plan.x: something",))
    m = memory_message(est)
    assert list(m.warnings) == ["plan.x: something"] and m.total == 75
    over = memory_message(MemoryBreakdown(1, 1, 1, INT64_MAX, 1, "formula"))  # the total passes int64 by 3
    assert over.activations == INT64_MAX and over.total == INT64_MAX
    assert [w.split(":")[0] for w in over.warnings] == ["memory.total, memory.reserved"]


def test_the_table_and_json_say_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = tmp_path / "max.yaml"
    job.write_text("name: x\nmodel: {hidden_size: 65536, num_layers: 1024, num_heads: 1024, vocab_size: 4000000, "
                   "seq_length: 1048576}\nglobal_batch_size: 1048576\niterations: 10\n")
    args = ["estimate", "memory", "-f", str(job), "--gpu", "h100", "--plan", "micro_batch=1048576"]
    assert tessctl.main(args) == 0
    assert "\nWarning:  memory.activations, memory.total, memory.reserved: saturated at int64's largest" in \
        capsys.readouterr().out
    assert tessctl.main([*args, "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)["memory"]
    assert any(w.startswith("memory.activations, memory.total, memory.reserved: saturated") for w in doc["warnings"])
