"""Morphling's performance model and Tessera's extension (estimator/perf_model.py): literal inputs."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tessera.estimator.perf_model import (
    DEFAULT_ENV,
    MODES,
    Environment,
    FitOptions,
    Params,
    PerfModelInputError,
    Placement,
    Plan,
    RunConfig,
    Sample,
    Workload,
    breakdown,
    fit,
    forward_profile,
    overlap,
    predict,
    refit,
    rmsle,
)

P = Params(
    k_bwd=2.0, k_sync=1.5, k_opt=5e-11, k_os_offload=3e-9, k_const=0.02, k_off=2.0, k_swap=3.0, k_host=2e-10
)
W7B = Workload(
    "toy-7b",
    params=6.74e9,
    layers=32,
    hidden=4096,
    seq=4096,
    global_batch=8,
    fwd_ref_time=0.381,
    fwd_ref_batch=1.0,
    fwd_exponent=0.9,
)
W1B = Workload(
    "toy-1b",
    params=1.2e9,
    layers=24,
    hidden=2048,
    seq=1024,
    global_batch=32,
    fwd_ref_time=0.5,
    fwd_ref_batch=32,
)


def cfg(plan: Plan, placement: str, workload: Workload = W7B, cpus: int = 4) -> RunConfig:
    return RunConfig(workload, plan, Placement.parse(placement), cpus=cpus)


# ---------------------------------------------------------------------------------------------- parsing


def test_placement_digit_strings() -> None:
    assert Placement.parse("88888888").gpus_per_node == (8,) * 8
    assert Placement.parse("88888888").gpus == 64
    assert Placement.parse("233").gpus_per_node == (2, 3, 3)
    assert Placement.parse("8,8,16").gpus_per_node == (8, 8, 16)
    assert str(Placement.parse("1124")) == "1124"
    assert Placement.parse("35").node_of_rank() == [0, 0, 0, 1, 1, 1, 1, 1]


@pytest.mark.parametrize("text", ["", "80", "8a", "8,,8"])
def test_placement_bad_strings_name_the_field(text: str) -> None:
    with pytest.raises(PerfModelInputError) as e:
        Placement.parse(text)
    assert e.value.field == "placement"


def test_plan_kinds() -> None:
    assert Plan(dp=8, tp=4, pp=2).kind == "3d"
    assert Plan(dp=8, tp=4, pp=2).gpus == 64
    assert Plan(dp=4, zero="offload").kind == "zero-offload"
    assert Plan(dp=4, zero="zero-dp").kind == "zero-dp"
    assert Plan(dp=4, checkpointing=True).kind == "gc"
    assert Plan(dp=4, ga_steps=2).kind == "ga"
    assert Plan(dp=4).kind == "dp"


# ------------------------------------------------------------------------------------- golden values


def test_overlap_function() -> None:
    assert overlap(1.0, 0.3, 0.2) == pytest.approx(0.5)
    assert overlap(100.0, 0.3, 0.2) == pytest.approx(0.3, rel=1e-6)
    assert overlap(2.0, 3.0, 4.0) == pytest.approx(5.0)
    assert overlap(5.0, 0.0, 0.2) == 0.2


def test_morphling_dp_single_node_by_hand() -> None:
    """Appendix A for plain DP on one server: T_fwd + f(T_bwd, V_dp/B_intra) + k_opt*P + k_const."""
    c = cfg(Plan(dp=8), "8", W1B)
    t_fwd = 0.5 * (32 / 8) / 32  # linear in the per-GPU batch
    t_bwd = 2.0 * t_fwd
    t_dp = 1.2e9 * 2 * 2 * 7 / 8 / 200e9
    want = t_fwd + (t_bwd**1.5 + t_dp**1.5) ** (1 / 1.5) + 5e-11 * 1.2e9 + 0.02
    assert predict(P, c, "morphling") == pytest.approx(want, rel=1e-12)


def test_morphling_offload_by_hand() -> None:
    """A.2: T_oo = f^k_off(T_dp, T_off) + f^k_swap(T_opt, T_off), T_opt = k_os*P/(d*c)."""
    c = cfg(Plan(dp=4, zero="offload"), "4", W1B, cpus=4)
    t_fwd = 0.5 * 8 / 32
    t_bwd = 2 * t_fwd
    t_dp = 1.2e9 * 2 * 2 * 3 / 4 / 200e9
    t_off = 1.2e9 * 4 / (4 * 32e9)
    t_opt = 3e-9 * 1.2e9 / (4 * 4)
    want = (
        t_fwd
        + overlap(1.5, t_bwd, t_dp)
        + (t_dp**2 + t_off**2) ** 0.5
        + (t_opt**3 + t_off**3) ** (1 / 3)
        + 0.02
    )
    assert predict(P, c, "morphling") == pytest.approx(want, rel=1e-12)


def test_morphling_3d_by_hand() -> None:
    """PP2 TP4 DP2 over two servers: 1F1B forward, V_tp over NVLink, V_dp and V_pp over B_inter."""
    c = cfg(Plan(dp=2, tp=4, pp=2), "88", W1B)
    m, p, t, d = 1, 2, 4, 2
    t_fwd = 0.5 * (32 / d / m) / 32 / t / p * (m + p - 1)
    t_bwd = 2 * t_fwd
    bsh = 32 * 1024 * 2048 * 2
    t_dp = 1.2e9 * 2 / (t * p) * 2 * (d - 1) / d / 12.5e9
    t_tp = 8 * (t - 1) * bsh * 24 / (d * t) / 200e9
    t_pp = 2 * p * bsh / (d * t) / 12.5e9
    want = t_fwd + overlap(1.5, t_bwd, t_dp) + t_tp + t_pp + 5e-11 * 1.2e9 / (t * p) + 0.02
    assert predict(P, c, "morphling") == pytest.approx(want, rel=1e-12)


def test_gradient_accumulation_and_checkpointing() -> None:
    base = breakdown(P, cfg(Plan(dp=4), "4", W1B), "morphling")
    ga = breakdown(P, cfg(Plan(dp=4, ga_steps=4), "4", W1B), "morphling")
    gc = breakdown(P, cfg(Plan(dp=4, checkpointing=True), "4", W1B), "morphling")
    assert ga.t_fwd == pytest.approx(base.t_fwd / 4)  # per accumulation step
    # a*T_fwd + (a-1)*T_bwd + f(T_bwd, T_dp): only the last step overlaps the sync.
    want = 4 * ga.t_fwd + 3 * ga.t_bwd + overlap(1.5, ga.t_bwd, ga.t_comm_dp)
    assert ga.t_cc == pytest.approx(want)
    assert gc.t_bwd == pytest.approx(base.t_bwd + base.t_fwd)  # one more forward


# Regression values of both modes for a 7B-like model (mode "tessera" has no closed form to re-derive).
GOLDEN = [
    (Plan(dp=8, tp=4, pp=2), "88888888", 0.5316646764165235, 0.6049189294321963),
    (Plan(dp=8, tp=8), "88888888", 0.42202697732191813, 0.8064574610077918),
    (Plan(dp=8, pp=8), "88888888", 1.3332406143898858, 1.3012844054320287),
    (Plan(dp=8, zero="offload"), "8", 1.9846029463969583, 4.158560521217407),
    (Plan(dp=8, zero="offload"), "2222", 5.121552845431207, 5.65227126795545),
    (Plan(dp=4, zero="zero-dp", checkpointing=True), "22", 3.987249109220778, 3.932664612479102),
]


@pytest.mark.parametrize(("plan", "placement", "morphling", "tessera"), GOLDEN)
def test_golden_predictions(plan: Plan, placement: str, morphling: float, tessera: float) -> None:
    c = cfg(plan, placement)
    assert predict(P, c, "morphling") == pytest.approx(morphling, rel=1e-9)
    assert predict(P, c, "tessera") == pytest.approx(tessera, rel=1e-9)


def test_tessera_sees_the_placement_shape() -> None:
    """Same plan, same GPU count: mode "morphling" only knows one server vs several."""
    shapes = ["8", "44", "2222", "11111111"]
    tess = [breakdown(P, cfg(Plan(dp=8), s, W1B), "tessera").t_comm_dp for s in shapes]
    morph = [breakdown(P, cfg(Plan(dp=8), s, W1B), "morphling").t_comm_dp for s in shapes]
    assert tess == sorted(tess) and len(set(tess)) == 4
    assert morph[1] == morph[2] == morph[3] > morph[0]


def test_tessera_megatron_rank_order() -> None:
    """TP fastest, then DP, then PP: with PP8 on 8 servers the DP groups stay inside a server; with
    TP8 DP8 every DP group crosses all 8 servers and shares their NICs."""
    pp8 = breakdown(P, cfg(Plan(dp=8, pp=8), "88888888"), "tessera")
    tp8 = breakdown(P, cfg(Plan(dp=8, tp=8), "88888888"), "tessera")
    assert pp8.t_comm_pp > 0
    assert tp8.t_comm_pp == 0
    assert pp8.t_comm_dp < tp8.t_comm_dp / 10


def test_tessera_offload_shares_the_host() -> None:
    one_server = breakdown(P, cfg(Plan(dp=8, zero="offload"), "8"), "tessera")
    spread = breakdown(P, cfg(Plan(dp=8, zero="offload"), "11111111"), "tessera")
    assert one_server.t_off > spread.t_off
    no_host = breakdown(replace(P, k_host=0.0), cfg(Plan(dp=8, zero="offload"), "8"), "tessera")
    assert no_host.t_off == pytest.approx(
        breakdown(P, cfg(Plan(dp=8, zero="offload"), "8"), "morphling").t_off
    )


def test_measured_forward_replaces_the_forward_model() -> None:
    c = RunConfig(W1B, Plan(dp=4, ga_steps=2), Placement.parse("4"), fwd_time=0.3)
    assert breakdown(P, c, "tessera").t_fwd == pytest.approx(0.15)


# -------------------------------------------------------------------------------------------- fitting


def synthetic(params: Params, mode: str) -> list[Sample]:
    """Samples generated by the model itself: DP, ZeRO-DP, checkpointing and offload on 1-8 GPUs."""
    out = []
    for g in (1, 2, 4, 8):
        for plan in (Plan(dp=g), Plan(dp=g, zero="offload"), Plan(dp=g, checkpointing=True)):
            c = cfg(plan, str(g), W1B, cpus=4)
            out.append(Sample(c, predict(params, c, mode)))  # type: ignore[arg-type]
    for plan, placement in ((Plan(dp=8, zero="zero-dp"), "44"), (Plan(dp=4), "1111")):
        c = cfg(plan, placement, W1B)
        out.append(Sample(c, predict(params, c, mode)))  # type: ignore[arg-type]
    # Other CPU counts: without them k_swap and k_os_offload trade off exactly (both terms ~ P/d).
    for g, cpus in ((2, 1), (8, 16)):
        c = cfg(Plan(dp=g, zero="offload"), str(g), W1B, cpus=cpus)
        out.append(Sample(c, predict(params, c, mode)))  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize("mode", MODES)
def test_fit_recovers_known_parameters(mode: str) -> None:
    truth = Params(
        k_bwd=1.8,
        k_sync=1.3,
        k_opt=8e-11,
        k_os_offload=5e-9,
        k_const=0.03,
        k_off=1.5,
        k_swap=2.5,
        k_host=3e-10 if mode == "tessera" else 0.0,
    )
    samples = synthetic(truth, mode)
    got = fit(samples, mode, options=FitOptions(prior_weight=1e-8))  # type: ignore[arg-type]
    assert rmsle(got, samples, mode) < 2e-3  # type: ignore[arg-type]
    # The parameters that move the samples most come back to within a few percent.
    for name in ("k_bwd", "k_sync", "k_opt", "k_os_offload", "k_const", "k_swap"):
        assert getattr(got, name) == pytest.approx(getattr(truth, name), rel=0.05), name
    if mode == "tessera":
        assert got.k_host == pytest.approx(truth.k_host, rel=0.1)
    else:
        assert got.k_host == 0.0


def test_fit_is_deterministic() -> None:
    samples = synthetic(P, "tessera")[:6]
    assert fit(samples, "tessera") == fit(samples, "tessera")


def test_refit_moves_toward_live_samples_and_favours_recent_ones() -> None:
    c = cfg(Plan(dp=8), "2222", W1B)
    before = predict(P, c, "tessera")
    # Running jobs report 30% slower steps than predicted.
    live = [Sample(c, before * 1.3, time=float(i)) for i in range(5)]
    after = refit(P, live, "tessera")
    assert abs(predict(after, c, "tessera") - before * 1.3) < 0.25 * abs(before - before * 1.3)
    # Old reports say 1.6x, the recent ones 1.1x: the refit follows the recent ones.
    mixed = [Sample(c, before * 1.6, time=float(i)) for i in range(5)] + [
        Sample(c, before * 1.1, time=100.0 + i) for i in range(5)
    ]
    pred = predict(refit(P, mixed, "tessera", half_life=10.0), c, "tessera")
    assert abs(pred - before * 1.1) < abs(pred - before * 1.6)
    assert pred == pytest.approx(before * 1.1, rel=0.05)


def test_refit_keeps_the_profile_when_asked() -> None:
    profile = synthetic(P, "tessera")
    c = cfg(Plan(dp=8), "8", W1B)
    live = [Sample(c, predict(P, c, "tessera") * 1.5, time=0.0)]
    drifted = refit(P, live, "tessera")
    anchored = refit(P, live, "tessera", base_samples=profile, base_weight=0.5)
    assert rmsle(anchored, profile, "tessera") < rmsle(drifted, profile, "tessera")


def test_forward_profile_is_robust_to_one_bad_point() -> None:
    # T5's profile has a 4 ms forward among ~100-400 ms ones.
    ref_t, ref_b, beta = forward_profile(
        [(2, 0.054 * 4), (4, 0.004), (8, 0.08 * 4 / 2), (4, 0.091), (2, 0.176)]
    )
    assert 0.5 <= beta <= 1.0
    assert 0.05 < ref_t * (4 / ref_b) ** beta < 0.2
    assert forward_profile([(4.0, 0.1)]) == pytest.approx((0.1, 4.0, 1.0))


# ----------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: Plan(dp=0), "plan.dp"),
        (lambda: Plan(tp=-2), "plan.tp"),
        (lambda: Plan(dp=2, zero="zero-3"), "plan.zero"),  # type: ignore[arg-type]
        (lambda: Plan(dp=2, micro_batches=0), "plan.micro_batches"),
        (lambda: RunConfig(W1B, Plan(dp=8), Placement.parse("44444")), "plan"),
        (lambda: RunConfig(W1B, Plan(dp=4), Placement.parse("4"), cpus=0), "cpus"),
        (lambda: replace(W1B, params=-1.0), "workload.params"),
        (lambda: replace(W1B, layers=0), "workload.layers"),
        (lambda: replace(W1B, fwd_ref_time=math.nan), "workload.fwd_ref_time"),
        (lambda: replace(P, k_bwd=0.0), "params.k_bwd"),
        (lambda: replace(P, k_host=-1.0), "params.k_host"),
        (lambda: Params.from_sequence([1.0] * 5), "params"),
        (lambda: Sample(cfg(Plan(dp=4), "4", W1B), 0.0), "iter_time"),
        (lambda: Environment(inter_node_bw=0.0), "env.inter_node_bw"),
        (lambda: Environment(net_efficiency=1.5), "env.net_efficiency"),
        (lambda: predict(P, cfg(Plan(dp=4), "4", W1B), "fast"), "mode"),  # type: ignore[arg-type]
        (lambda: fit([]), "samples"),
        (lambda: refit(P, [], "tessera"), "live_samples"),
    ],
)
def test_bad_input_names_the_field(make: object, field: str) -> None:
    with pytest.raises(PerfModelInputError) as e:
        make()  # type: ignore[operator]
    assert e.value.field == field
    assert str(e.value).startswith(field + ":")


def test_default_environment_is_the_morphling_cluster() -> None:
    assert DEFAULT_ENV.intra_node_bw == 200e9  # 400 GB/s NVLink, both directions
    assert DEFAULT_ENV.inter_node_bw == 12.5e9  # 100 Gb/s NICs
    assert DEFAULT_ENV.gpus_per_nic == 2
