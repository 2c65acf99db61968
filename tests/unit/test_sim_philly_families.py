"""The Philly generator's model families: GPT and LLaMA beside the artifact's three, a seeded draw
that is the same for the same seed, the oracle rule (arena: the artifact's families; estimator: no
Wide-ResNet) and clear errors for `--families`."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import pytest

from tessera.controller.sim import cli
from tessera.controller.sim.traces import (
    ARTIFACT_FAMILIES,
    PHILLY_DIMS,
    TRANSFORMER_FAMILIES,
    PhillyOptions,
    TraceError,
    generate_philly,
    philly_dims,
    split_philly_key,
)

TYPES = ["A100-40GB", "V100-32GB", "A40-48GB", "A10-24GB"]
MODELS: dict[str, dict[str, dict[str, object]]] = {
    "moe": {"2.4B": {"hidden_size": 1024, "num_layers": 16, "num_heads": 16, "vocab_size": 32000, "seq_len": 1024,
                     "num_experts": 16}},
    "bert": {"1.3B": {"hidden_size": 2048, "num_layers": 24, "num_heads": 32, "vocab_size": 51200, "seq_len": 1024}},
}


def _trace(tmp_path: Path, n: int = 2000) -> Path:
    """n submissions in one day (2017-10-01), one every 40 s."""
    p = tmp_path / "philly.csv"
    p.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n" + "".join(
        f"2017-10-01 {i * 40 // 3600:02d}:{i * 40 // 60 % 60:02d}:{i * 40 % 60:02d},{600 * (i % 5 + 1)},1,1,c\n"
        for i in range(n)))
    return p


def _always(key: str, t: str, n: int) -> float:
    return 2.0


def _family(key: str) -> str:
    return split_philly_key(key)[0]


def test_same_seed_same_trace_and_the_family_mix(tmp_path: Path) -> None:
    p = _trace(tmp_path)
    opts = PhillyOptions(seed=3, hours=24, families=TRANSFORMER_FAMILIES, estimator_dims=True)
    a = generate_philly(p, _always, TYPES, MODELS, opts)
    b = generate_philly(p, _always, TYPES, MODELS, opts)
    assert a == b and len(a) == 2000
    assert generate_philly(p, _always, TYPES, MODELS, PhillyOptions(seed=4, hours=24, families=TRANSFORMER_FAMILIES,
                                                                     estimator_dims=True)) != a
    # Weights bert 25, moe 60, gpt 25, llama 25 (of 135); every draw is feasible here.
    mix = Counter(_family(j.model_key) for j in a)
    assert set(mix) == {"bert", "moe", "gpt", "llama"}
    for fam, w in (("bert", 25), ("moe", 60), ("gpt", 25), ("llama", 25)):
        assert abs(mix[fam] / len(a) - w / 135) < 0.03, (fam, mix)
    # Sizes, batches and GPU counts come from each family's own tables.
    for j in a:
        fam, size, batch = split_philly_key(j.model_key)
        assert j.global_batch_size == batch and 1 <= j.gpus <= 16
        if fam == "llama":
            assert size in ("7B", "13B", "33B") and batch in (64, 128, 256)
            assert j.model == PHILLY_DIMS["llama"][size] and j.model.gated
        if fam == "gpt":
            assert batch in (128, 256, 512) and j.model == PHILLY_DIMS["gpt"][size]
            assert j.model.seq_length == 2048 and j.model.family == "decoder"
            if size == "350M":
                assert j.gpus <= 4  # the artifact's cap: rank 0 asks for at most 4 GPUs
    # The order of the chosen families does not matter.
    again = generate_philly(p, _always, TYPES, MODELS, PhillyOptions(seed=3, hours=24, estimator_dims=True,
                                                                     families=("llama", "gpt", "moe", "bert")))
    assert again == a


def test_the_artifact_families_keep_the_artifact_draw(tmp_path: Path) -> None:
    p = _trace(tmp_path, 200)
    feas = lambda key, t, n: 2.0 if n <= 8 and not key.startswith("moe_70B") else 0.0
    a = generate_philly(p, feas, TYPES, {}, PhillyOptions(seed=7, hours=24))
    assert PhillyOptions().families == ARTIFACT_FAMILIES
    # Pinned from the generator before GPT and LLaMA were added: the default draw must not move.
    assert [(j.model_key, j.gpus, j.gpu_type) for j in a[:6]] == [
        ("moe_10B_256", 1, "A100-40GB"), ("moe_690M_256", 1, "A40-48GB"), ("moe_2.4B_256", 2, "A10-24GB"),
        ("moe_27B_256", 2, "V100-32GB"), ("wide_resnet_500M_256", 4, "V100-32GB"), ("bert_1.3B_256", 2, "A10-24GB")]
    mix = Counter(_family(j.model_key) for j in a)
    assert set(mix) == set(ARTIFACT_FAMILIES)
    # The artifact's dims (every transformer a GPT-2-style decoder) unless the estimator's are asked for.
    assert all(j.model.family == "decoder" for j in a)


def test_estimator_dims_of_the_artifact_families() -> None:
    moe = philly_dims("moe", "2.4B", MODELS, estimator=True)
    assert (moe.family, moe.num_experts, moe.ffn, moe.tied_embeddings) == ("moe", 16, 8 * 1024, False)
    assert philly_dims("bert", "1.3B", MODELS, estimator=True).family == "encoder"
    assert philly_dims("moe", "2.4B", MODELS).family == "decoder"
    for fam in ("gpt", "llama"):
        for d in PHILLY_DIMS[fam].values():
            assert d.validate() is d
    # Parameter counts near the published sizes (GPT-3 Table 2.1, LLaMA Table 2).
    def params(fam: str, size: str) -> float:
        d = PHILLY_DIMS[fam][size]
        mlp = (3 if d.gated else 2) * d.hidden_size * d.ffn
        emb = d.vocab_size * d.hidden_size * (1 if d.tied_embeddings else 2)
        return (d.num_layers * (4 * d.hidden_size ** 2 + mlp) + emb) / 1e9
    for fam, size, want in (("gpt", "350M", 0.35), ("gpt", "1.3B", 1.3), ("gpt", "6.7B", 6.7), ("gpt", "13B", 12.8),
                            ("llama", "7B", 6.7), ("llama", "13B", 13.0), ("llama", "33B", 32.5)):
        assert abs(params(fam, size) / want - 1) < 0.06, (fam, size, params(fam, size))


def test_unknown_family_is_an_error(tmp_path: Path) -> None:
    p = _trace(tmp_path, 10)
    with pytest.raises(TraceError, match="families: unknown family 'gpt4'"):
        generate_philly(p, _always, TYPES, {}, PhillyOptions(families=("bert", "gpt4")))
    with pytest.raises(TraceError, match="families: none given"):
        generate_philly(p, _always, TYPES, {}, PhillyOptions(families=()))


def test_families_follow_the_oracle() -> None:
    assert cli.philly_families("", "arena") == ARTIFACT_FAMILIES
    assert cli.philly_families("", "estimator") == ("bert", "moe", "gpt", "llama")
    assert "wide_resnet" not in cli.philly_families("", "estimator")
    assert cli.philly_families(" GPT, llama,gpt ", "estimator") == ("gpt", "llama")
    assert cli.philly_families("wide_resnet,gpt", "mymod:factory") == ("wide_resnet", "gpt")
    with pytest.raises(cli.SimInputError, match=r"--families: unknown family 'vit' \(known: wide_resnet, bert"):
        cli.philly_families("bert,vit", "estimator")
    with pytest.raises(cli.SimInputError, match="--families: gpt is not in the arena oracle's measured table"):
        cli.philly_families("bert,gpt", "arena")
    with pytest.raises(cli.SimInputError, match="--families: llama is not in the arena oracle"):
        cli.philly_families("llama", "arena")
    with pytest.raises(cli.SimInputError, match="--families: wide_resnet is not covered by the estimator oracle"):
        cli.philly_families("wide_resnet,bert", "estimator")
    with pytest.raises(cli.SimInputError, match="--families: no family given"):
        cli.philly_families(" , ", "estimator")


def _args(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["--out", "/nonexistent", *argv])


def test_cli_reports_family_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["--trace", "philly", "--oracle", "arena", "--families", "bert,gpt", "--out", str(tmp_path / "a")])
    assert rc == 1 and "--families: gpt is not in the arena oracle's measured table" in capsys.readouterr().err
    rc = cli.main(["--trace", "philly", "--oracle", "estimator", "--families", "wide_resnet",
                   "--out", str(tmp_path / "b")])
    assert rc == 1 and "wide_resnet is not covered by the estimator oracle" in capsys.readouterr().err
    rc = cli.main(["--trace", "arena-pai", "--families", "bert", "--out", str(tmp_path / "c")])
    assert rc == 1 and "--families: only --trace philly" in capsys.readouterr().err
    with pytest.raises(cli.SimInputError, match="morphling oracle has no Philly models"):
        cli.load_inputs(_args("--trace", "philly", "--oracle", "morphling"))
