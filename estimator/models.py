"""Model dimensions: registered names and the dataclass every estimator function takes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelDims:
    hidden_size: int
    num_layers: int
    num_heads: int
    vocab_size: int
    seq_length: int
    name: str = ""

    @property
    def signature(self) -> str:
        """A stable key for caches: same dimensions, same signature, whatever the name."""
        return f"h{self.hidden_size}-l{self.num_layers}-a{self.num_heads}-v{self.vocab_size}-s{self.seq_length}"


# Public configurations of the families the seeds evaluate (GPT-2: OpenAI's released configs;
# LLaMA-2: Meta's model card; BERT: Devlin et al. Table; seq_length is the pretraining context).
REGISTERED: dict[str, ModelDims] = {
    m.name: m
    for m in [
        ModelDims(768, 12, 12, 50257, 1024, "gpt2-small"),
        ModelDims(1024, 24, 16, 50257, 1024, "gpt2-medium"),
        ModelDims(1280, 36, 20, 50257, 1024, "gpt2-large"),
        ModelDims(1600, 48, 25, 50257, 1024, "gpt2-xl"),
        ModelDims(4096, 32, 32, 32000, 4096, "llama2-7b"),
        ModelDims(5120, 40, 40, 32000, 4096, "llama2-13b"),
        ModelDims(1024, 24, 16, 30522, 512, "bert-large"),
        ModelDims(768, 12, 12, 30522, 512, "bert-base"),
    ]
}


def registered(name: str) -> ModelDims | None:
    return REGISTERED.get(name.strip().lower())
