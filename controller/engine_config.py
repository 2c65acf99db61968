"""The controller engine's settings (controller/engine.py): what `tessera-controller`'s flags set
(controller/main.py), with the defaults a bare `EngineConfig()` runs with in tests. Its own module so
that the engine stays one readable piece."""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera.common.tls import TlsConfig
from tessera.controller.core import frenzy
from tessera.controller.core.backoff import BackoffConfig
from tessera.controller.core.churn import ChurnConfig
from tessera.controller.core.forecast import ForecastConfig
from tessera.controller.core.step_times import StepTimeConfig
from tessera.controller.registry import LivenessConfig


@dataclass(frozen=True)
class EngineConfig:
    round_interval_s: float = 300.0
    inspect_interval_s: float = 20.0
    debounce_s: float = 1.0
    stop_grace_s: float = 30.0
    checkpoint_root: str = "/var/lib/tessera/checkpoints"
    policy: str = "crius"
    policy_mode: str = "paper"
    search_depth: int = 3
    round_budget_s: float = 10.0
    # Seconds a round may spend on new jobs' first Cell estimates (controller/warming.py).
    estimate_budget_s: float = 5.0
    min_gain: float = 0.2
    critical_factor: float = 0.85  # morphling's makespan guard (docs/scheduler-morphling.md); 0 = off
    start_timeout_s: float = 300.0
    progress_timeout_s: float = 900.0
    port_base: int = 29500
    port_count: int = 2000
    # Whose step times the estimates learn from: "nvml" (nodes whose GPUs were probed), "all"
    # (declared inventories too: only for demos and tests, where a CPU process stands in for the
    # declared GPU and its step times say nothing about that GPU), or "off".
    learn_step_times: str = "nvml"
    # host:port of a tessera-estimator that receives the step times too ("" = none).
    estimator: str = ""
    # Environment names a job may set although common/envpolicy.py refuses them (--allow-env).
    allowed_env: frozenset[str] = frozenset()
    step_times: StepTimeConfig = field(default_factory=StepTimeConfig)
    liveness: LivenessConfig = field(default_factory=LivenessConfig)
    backoff: BackoffConfig = field(default_factory=BackoffConfig)
    frenzy: frenzy.FrenzyConfig = field(default_factory=frenzy.FrenzyConfig)
    # The controller's certificate for its calls to the estimator; None = the controller's --insecure.
    tls: TlsConfig | None = None
    # Price per GPU-hour of each GPU type (--prices): the cost objective's input; empty = none.
    prices: tuple[tuple[str, float], ...] = ()
    # Forecasts of start and finish after each round (docs/forecasts.md); None = off. Rounds follow
    # departures live (a finished job kicks a round).
    forecast: ForecastConfig | None = field(default_factory=lambda: ForecastConfig(rounds_at_departures=True))
    # The tenants file (--tenants; controller/tenants.py): GPU quotas per tenant, reloaded when it
    # changes. "" = none: no quotas, every job best-effort.
    tenants_file: str = ""
    # Jobs of one tenant not yet ended that SubmitJob accepts (--max-unended-jobs; controller/unended.py;
    # a tenant's max_unended_jobs in the tenants file wins); 0 = no cap.
    max_unended_jobs: int = 10_000
    # Jobs not yet ended over all tenants that SubmitJob accepts (--max-unended-jobs-total): what bounds
    # them where tenants are free-form (no tenants file, anonymous or admin callers); 0 = no cap.
    max_unended_jobs_total: int = 100_000
    # The churn guard (--churn-limit, --churn-window, --churn-quick, --churn-cooloff; controller/core/churn.py):
    # a tenant whose preempting guaranteed jobs keep ending quickly may not preempt for a while.
    churn: ChurnConfig = field(default_factory=ChurnConfig)
    # --min-run: a best-effort job placed less than this long ago (seconds) is not restarted by a
    # round (controller/core/minrun.py); 0 = off.
    min_run_s: float = 0.0
    # Each attempt's rendezvous key derives from it (controller/launches.py attempt_key): STATE_DIR/rendezvous.key,
    # or etcd meta/rendezvous_key shared by the controllers; b"" = attempts get no key.
    rendezvous_key: bytes = field(default=b"", repr=False)  # a secret: never in a printed config
