"""Entry point: read the contract, install the signal handlers, check the plan, then import torch.

Exit codes: 0 = all iterations done, or stopped cooperatively after a checkpoint; 3 = this
configuration is not supported by the reference trainer (one line on stderr says why); 1 = a stale
attempt (a later attempt of the job claimed the checkpoints: one line says so, nothing was published),
a diverged step (loss or gradient norm not finite: one line, nothing applied or published), no
complete checkpoint that loads (one line names each one tried), or any other error (traceback on
stderr); 2 = bad command-line flags.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence

from tessera.clients.trainer import ContractError, StaleAttempt, TrainerContext
from tessera.clients.trainer.reference.config import (
    EXIT_ERROR,
    EXIT_UNSUPPORTED,
    Unsupported,
    parse_options,
    resolve,
)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(sys.argv[1:] if argv is None else argv)
    try:
        ctx = TrainerContext.from_env()
    except ContractError as e:
        print(f"bad worker environment: {e}", file=sys.stderr, flush=True)
        return EXIT_UNSUPPORTED
    # Before the slow torch import: a SIGTERM from now on means "stop at the next step boundary".
    ctx.install_signal_handlers()
    try:
        cfg = resolve(ctx, options)
    except Unsupported as e:
        print(str(e), file=sys.stderr, flush=True)
        return EXIT_UNSUPPORTED
    try:
        import warnings

        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
        # DCP at world size 1 (no process group) says it saves/loads "in a single process": intended.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        from tessera.clients.trainer.reference import checkpoint, resume, train

        try:
            return train.run(ctx, cfg)
        except checkpoint.IncompatibleCheckpoint as e:
            print(f"incompatible checkpoint: {e}", file=sys.stderr, flush=True)
            return EXIT_UNSUPPORTED
        except (train.Diverged, resume.NoReadableCheckpoint) as e:  # one line says it all
            print(str(e), file=sys.stderr, flush=True)
            return EXIT_ERROR
        except StaleAttempt as e:  # a duplicate left by a lost node: it must not train or write on
            print(f"stopping: {e}", file=sys.stderr, flush=True)
            return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130
    except Exception:  # noqa: BLE001 - any failure becomes a non-zero exit with its traceback
        traceback.print_exc()
        sys.stderr.flush()
        return EXIT_ERROR
    finally:
        ctx.close()
