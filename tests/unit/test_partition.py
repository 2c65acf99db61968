"""Stage partition by FLOPs and inter-operator communication (Crius, arXiv 2024: Sec. 4.2,
Figure 7; docs/reference/papers.md)."""

from __future__ import annotations

import pytest

from tessera.estimator.partition import (
    Operator,
    PartitionError,
    gpu_shares,
    partition_stages,
    power_of_two_split,
)


def ops(flops: list[float], out: list[float]) -> list[Operator]:
    return [Operator(f"op{i}", f, out_bytes=c) for i, (f, c) in enumerate(zip(flops, out))]


def test_figure7_example_golden() -> None:
    # Figure 7: six operators, 8 GPUs; OP1 has 1/16 of the FLOPs (0.5 GPU), OP2 3/16 (1.5 GPUs)
    chain = ops([1, 3, 4, 4, 2, 2], [5, 2, 3, 1, 4, 0])
    assert gpu_shares(chain, 8) == (0.5, 1.5, 2.0, 2.0, 1.0, 1.0)
    p = partition_stages(chain, 8, 4)
    assert p.bounds == ((0, 2), (2, 3), (3, 4), (4, 6))
    assert p.gpus == (2, 2, 2, 2)
    assert p.stage_flops == (4.0, 4.0, 4.0, 4.0)
    assert p.cut_bytes == (2, 3, 1)
    assert p.num_stages == 4


def test_cut_with_least_communication_among_balanced_cuts() -> None:
    chain = ops([2, 1, 1, 2], [1, 9, 2, 0])
    # perfectly balanced cut (3 | 3) crosses 9 bytes; within 34% imbalance the 1-byte cut wins
    assert partition_stages(chain, 2, 2, balance_tolerance=0.0).bounds == ((0, 2), (2, 4))
    assert partition_stages(chain, 2, 2, balance_tolerance=0.34).bounds == ((0, 1), (1, 4))


def test_single_stage_and_uneven_gpu_split() -> None:
    chain = ops([1, 1, 1], [1, 1, 0])
    assert partition_stages(chain, 4, 1).bounds == ((0, 3),)
    assert partition_stages(chain, 4, 1).gpus == (4,)
    p = partition_stages(chain, 8, 3)  # 8/3 GPUs each -> powers of two that add up to 8
    assert sorted(p.gpus) == [2, 2, 4] and sum(p.gpus) == 8


def test_power_of_two_split_golden() -> None:
    assert power_of_two_split([8 / 3] * 3, 8) == (4, 2, 2)
    assert power_of_two_split([1.5, 3.5, 3.0], 8) == (2, 4, 2)
    assert power_of_two_split([2.0, 2.0], 4) == (2, 2)
    assert power_of_two_split([1.0, 1.0, 1.0], 2) is None


@pytest.mark.parametrize(
    ("gpus", "stages", "field"),
    [(0, 1, "num_gpus"), (4, 0, "num_stages"), (4, 7, "num_stages"), (2, 3, "num_stages")],
)
def test_bad_input_names_the_field(gpus: int, stages: int, field: str) -> None:
    chain = ops([1, 1, 1, 1, 1], [1, 1, 1, 1, 0])
    with pytest.raises(PartitionError, match=f"^{field}:"):
        partition_stages(chain, gpus, stages)


def test_zero_flops_is_rejected() -> None:
    with pytest.raises(PartitionError, match="^ops:"):
        partition_stages(ops([0, 0], [0, 0]), 2, 1)
