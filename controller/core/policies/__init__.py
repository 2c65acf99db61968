"""Scheduling policies behind tessera.controller.core.policy.Policy, by name.

`make_policy("crius")` is Tessera's default. Each baseline has two modes (docs/reference/baselines.md):
"artifact", as the Crius artifact ran it, and "paper", as its own paper describes it. Every policy has a frozen
options type (`OPTIONS_TYPES`); `make_policy(name, mode, options)` takes an instance of it, or a
mapping of its field names, or nothing (the defaults).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tessera.common.errors import InvalidInput
from tessera.controller.core.frenzy import FrenzyConfig
from tessera.controller.core.policies.crius import CriusOptions, CriusPolicy
from tessera.controller.core.policies.elasticflow import ElasticFlowOptions, ElasticFlowPolicy
from tessera.controller.core.policies.fcfs import FcfsOptions, FcfsPolicy
from tessera.controller.core.policies.frenzy import FrenzyPolicy
from tessera.controller.core.policies.gandiva import GandivaOptions, GandivaPolicy
from tessera.controller.core.policies.gavel import GavelOptions, GavelPolicy
from tessera.controller.core.policies.morphling import MorphlingOptions, MorphlingPolicy
from tessera.controller.core.policies.sia import SiaOptions, SiaPolicy
from tessera.controller.core.policy import Mode, Policy

MODES = tuple(m.value for m in Mode)

PolicyOptions = (CriusOptions | ElasticFlowOptions | FcfsOptions | FrenzyConfig | GandivaOptions
                 | GavelOptions | MorphlingOptions | SiaOptions)

O = TypeVar("O", CriusOptions, ElasticFlowOptions, FcfsOptions, FrenzyConfig, GandivaOptions,
            GavelOptions, MorphlingOptions, SiaOptions)


class UnknownPolicy(InvalidInput, ValueError):
    """A policy name that is neither registered nor an alias."""


class BadPolicyOptions(UnknownPolicy):
    """Options of the wrong type for the policy, or naming a field it does not have."""


@dataclass(frozen=True)
class _Entry(Generic[O]):
    options: type[O]
    build: Callable[[Mode, O], Policy]
    # Option fields the name itself fixes (a variant: "crius-ddl" is Crius with deadline_aware).
    variant: Mapping[str, object] = field(default_factory=dict)

    def make(self, name: str, mode: Mode, options: O | Mapping[str, object] | None) -> Policy:
        kind = self.options.__name__
        explicit: set[str] = set()  # fields the caller named (a mapping's keys)
        if options is None:
            opts = self.options()
        elif isinstance(options, self.options):
            opts = options
        elif isinstance(options, Mapping):
            hints = typing.get_type_hints(self.options)
            known = sorted(f.name for f in dataclasses.fields(self.options) if f.name != "mode")
            bad = sorted(str(k) for k in options if k not in known)
            if bad:
                raise BadPolicyOptions(f"policy {name!r}: unknown option {', '.join(map(repr, bad))}; "
                                       f"{kind} has {', '.join(known) or 'no options'}"
                                       + ("; the mode is make_policy's argument" if "mode" in bad else ""))
            for k, v in options.items():
                if not _is_a(v, hints[k]):
                    want = getattr(hints[k], "__name__", str(hints[k]))
                    raise BadPolicyOptions(f"policy {name!r}: option {k} must be {want}, not {v!r}")
            opts = self.options(**typing.cast(dict[str, Any], dict(options)))
            explicit = set(options)
        else:
            raise BadPolicyOptions(f"policy {name!r} takes {kind}, not {type(options).__name__}")
        default = self.options()
        for key, value in self.variant.items():
            got = getattr(opts, key)
            if got != value and (key in explicit or got != getattr(default, key)):
                raise BadPolicyOptions(f"policy {name!r} sets {key}={value!r}; the options say {got!r}")
        if self.variant:
            opts = dataclasses.replace(opts, **typing.cast(dict[str, Any], self.variant))
        return self.build(mode, opts)


def _is_a(value: object, hint: object) -> bool:
    for t in typing.get_args(hint) or (hint,):
        if t is type(None) and value is None:
            return True
        if isinstance(value, bool):  # a bool is an int to isinstance, not to an option
            if t is bool:
                return True
        elif t is float and isinstance(value, (int, float)) or isinstance(t, type) and isinstance(value, t):
            return True
    return False


def _crius(**variant: object) -> _Entry[CriusOptions]:
    return _Entry(CriusOptions, lambda m, o: CriusPolicy(dataclasses.replace(o, mode=m)), variant)


FACTORIES: dict[str, _Entry[Any]] = {
    "crius": _crius(),
    "crius-ddl": _crius(deadline_aware=True),
    "crius-na": _crius(scale_count=False),
    "crius-nh": _crius(change_type=False),
    "crius-no": _crius(opportunistic=False),
    "fcfs": _Entry(FcfsOptions, lambda m, o: FcfsPolicy(m)),
    "frenzy": _Entry(FrenzyConfig, lambda m, o: FrenzyPolicy(o, mode=m)),
    "gavel": _Entry(GavelOptions, lambda m, o: GavelPolicy(m, o)),
    "gandiva": _Entry(GandivaOptions, lambda m, o: GandivaPolicy(m)),
    "sia": _Entry(SiaOptions, lambda m, o: SiaPolicy(m)),
    # Morphling has one description (its paper and artifact agree): the mode is ignored.
    "morphling": _Entry(MorphlingOptions, lambda m, o: MorphlingPolicy(o, m)),
    "elasticflow": _Entry(ElasticFlowOptions, lambda m, o: ElasticFlowPolicy(m, o.loose), {"loose": False}),
    "elasticflow-l": _Entry(ElasticFlowOptions, lambda m, o: ElasticFlowPolicy(m, o.loose), {"loose": True}),
}

ALIASES = {"elasticflow-ls": "elasticflow-l", "ef": "elasticflow-l", "ef-ls": "elasticflow-l"}

# The options type of each policy name.
OPTIONS_TYPES: dict[str, type[PolicyOptions]] = {k: e.options for k, e in FACTORIES.items()}


def policy_names() -> list[str]:
    return sorted(FACTORIES)


def parse_mode(mode: Mode | str) -> Mode:
    try:
        return Mode(mode)
    except ValueError:
        raise UnknownPolicy(f"unknown mode {mode!r}: use one of {', '.join(MODES)}") from None


def make_policy(name: str, mode: Mode | str = Mode.PAPER,
                options: PolicyOptions | Mapping[str, object] | None = None) -> Policy:
    """A policy by name ("crius", "fcfs", ...), in mode "paper" or "artifact", with its options:
    an instance of its type in `OPTIONS_TYPES` (e.g. `CriusOptions` for every crius variant,
    `FrenzyConfig` for frenzy), a mapping of that type's field names, or None for the defaults.
    The name's variant fields (crius-ddl: deadline_aware, elasticflow: loose, ...) and, for Crius,
    the mode are set on top of the options; options of another type, an unknown field, or a field
    that contradicts the variant raise `BadPolicyOptions`."""
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    m = parse_mode(mode)
    entry = FACTORIES.get(key)
    if entry is None:
        raise UnknownPolicy(f"unknown policy {name!r}: use one of {', '.join(policy_names())}")
    return entry.make(name, m, options)
