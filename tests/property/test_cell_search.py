"""The Cell search against plain data parallelism, on random small transformers, batches and GPU
counts on one node (estimator/cell_search.py).

Property: the best Cell on N GPUs (over its stage counts) is never slower than plain data
parallelism on the same N GPUs (one stage, dp = N, no TP, no sharding, the smallest number of
micro-batches B that gives every rank whole samples and fits in memory) whenever that plan fits.
Before the fix the search forced B = 4 x stages and dropped DP layouts with more ranks than samples
per micro-batch, so it missed plain DP whenever the global batch / 4 < N.

Not asserted: that more GPUs of a type never give a slower best Cell than fewer. The model does not
guarantee it: a Cell uses all its GPUs, and when the batch does not split over twice the ranks the
extra GPUs must go to TP or PP, whose communication can cost more than the compute they save
(tests/unit/test_cell_search.py::test_more_gpus_can_be_slower_when_the_batch_does_not_split).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tessera.estimator.cell_search import divisors
from tessera.estimator.cells import CellConfig, CellEstimator, CellModel, GpuPool, iteration_time
from tests.property import profile

GPUS = ("H100-80GB", "A100-40GB", "A10", "V100-32GB", "L4")


@st.composite
def cases(draw: st.DrawFn) -> tuple[CellModel, GpuPool, int, bool]:
    heads = draw(st.sampled_from((4, 8, 16)))
    hidden = heads * draw(st.sampled_from((32, 64, 128)))
    model = CellModel(
        draw(st.sampled_from(("gpt", "bert"))), hidden_size=hidden, num_layers=draw(st.integers(1, 8)),
        num_heads=heads, vocab_size=draw(st.integers(500, 50000)), seq_length=draw(st.sampled_from((128, 512, 2048))),
        global_batch=draw(st.integers(1, 96)), recompute=draw(st.booleans()))
    per_node = draw(st.sampled_from((2, 4, 8)))
    pool = GpuPool(draw(st.sampled_from(GPUS)), per_node, per_node)
    n = draw(st.sampled_from([g for g in (1, 2, 4, 8) if g <= per_node]))
    return model, pool, n, draw(st.booleans())


def plain_dp(est: CellEstimator, model: CellModel, pool: GpuPool, n: int) -> float | None:
    """One stage, dp = n, the smallest B with whole samples per rank that fits; None if none fits."""
    for b in divisors(model.global_batch):
        if (model.global_batch // b) % n:
            continue
        rows, _, _ = est.stage_costs(model, pool, n, 1, options=[[(n, 1)]], num_microbatches=b)
        if rows[0] and rows[0][0].fits:
            return iteration_time(rows[0], b)
    return None


@profile(150)
@given(cases())
def test_best_cell_is_never_slower_than_plain_data_parallelism(case: tuple[CellModel, GpuPool, int, bool]) -> None:
    model, pool, n, fsdp = case
    est = CellEstimator(CellConfig(fsdp_stages=fsdp))
    dp = plain_dp(est, model, pool, n)
    stages = [s for s in (1, 2, 4, 8) if s <= n and s <= model.num_layers]
    cells = [est.cell(model, pool, n, s) for s in stages]
    times = [c.iter_time.value for c in cells if c.fits and c.iter_time is not None]
    if dp is None:
        return
    assert times, f"plain DP fits ({dp:.4g} s) but no Cell does: {[c.reason for c in cells]}"
    assert min(times) <= dp * (1 + 1e-9)
    one = cells[0]
    assert one.plan is not None and one.iter_time is not None and one.iter_time.value <= dp * (1 + 1e-9)
