"""A worker's progress report made safe to show and compute with.

The report comes from the job's own program, through its agent: a rate or a time that is not a
finite, non-negative number (inf, NaN, -1) is cleared to 0, i.e. "not reported", before anything
divides by it or turns it into a date (tessctl's ETA divided by 1/inf, `describe job` turned a NaN
time into an integer and stopped there). A NaN or infinite loss is kept: it says the run diverged.

`checkpoint_iteration` is the last iteration with a complete checkpoint, -1 = none yet (the trainer
SDK's default; the reference trainer checkpoints at the iteration it then reports); a report that
leaves it unset (a client built without the SDK) has none, not one at iteration 0. It is kept in
-1..iteration: a checkpoint newer than the work done does not exist, and the agent serves a pending
checkpoint request on a newer one, so a rank that reported 2**62 cleared it without checkpointing.
"""

from __future__ import annotations

import math

from tessera.v1 import common_pb2

_NON_NEGATIVE = ("samples_per_second", "step_time_seconds", "time")
NO_CHECKPOINT = -1


def sanitized(progress: common_pb2.Progress) -> common_pb2.Progress:
    """`progress` itself when it is sound, else a copy with its unusable fields cleared."""
    bad = [f for f in _NON_NEGATIVE if not 0.0 <= getattr(progress, f) < math.inf]
    iteration = max(0, progress.iteration)
    said = progress.HasField("checkpoint_iteration")
    checkpoint = min(max(NO_CHECKPOINT, progress.checkpoint_iteration), iteration) if said else NO_CHECKPOINT
    if (not bad and progress.iteration == iteration and progress.peak_memory_bytes >= 0
            and said and progress.checkpoint_iteration == checkpoint):
        return progress
    out = common_pb2.Progress()
    out.CopyFrom(progress)
    for f in bad:
        setattr(out, f, 0.0)
    out.iteration = iteration
    out.peak_memory_bytes = max(0, out.peak_memory_bytes)
    out.checkpoint_iteration = checkpoint
    return out
