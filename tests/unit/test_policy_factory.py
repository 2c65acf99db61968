"""make_policy(name, mode, options): typed options for every policy, refused when they do not fit."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.controller.core.frenzy import FrenzyConfig
from tessera.controller.core.policies import (
    OPTIONS_TYPES,
    BadPolicyOptions,
    UnknownPolicy,
    make_policy,
    policy_names,
)
from tessera.controller.core.policies.crius import CriusOptions, CriusPolicy
from tessera.controller.core.policies.elasticflow import ElasticFlowOptions, ElasticFlowPolicy
from tessera.controller.core.policies.fcfs import FcfsOptions, FcfsPolicy
from tessera.controller.core.policies.frenzy import FrenzyPolicy
from tessera.controller.core.policies.gandiva import GandivaOptions, GandivaPolicy
from tessera.controller.core.policies.gavel import GavelOptions, GavelPolicy
from tessera.controller.core.policies.morphling import MorphlingPolicy
from tessera.controller.core.policies.sia import SiaOptions, SiaPolicy
from tessera.controller.core.policy import Mode


def test_every_policy_has_an_options_type_and_takes_it() -> None:
    want = {"crius": CriusPolicy, "fcfs": FcfsPolicy, "frenzy": FrenzyPolicy, "gavel": GavelPolicy,
            "gandiva": GandivaPolicy, "sia": SiaPolicy, "elasticflow": ElasticFlowPolicy,
            "morphling": MorphlingPolicy}
    assert set(OPTIONS_TYPES) == set(policy_names())
    for name in policy_names():
        for mode in Mode:
            pol = make_policy(name, mode, OPTIONS_TYPES[name]())
            assert isinstance(pol, want[name.split("-")[0]])
            # The ablations (na, nh, no) report as "crius", as they always have.
            ablation = name in ("crius-na", "crius-nh", "crius-no")
            assert pol.name == ("crius" if ablation else name)
            assert (pol.options.mode if isinstance(pol, CriusPolicy) else vars(pol)["mode"]) is mode
    assert OPTIONS_TYPES["fcfs"] is FcfsOptions and OPTIONS_TYPES["gavel"] is GavelOptions
    assert OPTIONS_TYPES["gandiva"] is GandivaOptions and OPTIONS_TYPES["sia"] is SiaOptions
    assert OPTIONS_TYPES["frenzy"] is FrenzyConfig and OPTIONS_TYPES["crius-nh"] is CriusOptions


def test_crius_options_as_the_engine_passes_them() -> None:
    # What the live controller builds for "crius": its mode, and a running job moves only for a gain.
    pol = make_policy("crius", "artifact", CriusOptions(upgrade_min_gain=0.2))
    assert isinstance(pol, CriusPolicy)
    assert pol.options == CriusOptions(mode=Mode.ARTIFACT, upgrade_min_gain=0.2)
    # A mapping of field names says the same.
    same = make_policy("crius", Mode.ARTIFACT, {"upgrade_min_gain": 0.2})
    assert isinstance(same, CriusPolicy) and same.options == pol.options
    # The variant's own fields go on top of the options; the rest are kept.
    ddl = make_policy("crius-ddl", "paper", CriusOptions(search_depth=2))
    assert isinstance(ddl, CriusPolicy) and ddl.name == "crius-ddl"
    assert ddl.options == CriusOptions(deadline_aware=True, search_depth=2)
    na = make_policy("crius-na", options={"upgrade_steps": 0})
    assert isinstance(na, CriusPolicy)
    assert (na.options.scale_count, na.options.change_type, na.options.upgrade_steps) == (False, True, 0)


def test_frenzy_and_elasticflow_options() -> None:
    cfg = FrenzyConfig(reserve_bytes=3 << 30)
    pol = make_policy("frenzy", "paper", cfg)
    assert isinstance(pol, FrenzyPolicy) and pol.cfg is cfg
    assert isinstance(make_policy("frenzy"), FrenzyPolicy)
    strict = make_policy("elasticflow", "paper", ElasticFlowOptions(loose=False))
    loose = make_policy("ef", "artifact")
    assert isinstance(strict, ElasticFlowPolicy) and isinstance(loose, ElasticFlowPolicy)
    assert (strict.loose, loose.loose, loose.name) == (False, True, "elasticflow-l")


def test_options_of_another_policy_or_unknown_fields_are_refused() -> None:
    with pytest.raises(BadPolicyOptions, match="policy 'crius' takes CriusOptions, not FcfsOptions"):
        make_policy("crius", "paper", FcfsOptions())
    with pytest.raises(BadPolicyOptions, match="policy 'frenzy' takes FrenzyConfig, not CriusOptions"):
        make_policy("frenzy", "paper", CriusOptions())
    with pytest.raises(BadPolicyOptions, match=r"unknown option 'depth'; CriusOptions has .*search_depth"):
        make_policy("crius", "paper", {"depth": 2})
    with pytest.raises(BadPolicyOptions, match="the mode is make_policy's argument"):
        make_policy("crius", "paper", {"mode": "artifact"})
    with pytest.raises(BadPolicyOptions, match="FcfsOptions has no options"):
        make_policy("fcfs", "paper", {"blocking": False})
    with pytest.raises(BadPolicyOptions, match="option upgrade_min_gain must be float"):
        make_policy("crius", "paper", {"upgrade_min_gain": "high"})
    with pytest.raises(BadPolicyOptions, match="option opportunistic must be bool"):
        make_policy("crius", "paper", {"opportunistic": 1})
    # A field the name fixes, set the other way, is a contradiction, not silently overridden.
    with pytest.raises(BadPolicyOptions, match="policy 'elasticflow-l' sets loose=True"):
        make_policy("elasticflow-l", "paper", ElasticFlowOptions(loose=False))
    with pytest.raises(BadPolicyOptions, match="sets deadline_aware=True"):
        make_policy("crius-ddl", "paper", {"deadline_aware": False, "restart_s": 1.0})
    # Both are UnknownPolicy errors, which the callers already report as bad input.
    assert issubclass(BadPolicyOptions, UnknownPolicy)


def test_unknown_policy_and_mode() -> None:
    with pytest.raises(UnknownPolicy, match="unknown policy 'nope': use one of crius, crius-ddl"):
        make_policy("nope")
    with pytest.raises(UnknownPolicy, match="unknown mode 'best': use one of paper, artifact"):
        make_policy("crius", "best")
    untyped: dict[str, Any] = {"mode": "best"}
    with pytest.raises(ValueError, match="'best' is not a valid Mode"):
        CriusOptions(**untyped)
