"""The reference trainer's LLaMA-style decoder and Mixtral-style MoE (model_llama.py, model_moe.py), in one
process: shapes, grouped-query attention, rotary positions, routing, dropless experts, the balancing
loss and its gradient, pipeline cuts, activation checkpointing, and the parameter count against the
estimator's."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # imports torch (seconds)

from torch import nn

from tessera.clients.trainer import ModelDims
from tessera.clients.trainer.reference.architecture import ROUTER_AUX_LOSS_COEF, Arch, resolve_arch
from tessera.clients.trainer.reference.model import lm_loss
from tessera.clients.trainer.reference.model_llama import GQAttention, Llama, apply_rotary, rotary_tables
from tessera.clients.trainer.reference.model_moe import SparseMoE, load_balancing_loss, route
from tessera.clients.trainer.reference.parallel import stage_layers

torch.set_num_threads(1)
DIMS = ModelDims("t", 64, 4, 4, 96, 16)
GATED = {"gated": True, "num_kv_heads": 2, "ffn_hidden": 96}
MOE = {**GATED, "family": "moe", "num_experts": 4, "top_k": 2, "moe_every": 1, "dropless": True}


def arch(**fields: object) -> Arch:
    return resolve_arch(DIMS, fields)


def test_shapes_and_head_counts() -> None:
    torch.manual_seed(0)
    m = Llama(DIMS, arch(**MOE, untied_embeddings=True), tied_head=False)
    x = torch.randint(0, DIMS.vocab_size, (3, DIMS.seq_length))
    assert m(x).shape == (3, DIMS.seq_length, DIMS.vocab_size)
    block = m.blocks["0"]
    assert (block.attn.q.out_features, block.attn.k.out_features, block.attn.v.out_features) == (64, 32, 32)
    assert block.mlp is None and block.moe is not None and len(block.moe.experts) == 4
    assert m.pos_emb is None and m.head is not None and m.head.weight is not m.tok_emb.weight  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="longer than seq_length"):
        m(torch.zeros(1, DIMS.seq_length + 1, dtype=torch.long))
    # The TP plan names modules that exist: every expert's w1/w3 column-wise, w2 row-wise, router left out.
    plan = block.tp_plan()
    assert plan["moe.experts.3.w2"] == "rowwise" and plan["moe.experts.0.w1"] == "colwise"
    assert not any("router" in k for k in plan)
    assert all(block.get_submodule(k) is not None for k in plan)
    dense = Llama(DIMS, arch(**GATED))
    assert dense.blocks["0"].tp_plan() == {"attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise",
                                           "attn.proj": "rowwise", "mlp.w1": "colwise", "mlp.w3": "colwise",
                                           "mlp.w2": "rowwise"}


def test_grouped_query_attention_is_full_attention_with_each_kv_head_repeated() -> None:
    """GQA with 2 kv heads for 4 query heads = full multi-head attention whose k and v projections hold
    each kv head's weights (and q/k/v biases) twice, query head j reading kv head j // 2."""
    torch.manual_seed(0)
    gqa = GQAttention(64, 4, 2, 16, qkv_bias=True)
    full = GQAttention(64, 4, 4, 16, qkv_bias=True)
    with torch.no_grad():
        for lin in (gqa.q, gqa.k, gqa.v):
            nn.init.normal_(lin.bias)
        full.q.load_state_dict(gqa.q.state_dict())
        full.proj.load_state_dict(gqa.proj.state_dict())
        for src, dst in ((gqa.k, full.k), (gqa.v, full.v)):
            dst.weight.copy_(src.weight.view(2, 16, 64).repeat_interleave(2, dim=0).reshape(64, 64))
            dst.bias.copy_(src.bias.view(2, 16).repeat_interleave(2, dim=0).reshape(64))
    x = torch.randn(2, 10, 64)
    torch.testing.assert_close(gqa(x), full(x))
    # Plain attention (scores materialised) computes the same.
    gqa.flash = False
    torch.testing.assert_close(gqa(x), full(x))


def test_rotary_scores_depend_on_relative_position_only() -> None:
    t, d = 12, 16
    cos, sin = rotary_tables(t, d, 10000.0, torch.device("cpu"), torch.float64)
    torch.manual_seed(0)
    qv, kv = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    q = apply_rotary(qv.expand(1, 1, t, d), cos, sin)[0, 0]
    k = apply_rotary(kv.expand(1, 1, t, d), cos, sin)[0, 0]
    scores = q @ k.T  # scores[m, n] = <R_m q, R_n k>
    for offset in range(-3, 4):
        diag = torch.diagonal(scores, offset)
        torch.testing.assert_close(diag, diag[:1].expand_as(diag))
    torch.testing.assert_close(q.norm(dim=-1), qv.norm().expand(t))  # a rotation
    torch.testing.assert_close(q[0], qv)  # position 0 is not turned
    assert not torch.allclose(scores[0, 1], scores[1, 0])  # but direction matters


