"""Scheduling policies behind tessera.controller.core.policy.Policy, by name.

`make_policy("crius")` is Tessera's default. Each baseline has two modes
(docs/reference/baselines.md): "artifact", as the Crius artifact ran it, and "paper", as its own
paper describes it.
"""

from __future__ import annotations

from collections.abc import Callable

from tessera.common.errors import InvalidInput
from tessera.controller.core.policies.crius import CriusOptions, CriusPolicy
from tessera.controller.core.policies.elasticflow import ElasticFlowPolicy
from tessera.controller.core.policies.fcfs import FcfsPolicy
from tessera.controller.core.policies.frenzy import FrenzyPolicy
from tessera.controller.core.policies.gandiva import GandivaPolicy
from tessera.controller.core.policies.gavel import GavelPolicy
from tessera.controller.core.policies.sia import SiaPolicy
from tessera.controller.core.policy import Policy

MODES = ("paper", "artifact")


def _crius(mode: str, **kw: object) -> Policy:
    return CriusPolicy(CriusOptions(mode=mode, **kw))  # type: ignore[arg-type]


FACTORIES: dict[str, Callable[[str], Policy]] = {
    "crius": lambda m: _crius(m),
    "crius-ddl": lambda m: _crius(m, deadline_aware=True),
    "crius-na": lambda m: _crius(m, scale_count=False),
    "crius-nh": lambda m: _crius(m, change_type=False),
    "crius-no": lambda m: _crius(m, opportunistic=False),
    "fcfs": lambda m: FcfsPolicy(m),
    "frenzy": lambda m: FrenzyPolicy(mode=m),
    "gavel": lambda m: GavelPolicy(m),
    "gandiva": lambda m: GandivaPolicy(m),
    "sia": lambda m: SiaPolicy(m),
    "elasticflow": lambda m: ElasticFlowPolicy(m, loose=False),
    "elasticflow-l": lambda m: ElasticFlowPolicy(m, loose=True),
}

ALIASES = {"elasticflow-ls": "elasticflow-l", "ef": "elasticflow-l", "ef-ls": "elasticflow-l"}


class UnknownPolicy(InvalidInput, ValueError):
    """A policy name that is neither registered nor an alias."""


def policy_names() -> list[str]:
    return sorted(FACTORIES)


def make_policy(name: str, mode: str = "paper") -> Policy:
    """A policy by name ("crius", "fcfs", ...), in mode "paper" or "artifact"."""
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if mode not in MODES:
        raise UnknownPolicy(f"unknown mode {mode!r}: use one of {', '.join(MODES)}")
    f = FACTORIES.get(key)
    if f is None:
        raise UnknownPolicy(f"unknown policy {name!r}: use one of {', '.join(policy_names())}")
    return f(mode)
