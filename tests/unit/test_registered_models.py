"""The registered current-family models (estimator/models.py): each one's parameter count, as the
estimator computes it (memory.num_params), within 2% of the count its publisher gives."""

from __future__ import annotations

import pytest

from tessera.estimator.memory import num_params
from tessera.estimator.models import REGISTERED, registered

# Published sizes. Llama 3.1/3.2: Meta's model cards (8.03B, 70.6B, 405B, 1.24B, 3.21B). Mistral
# 7B v0.3 and Mixtral: the Hugging Face hub's safetensors totals (7.25B, 46.7B, 141B). Qwen2.5: the
# Qwen2.5 model cards ("Number of Parameters"). Gemma 2: the hub's safetensors totals (2.61B, 9.24B,
# 27.2B). T5: the hub's counts of google-t5/t5-* (the paper's 60M/220M/770M/3B/11B round these; its
# "770M" large and "11B" are 738M and 11.3B counted: Raffel et al. count differently, e.g. t5-large's
# hub card gives 738M). T5 v1.1 / Flan-T5: the flan-t5 cards (248M, 783M, 2.85B). mT5: Xue et al.
# Table 1 (300M, 580M, 1.2B, 3.7B, 13B); mt5-large counts 1.23B on the hub.
PUBLISHED: dict[str, float] = {
    "llama3.1-8b": 8.03e9, "llama3.1-70b": 70.6e9, "llama3.1-405b": 405e9,
    "llama3.2-1b": 1.24e9, "llama3.2-3b": 3.21e9,
    "mistral-7b-v0.3": 7.25e9, "mixtral-8x7b": 46.7e9, "mixtral-8x22b": 141e9,
    "qwen2.5-0.5b": 0.49e9, "qwen2.5-1.5b": 1.54e9, "qwen2.5-3b": 3.09e9, "qwen2.5-7b": 7.62e9,
    "qwen2.5-14b": 14.7e9, "qwen2.5-32b": 32.8e9, "qwen2.5-72b": 72.7e9,
    "gemma2-2b": 2.61e9, "gemma2-9b": 9.24e9, "gemma2-27b": 27.2e9,
    "t5-small": 60.5e6, "t5-base": 223e6, "t5-large": 738e6, "t5-3b": 2.85e9, "t5-11b": 11.3e9,
    "t5-v1.1-base": 248e6, "t5-v1.1-large": 783e6, "t5-v1.1-xl": 2.85e9,
    "flan-t5-base": 248e6, "flan-t5-large": 783e6, "flan-t5-xl": 2.85e9,
    "mt5-small": 300e6, "mt5-base": 580e6, "mt5-large": 1.23e9, "mt5-xl": 3.7e9, "mt5-xxl": 13e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_within_2_percent_of_the_published_size(name: str) -> None:
    m = registered(name)
    assert m is not None, name
    m.validate()
    n = num_params(m)
    assert abs(n / PUBLISHED[name] - 1) < 0.02, f"{name}: {n / 1e9:.3f}B vs published {PUBLISHED[name] / 1e9:.3f}B"


def test_every_current_family_model_has_a_published_size() -> None:
    current = {n for n, m in REGISTERED.items()
               if m.family == "encoder-decoder" or m.num_kv_heads or m.qkv_bias or m.kv_channels}
    assert current <= set(PUBLISHED), sorted(current - set(PUBLISHED))


def test_family_specific_fields() -> None:
    t5 = REGISTERED["t5-3b"]
    assert (t5.family, t5.head_dim, t5.attention_width, t5.gated, t5.tied_embeddings) == \
        ("encoder-decoder", 128, 4096, False, True)
    assert (t5.decoder_layers, t5.target_length, t5.learned_positions) == (24, 114, False)
    gemma = REGISTERED["gemma2-9b"]
    assert (gemma.head_dim, gemma.sliding_window, gemma.logit_softcap, gemma.sandwich_norm) == (256, 4096, 30.0, True)
    mixtral = REGISTERED["mixtral-8x7b"]
    assert (mixtral.num_moe_layers, mixtral.capacity_factor, mixtral.top_k) == (32, 0.0, 2)
    assert REGISTERED["qwen2.5-7b"].qkv_bias and not REGISTERED["qwen2.5-7b"].tied_embeddings
    assert registered(" Llama3.1-8B ") is REGISTERED["llama3.1-8b"]