def test_attention_is_causal() -> None:
    """A token's output depends only on the tokens up to it (rotary tables start at position 0 for
    any length, so a sequence's first tokens compute the same alone)."""
    torch.manual_seed(0)
    attn = GQAttention(64, 4, 2, 16)
    x = torch.randn(1, 8, 64)
    torch.testing.assert_close(attn(x)[:, :5], attn(x[:, :5]))


def test_router_weights_are_the_renormalised_top_k() -> None:
    torch.manual_seed(0)
    logits = torch.randn(7, 5)
    probs, weights, experts = route(logits, 2)
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(7))
    torch.testing.assert_close(probs.sum(dim=-1), torch.ones(7))
    # = the softmax of the top-2 logits (Mixtral paper, eq. 1)
    top = torch.topk(logits, 2, dim=-1)
    torch.testing.assert_close(weights, torch.softmax(top.values, dim=-1))
    assert torch.equal(experts, top.indices)


def test_dropless_output_is_each_tokens_weighted_sum_of_its_experts() -> None:
    torch.manual_seed(0)
    moe = SparseMoE(16, 24, num_experts=4, top_k=2)
    x = torch.randn(2, 5, 16)
    y = moe(x)
    flat = x.reshape(-1, 16)
    _, weights, experts = route(moe.router(flat), 2)
    for t in range(flat.shape[0]):
        expected = sum(weights[t, k] * moe.experts[str(int(experts[t, k]))](flat[t]) for k in range(2))
        torch.testing.assert_close(y.reshape(-1, 16)[t], expected)


def test_an_expert_no_token_chose_still_gets_a_zero_gradient() -> None:
    """Dropless routing runs every expert, on zero rows if need be: each parameter has a gradient on
    every rank (DDP, FSDP2 and the hand all-reduce need the same tensors everywhere)."""
    torch.manual_seed(0)
    moe = SparseMoE(8, 12, num_experts=4, top_k=1)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[1] = 1.0
    x = torch.ones(1, 3, 8)  # every token picks expert 1
    moe(x).sum().backward()
    for e in ("0", "2", "3"):
        grads = [p.grad for p in moe.experts[e].parameters()]
        assert all(g is not None and not g.any() for g in grads)
    assert moe.experts["1"].w2.weight.grad.abs().sum() > 0  # type: ignore[union-attr]


def test_balancing_loss_on_a_literal_input() -> None:
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.1, 0.2, 0.7], [0.5, 0.4, 0.1]])
    _, _, experts = route(torch.log(probs), 1)  # choices 0, 0, 2, 0
    # f = (3/4, 0, 1/4), P = (1.9/4, 1.1/4, 1.0/4): 3 * (0.75 * 0.475 + 0.25 * 0.25) = 1.25625
    assert float(load_balancing_loss(probs, experts, 3)) == pytest.approx(1.25625)
    # top-2: f = sum over both choices; balanced routing of uniform probabilities gives top_k.
    _, _, experts2 = route(torch.log(probs), 2)  # {0,1}, {0,1}, {2,1}, {0,1}
    # f_k=0 = (3/4, 0, 1/4), f_k=1 = (0, 1, 0): 3 * (0.75 * 0.475 + 0.25 * 0.25 + 1 * 0.275) = 2.08125
    assert float(load_balancing_loss(probs, experts2, 3)) == pytest.approx(2.08125)
    uniform = torch.full((4, 4), 0.25)
    assert float(load_balancing_loss(uniform, torch.tensor([[0, 1], [2, 3], [0, 1], [2, 3]]), 4)) == pytest.approx(2.0)


def test_the_balancing_loss_reaches_the_router_as_if_added_to_the_loss() -> None:
    torch.manual_seed(0)
    moe = SparseMoE(8, 12, num_experts=4, top_k=2)
    moe.aux_weight, moe.grad_scale = 0.3, 0.5
    x = torch.randn(2, 6, 8)
    moe(x).square().sum().backward()
    injected = moe.router.weight.grad.clone()  # type: ignore[union-attr]
    moe.zero_grad()
    moe.aux_weight = 0.0
    out = moe(x)
    probs, _, chosen = route(moe.router(x.reshape(-1, 8)), 2)
    (out.square().sum() + 0.15 * load_balancing_loss(probs, chosen, 4)).backward()
    torch.testing.assert_close(injected, moe.router.weight.grad)
    assert moe.last_aux_loss is not None and float(moe.last_aux_loss) >= 2.0 - 1e-6  # >= top_k


