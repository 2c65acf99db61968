"""Wide-ResNet operators (estimator/convnets.py), its Cells and the FP32 compute path."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tessera.common.gpus import CATALOG, lookup
from tessera.estimator.cells import (
    CellConfig,
    CellEstimator,
    CellInputError,
    CellModel,
    GpuPool,
    best_plan,
    execution_plan,
)
from tessera.estimator.compute import (
    EfficiencyPrior,
    profile_stage_compute,
    stage_compute_time,
)
from tessera.estimator.convnets import bottleneck, wide_resnet_operators
from tessera.estimator.partition import Operator
from tessera.estimator.torch.stage_profiler import StageProfiler


def test_bottleneck_block_by_hand() -> None:
    # c_in 8, filters 4, width 2, 8x8 input, stride 2 (so a projection), float32, remat.
    # output 4x4; conv outputs: a1 = 4*8*8 = 256, a2 = 8*4*4 = 128, a3 = 16*4*4 = 256
    # MACs: 8*4*64 + 9*4*8*16 + 8*16*16 + proj 8*16*16 = 2048 + 4608 + 2048 + 2048 = 10752
    b = bottleneck(0, 8, 4, 2, 8, 2, 4, True)
    assert b.flops == 4 * 2 * 10752  # forward, backward (2x), recomputed forward
    assert b.params == 32 + 288 + 128 + 2 * (4 + 8 + 16) + 128 + 2 * 16  # convs, BNs, projection
    assert b.out_bytes == 256 * 4
    assert b.traffic_sharded_bytes == 2 * (256 + 128) * 4  # BN + ReLU after conv1 and conv2
    assert b.traffic_bytes == (3 * 256 + 256) * 4  # BN, add, ReLU on the output; projection BN
    assert b.tp_comm_bytes == 3 * (128 + 256) * 4 and b.comm_calls == 6
    assert b.stored_bytes == 8 * 8 * 8 * 4  # remat keeps the block input only
    assert b.shape is not None and (b.shape.kind, b.shape.stride, b.shape.heads) == ("bottleneck", 2, 2)


def test_no_projection_when_shapes_match() -> None:
    b = bottleneck(1, 16, 4, 2, 8, 1, 4, False)
    assert b.params == 16 * 4 + 9 * 4 * 8 + 8 * 16 + 2 * (4 + 8 + 16)
    assert b.flops == 3 * 2 * (16 * 4 * 64 + 9 * 4 * 8 * 64 + 8 * 16 * 64)


@pytest.mark.parametrize("filters, width, depth, params", [
    (224, 2, 50, 495_046_176),  # the artifact's "500M"
    (320, 2, 50, 1_005_653_184),  # "1B"
    (448, 2, 50, 1_965_011_008),  # "2B"
    (640, 2, 50, 4_000_937_344),  # "4B"
    (320, 16, 50, 6_727_679_424),  # "6.8B"
    (320, 16, 101, 12_633_386_944),  # "13B"
])
def test_parameter_counts_match_the_artifact_names(filters: int, width: int, depth: int, params: int) -> None:
    ops = wide_resnet_operators(depth, width, filters, 1024, 224)
    assert sum(o.params for o in ops) == params
    assert len(ops) == 2 + {50: 16, 101: 33}[depth]


def test_spatial_sizes_follow_same_padding() -> None:
    ops = wide_resnet_operators(50, 2, 4, 10, 224)
    assert ops[0].out_bytes == 4 * 56 * 56 * 4  # 224 -> 112 (conv) -> 56 (pool)
    assert ops[-1].shape is not None and ops[-1].shape.seq == 7 and ops[-1].shape.hidden == 4 * 4 * 8
    odd = wide_resnet_operators(50, 2, 4, 10, 33)  # 33 -> 17 -> 9 -> 5 -> 3 -> 2
    assert odd[-1].shape is not None and odd[-1].shape.seq == 2


@pytest.mark.parametrize("kwargs, field", [
    ({"depth": 34}, "num_layers"), ({"width_factor": 0}, "width_factor"), ({"filters": -1}, "hidden_size"),
    ({"num_classes": 0}, "vocab_size"), ({"image_size": 0}, "seq_length"),
])
def test_bad_dimensions_name_the_field(kwargs: dict[str, int], field: str) -> None:
    args = {"depth": 50, "width_factor": 2, "filters": 8, "num_classes": 10, "image_size": 32, **kwargs}
    with pytest.raises(ValueError, match=f"^{field}:"):
        wide_resnet_operators(**args)


def test_cell_model_validation() -> None:
    m = CellModel.wide_resnet(50, 2, 64, 1000, 224, 256)
    assert (m.family, m.dtype_bytes, m.state_bytes_per_param) == ("wresnet", 4, 12.0)
    assert m.signature.endswith("-wf2")
    with pytest.raises(CellInputError, match="^num_layers:"):
        CellModel.wide_resnet(34, 2, 64, 1000, 224, 256)
    with pytest.raises(CellInputError, match="^num_heads:"):
        replace(m, num_heads=2)
    with pytest.raises(CellInputError, match="^width_factor:"):
        replace(m, width_factor=0)
    with pytest.raises(CellInputError, match="^width_factor:"):
        CellModel("gpt", 64, 2, 4, 100, 32, global_batch=4, width_factor=2)


def test_fp32_rates_in_the_catalog() -> None:
    assert lookup("A100-40GB").tflops_fp32_dense == 19.5
    assert lookup("V100").tflops_fp32_dense == 15.7
    a40 = lookup("A40")
    assert a40.tflops_fp32 == 37.4 and a40.fp32_shares_int32 and a40.tflops_fp32_dense == 18.7
    assert CATALOG["H100-80GB"].tflops_fp32_dense == 66.9
    assert CATALOG["T4-16GB"].tflops_fp32_dense == 0.0  # not in the table: unknown, not guessed


def test_fp32_compute_uses_the_fp32_rate_and_its_efficiency() -> None:
    op = Operator("x", flops=1e12)
    prior = EfficiencyPrior(matmul_efficiency=0.5, fp32_efficiency=0.25, traffic_multiplier=0.0)
    a100 = lookup("A100-40GB")
    assert stage_compute_time([op], a100, 1, 1, 1, prior, fp32=True).seconds == pytest.approx(1 / (19.5 * 0.25))
    assert stage_compute_time([op], a100, 1, 1, 1, prior).seconds == pytest.approx(1 / (312 * 0.5))
    t4 = lookup("T4")  # no FP32 figure: 1/8 of the FP16 rate, and the source says so
    est = stage_compute_time([op], t4, 1, 1, 1, prior, fp32=True)
    assert est.seconds == pytest.approx(1 / (65 / 8 * 0.25))
    assert "fp32=fp16/8(T4-16GB)" in est.source
    with pytest.raises(ValueError, match="^fp32_efficiency:"):
        EfficiencyPrior(fp32_efficiency=0.0)


def test_wide_resnet_cells() -> None:
    m = CellModel.wide_resnet(50, 2, 224, 1024, 224, 256, name="wrn-500m")
    est = CellEstimator()
    a100 = GpuPool("A100-40GB", 64, 4, "nvlink", 12.5)
    one = est.cell(m, a100, 1, 1)
    four = est.cell(m, a100, 4, 1)
    assert one.fits and four.fits and one.iter_time and four.iter_time
    assert four.iter_time.value < one.iter_time.value / 2  # data parallel on NVLink scales
    assert one.memory_per_gpu and one.memory_per_gpu.value > 495_046_176 * 12  # states alone
    assert one.plan is not None and execution_plan(m, one.plan) is None  # no transformer plan for it
    # an A40 has twice the datasheet FP32 peak of an A100 but only its dense half: not faster here
    a40 = est.cell(m, GpuPool("A40-48GB", 64, 2, "pcie", 12.5), 1, 1)
    assert a40.iter_time and a40.iter_time.value > one.iter_time.value
    piped = est.cell(m, a100, 8, 4, nodes=2, gpus_per_node=4)
    assert piped.fits and piped.num_stages == 4
    assert not est.cell(m, a100, 64, 64).fits  # more stages than the 18 operators


def test_profiler_runs_the_conv_operators_on_cpu() -> None:
    ops = wide_resnet_operators(50, 2, 4, 10, 32)
    prof = StageProfiler(device="cpu", dtype="float32", repeats=1, warmup=0)
    dp_time = profile_stage_compute(ops, 1, 1, 2, prof).seconds
    tp_time = profile_stage_compute(ops, 1, 2, 2, prof).seconds
    assert dp_time > 0 and tp_time > 0
    assert len(prof._cache) == len({(o.shape, 2, 1, 1) for o in ops}) + len({(o.shape, 2, 1, 2) for o in ops})


def test_fixed_number_of_microbatches() -> None:
    m = CellModel.wide_resnet(50, 2, 16, 10, 32, 64)
    a100 = GpuPool("A100-40GB", 64, 4, "nvlink", 12.5)
    est = CellEstimator()
    chosen = est.cell(m, a100, 4, 2)
    fixed = CellEstimator(CellConfig(num_microbatches=16)).cell(m, a100, 4, 2)
    # without a fixed count the Cell takes the fastest divisor of the batch from Ns to 4 x Ns, so it
    # is never slower than the paper's B = 4 x Ns = 8 with the same stage options
    assert chosen.plan is not None and chosen.plan.num_microbatches in (2, 4, 8)
    assert chosen.iter_time is not None
    paper = best_plan(est.stage_costs(m, a100, 4, 2, num_microbatches=8)[0], 8)
    assert paper is not None and chosen.iter_time.value <= paper.iter_time
    assert fixed.plan is not None and fixed.plan.num_microbatches == 16
    capped = CellEstimator(CellConfig(num_microbatches=128)).cell(m, a100, 1, 1)
    assert capped.plan is not None and capped.plan.num_microbatches == 64  # at most the batch
    with pytest.raises(CellInputError, match="^num_microbatches:"):
        CellConfig(num_microbatches=-1)


def test_conv_weight_traffic_per_micro_batch() -> None:
    conv = Operator("b", flops=0.0, params=1e9, shape=bottleneck(0, 8, 4, 2, 8, 1, 4, True).shape)
    dense = Operator("h", flops=0.0, params=1e9, shape=wide_resnet_operators(50, 2, 4, 10, 32)[-1].shape)
    prior = EfficiencyPrior(traffic_multiplier=0.0, conv_weight_traffic=10.0)
    a100 = lookup("A100-40GB")  # 1,555 GB/s
    one = stage_compute_time([conv, dense], a100, 1, 1, 1, prior, fp32=True).seconds
    assert one == pytest.approx(10.0 * 4e9 / 1555e9)  # convolution weights only, 4 bytes each
    assert stage_compute_time([conv], a100, 4, 1, 8, prior, fp32=True).seconds == pytest.approx(one)  # DP: all
    assert stage_compute_time([conv], a100, 1, 2, 1, prior, fp32=True).seconds == pytest.approx(one / 2)  # TP shard
    with pytest.raises(ValueError, match="^conv_weight_traffic:"):
        EfficiencyPrior(conv_weight_traffic=-1.0)
