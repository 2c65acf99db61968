"""bench/estimator_gpu_recipes.py end to end on the CPU: the GPU script's code paths (torchtitan's
Llama under FSDP2 on a one-rank group with op/full checkpointing, chunked loss and compile; a
transformers model with and without PEFT LoRA), tiny models, real steps, the estimator's predictions
beside them. It proves the script runs before a GPU session spends its minutes on it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "estimator_gpu_recipes.py"

pytest.importorskip("torchtitan")
pytest.importorskip("peft")


def _hand_count(d: dict) -> int:
    """Parameters of a Llama/Qwen2-style model from its dims, counted here by hand (not by the
    estimator, whose count is what the bench compares): embedding (and an untied head), per layer
    q/k/v/o, the q/k/v biases of Qwen2, the SwiGLU MLP and two RMSNorms, and the final norm."""
    h, a, v, f = d["hidden_size"], d["num_heads"], d["vocab_size"], d["ffn_hidden"]
    hd = d["kv_channels"] or h // a
    kv = d["num_kv_heads"] or a
    qkv = (a + 2 * kv) * hd
    layer = h * qkv + a * hd * h + 3 * h * f + 2 * h + (qkv if d["qkv_bias"] else 0)
    return v * h * (1 if d["tied_embeddings"] else 2) + d["num_layers"] * layer + h


def _lora_count(d: dict, r: int) -> int:
    """LoRA on all linears of each layer: A (r x in) and B (out x r) for q, k, v, o, gate, up, down."""
    h, a, f = d["hidden_size"], d["num_heads"], d["ffn_hidden"]
    hd = d["kv_channels"] or h // a
    kv = d["num_kv_heads"] or a
    in_out = [(h, a * hd), (h, kv * hd), (h, kv * hd), (a * hd, h), (h, f), (h, f), (f, h)]
    return d["num_layers"] * r * sum(i + o for i, o in in_out)


def _run(tmp_path: Path, *extra: str) -> dict:
    out = tmp_path / "recipes.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--tiny", "--warmup", "1", "--steps", "2",
                           "--out", str(out), *extra], capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "cpu: no cuda memory stats" in proc.stdout
    return json.loads(out.read_text())


@pytest.mark.slow
def test_every_recipe_runs_on_cpu(tmp_path: Path) -> None:
    res = _run(tmp_path)
    rows = {r["case"]: r for r in res["rows"]}
    assert len(rows) >= 11 and not res["float8_supported"]
    for name, r in rows.items():
        if r["plan"]["float8"] != "none" and r["plan"]["compile"]:  # fp8 emulation is eager only
            assert r["status"] == "skipped" and "eager only" in r["reason"], name
            continue
        assert r["status"] == "ok", f"{name}: {r.get('error')}\n{r['measured'].get('traceback', '')}"
        m = r["measured"]
        assert m["memory"] == {"note": "cpu: no cuda memory stats"}
        assert len(m["step_s"]) == 2 and m["step_median_s"] > 0 and m["tokens_per_s"] > 0
        assert all(math.isfinite(loss) and 0 < loss < 20 for loss in m["losses"]), m["losses"]
        assert r["predicted"]["memory"]["total"] > 0, r["predicted"]["memory"]
        assert "time" in r["predicted"]
        if not r["plan"]["lora_rank"]:  # the declared ModelDims are the model that ran
            assert m["params_real"] == _hand_count(r["model"]), name
        else:
            assert m["info"]["trainable_params"] == _lora_count(r["model"], r["plan"]["lora_rank"]), name
            assert m["params_real"] == _hand_count(r["model"]) + m["info"]["trainable_params"], name
        if r["plan"]["float8"] != "none":  # emulated on the CPU, the same conversion as on a GPU
            # torchtitan fuses q/k/v: wqkv, wo, w1, w2, w3 per layer, and the output head
            assert m["info"]["float8_linears"] == {"count": 5 * r["model"]["num_layers"] + 1, "lm_head": True}
    stacks = {r["stack"] for r in rows.values()}
    assert stacks == {"torchtitan", "transformers"}
    plans = [r["plan"] for r in rows.values() if r["status"] == "ok"]
    for field, value in (("float8", "linear"), ("checkpointing", "op"), ("checkpointing", "full"), ("loss", "chunked"),
                         ("compile", True), ("lora_rank", 16), ("sharding", "fsdp")):
        assert any(p[field] == value for p in plans), f"no case ran with {field}={value}"


@pytest.mark.slow
def test_isolated_worker_and_budget(tmp_path: Path) -> None:
    """The GPU run's layout: each case in its own process, and the time budget skips the rest."""
    res = _run(tmp_path, "--isolate", "yes", "--only", "tt tiny fsdp op-sac chunked", "--only", "tiny-qwen2 lora",
               "--budget-s", "1")
    rows = res["rows"]
    assert rows[0]["status"] == "ok", rows[0].get("error")
    assert rows[0]["measured"]["params_real"] == rows[0]["predicted"]["params_dims"]
    assert all(r["status"] == "skipped" and "budget" in r["reason"] for r in rows[1:]) and len(rows) >= 2