def test_the_model_weighs_each_moe_layer_by_the_coefficient_over_the_moe_layers() -> None:
    m = Llama(DIMS, arch(**{**MOE, "moe_every": 2}))
    weights = {k: b.moe.aux_weight for k, b in m.blocks.items() if b.moe is not None}
    assert weights == {"1": ROUTER_AUX_LOSS_COEF / 2, "3": ROUTER_AUX_LOSS_COEF / 2}
    m.set_aux_grad_scale(0.25)
    assert all(b.moe.grad_scale == 0.25 for b in m.blocks.values() if b.moe is not None)


@pytest.mark.parametrize("fields", [
    GATED, {**GATED, "qkv_bias": True}, {**GATED, "untied_embeddings": True, "kv_channels": 8},
    MOE, {**MOE, "moe_every": 2, "untied_embeddings": True, "qkv_bias": True},
], ids=["gated", "qkv-bias", "untied-kv-channels", "moe", "moe-every-2"])
def test_parameter_count_equals_the_estimators(fields: dict[str, object]) -> None:
    """The built model against estimator/memory.py num_params for the same ModelDims: the trainer
    builds what the estimator plans for."""
    from tessera.estimator.memory import num_params
    from tessera.estimator.models import ModelDims as EstimatorDims

    a = arch(**fields)
    est = EstimatorDims(DIMS.hidden_size, DIMS.num_layers, DIMS.num_heads, DIMS.vocab_size, DIMS.seq_length,
                        family="moe" if a.moe else "decoder", gated=True, ffn_hidden=a.ffn, num_kv_heads=a.kv_heads,
                        kv_channels=int(fields.get("kv_channels", 0)), qkv_bias=a.qkv_bias,  # type: ignore[call-overload]
                        tied_embeddings=a.tied_embeddings, num_experts=a.num_experts, top_k=a.top_k or 2,
                        moe_every=a.moe_every or 2, capacity_factor=0.0 if a.moe else 1.0).validate()
    m = Llama(DIMS, a, tied_head=a.tied_embeddings)
    assert sum(p.numel() for p in m.parameters()) == num_params(est)


def test_pipeline_stages_chained_equal_the_whole_model() -> None:
    a = arch(**{**MOE, "moe_every": 2})
    torch.manual_seed(0)
    whole = Llama(DIMS, a)
    x = torch.randint(0, DIMS.vocab_size, (2, DIMS.seq_length))
    expected = whole(x)
    h = x
    names: list[set[str]] = []
    for s in range(2):
        torch.manual_seed(0)
        m = Llama(DIMS, a)
        m.keep_stage(stage_layers(DIMS.num_layers, 2, s), s == 0, s == 1)
        names.append(set(dict(m.named_parameters())))
        h = m(h)
    torch.testing.assert_close(h, expected)
    assert "blocks.3.moe.experts.2.w3.weight" in names[1] and "tok_emb.weight" in names[0]
    assert set().union(*names) == set(dict(whole.named_parameters(remove_duplicate=False)))


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_activation_checkpointing_changes_no_gradient(mode: str) -> None:
    a = arch(**MOE)
    x = torch.randint(0, DIMS.vocab_size, (2, DIMS.seq_length + 1))
    grads = []
    for ac in ("none", mode):
        torch.manual_seed(0)
        m = Llama(DIMS, a, activation_checkpointing=ac, flash_attention=mode != "selective")
        lm_loss(m(x[:, :-1]), x[:, 1:]).backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], msg=name)
    with pytest.raises(ValueError, match="flash_attention"):
        Llama(DIMS, a, activation_checkpointing="selective")
    with pytest.raises(ValueError, match="GPT-2-style"):
        Llama(DIMS, Arch.gpt2(DIMS))


def test_a_tiny_moe_learns() -> None:
    """Twenty steps of AdamW on one repeated batch: the loss falls well below ln(vocab)."""
    torch.manual_seed(0)
    m = Llama(DIMS, arch(**MOE))
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    x = torch.randint(0, DIMS.vocab_size, (4, DIMS.seq_length + 1))
    losses = []
    for _ in range(20):
        loss = lm_loss(m(x[:, :-1]), x[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    first, last = losses[0], losses[-1]
    assert first == pytest.approx(math.log(DIMS.vocab_size), rel=0.05) and last < 0.6 * first
