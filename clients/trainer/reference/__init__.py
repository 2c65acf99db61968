"""Tessera's reference trainer: GPT-2-style, LLaMA-style and Mixtral-style decoders in torch that run the
plans Tessera schedules.

Run it as `python -m tessera.clients.trainer.reference` under a node agent (or by hand: it falls back to the
trainer SDK's defaults). See docs/trainer.md. Importing this package does not import torch; only
`tessera.clients.trainer.reference.train` (and the model/data/checkpoint modules it uses) do.
"""

from tessera.clients.trainer.reference.config import EXIT_ERROR, EXIT_OK, EXIT_UNSUPPORTED

ENTRYPOINT_MODULE = "tessera.clients.trainer.reference"

__all__ = ["ENTRYPOINT_MODULE", "EXIT_ERROR", "EXIT_OK", "EXIT_UNSUPPORTED"]
