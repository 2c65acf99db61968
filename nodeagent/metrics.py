"""The agent's Prometheus metrics. Process-wide (the default registry), created once at import.

No job id is ever a label: it would grow the series without bound.
"""

from __future__ import annotations

import time

from prometheus_client import Counter, Gauge

WORKERS_RUNNING = Gauge("tessera_agent_workers_running", "Worker processes running or stopping on this node")
HEARTBEAT_FAILURES = Counter(
    "tessera_agent_heartbeat_failures", "Register or Heartbeat calls to the controller that failed"
)
REGISTERED = Gauge("tessera_agent_registered", "1 once the agent has registered with the controller")
LAST_HEARTBEAT_AGE = Gauge(
    "tessera_agent_last_heartbeat_age_seconds",
    "Seconds since the last successful Register or Heartbeat (since the agent started, before any)",
)

_last_success = time.monotonic()
# Read from the metrics HTTP thread: only a float is shared, so no lock is needed.
LAST_HEARTBEAT_AGE.set_function(lambda: time.monotonic() - _last_success)


def heartbeat_result(ok: bool) -> None:
    """Hook for the registration loop."""
    global _last_success
    if ok:
        _last_success = time.monotonic()
        REGISTERED.set(1)
    else:
        HEARTBEAT_FAILURES.inc()
