"""Which structure the reference trainer builds for a model, decided from its family fields before
torch is imported.

Pure: `resolve_arch(model, fields)` turns the model's dimensions and its family fields (TESSERA_MODEL's
extra keys, or the registered name's ModelDims) into an Arch or raises Unsupported naming the field.

Two structures are built:

- GPT-2 style (model.py): LayerNorm, biases, learned positions, 4h GELU MLP, full multi-head attention;
- LLaMA style (`gated`; model_llama.py): RMSNorm, SwiGLU MLP of `ffn_hidden`, rotary positions,
  grouped-query attention (`num_kv_heads`), per-head width `kv_channels`, optional q/k/v biases
  (`qkv_bias`, Qwen2.5); with `family: moe` and `dropless` routing, Mixtral's sparse MoE of SwiGLU
  experts (model_moe.py) in every `moe_every`-th layer.

Everything else (encoders, encoder-decoders, sliding windows, soft-capped logits, sandwich norms,
GShard's non-gated MoE with its capacity factor) is refused by field: never trained as another model
under its name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from tessera.clients.trainer import ModelDims

# No ModelDims (SDK or estimator) carries a rope base: the RoFormer/LLaMA default (Llama 3.1 trains
# with 500,000, Mixtral with 1,000,000; the parameters and the compute are the same).
ROPE_THETA = 10000.0
# RMSNorm epsilon of Llama 3 and Mixtral (config.json rms_norm_eps).
RMS_NORM_EPS = 1e-5
# Weight of the load-balancing loss (Mixtral-8x7B-v0.1 config.json router_aux_loss_coef).
ROUTER_AUX_LOSS_COEF = 0.02

GPT2, LLAMA = "gpt2", "llama"


class Unsupported(Exception):
    """This configuration cannot be run by the reference trainer; str(e) is the one-line reason."""


@dataclass(frozen=True)
class Arch:
    """The built structure, every size resolved (no 0 = default left)."""

    kind: str  # GPT2 or LLAMA
    kv_heads: int
    head_dim: int
    ffn: int
    qkv_bias: bool = False  # LLAMA only: biases on q, k, v (GPT-2 has biases everywhere)
    tied_embeddings: bool = True
    num_experts: int = 0  # > 0: Mixtral-style MoE (LLAMA only)
    top_k: int = 0
    moe_every: int = 0
    rope_theta: float = ROPE_THETA

    @classmethod
    def gpt2(cls, model: ModelDims, tied_embeddings: bool = True) -> Arch:
        return cls(GPT2, model.num_heads, model.hidden_size // max(1, model.num_heads), 4 * model.hidden_size,
                   tied_embeddings=tied_embeddings)

    @property
    def gated(self) -> bool:
        return self.kind == LLAMA

    @property
    def moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, index: int) -> bool:
        """Layer `index` (0-based) has experts: the estimator's rule (estimator/models.py is_moe_layer)."""
        return self.moe and (index + 1) % self.moe_every == 0

    def num_moe_layers(self, num_layers: int) -> int:
        return sum(self.is_moe_layer(i) for i in range(num_layers))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Arch:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def describe(self) -> str:
        """`gpt2`, or e.g. `llama-kv2-d16-f128-untied-moe4x2/1` for the start line."""
        if not self.gated:
            return GPT2 + ("" if self.tied_embeddings else "-untied")
        parts = [LLAMA, f"kv{self.kv_heads}", f"d{self.head_dim}", f"f{self.ffn}"]
        if self.qkv_bias:
            parts.append("qkvbias")
        if not self.tied_embeddings:
            parts.append("untied")
        if self.moe:
            parts.append(f"moe{self.num_experts}x{self.top_k}/{self.moe_every}")
        return "-".join(parts)


