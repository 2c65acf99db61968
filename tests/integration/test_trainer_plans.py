"""Every plan kind the reference trainer runs, as real processes on CPU with gloo, against one process.

Each plan trains the same tiny GPT (hidden 32, 2 layers, 2 heads, vocab 64, seq 16) on the same global
batch of 8 for a few steps; its loss at every step must match a single-process run (micro batch 8, no
accumulation) within PLAN_RTOL = 1e-4. Only the order of floating-point sums differs between plans
(observed: at most 3e-7 relative, the printed precision), while changing the seed moves the losses by
more than 100x the tolerance (test_a_changed_seed_moves_the_curve_far_more_than_migration).

The ranks are forked from a forkserver that imported torch once (tessera.clients.trainer.reference.local,
mode "fork"): each rank is still its own OS process running the trainer's `cli.main()` with the worker
contract's environment and a gloo process group over TCP, but does not pay the seconds of torch import
per rank, which keeps this module within 1-2 minutes on a 2-core machine. The subprocess path (exactly
what an agent runs) is covered by test_trainer_train.py and by the e2e tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from tessera.clients.trainer import latest_checkpoint
from tessera.clients.trainer.reference.local import (
    RankResult,
    launch,
    plan_envs,
    start_ranks,
    warm_forkserver,
)

pytestmark = pytest.mark.slow

MODEL = {"name": "tiny", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "vocab_size": 64, "seq_length": 16}
GLOBAL_BATCH = 8
STEPS = 4  # per plan test
MIGRATION_STEPS = 6  # K = 3 on plan A, then K more on plan B
# Plan vs one process, every step: relative tolerance on the loss.
PLAN_RTOL = 1e-4
# Migration (checkpoint on plan A, resume on plan B) vs an uninterrupted run, every step.
MIGRATION_RTOL = 1e-4
TIMEOUT = 120.0
STEP = re.compile(r"step iteration=(\d+)/\d+ loss=(\S+)")
PARAMS = re.compile(r"parameters local=(\d+) total=(\d+)")


def losses(out: str) -> dict[int, float]:
    return {int(m.group(1)): float(m.group(2)) for m in STEP.finditer(out)}


def run(plan: dict[str, Any], ckpt: Path, iterations: int, argv: tuple[str, ...] = ()) -> list[RankResult]:
    results = launch(plan, model=MODEL, checkpoint_dir=ckpt, iterations=iterations, global_batch=GLOBAL_BATCH,
                     mode="fork", timeout=TIMEOUT, cwd=ckpt.parent, argv=argv)
    for r in results:
        assert r.rc == 0, f"rank {r.rank} exited {r.rc}:\n{r.out[-2000:]}\n{r.err[-4000:]}"
    return results


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """One process, micro batch 8, MIGRATION_STEPS steps: the curve every plan must reproduce."""
    warm_forkserver()
    tmp = tmp_path_factory.mktemp("reference")
    (single,) = run({"dp": 1, "micro_batch": 8}, tmp / "ckpt", MIGRATION_STEPS)
    curve = losses(single.out)
    assert sorted(curve) == list(range(1, MIGRATION_STEPS + 1))
    assert curve[MIGRATION_STEPS] < curve[1]
    return curve


def assert_matches(curve: dict[int, float], ref: dict[int, float], steps: range, rtol: float) -> None:
    assert sorted(curve) == list(steps), curve
    for it in steps:
        assert curve[it] == pytest.approx(ref[it], rel=rtol), f"iteration {it}: {curve[it]} vs {ref[it]}"


PLANS: dict[str, tuple[dict[str, Any], str]] = {
    # name: (TESSERA_PLAN, what the trainer says it runs)
    "dp2-ddp": ({"dp": 2, "micro_batch": 4}, "dp=2 tp=1 pp=1 ddp"),
    "dp2-zero2": ({"dp": 2, "micro_batch": 4, "zero_stage": 2}, "dp=2 tp=1 pp=1 zero2(fsdp2)"),
    "dp2-zero3": ({"dp": 2, "micro_batch": 4, "sharding": "zero3"}, "dp=2 tp=1 pp=1 zero3(fsdp2)"),
    "tp2": ({"dp": 1, "tp": 2, "micro_batch": 8}, "dp=1 tp=2 pp=1 replicated"),
    "pp2-gpipe": ({"dp": 1, "pp": 2, "micro_batch": 2, "grad_accum": 4, "pp_schedule": "gpipe"},
                  "dp=1 tp=1 pp=2 replicated schedule=gpipe"),
    "pp2-1f1b": ({"dp": 1, "pp": 2, "micro_batch": 2, "grad_accum": 4, "pp_schedule": "1f1b"},
                 "dp=1 tp=1 pp=2 replicated schedule=1f1b"),
    "tp2xdp2": ({"dp": 2, "tp": 2, "micro_batch": 4}, "dp=2 tp=2 pp=1 ddp"),
    "pp2xdp2-zero2": ({"dp": 2, "pp": 2, "micro_batch": 2, "grad_accum": 2, "zero_stage": 2},
                      "dp=2 tp=1 pp=2 zero2(fsdp2) schedule=1f1b"),
    # Full 3D: 8 processes (PP 2 x DP 2 x TP 2), ZeRO-3 over the dp dimension (FSDP2 on DTensor TP).
    "pp2xdp2xtp2-zero3": ({"dp": 2, "tp": 2, "pp": 2, "micro_batch": 2, "grad_accum": 2, "zero_stage": 3},
                          "dp=2 tp=2 pp=2 zero3(fsdp2) schedule=1f1b"),
    "grad-accum": ({"dp": 1, "micro_batch": 2, "grad_accum": 4}, "dp=1 tp=1 pp=1 replicated"),
    "dp2-grad-accum": ({"dp": 2, "micro_batch": 2, "grad_accum": 2}, "dp=2 tp=1 pp=1 ddp"),
    "activation-checkpointing": ({"dp": 2, "micro_batch": 4, "activation_checkpointing": "full", "zero_stage": 3},
                                 "dp=2 tp=1 pp=1 zero3(fsdp2) activation-checkpointing=full"),
    # Megatron's selective recompute needs plain attention (the estimator refuses it under flash).
    "selective-checkpointing-tp2": ({"dp": 1, "tp": 2, "micro_batch": 8, "checkpointing": "selective",
                                     "flash_attention": False},
                                    "dp=1 tp=2 pp=1 replicated activation-checkpointing=selective plain-attention"),
    "offload": ({"dp": 2, "micro_batch": 4, "zero_stage": 3, "offload": "optimizer+params"},
                "dp=2 tp=1 pp=1 zero3(fsdp2) offload=optimizer+params"),
    # Morphling's one-GPU plan: ZeRO-Offload on a single rank (a process group of one for FSDP2).
    "offload-one-process": ({"dp": 1, "micro_batch": 4, "grad_accum": 2, "offload": "optimizer"},
                            "dp=1 tp=1 pp=1 zero2(fsdp2) offload=optimizer"),
}
# Plans whose ranks each hold only part of the parameters.
SHARDED = {"dp2-zero2", "dp2-zero3", "tp2", "pp2-gpipe", "pp2-1f1b", "tp2xdp2", "pp2xdp2-zero2", "pp2xdp2xtp2-zero3",
           "activation-checkpointing", "selective-checkpointing-tp2", "offload"}


@pytest.mark.parametrize("name", list(PLANS))
def test_plan_matches_one_process(name: str, reference: dict[int, float], tmp_path: Path) -> None:
    plan, kind = PLANS[name]
    results = run(plan, tmp_path / "ckpt", STEPS)
    for r in results:  # every rank prints the step's global mean loss
        assert f"plan={kind} " in r.out, r.out[:600]
        assert_matches(losses(r.out), reference, range(1, STEPS + 1), PLAN_RTOL)
        local, total = map(int, PARAMS.search(r.out).groups())  # type: ignore[union-attr]
        assert (local < total) == (name in SHARDED), (name, local, total)
    # The end-of-run checkpoint is one DCP checkpoint written by all ranks, published once.
    ref = latest_checkpoint(tmp_path / "ckpt")
    assert ref is not None and ref.iteration == STEPS
    meta = ref.meta()
    assert (meta["format"], meta["world_size"], meta["data_position"]) == (
        "tessera-reference-trainer/2", len(results), STEPS * GLOBAL_BATCH)
    assert (ref.path / ".metadata").is_file()


def _migrate(tmp_path: Path, plans: list[tuple[dict[str, Any], int]], reference: dict[int, float]) -> None:
    """Train on each plan in turn up to its iteration count, in one checkpoint directory (each stops
    with a checkpoint, the next resumes from it), and compare the whole curve to the reference."""
    ckpt = tmp_path / "ckpt"
    curve: dict[int, float] = {}
    start, previous_world = 0, 0
    for plan, until in plans:
        results = run(plan, ckpt, until)
        out = results[0].out
        if start == 0:
            assert "fresh start" in out
        else:
            assert f"resumed from step {start} " in out, out[:800]
            assert f"written at world size {previous_world}," in out, out[:800]
        part = losses(out)
        assert sorted(part) == list(range(start + 1, until + 1))
        curve.update(part)
        start, previous_world = until, len(results)
    assert_matches(curve, reference, range(1, plans[-1][1] + 1), MIGRATION_RTOL)


def test_migration_dp2_to_tp2xpp2_keeps_the_loss_curve(reference: dict[int, float], tmp_path: Path) -> None:
    """Morphling's reconfiguration: K = 3 steps on DP 2 (DDP), checkpoint, then 3 more on TP 2 x PP 2
    (the tied head moves to a pipeline stage of its own, every matrix is split in two): the curve is
    the uninterrupted one."""
    _migrate(tmp_path, [({"dp": 2, "micro_batch": 4}, 3),
                        ({"dp": 1, "tp": 2, "pp": 2, "micro_batch": 4, "grad_accum": 2}, 6)], reference)


def test_migration_chain_across_sharded_plans(reference: dict[int, float], tmp_path: Path) -> None:
    """ZeRO-3 with offload on DP 2 -> one process with accumulation 2 -> PP 2 x DP 2 (1F1B): two
    reshardings, each from sharded optimizer state, two steps each."""
    _migrate(tmp_path, [({"dp": 2, "micro_batch": 4, "zero_stage": 3, "offload": "optimizer"}, 2),
                        ({"dp": 1, "micro_batch": 4, "grad_accum": 2}, 4),
                        ({"dp": 2, "pp": 2, "micro_batch": 2, "grad_accum": 2}, 6)], reference)


def test_a_changed_seed_moves_the_curve_far_more_than_migration(reference: dict[int, float],
                                                                tmp_path: Path) -> None:
    """Morphling's yardstick (Table 3): reconfiguration must change the loss less than a new seed does.
    Here a new seed moves the 6-step curve by > 100x the migration tolerance."""
    (other,) = run({"dp": 1, "micro_batch": 8}, tmp_path / "ckpt", MIGRATION_STEPS, argv=("--seed", "99"))
    seeded = losses(other.out)
    worst = max(abs(seeded[i] - reference[i]) / reference[i] for i in reference)
    assert worst > 100 * MIGRATION_RTOL, worst


def test_resume_refuses_a_changed_global_batch(reference: dict[int, float], tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    run({"dp": 2, "micro_batch": 4}, ckpt, 2)
    (r,) = launch({"dp": 1, "micro_batch": 4}, model=MODEL, checkpoint_dir=ckpt, iterations=4, global_batch=4,
                  mode="fork", timeout=TIMEOUT, cwd=tmp_path)
    assert r.rc == 3
    assert "the global batch must not change within a job" in r.err.strip().splitlines()[-1]


def test_checkpoint_of_one_plan_is_complete_for_every_other(reference: dict[int, float], tmp_path: Path) -> None:
    """A PP 2 x TP 2 checkpoint (every rank wrote a different part) holds the whole model: copied
    alone into a fresh directory, it resumes one process on the reference curve."""
    ckpt = tmp_path / "ckpt"
    run({"dp": 1, "tp": 2, "pp": 2, "micro_batch": 2, "grad_accum": 4, "pp_schedule": "gpipe"}, ckpt, 3)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    shutil.copytree(ckpt / "step-3", fresh / "step-3")
    meta = json.loads((fresh / "step-3" / "meta.json").read_text())
    assert (meta["plan"]["tp"], meta["plan"]["pp"], meta["plan"]["pp_schedule"]) == (2, 2, "gpipe")
    assert len(list((fresh / "step-3").glob("*.distcp"))) == 4
    (single,) = run({"dp": 1, "micro_batch": 8}, fresh, MIGRATION_STEPS)
    assert "resumed from step 3 " in single.out
    assert_matches(losses(single.out), reference, range(4, MIGRATION_STEPS + 1), MIGRATION_RTOL)


def test_sigterm_to_one_pipeline_rank_checkpoints_all_and_resumes_elsewhere(reference: dict[int, float],
                                                                           tmp_path: Path) -> None:
    """SIGTERM reaches only the last stage of a PP 2 run: at the next step boundary both ranks agree to
    stop, write one DCP checkpoint together and exit 0; DP 2 with ZeRO-2 resumes it on the curve."""
    ckpt = tmp_path / "ckpt"
    # Steps padded to 0.2 s so that the run is still going when the signal lands (numerics unchanged).
    envs = plan_envs({"dp": 1, "pp": 2, "micro_batch": 2, "grad_accum": 4}, model=MODEL, checkpoint_dir=ckpt,
                     iterations=MIGRATION_STEPS, global_batch=GLOBAL_BATCH,
                     extra={"TESSERA_TRAINER_MIN_STEP_SECONDS": "0.2"})
    ranks = start_ranks(envs, mode="fork", cwd=tmp_path)
    try:
        ranks.wait_for_output(0, "step iteration=2/", TIMEOUT)
        os.kill(ranks.pids[1], signal.SIGTERM)
        results = ranks.wait(TIMEOUT)
    finally:
        ranks.kill()
    stops = []
    for r in results:
        assert r.rc == 0, r.err[-3000:]
        m = re.search(r"stopped iteration=(\d+) .*checkpoint_iteration=(\d+) reason=(\S+)", r.out)
        assert m, r.out[-1500:]
        stops.append((int(m.group(1)), int(m.group(2)), m.group(3)))
    (it0, ck0, why0), (it1, ck1, why1) = stops
    assert it0 == it1 == ck0 == ck1 and 2 <= it0 < MIGRATION_STEPS
    assert (why0, why1) == ("peer", "SIGTERM")
    assert latest_checkpoint(ckpt).iteration == it0  # type: ignore[union-attr]

    (a, _) = run({"dp": 2, "micro_batch": 4, "zero_stage": 2}, ckpt, MIGRATION_STEPS)
    assert f"resumed from step {it0} " in a.out
    assert_matches(losses(a.out), reference, range(it0 + 1, MIGRATION_STEPS + 1), MIGRATION_RTOL)


# ---------------------------------------------------------------- checkpoints of the previous format


def _train_format1(ckpt: Path, save_at: int, until: int) -> dict[int, float]:
    """The previous trainer's model and loop (fused qkv, ModuleList, one process): train to `save_at`,
    write its checkpoint format (state.pt by torch.save, format 1) there, and go on to `until`.
    Returns its losses after the checkpoint."""
    import math
    import random

    import torch
    import torch.nn.functional as F
    from torch import nn

    from tessera.clients.trainer import checkpoint_writer
    from tessera.clients.trainer.reference.data import MarkovData
    from tessera.clients.trainer.reference.model import param_groups

    h, layers, heads, vocab, seq = (MODEL[k] for k in ("hidden_size", "num_layers", "num_heads", "vocab_size",
                                                       "seq_length"))

    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = (z.view(b, t, heads, h // heads).transpose(1, 2) for z in self.qkv(x).split(h, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).contiguous().view(b, t, h))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.attn, self.ln2 = nn.LayerNorm(h), Attn(), nn.LayerNorm(h)
            self.fc, self.out = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln1(x))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class OldGPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok_emb, self.pos_emb = nn.Embedding(vocab, h), nn.Embedding(seq, h)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f, self.head = nn.LayerNorm(h), nn.Linear(h, vocab, bias=False)
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.02)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.normal_(m.bias, std=0.02)  # non-zero, so that a mis-split bias shows
            self.head.weight = self.tok_emb.weight

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1]))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln_f(x))

    seed = 1234
    torch.manual_seed(seed)
    random.seed(seed)
    model = OldGPT()
    opt = torch.optim.AdamW(param_groups(model, 0.01), lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    data = MarkovData(vocab, seq, seed)
    after: dict[int, float] = {}
    for step in range(until):
        batch = torch.tensor(data.samples(step * GLOBAL_BATCH, GLOBAL_BATCH))
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step + 1 > save_at:
            after[step + 1] = loss.item()
        if step + 1 == save_at:
            meta = {"format": "tessera-reference-trainer/1", "data_position": save_at * GLOBAL_BATCH,
                    "loss": loss.item(), "world_size": 1, "plan": {"dp": 1, "micro_batch": GLOBAL_BATCH},
                    "model": MODEL, "seed": seed}
            state = {**meta, "iteration": save_at, "model_state": model.state_dict(),
                     "optimizer_state": opt.state_dict(),
                     "rng": {"torch": torch.get_rng_state(), "python": random.getstate()}}
            with checkpoint_writer(ckpt, save_at, meta) as tmp:
                torch.save(state, tmp / "state.pt")
    assert all(math.isfinite(v) for v in after.values())
    return after


def test_format1_checkpoint_of_the_previous_trainer_resumes_on_any_plan(tmp_path: Path) -> None:
    """A DP checkpoint of the previous format (torch.save, fused qkv, positional optimizer state)
    resumes under PP 2 x TP 2: the qkv matrix and its Adam moments are split into q, k, v, the tied
    head's state reaches the last stage, and the curve is the one the old trainer would have followed."""
    ckpt = tmp_path / "ckpt"
    old = _train_format1(ckpt, save_at=3, until=MIGRATION_STEPS)
    results = run({"dp": 1, "tp": 2, "pp": 2, "micro_batch": 4, "grad_accum": 2}, ckpt, MIGRATION_STEPS)
    assert "resumed from step 3 " in results[0].out
    assert_matches(losses(results[0].out), old, range(4, MIGRATION_STEPS + 1), MIGRATION_RTOL)
