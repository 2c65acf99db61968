"""estimator/hfconfig.py: local Hugging Face config.json files read into ModelDims (literal configs, as
published on the hub for the repo named in each test), and every error naming model.hf_config and the key."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tessera.estimator.errors import PlanInputError
from tessera.estimator.hfconfig import SEQ_CAP, dims_from_config, load_hf_config
from tessera.estimator.models import REGISTERED, ModelDims

# meta-llama/Llama-3.1-8B config.json
LLAMA_31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True,
    "vocab_size": 128256,
}
# google/gemma-2-9b config.json (the keys that matter)
GEMMA2_9B: dict[str, Any] = {
    "model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000,
    "max_position_embeddings": 8192, "sliding_window": 4096, "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0, "query_pre_attn_scalar": 256, "hidden_activation": "gelu_pytorch_tanh",
}
# mistralai/Mixtral-8x7B-v0.1
MIXTRAL_8X7B: dict[str, Any] = {
    "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
    "vocab_size": 32000, "max_position_embeddings": 32768, "sliding_window": None, "tie_word_embeddings": False,
    "rope_theta": 1e6,
}
# Qwen/Qwen2.5-0.5B
QWEN25_05B: dict[str, Any] = {
    "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936, "max_position_embeddings": 32768,
    "tie_word_embeddings": True, "use_sliding_window": False, "sliding_window": 32768, "max_window_layers": 24,
}
# google-t5/t5-small and google/mt5-small
T5_SMALL: dict[str, Any] = {
    "model_type": "t5", "d_model": 512, "d_ff": 2048, "d_kv": 64, "num_heads": 8, "num_layers": 6,
    "vocab_size": 32128, "n_positions": 512, "feed_forward_proj": "relu", "relative_attention_num_buckets": 32,
}
MT5_SMALL: dict[str, Any] = {
    "model_type": "mt5", "d_model": 512, "d_ff": 1024, "d_kv": 64, "num_heads": 6, "num_layers": 8,
    "num_decoder_layers": 8, "vocab_size": 250112, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False,
}


def _write(tmp_path: Path, config: Any, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


def _same(a: ModelDims, b: ModelDims) -> None:
    assert dataclasses.replace(a, name="") == dataclasses.replace(b, name="")


def test_golden_llama_31_8b_reproduces_the_registered_dims_exactly(tmp_path: Path) -> None:
    dims = load_hf_config(_write(tmp_path, LLAMA_31_8B), name="llama3.1-8b")
    assert dims == REGISTERED["llama3.1-8b"]
    # max_position_embeddings 131,072 is capped: the registered 8,192 pretraining context
    assert dims.seq_length == SEQ_CAP == 8192


def test_a_directory_holding_config_json_and_the_jobs_seq_length(tmp_path: Path) -> None:
    _write(tmp_path, LLAMA_31_8B)
    dims = load_hf_config(tmp_path, seq_length=2048)
    assert (dims.seq_length, dims.name) == (2048, "hf-llama")


@pytest.mark.parametrize("config, registered, seq, dec", [
    (GEMMA2_9B, "gemma2-9b", 0, 0),
    (MIXTRAL_8X7B, "mixtral-8x7b", 32768, 0),
    (QWEN25_05B, "qwen2.5-0.5b", 32768, 0),
    (T5_SMALL, "t5-small", 0, 114),
    (MT5_SMALL, "mt5-small", 1024, 229),
])
def test_each_family_matches_its_registered_model(config: dict[str, Any], registered: str, seq: int,
                                                  dec: int) -> None:
    _same(dims_from_config(config, seq_length=seq, decoder_seq_length=dec), REGISTERED[registered])


def test_defaults_follow_the_transformers_config_classes() -> None:
    mistral = dims_from_config({**{k: v for k, v in LLAMA_31_8B.items() if k != "tie_word_embeddings"},
                                "model_type": "mistral", "max_position_embeddings": 4096})
    assert (mistral.sliding_window, mistral.tied_embeddings, mistral.seq_length) == (4096, False, 4096)
    gemma = dims_from_config({k: v for k, v in GEMMA2_9B.items() if k not in ("sliding_window", "head_dim",
                                                                               "final_logit_softcapping")})
    assert (gemma.sliding_window, gemma.head_dim, gemma.logit_softcap, gemma.tied_embeddings) == (4096, 256, 30.0, True)
    no_cap = dims_from_config({**GEMMA2_9B, "final_logit_softcapping": None, "sliding_window": None})
    assert (no_cap.logit_softcap, no_cap.sliding_window) == (0.0, 0)
    t5 = dims_from_config({"model_type": "t5"})  # T5Config's defaults are t5-small
    _same(t5, dataclasses.replace(REGISTERED["t5-small"], decoder_seq_length=0))
    assert t5.target_length == 512
    qwen = dims_from_config({**QWEN25_05B, "use_sliding_window": True, "sliding_window": 4096})
    assert qwen.sliding_window == 4096 and qwen.qkv_bias


def test_gpt2_and_bert_as_a_bonus() -> None:
    gpt2 = dims_from_config({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
                             "n_positions": 1024, "n_inner": None})
    _same(gpt2, REGISTERED["gpt2-small"])
    bert = dims_from_config({"model_type": "bert", "hidden_size": 1024, "num_hidden_layers": 24,
                             "num_attention_heads": 16, "intermediate_size": 4096, "vocab_size": 30522,
                             "max_position_embeddings": 512})
    _same(bert, REGISTERED["bert-large"])


@pytest.mark.parametrize("config, needle", [
    ({**LLAMA_31_8B, "model_type": "falcon"}, "key 'model_type': 'falcon' is not one of"),
    ({k: v for k, v in LLAMA_31_8B.items() if k != "model_type"}, "key 'model_type' missing"),
    ({k: v for k, v in LLAMA_31_8B.items() if k != "num_attention_heads"}, "key 'num_attention_heads' (llama): missing"),
    ({**LLAMA_31_8B, "hidden_size": "4096"}, "key 'hidden_size' (llama): must be an integer >= 1, got '4096'"),
    ({**LLAMA_31_8B, "num_hidden_layers": 0}, "key 'num_hidden_layers' (llama): must be an integer >= 1"),
    ({**LLAMA_31_8B, "tie_word_embeddings": "no"}, "key 'tie_word_embeddings' (llama): must be true or false"),
    ({**LLAMA_31_8B, "attention_bias": True}, "key 'attention_bias' (llama)"),
    ({**LLAMA_31_8B, "num_key_value_heads": 5}, "model.num_kv_heads"),
    ({**T5_SMALL, "feed_forward_proj": "swish-gelu"}, "key 'feed_forward_proj' (t5)"),
    ({**GEMMA2_9B, "final_logit_softcapping": -1}, "key 'final_logit_softcapping' (gemma2): must be a number >= 0"),
    ([1, 2], "must be a JSON object"),
    ({**LLAMA_31_8B, "hidden_size": 2**40}, ("hidden_size is 1,099,511,627,776, over 65,536 (the bound of a job's "
                                              "model.hidden_size)")),  # it crashed the int32 conversion
])
def test_bad_configs_name_model_hf_config_and_the_key(config: Any, needle: str) -> None:
    with pytest.raises(PlanInputError) as err:
        dims_from_config(config)
    assert err.value.field == "model.hf_config"
    assert needle in err.value.reason


def test_unreadable_files(tmp_path: Path) -> None:
    for path, needle in ((tmp_path / "missing.json", "no such file"),
                         (_write(tmp_path, "{", "bad.json"), "not valid JSON"),
                         (tmp_path / "empty-dir", "no such file")):
        if path.name == "empty-dir":
            path.mkdir()
        if path.name == "bad.json":
            path.write_text("{")
        with pytest.raises(PlanInputError) as err:
            load_hf_config(path)
        assert err.value.field == "model.hf_config" and needle in err.value.reason, err.value.reason
    with pytest.raises(PlanInputError, match="never downloads"):
        load_hf_config("meta-llama/Llama-3.1-8B")
    # JSON Python refuses past its own limits, and a FIFO, which blocked the read for ever.
    for text in ("[" * 200_000, '{"x": ' + "9" * 5000 + "}"):
        (tmp_path / "odd.json").write_text(text)
        with pytest.raises(PlanInputError, match="not valid JSON"):
            load_hf_config(tmp_path / "odd.json")
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(PlanInputError, match="fifo.json: not a plain file"):
        load_hf_config(tmp_path / "fifo.json")


def test_decoder_seq_length_only_for_an_encoder_decoder() -> None:
    with pytest.raises(PlanInputError) as err:
        dims_from_config(LLAMA_31_8B, decoder_seq_length=128)
    assert err.value.field == "model.decoder_seq_length"
