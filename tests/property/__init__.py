"""Property-based tests (hypothesis).

Reproducible in CI: every test uses profile(N), derandomized (the examples are a fixed function of the
test, the same on every run and machine) with no example database (nothing read from or written to
.hypothesis/), no per-example deadline (2 shared cores make timings noisy) and a modest number of
examples so each test stays well under a minute. TESSERA_HYPOTHESIS_EXAMPLES=N overrides the count
for a longer local exploration, and TESSERA_HYPOTHESIS_RANDOM=1 draws fresh random examples (then
a failure prints the seed to reproduce it with @seed).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_BASE = settings(
    derandomize=os.environ.get("TESSERA_HYPOTHESIS_RANDOM") != "1",
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    print_blob=True,
)


def profile(examples: int) -> settings:
    """The CI profile with `examples` examples (TESSERA_HYPOTHESIS_EXAMPLES overrides)."""
    return settings(_BASE, max_examples=int(os.environ.get("TESSERA_HYPOTHESIS_EXAMPLES", examples)))