def test_full_size_dims_match_the_models() -> None:
    """The GPU cases' ModelDims count the parameters the real models have (built on the meta device)."""
    import torch
    import transformers
    from torchtitan.models.llama3 import llama3_configs

    sys.path.insert(0, str(REPO / "bench"))
    import estimator_gpu_recipes as bench

    from tessera.estimator.memory import num_params

    gpu_cases = bench.cases(tiny=False)
    seen = set()
    for case in gpu_cases:
        key = (case.stack, case.arch)
        if key in seen:
            continue
        seen.add(key)
        with torch.device("meta"):
            if case.stack == "torchtitan":
                model = llama3_configs[case.arch](attn_backend="flex").build()
            else:
                d = case.dims
                cls = transformers.Qwen2Config if case.arch == "qwen2" else transformers.LlamaConfig
                cfg = cls(hidden_size=d.hidden_size, intermediate_size=d.ffn, num_hidden_layers=d.num_layers,
                          num_attention_heads=d.num_heads, num_key_value_heads=d.kv_heads,
                          vocab_size=d.vocab_size, tie_word_embeddings=d.tied_embeddings)
                model = transformers.AutoModelForCausalLM.from_config(cfg)
        real = sum(p.numel() for p in model.parameters())
        assert real == _hand_count(asdict(case.dims)), (case.name, real)
        if not case.dims.qkv_bias:  # the estimator's count (it leaves Qwen2's q/k/v biases out at 32eade9)
            assert real == num_params(case.dims), (case.name, real, num_params(case.dims))
    assert {k[1] for k in seen} >= {"debugmodel", "1B", "qwen2", "llama"}


@pytest.mark.slow
def test_native_stand_in_for_torchtitan(tmp_path: Path) -> None:
    """Where torchtitan cannot build (an older torch on the GPU machine), its recipes run on torch's
    and torchao's own APIs over a transformers Llama of the same dims; the chunked loss has no stand-in."""
    res = _run(tmp_path, "--torchtitan", "native", "--only", "tt tiny fsdp float8 op-sac",
               "--only", "tt tiny fsdp op-sac chunked")
    rows = {r["case"]: r for r in res["rows"]}
    f8 = rows["tt tiny fsdp float8 op-sac"]
    assert f8["status"] == "ok", f8.get("error")
    info = f8["measured"]["info"]
    assert info["built_with"] == "native" and "TESSERA_RECIPES_TORCHTITAN=native" in info["torchtitan_error"]
    assert f8["measured"]["params_real"] == _hand_count(f8["model"])
    # transformers' Llama keeps q, k, v apart: 7 linears per layer, and the head
    assert info["float8_linears"] == {"count": 7 * f8["model"]["num_layers"] + 1, "lm_head": True}
    chunked = rows["tt tiny fsdp op-sac chunked"]
    assert chunked["status"] == "error" and "ChunkedLossWrapper" in chunked["error"]


def test_compare_against_measured_figures() -> None:
    """The errors the GPU run reports, on figures given by hand (the CPU run has no CUDA memory)."""
    sys.path.insert(0, str(REPO / "bench"))
    import estimator_gpu_recipes as bench

    gib = 2**30
    measured = {"memory": {"max_allocated": 10 * gib, "max_reserved": 12 * gib}, "step_median_s": 0.5,
                "params_real": 1000}
    pred = {"memory": {"total": 12 * gib, "other": gib, "reserved": 13 * gib}, "time": {"iter_time": 0.4},
            "params_dims": 990}
    c = bench.compare({"measured": measured, "predicted": pred})
    assert c["pred_tensor_bytes"] == 11 * gib and c["alloc_err"] == 0.1
    assert c["pred_reserved_from"] == "reserved" and c["reserved_err"] == round(1 / 12, 4)
    assert c["reserved_over_allocated"] == 1.2 and c["time_err"] == -0.2 and c["params_err"] == -0.01
    del pred["memory"]["reserved"]  # a library without MemoryBreakdown.reserved: its total stands in
    c = bench.compare({"measured": measured, "predicted": pred})
    assert c["pred_reserved_from"] == "total" and c["reserved_err"] == 0.0
    assert bench.compare({"measured": {"memory": {"note": "cpu: no cuda memory stats"}}, "predicted": pred}) == {}
