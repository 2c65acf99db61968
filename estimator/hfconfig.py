"""A model named by its Hugging Face ``config.json``: a LOCAL file read into ModelDims (never downloaded).

Job files say ``model: {hf_config: path/to/config.json}`` (or a directory holding one) and
``tessctl estimate ... --hf-config PATH`` does the same. The ``model_type`` key picks the reading:

- ``llama``, ``mistral``, ``qwen2``: the LLaMA-style decoder (SwiGLU, RMSNorm, rotary, GQA);
  ``qwen2`` adds q/k/v biases; a sliding window counts where the config turns it on (Mistral's
  ``sliding_window``; Qwen2's only with ``use_sliding_window``).
- ``mixtral``: the same stack with ``num_local_experts`` SwiGLU experts in every layer, top
  ``num_experts_per_tok``, dropless routing.
- ``gemma2``: gated GELU, its own ``head_dim``, ``sliding_window`` on every other layer,
  ``final_logit_softcapping``, norms before and after each block.
- ``t5``, ``mt5``: the encoder-decoder; ``feed_forward_proj`` ``relu`` (original T5) or
  ``gated-gelu`` (T5 v1.1, Flan-T5, mT5); ``d_kv`` is the per-head width.
- ``gpt2`` and ``bert``: the GPT-2-style decoder and the BERT encoder.

Defaults for absent keys are those of transformers' config classes (LlamaConfig, MistralConfig,
MixtralConfig, Qwen2Config, Gemma2Config, T5Config, MT5Config, GPT2Config, BertConfig): e.g. a
missing ``num_key_value_heads`` is ``num_attention_heads``, a missing ``tie_word_embeddings`` is
false for llama/mistral/mixtral/qwen2 and true for gemma2/t5/gpt2/bert (mT5's own configs say false).

Sequence length (the config holds no training length): the caller's (a job file's
``model.seq_length``) when given; else the config's position limit (``max_position_embeddings``,
GPT-2's ``n_positions``) capped at ``SEQ_CAP`` = 8,192 tokens, because current configs give the
inference context there (131,072 for Llama 3.1) while their pretraining ran at 8K or less; T5/mT5
have no position limit (relative buckets) and take ``n_positions`` where the file has it, else 512
(T5's pretraining inputs). An encoder-decoder's target length is the caller's
``decoder_seq_length``, else the input length.

Every problem is a PlanInputError on ``model.hf_config`` whose reason names the file and the key.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tessera.common.jobspec import MODEL_DIMS, MODEL_REFINEMENTS
from tessera.common.plainfile import NotPlainFile, read_plain
from tessera.estimator.errors import PlanInputError
from tessera.estimator.models import ModelDims

FIELD = "model.hf_config"
SEQ_CAP = 8192
T5_DEFAULT_SEQ = 512
MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a config.json is a few KiB; anything this large is not one


def load_hf_config(path: str | Path, *, seq_length: int = 0, decoder_seq_length: int = 0,
                   name: str = "") -> ModelDims:
    """The ModelDims of the local config.json at `path` (a file, or a directory holding config.json)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        raw, _ = read_plain(p, MAX_CONFIG_BYTES)
    except NotPlainFile:
        raise PlanInputError(FIELD, f"{p}: not a plain file") from None
    except FileNotFoundError:
        hint = (" (hf_config reads a local config.json; Tessera never downloads: fetch the file first)"
                if "/" in str(path) and not str(path).endswith(".json") and not Path(path).parent.exists() else "")
        raise PlanInputError(FIELD, f"{p}: no such file{hint}") from None
    except OSError as exc:
        raise PlanInputError(FIELD, f"{p}: cannot read it: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise PlanInputError(FIELD, f"{p}: larger than {MAX_CONFIG_BYTES:,} bytes: not a config.json")
    try:
        config = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # not UTF-8 or JSON, an integer of 4,300+ digits, deep nesting
        raise PlanInputError(FIELD, f"{p}: not valid JSON: {str(exc)[:200]}") from None
    return dims_from_config(config, seq_length=seq_length, decoder_seq_length=decoder_seq_length, name=name,
                            source=str(p))


def dims_from_config(config: Any, *, seq_length: int = 0, decoder_seq_length: int = 0, name: str = "",
                     source: str = "config.json") -> ModelDims:
    """The ModelDims of a parsed config.json (see the module's docstring)."""
    if not isinstance(config, Mapping):
        raise PlanInputError(FIELD, f"{source}: must be a JSON object, got {type(config).__name__}")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise PlanInputError(FIELD, f"{source}: key 'model_type' missing (one of {', '.join(sorted(READERS))})")
    reader = READERS.get(model_type)
    if reader is None:
        raise PlanInputError(FIELD, f"{source}: key 'model_type': {model_type!r} is not one of "
                                    f"{', '.join(sorted(READERS))}")
    c = _Config(config, source, model_type)
    for key, value in (("seq_length", seq_length), ("decoder_seq_length", decoder_seq_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise PlanInputError(f"model.{key}", f"must be an integer >= 1, got {value!r}")
    kwargs = reader(c)
    if not seq_length:
        seq_length = kwargs.pop("seq_length")
    else:
        kwargs.pop("seq_length")
    if decoder_seq_length:
        if kwargs.get("family") != "encoder-decoder":
            raise PlanInputError("model.decoder_seq_length", f"only an encoder-decoder has one ({model_type} "
                                                             "is not)")
        kwargs["decoder_seq_length"] = decoder_seq_length
    dims = ModelDims(seq_length=seq_length, name=name or f"hf-{model_type}", **kwargs)
    for key, hi in MODEL_DIMS + MODEL_REFINEMENTS:  # a job's model has the same bounds, checked first
        if isinstance(v := getattr(dims, key), int) and v > hi:
            raise PlanInputError(FIELD, f"{source}: {key} is {v:,}, over {hi:,} (the bound of a job's model.{key})")
    try:
        return dims.validate()
    except PlanInputError as exc:
        raise PlanInputError(FIELD, f"{source}: {exc.field}: {exc.reason}") from None


class _Config:
    """Typed access to the keys of one config, each error naming the key."""

    def __init__(self, d: Mapping[str, Any], source: str, model_type: str) -> None:
        self.d, self.source, self.model_type = d, source, model_type

    def error(self, key: str, why: str) -> PlanInputError:
        return PlanInputError(FIELD, f"{self.source}: key {key!r} ({self.model_type}): {why}")

    def integer(self, key: str, default: int | None = None, *, lo: int = 1) -> int:
        value = self.d.get(key)
        if value is None:
            if default is None:
                raise self.error(key, "missing")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise self.error(key, f"must be an integer >= {lo}, got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.d.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {value!r}")
        return value

    def number(self, key: str, default: float) -> float:
        value = self.d.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise self.error(key, f"must be a number >= 0, got {value!r}")
        return float(value)

    def text(self, key: str, default: str) -> str:
        value = self.d.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, got {value!r}")
        return value

    def refuse_true(self, key: str, why: str) -> None:
        if self.flag(key, False):
            raise self.error(key, why)

    def seq(self, key: str = "max_position_embeddings") -> int:
        return min(self.integer(key), SEQ_CAP)

    def head_dim(self, hidden: int, heads: int) -> int:
        """kv_channels: the config's head_dim when it differs from hidden / heads, else 0."""
        d = self.integer("head_dim", 0, lo=0)
        return 0 if not d or d * heads == hidden else d


def _llama_like(c: _Config, *, tied_default: bool = False) -> dict[str, Any]:
    h, heads = c.integer("hidden_size"), c.integer("num_attention_heads")
    c.refuse_true("mlp_bias", "biases on the MLP are not modelled")
    return {
        "hidden_size": h, "num_layers": c.integer("num_hidden_layers"), "num_heads": heads,
        "vocab_size": c.integer("vocab_size"), "seq_length": c.seq(), "ffn_hidden": c.integer("intermediate_size"),
        "gated": True, "num_kv_heads": c.integer("num_key_value_heads", heads),
        "tied_embeddings": c.flag("tie_word_embeddings", tied_default), "kv_channels": c.head_dim(h, heads),
    }


def _llama(c: _Config) -> dict[str, Any]:
    c.refuse_true("attention_bias", "biases on all four attention projections are not modelled (qkv_bias is)")
    return _llama_like(c)


def _mistral(c: _Config, window_default: int = 4096) -> dict[str, Any]:
    # absent: the config class's default (MistralConfig 4,096, MixtralConfig none); null: none (v0.3)
    window = c.integer("sliding_window", 0, lo=0) if "sliding_window" in c.d else window_default
    return {**_llama_like(c), "sliding_window": window}


def _mixtral(c: _Config) -> dict[str, Any]:
    experts = c.integer("num_local_experts", 8)
    return {**_mistral(c, window_default=0), "family": "moe", "num_experts": experts, "top_k": c.integer("num_experts_per_tok", 2),
            "moe_every": 1, "capacity_factor": 0.0}


def _qwen2(c: _Config) -> dict[str, Any]:
    out = {**_llama_like(c), "qkv_bias": True}
    if c.flag("use_sliding_window", False):
        out["sliding_window"] = c.integer("sliding_window", 4096)
    return out


def _gemma2(c: _Config) -> dict[str, Any]:
    h, heads = c.integer("hidden_size"), c.integer("num_attention_heads")
    return {
        "hidden_size": h, "num_layers": c.integer("num_hidden_layers"), "num_heads": heads,
        "vocab_size": c.integer("vocab_size"), "seq_length": c.seq(), "ffn_hidden": c.integer("intermediate_size"),
        "gated": True, "num_kv_heads": c.integer("num_key_value_heads", heads),
        "tied_embeddings": c.flag("tie_word_embeddings", True),
        # Gemma2Config's default head_dim is 256, whatever hidden_size / heads is
        "kv_channels": c.integer("head_dim", 256) if c.integer("head_dim", 256) * heads != h else 0,
        # absent: Gemma2Config's defaults (4,096; 30.0); null: none
        "sliding_window": c.integer("sliding_window", 0, lo=0) if "sliding_window" in c.d else 4096,
        "logit_softcap": c.number("final_logit_softcapping", 0.0) if "final_logit_softcapping" in c.d else 30.0,
        "sandwich_norm": True,
    }


def _t5(c: _Config) -> dict[str, Any]:
    h, heads, layers = c.integer("d_model", 512), c.integer("num_heads", 8), c.integer("num_layers", 6)
    # T5Config's rule: "ACT" or "gated-ACT" (relu: the original T5; gated-gelu: v1.1, Flan-T5, mT5)
    proj = c.text("feed_forward_proj", "gated-gelu" if c.model_type == "mt5" else "relu")
    parts = proj.split("-")
    if not all(parts) or len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise c.error("feed_forward_proj", f"{proj!r} is not 'ACT' or 'gated-ACT' (e.g. relu, gated-gelu)")
    d = c.integer("d_kv", 64)
    return {
        "hidden_size": h, "num_layers": layers, "num_heads": heads, "vocab_size": c.integer("vocab_size", 32128),
        "seq_length": c.integer("n_positions", T5_DEFAULT_SEQ), "family": "encoder-decoder",
        "ffn_hidden": c.integer("d_ff", 2048), "gated": proj.startswith("gated-"),
        "kv_channels": d, "num_decoder_layers": c.integer("num_decoder_layers", layers),
        # the published v1.1 / mT5 checkpoints say false (a separate lm_head); T5Config's default is true
        "tied_embeddings": c.flag("tie_word_embeddings", True),
    }


def _gpt2(c: _Config) -> dict[str, Any]:
    h = c.integer("n_embd", 768)
    return {"hidden_size": h, "num_layers": c.integer("n_layer", 12), "num_heads": c.integer("n_head", 12),
            "vocab_size": c.integer("vocab_size", 50257), "seq_length": c.seq("n_positions") if "n_positions" in c.d
            else 1024, "ffn_hidden": _ffn(c.integer("n_inner", 4 * h), h),
            "tied_embeddings": c.flag("tie_word_embeddings", True)}


def _bert(c: _Config) -> dict[str, Any]:
    h = c.integer("hidden_size", 768)
    return {"hidden_size": h, "num_layers": c.integer("num_hidden_layers", 12),
            "num_heads": c.integer("num_attention_heads", 12), "vocab_size": c.integer("vocab_size", 30522),
            "seq_length": min(c.integer("max_position_embeddings", 512), SEQ_CAP), "family": "encoder",
            "ffn_hidden": _ffn(c.integer("intermediate_size", 4 * h), h)}


def _ffn(ffn: int, h: int) -> int:
    """ModelDims's spelling: 0 for the default 4h MLP (so a GPT-2 or BERT config equals its registered model)."""
    return 0 if ffn == 4 * h else ffn


READERS: dict[str, Callable[[_Config], dict[str, Any]]] = {
    "llama": _llama, "mistral": _mistral, "mixtral": _mixtral, "qwen2": _qwen2, "gemma2": _gemma2,
    "t5": _t5, "mt5": _t5, "gpt2": _gpt2, "bert": _bert,
}