# Family fields of a structure this trainer does not build, refused by name when set.
_NOT_BUILT = (
    ("sandwich_norm", "sandwich norms (sandwich_norm)"),
    ("sliding_window", "sliding-window attention (sliding_window)"),
    ("logit_softcap", "logit soft-capping (logit_softcap)"),
    ("num_decoder_layers", "an encoder-decoder (num_decoder_layers)"),
    ("decoder_seq_length", "an encoder-decoder (decoder_seq_length)"),
)
_OFF = (None, False, 0, 0.0, "", "false")


def registered_fields(name: str) -> dict[str, Any] | None:
    """The family fields of a registered name (tessera.estimator.models), or None."""
    try:
        from tessera.estimator.models import registered
    except ImportError:
        return None
    known = registered(name)
    if known is None:
        return None
    return {"family": known.family, "gated": known.gated, "num_kv_heads": known.num_kv_heads,
            "ffn_hidden": known.ffn_hidden, "kv_channels": known.kv_channels, "qkv_bias": known.qkv_bias,
            "sliding_window": known.sliding_window, "logit_softcap": known.logit_softcap,
            "sandwich_norm": known.sandwich_norm, "num_experts": known.num_experts, "top_k": known.top_k,
            "moe_every": known.moe_every, "dropless": known.family == "moe" and known.capacity_factor == 0,
            "tied_embeddings": known.tied_embeddings, "num_decoder_layers": known.num_decoder_layers,
            "decoder_seq_length": known.decoder_seq_length}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _get(fields: Mapping[str, Any], key: str) -> Any:
    return fields.get(key, fields.get(_camel(key)))


def _flag(fields: Mapping[str, Any], key: str) -> bool:
    value = _get(fields, key)
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def _int(fields: Mapping[str, Any], key: str, who: str) -> int:
    raw = _get(fields, key)
    try:
        value = int(raw or 0)
    except (TypeError, ValueError):
        raise Unsupported(f"{who}: model.{key}={raw!r} is not an integer") from None
    if value < 0:
        raise Unsupported(f"{who}: model.{key}={value} must be >= 0")
    return value


def _family(fields: Mapping[str, Any]) -> str:
    word = str(_get(fields, "family") or "").strip().lower().removeprefix("model_family_")
    return {"": "decoder", "unspecified": "decoder", "encoder-decoder": "encoder_decoder",
            "wresnet": "wide_resnet"}.get(word, word)


def _tied(fields: Mapping[str, Any]) -> bool:
    """common.proto's `untied_embeddings`, or the estimator's and job file's `tied_embeddings`."""
    if _get(fields, "untied_embeddings") is not None:
        return not _flag(fields, "untied_embeddings")
    if _get(fields, "tied_embeddings") is not None:
        return _flag(fields, "tied_embeddings")
    return True


