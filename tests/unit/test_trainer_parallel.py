"""The reference trainer's torch parts that need no process group: rank grid, stage split, the model
cut into pipeline stages, activation checkpointing, checkpoint key helpers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # imports torch (seconds)

import torch.nn.functional as F

from tessera.clients.trainer import ModelDims
from tessera.clients.trainer.reference.checkpoint import _legacy_param_order, _legacy_split, _rename_param
from tessera.clients.trainer.reference.model import GPT, _plain_attention, lm_loss
from tessera.clients.trainer.reference.parallel import Coords, stage_layers

TINY = ModelDims("t", 32, 4, 4, 64, 16)


def test_coords_are_pp_major_tp_minor() -> None:
    grid = [Coords.of(r, pp=2, dp=2, tp=2) for r in range(8)]
    assert [(c.pp_rank, c.dp_rank, c.tp_rank) for c in grid] == [
        (0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert all(c.rank_of(c.pp_rank, c.dp_rank, c.tp_rank) == r for r, c in enumerate(grid))
    assert grid[0].first_stage and not grid[0].last_stage and grid[7].last_stage


@pytest.mark.parametrize(("layers", "pp", "expected"), [
    (4, 2, [range(2), range(2, 4)]),
    (5, 2, [range(2), range(2, 5)]),  # the remainder goes to later stages (the first has embeddings)
    (7, 3, [range(2), range(2, 4), range(4, 7)]),
    (3, 3, [range(1), range(1, 2), range(2, 3)]),
])
def test_stage_layers_cover_the_model_once(layers: int, pp: int, expected: list[range]) -> None:
    got = [stage_layers(layers, pp, s) for s in range(pp)]
    assert got == expected
    assert [i for r in got for i in r] == list(range(layers))


def test_pipeline_stages_chained_equal_the_whole_model() -> None:
    torch.manual_seed(0)
    whole = GPT(TINY)
    x = torch.randint(0, TINY.vocab_size, (2, TINY.seq_length))
    expected = whole(x)
    stages = []
    for s in range(3):
        torch.manual_seed(0)
        m = GPT(TINY)
        m.keep_stage(stage_layers(TINY.num_layers, 3, s), s == 0, s == 2)
        stages.append(m)
    # Names survive the cut: a stage's parameters are a subset of the whole model's, same names.
    names = [set(dict(m.named_parameters())) for m in stages]
    assert "blocks.3.fc.weight" in names[2] and "tok_emb.weight" in names[0] and "head.weight" in names[2]
    assert not names[1] & {"tok_emb.weight", "head.weight", "ln_f.weight"}
    assert set().union(*names) == set(dict(whole.named_parameters(remove_duplicate=False)))
    h = x
    for m in stages:
        h = m(h)
    torch.testing.assert_close(h, expected)


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_activation_checkpointing_changes_no_gradient(mode: str) -> None:
    x = torch.randint(0, TINY.vocab_size, (2, TINY.seq_length + 1))
    grads = []
    flash = mode != "selective"  # Megatron's selective recompute runs on plain attention only
    for ac in ("none", mode):
        torch.manual_seed(0)
        m = GPT(TINY, activation_checkpointing=ac, flash_attention=flash)
        lm_loss(m(x[:, :-1]), x[:, 1:]).backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], msg=name)
    with pytest.raises(ValueError, match="none, selective or full"):
        GPT(TINY, activation_checkpointing="sometimes")
    with pytest.raises(ValueError, match="flash_attention"):
        GPT(TINY, activation_checkpointing="selective")


def test_plain_attention_equals_sdpa() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    torch.testing.assert_close(_plain_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_checkpoint_key_helpers() -> None:
    flat = {"state.head.weight.exp_avg": 1, "param_groups.head.weight.lr": 2, "state.ln_f.weight.step": 3}
    assert _rename_param(flat, "head.weight", "tok_emb.weight") == {
        "state.tok_emb.weight.exp_avg": 1, "param_groups.tok_emb.weight.lr": 2, "state.ln_f.weight.step": 3}
    qkv = torch.arange(12.0).reshape(6, 2)
    parts = _legacy_split("blocks.0.attn.qkv.weight", qkv)
    assert [n for n, _ in parts] == [f"blocks.0.attn.{x}.weight" for x in "qkv"]
    torch.testing.assert_close(torch.cat([t for _, t in parts]), qkv)
    assert _legacy_split("blocks.0.attn.qkv.bias", 0.5) == [(f"blocks.0.attn.{x}.bias", 0.5) for x in "qkv"]
    order = _legacy_param_order(ModelDims("t", 8, 1, 2, 16, 4), tied=True)
    assert order[:4] == ["tok_emb.weight", "pos_emb.weight", "blocks.0.ln1.weight", "blocks.0.ln1.bias"]
    assert order[-1] == "ln_f.bias" and len(order) == 2 + 12 + 2
