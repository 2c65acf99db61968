"""Model dimensions: registered names and the dataclass every estimator function takes.

Three families (the ones the seeds evaluate):

- ``decoder``: decoder-only dense transformer. With ``gated=False`` it is GPT-2 style (LayerNorm,
  biases, learned position embeddings, GELU MLP of ``ffn_hidden`` = 4h, dropout). With ``gated=True``
  it is LLaMA style (RMSNorm, no biases, rotary positions so no position parameters, SwiGLU MLP of
  three ``h x ffn_hidden`` matrices, no dropout).
- ``encoder``: BERT (masked LM): word + position + token-type embeddings and their LayerNorm, the
  GPT-2-style layer stack (bidirectional attention; same shapes), and the MLM head (a dense h x h
  transform + LayerNorm, the output projection tied to the word embedding, plus a V bias). No pooler.
- ``moe``: GShard-style mixture of experts on the GPT-2-style stack: every ``moe_every``-th layer
  (GShard: every other one) replaces its MLP by ``num_experts`` expert MLPs and an ``h x E`` router;
  each token goes to its ``top_k`` experts with a ``capacity_factor``. Experts are sharded across
  DP ranks by the plan's ``ep``.
  With ``gated=True`` it is Mixtral style (SwiGLU experts on the LLaMA-style stack; ``moe_every=1``
  puts experts in every layer; ``capacity_factor=0`` is dropless routing, as Mixtral and torchtitan).
- ``encoder-decoder``: T5 / mT5: ``num_layers`` encoder layers over ``seq_length`` tokens and
  ``num_decoder_layers`` decoder layers (self- and cross-attention) over ``decoder_seq_length``
  tokens; no biases, RMS-style LayerNorm, relative position buckets; ``gated`` picks T5 v1.1/mT5's
  gated-GELU MLP over the original T5's ReLU MLP; per-head width ``kv_channels`` (T5's d_kv).
- ``wresnet``: Alpa's Wide-ResNet, the Crius artifact's third family (estimator/convnets.py). Its
  fields read: ``hidden_size`` = the stem's filters, ``num_layers`` = the depth (50, 101, 152, 200),
  ``num_heads`` = 1, ``vocab_size`` = classes, ``seq_length`` = the image side, ``width_factor`` =
  the widening of each block's 3x3 convolution. Only the Cell estimator models it (``is_transformer``
  is False: the memory formulas, the traced mode and the workers are for transformers).

Only the first six fields are required; every added field has a default that keeps the original
meaning (a GPT-2-style decoder with a 4h MLP and tied embeddings), so ``ModelDims(h, l, a, v, s)``
and the REGISTERED names keep working.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tessera.estimator.convnets import STAGE_SIZES
from tessera.estimator.errors import PlanInputError

Family = Literal["decoder", "encoder", "moe", "wresnet", "encoder-decoder"]
FAMILIES = ("decoder", "encoder", "moe", "wresnet", "encoder-decoder")


@dataclass(frozen=True)
class ModelDims:
    hidden_size: int
    num_layers: int
    num_heads: int
    vocab_size: int
    seq_length: int
    name: str = ""
    family: Family = "decoder"
    ffn_hidden: int = 0  # 0: 4 * hidden_size
    gated: bool = False  # LLaMA style (SwiGLU, RMSNorm, no bias, rotary, no dropout)
    num_kv_heads: int = 0  # 0: num_heads (grouped-query attention when smaller)
    tied_embeddings: bool = True
    num_experts: int = 0  # moe only
    top_k: int = 2
    moe_every: int = 2  # every moe_every-th layer (1-based: layers moe_every-1, 2*moe_every-1, ...) is MoE
    capacity_factor: float = 1.0
    width_factor: int = 0  # wresnet only
    # Current families (Llama 3, Mistral/Mixtral, Qwen2.5, Gemma 2, T5/mT5); every default keeps the
    # meaning above.
    kv_channels: int = 0  # per-head dimension; 0: hidden_size // num_heads (Gemma 2, T5 set their own)
    qkv_bias: bool = False  # biases on the q, k, v projections only (Qwen2.5) on a bias-free model
    num_decoder_layers: int = 0  # encoder-decoder only: decoder layers; 0 = num_layers (T5's encoder)
    decoder_seq_length: int = 0  # encoder-decoder only: target tokens; 0 = seq_length
    sliding_window: int = 0  # tokens a sliding-window layer attends to (Mistral: all, Gemma 2: every other)
    logit_softcap: float = 0.0  # Gemma 2's tanh soft-capping of the final logits (extra logits-sized tensors)
    sandwich_norm: bool = False  # Gemma 2: norms after attention and MLP as well as before

    @property
    def is_transformer(self) -> bool:
        return self.family != "wresnet"

    @property
    def family_word(self) -> str:
        """The family as a job file writes it (`model.family: wide_resnet`), for messages."""
        return "wide_resnet" if self.family == "wresnet" else self.family

    def require_transformer(self, what: str) -> None:
        """PlanInputError naming ``model.family`` when `what` (a memory formula, a trace...) is asked of a
        family it does not cover."""
        if not self.is_transformer:
            raise PlanInputError("model.family", f"{what} covers transformers; a {self.family_word} model has Cells "
                                                 "only (GetCells / tessctl estimate cells)")

    @property
    def signature(self) -> str:
        """A stable key for caches: same dimensions, same signature, whatever the name."""
        base = f"h{self.hidden_size}-l{self.num_layers}-a{self.num_heads}-v{self.vocab_size}-s{self.seq_length}"
        extra: list[str] = []
        if self.family != "decoder":
            extra.append(self.family)
        if self.ffn_hidden and self.ffn_hidden != 4 * self.hidden_size:
            extra.append(f"f{self.ffn_hidden}")
        if self.gated:
            extra.append("gated")
        if self.num_kv_heads and self.num_kv_heads != self.num_heads:
            extra.append(f"kv{self.num_kv_heads}")
        if not self.tied_embeddings:
            extra.append("untied")
        if self.family == "moe":
            extra.append(f"e{self.num_experts}k{self.top_k}m{self.moe_every}c{self.capacity_factor:g}")
        if self.family == "wresnet":
            extra.append(f"wf{self.width_factor}")
        for key, value in (("kvc", self.kv_channels), ("qkvb", int(self.qkv_bias)),
                           ("dl", self.num_decoder_layers), ("ds", self.decoder_seq_length),
                           ("sw", self.sliding_window), ("cap", self.logit_softcap),
                           ("sandwich", int(self.sandwich_norm))):
            if value:
                extra.append(f"{key}{value:g}")
        return "-".join([base, *extra])

    # Derived sizes -------------------------------------------------------------------------------
    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden_size

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_heads

    @property
    def attention_width(self) -> int:
        """num_heads x head_dim: the q projection's output (hidden_size unless kv_channels says otherwise)."""
        return self.num_heads * self.head_dim

    @property
    def has_bias(self) -> bool:
        """GPT-2 and BERT have biases; LLaMA-style and T5 models have none (Qwen2.5's qkv_bias aside)."""
        return not self.gated and self.family != "encoder-decoder"

    @property
    def decoder_layers(self) -> int:
        """Encoder-decoder: the decoder's layers (num_layers counts the encoder's)."""
        return self.num_decoder_layers or self.num_layers

    @property
    def target_length(self) -> int:
        """Encoder-decoder: the decoder's tokens per sample."""
        return self.decoder_seq_length or self.seq_length

    @property
    def has_dropout(self) -> bool:
        """GPT-2 and BERT train with dropout (1-byte masks); LLaMA does not."""
        return not self.gated

    @property
    def learned_positions(self) -> bool:
        """GPT-2 and BERT learn a position table; rotary (LLaMA style) and T5's relative position
        buckets have none."""
        return not self.gated and self.family != "encoder-decoder"

    def is_moe_layer(self, i: int) -> bool:
        """Whether layer i (0-based) has experts."""
        return self.family == "moe" and self.num_experts > 0 and (i + 1) % self.moe_every == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    def validate(self) -> ModelDims:
        """Raise PlanInputError naming the field (``model.hidden_size``...) for impossible dimensions."""
        for f in ("hidden_size", "num_layers", "num_heads", "vocab_size", "seq_length"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PlanInputError(f"model.{f}", f"must be an integer >= 1, got {v!r}")
        for f in ("ffn_hidden", "num_kv_heads", "num_experts", "kv_channels", "num_decoder_layers",
                  "decoder_seq_length", "sliding_window"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise PlanInputError(f"model.{f}", f"must be an integer >= 0, got {v!r}")
        if self.family not in FAMILIES:
            raise PlanInputError("model.family", f"{self.family!r} is not one of {', '.join(FAMILIES)}")
        if not isinstance(self.logit_softcap, (int, float)) or isinstance(self.logit_softcap, bool) \
                or not self.logit_softcap >= 0:
            raise PlanInputError("model.logit_softcap", f"must be a number >= 0, got {self.logit_softcap!r}")
        if self.family != "encoder-decoder":
            for f in ("num_decoder_layers", "decoder_seq_length"):
                if getattr(self, f):
                    raise PlanInputError(f"model.{f}", f"only the encoder-decoder family has one (family {self.family!r})")
        if not self.kv_channels and self.hidden_size % self.num_heads:
            raise PlanInputError("model.num_heads",
                                 f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.num_heads % self.kv_heads:
            raise PlanInputError("model.num_kv_heads",
                                 f"num_heads {self.num_heads} is not divisible by num_kv_heads {self.kv_heads}")
        if self.family == "moe":
            if self.num_experts < 1:
                raise PlanInputError("model.num_experts", "a moe model needs num_experts >= 1")
            if not 1 <= self.top_k <= self.num_experts:
                raise PlanInputError("model.top_k", f"must be in 1..num_experts ({self.num_experts}), got {self.top_k}")
            if self.moe_every < 1:
                raise PlanInputError("model.moe_every", f"must be >= 1, got {self.moe_every}")
            if not self.capacity_factor >= 0:
                raise PlanInputError("model.capacity_factor", f"must be > 0, or 0 for dropless routing "
                                                              f"(Mixtral), got {self.capacity_factor}")
        elif self.num_experts:
            raise PlanInputError("model.num_experts", f"only the moe family has experts (family {self.family!r})")
        if self.family == "wresnet":
            if self.num_layers not in STAGE_SIZES:
                raise PlanInputError("model.num_layers", f"a Wide-ResNet's depth is one of "
                                                         f"{', '.join(map(str, STAGE_SIZES))}, got {self.num_layers}")
            if self.num_heads != 1:
                raise PlanInputError("model.num_heads", f"must be 1 for a Wide-ResNet, got {self.num_heads}")
            if isinstance(self.width_factor, bool) or not isinstance(self.width_factor, int) or self.width_factor < 1:
                raise PlanInputError("model.width_factor", f"must be an integer >= 1, got {self.width_factor!r}")
        elif self.width_factor:
            raise PlanInputError("model.width_factor", f"only the wresnet family has one (family {self.family!r})")
        return self


# Public configurations of the families the seeds evaluate (GPT-2: OpenAI's released configs;
# LLaMA-2: Meta's model card; BERT: Devlin et al. Table; seq_length is the pretraining context).
# GShard MoE: the Crius artifact's models (arena/models.json of the shared data, docs/reference/data.md;
# its trainer uses an 8h expert MLP and untied embeddings,
# sjtu-epcc/arena runtime/crius_worker/jax/trainer/moe_trainer.py).
_SEED_MODELS = [
    ModelDims(768, 12, 12, 50257, 1024, "gpt2-small"),
    ModelDims(1024, 24, 16, 50257, 1024, "gpt2-medium"),
    ModelDims(1280, 36, 20, 50257, 1024, "gpt2-large"),
    ModelDims(1600, 48, 25, 50257, 1024, "gpt2-xl"),
    ModelDims(4096, 32, 32, 32000, 4096, "llama2-7b", ffn_hidden=11008, gated=True, tied_embeddings=False),
    ModelDims(5120, 40, 40, 32000, 4096, "llama2-13b", ffn_hidden=13824, gated=True, tied_embeddings=False),
    ModelDims(1024, 24, 16, 30522, 512, "bert-large", family="encoder"),
    ModelDims(768, 12, 12, 30522, 512, "bert-base", family="encoder"),
    *(ModelDims(h, l, 16, 32000, 1024, f"moe-{size}", family="moe", num_experts=e, ffn_hidden=8 * h,
                tied_embeddings=False)
      for size, h, l, e in (("690m", 768, 8, 16), ("1.3b", 768, 16, 16), ("2.4b", 1024, 16, 16),
                            ("10b", 1536, 16, 32), ("27b", 2048, 16, 48))),
    # Wide-ResNet: the Crius artifact's models.json (Table 2), 1,024 classes, 224 x 224 images.
    *(ModelDims(f, d, 1, 1024, 224, f"wide-resnet-{size}", family="wresnet", width_factor=w)
      for size, f, d, w in (("500m", 224, 50, 2), ("1b", 320, 50, 2), ("2b", 448, 50, 2), ("4b", 640, 50, 2),
                            ("6.8b", 320, 50, 16), ("13b", 320, 101, 16))),
]

# Current families: each row is the model's published config.json on the Hugging Face hub (the repo
# named per family), read as estimator/hfconfig.py reads one. seq_length is the context of the
# model's (last) pretraining stage from its paper or card, not max_position_embeddings (Llama 3.1's
# 131,072 is the long-context extension); a job file's model.seq_length with hf_config says otherwise.
_CURRENT_MODELS = [
    # meta-llama/Llama-3.1-{8B,70B,405B}: rope, SwiGLU, GQA 8 KV heads, vocab 128,256, untied; 8,192 tokens
    # (Llama 3 paper, "The Llama 3 Herd of Models", sec. 3.4: pretraining at 8K before the long-context stage).
    *(ModelDims(h, l, a, 128256, 8192, f"llama3.1-{size}", ffn_hidden=f, gated=True, num_kv_heads=8,
                tied_embeddings=False)
      for size, h, l, a, f in (("8b", 4096, 32, 32, 14336), ("70b", 8192, 80, 64, 28672),
                               ("405b", 16384, 126, 128, 53248))),
    # meta-llama/Llama-3.2-{1B,3B}: tied embeddings (tie_word_embeddings: true), head_dim 64 / 128.
    ModelDims(2048, 16, 32, 128256, 8192, "llama3.2-1b", ffn_hidden=8192, gated=True, num_kv_heads=8),
    ModelDims(3072, 28, 24, 128256, 8192, "llama3.2-3b", ffn_hidden=8192, gated=True, num_kv_heads=8),
    # mistralai/Mistral-7B-v0.3: vocab 32,768, sliding_window null (v0.1's was 4,096); 32K context.
    ModelDims(4096, 32, 32, 32768, 32768, "mistral-7b-v0.3", ffn_hidden=14336, gated=True, num_kv_heads=8,
              tied_embeddings=False),
    # mistralai/Mixtral-8x7B-v0.1 and Mixtral-8x22B-v0.1: 8 SwiGLU experts in every layer, top-2, dropless
    # (Mixtral paper, Jiang et al. 2024: 32K context; the 8x22B card: 64K).
    ModelDims(4096, 32, 32, 32000, 32768, "mixtral-8x7b", family="moe", ffn_hidden=14336, gated=True,
              num_kv_heads=8, tied_embeddings=False, num_experts=8, top_k=2, moe_every=1, capacity_factor=0.0),
    ModelDims(6144, 56, 48, 32000, 65536, "mixtral-8x22b", family="moe", ffn_hidden=16384, gated=True,
              num_kv_heads=8, tied_embeddings=False, num_experts=8, top_k=2, moe_every=1, capacity_factor=0.0),
    # Qwen/Qwen2.5-{0.5B,...,72B}: q/k/v biases; 0.5B-3B tie their embeddings, vocab 151,936 (7B and up
    # 152,064, untied); 32,768 tokens (Qwen2.5 technical report: the final pretraining stage's context).
    *(ModelDims(h, l, a, v, 32768, f"qwen2.5-{size}", ffn_hidden=f, gated=True, num_kv_heads=kv,
                qkv_bias=True, tied_embeddings=tied)
      for size, h, l, a, kv, f, v, tied in (
          ("0.5b", 896, 24, 14, 2, 4864, 151936, True), ("1.5b", 1536, 28, 12, 2, 8960, 151936, True),
          ("3b", 2048, 36, 16, 2, 11008, 151936, True), ("7b", 3584, 28, 28, 4, 18944, 152064, False),
          ("14b", 5120, 48, 40, 8, 13824, 152064, False), ("32b", 5120, 64, 40, 8, 27648, 152064, False),
          ("72b", 8192, 80, 64, 8, 29568, 152064, False))),
    # google/gemma-2-{2b,9b,27b}: gated GELU MLP, head_dim 256 (27B: 128), a 4,096-token sliding window on
    # every other layer, final logits soft-capped at 30, norms before and after each block, tied
    # embeddings of 256,000 rows; 8,192 tokens (Gemma 2 report).
    *(ModelDims(h, l, a, 256000, 8192, f"gemma2-{size}", ffn_hidden=f, gated=True, num_kv_heads=kv,
                kv_channels=d, sliding_window=4096, logit_softcap=30.0, sandwich_norm=True)
      for size, h, l, a, kv, d, f in (("2b", 2304, 26, 8, 4, 256, 9216), ("9b", 3584, 42, 16, 8, 256, 14336),
                                      ("27b", 4608, 46, 32, 16, 128, 36864))),
    # google-t5/t5-{small,base,large,3b,11b} (the original T5: ReLU MLP, tied embeddings, vocab 32,128,
    # d_kv 64, or 128 for 3B/11B). 512 input and 114 target tokens: Raffel et al., sec. 3.1.4
    # (span corruption of 512-token inputs with 15% noise gives about 114 target tokens).
    *(ModelDims(h, l, a, 32128, 512, f"t5-{size}", family="encoder-decoder", ffn_hidden=f, kv_channels=d,
                num_decoder_layers=l, decoder_seq_length=114)
      for size, h, l, a, d, f in (("small", 512, 6, 8, 64, 2048), ("base", 768, 12, 12, 64, 3072),
                                  ("large", 1024, 24, 16, 64, 4096), ("3b", 1024, 24, 32, 128, 16384),
                                  ("11b", 1024, 24, 128, 128, 65536))),
    # google/t5-v1_1-{base,large,xl} and google/flan-t5-{base,large,xl} (same configs): gated GELU,
    # untied output layer, d_kv 64.
    *(ModelDims(h, l, a, 32128, 512, f"{prefix}-{size}", family="encoder-decoder", ffn_hidden=f, gated=True,
                kv_channels=64, tied_embeddings=False, num_decoder_layers=l, decoder_seq_length=114)
      for prefix in ("t5-v1.1", "flan-t5")
      for size, h, l, a, f in (("base", 768, 12, 12, 2048), ("large", 1024, 24, 16, 2816),
                               ("xl", 2048, 24, 32, 5120))),
    # google/mt5-{small,base,large,xl,xxl}: T5 v1.1's architecture with a 250,112-row vocabulary;
    # 1,024 input and 229 target tokens (Xue et al. 2021, sec. 3).
    *(ModelDims(h, l, a, 250112, 1024, f"mt5-{size}", family="encoder-decoder", ffn_hidden=f, gated=True,
                kv_channels=64, tied_embeddings=False, num_decoder_layers=l, decoder_seq_length=229)
      for size, h, l, a, f in (("small", 512, 8, 6, 1024), ("base", 768, 12, 12, 2048),
                               ("large", 1024, 24, 16, 2816), ("xl", 2048, 24, 32, 5120),
                               ("xxl", 4096, 24, 64, 10240))),
]

REGISTERED: dict[str, ModelDims] = {m.name: m for m in [*_SEED_MODELS, *_CURRENT_MODELS]}


def registered(name: str) -> ModelDims | None:
    return REGISTERED.get(name.strip().lower())