def resolve_arch(model: ModelDims, fields: Mapping[str, Any]) -> Arch:
    """The structure to build for `model` with family fields `fields`; Unsupported naming the field
    of anything this trainer does not build."""
    who = f"model {model.name or '(unnamed)'!r}"
    family = _family(fields)
    if family not in ("decoder", "moe"):
        raise Unsupported(f"{who}: model.family={family}: the reference trainer builds decoders only (GPT-2 or "
                          "LLaMA style, and Mixtral-style MoE)")
    for key, what in _NOT_BUILT:
        value = _get(fields, key)
        if value not in _OFF:
            raise Unsupported(f"{who}: model.{key}={value!r}: {what} is not built by the reference trainer")
    h, heads = model.hidden_size, model.num_heads
    gated = _flag(fields, "gated")
    experts = _int(fields, "num_experts", who)
    if experts and family != "moe":
        raise Unsupported(f"{who}: model.num_experts={experts}: only the moe family has experts "
                          f"(family {family})")
    tied = _tied(fields)
    if not gated:
        if family == "moe":
            raise Unsupported(f"{who}: model.family=moe without model.gated: GShard-style MoE (GELU experts, "
                              "capacity factor) is not built by the reference trainer (Mixtral style: gated, "
                              "dropless)")
        if h % heads:
            raise Unsupported(f"model hidden_size={h} is not divisible by num_heads={heads}")
        for key, default in (("num_kv_heads", heads), ("ffn_hidden", 4 * h), ("kv_channels", h // heads)):
            value = _int(fields, key, who)
            if value and value != default:
                raise Unsupported(f"{who}: model.{key}={value} is not built for a GPT-2-style model ({key} = "
                                  f"{default}); LLaMA-style models (gated) take it")
        return Arch.gpt2(model, tied_embeddings=tied)
    kv = _int(fields, "num_kv_heads", who) or heads
    if heads % kv:
        raise Unsupported(f"{who}: model.num_kv_heads={kv} does not divide num_heads={heads}")
    head_dim = _int(fields, "kv_channels", who)
    if not head_dim:
        if h % heads:
            raise Unsupported(f"model hidden_size={h} is not divisible by num_heads={heads}")
        head_dim = h // heads
    if head_dim % 2:
        raise Unsupported(f"{who}: head width {head_dim} (model.kv_channels, or hidden_size / num_heads) is odd: "
                          "rotary embeddings rotate pairs of channels")
    ffn = _int(fields, "ffn_hidden", who) or 4 * h
    arch = Arch(LLAMA, kv, head_dim, ffn, qkv_bias=_flag(fields, "qkv_bias"), tied_embeddings=tied)
    if family != "moe":
        return arch
    return _moe(arch, fields, experts, model.num_layers, who)


def _moe(arch: Arch, fields: Mapping[str, Any], experts: int, layers: int, who: str) -> Arch:
    if experts < 1:
        raise Unsupported(f"{who}: model.num_experts: a moe model needs num_experts >= 1")
    # common.proto: top_k 0 = 2, moe_every 0 = 2; capacity_factor 0 there means 1.0, so a 0 that is
    # given (a hand-written TESSERA_MODEL, the estimator's spelling) is the only other way to say dropless.
    top_k = _int(fields, "top_k", who) or 2
    every = _int(fields, "moe_every", who) or 2
    if top_k > experts:
        raise Unsupported(f"{who}: model.top_k={top_k} is more than num_experts={experts}")
    cf = _get(fields, "capacity_factor")
    dropless = _flag(fields, "dropless") or (cf is not None and not isinstance(cf, bool) and _zero(cf))
    if not dropless:
        raise Unsupported(f"{who}: model.dropless=false: routing with a capacity factor (tokens over an expert's "
                          "capacity dropped) is not built by the reference trainer, which routes dropless as "
                          "Mixtral does: set model.dropless")
    out = Arch(arch.kind, arch.kv_heads, arch.head_dim, arch.ffn, arch.qkv_bias, arch.tied_embeddings,
               num_experts=experts, top_k=top_k, moe_every=every)
    if not out.num_moe_layers(layers):
        raise Unsupported(f"{who}: model.moe_every={every} puts experts in none of the {layers} layers")
    return out


def _zero(value: Any) -> bool:
    try:
        return float(value) == 0.0
    except (TypeError, ValueError):
        return False


def tp_divides(arch: Arch, model: ModelDims, tp: int) -> None:
    """Unsupported unless tensor parallelism `tp` splits whole heads, whole kv heads and the MLP width."""
    if tp <= 1:
        return
    if model.num_heads % tp:
        raise Unsupported(f"plan tp={tp} does not divide the model's num_heads={model.num_heads} "
                          f"(tensor parallelism splits whole attention heads)")
    if arch.kv_heads % tp:
        raise Unsupported(f"plan tp={tp} does not divide the model's num_kv_heads={arch.kv_heads} "
                          f"(tensor parallelism splits whole key/value heads)")
    if arch.ffn % tp:
        raise Unsupported(f"plan tp={tp} does not divide the model's ffn_hidden={arch.ffn}")
