"""Tessera's reference trainer: a small GPT in torch that runs the plans Tessera schedules.

Run it as `python -m tessera.clients.reference_trainer` under a node agent (or by hand: it falls back to the
trainer SDK's defaults). See docs/trainer.md. Importing this package does not import torch; only
`tessera.clients.reference_trainer.train` (and the model/data/checkpoint modules it uses) do.
"""

from tessera.clients.reference_trainer.config import EXIT_ERROR, EXIT_OK, EXIT_UNSUPPORTED

ENTRYPOINT_MODULE = "tessera.clients.reference_trainer"

__all__ = ["ENTRYPOINT_MODULE", "EXIT_ERROR", "EXIT_OK", "EXIT_UNSUPPORTED"]
