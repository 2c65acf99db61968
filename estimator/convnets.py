"""Wide-ResNet as a chain of operators for the Cell estimator (the Crius artifact's third family).

The architecture is Alpa's (alpa/model/wide_resnet.py, used unchanged by the Crius artifact's
trainer, sjtu-epcc/arena runtime/crius_worker/jax/trainer/wide_resnet_trainer.py): ResNet v1 with
bottleneck blocks whose 3x3 convolution is `width_factor` times wider than the block's filters.

- stem: 7x7 convolution, stride 2, 3 -> `filters` channels; batch norm; ReLU; 3x3 max pool, stride 2;
- stage i (i = 0..3) of `stage_sizes[depth][i]` blocks with f = filters * 2^i; the first block of
  stages 1-3 has stride 2 (on its 3x3 convolution); each block is
  conv 1x1 (c_in -> f), BN, ReLU; conv 3x3 (f -> f * width_factor, stride), BN, ReLU;
  conv 1x1 (-> 4f), BN; plus a 1x1 projection (c_in -> 4f, stride) and BN when the shape changes;
  add, ReLU;
- head: global average pool, dense 4 * 8 * filters -> classes (with bias), softmax cross-entropy.

Convolutions have no bias; every batch norm has a scale and a bias (its running statistics are not
trained and are not counted as parameters). Spatial sizes follow "SAME" padding: ceil(size / stride).

Costs are per sample (one image), in the units of `partition.Operator`; `dtype_bytes` is 4 for the
artifact's float32 training. Rematerialisation (Alpa's coarse-grained remat) stores only each
operator's input and runs its forward twice. The parameter counts match the artifact's names:
495 M ("500M"), 1,005 M ("1B"), 1,965 M ("2B"), 4,000 M ("4B"), 6,727 M ("6.8B") (a unit test).
"""

from __future__ import annotations

import math

from tessera.estimator.partition import LayerShape, Operator

# Bottleneck stage sizes by depth (Alpa's model_configs; 18 and 34 use basic blocks and are not here).
STAGE_SIZES: dict[int, tuple[int, int, int, int]] = {
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
    200: (3, 24, 36, 3),
}


def _out(size: int, stride: int) -> int:
    return math.ceil(size / stride)


def bottleneck(idx: int, c_in: int, filters: int, width_factor: int, size: int, stride: int,
               dtype_bytes: int, recompute: bool) -> Operator:
    """One bottleneck block on a `size` x `size` input with `c_in` channels."""
    f, w, d = filters, width_factor, dtype_bytes
    o = _out(size, stride)
    a1, a2, a3 = f * size * size, f * w * o * o, 4 * f * o * o  # conv outputs (elements)
    proj = c_in != 4 * f or stride != 1
    macs = c_in * f * size * size + 9 * f * f * w * o * o + f * w * 4 * f * o * o
    params = c_in * f + 9 * f * f * w + f * w * 4 * f + 2 * (f + f * w + 4 * f)
    if proj:
        macs += c_in * 4 * f * o * o
        params += c_in * 4 * f + 2 * 4 * f
    passes = 4 if recompute else 3  # forward, backward (2x), recomputed forward
    # memory-bound elementwise tensors: BN + ReLU after conv1 and conv2 (channel-sharded under TP);
    # BN, add and ReLU on the block output, and BN of the projection (replicated)
    sharded = 2 * (a1 + a2) * d
    replicated = (3 * a3 + (a3 if proj else 0)) * d
    conv_outputs = (a1 + a2 + a3 + (a3 if proj else 0)) * d
    calls = 6 if recompute else 4  # TP: conv2 (row-parallel) and conv3 outputs reduced per pass
    return Operator(
        name=f"block{idx}", flops=passes * 2.0 * macs, params=float(params), out_bytes=float(a3 * d),
        traffic_bytes=float(replicated), traffic_sharded_bytes=float(sharded),
        tp_comm_bytes=float(calls // 2 * (a2 + a3) * d), comm_calls=calls,
        stored_bytes=float(c_in * size * size * d) if recompute else float(sharded + replicated + conv_outputs),
        shape=LayerShape("bottleneck", c_in, heads=width_factor, ffn=f, seq=size, stride=stride,
                         recompute=recompute),
    )


def wide_resnet_operators(depth: int, width_factor: int, filters: int, num_classes: int, image_size: int,
                          dtype_bytes: int = 4, recompute: bool = True) -> tuple[Operator, ...]:
    """Stem, one operator per bottleneck block, head; per image. Raises ValueError naming the field."""
    if depth not in STAGE_SIZES:
        raise ValueError(f"num_layers: Wide-ResNet depth must be one of {sorted(STAGE_SIZES)}, got {depth}")
    for name, v in (("width_factor", width_factor), ("hidden_size", filters), ("vocab_size", num_classes),
                    ("seq_length", image_size), ("dtype_bytes", dtype_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: must be a positive integer, got {v!r}")
    d = dtype_bytes
    s1 = _out(image_size, 2)  # after the 7x7 stride-2 convolution
    s2 = _out(s1, 2)  # after the max pool
    stem_out = filters * s2 * s2
    stem_traffic = (2 * filters * s1 * s1 + stem_out) * d  # BN, ReLU, pool
    passes = 4 if recompute else 3
    ops = [Operator(
        "stem", flops=passes * 2.0 * 49 * 3 * filters * s1 * s1, params=float(49 * 3 * filters + 2 * filters),
        out_bytes=float(stem_out * d), traffic_sharded_bytes=float(stem_traffic),
        stored_bytes=float(3 * image_size * image_size * d) if recompute else float(stem_traffic + filters * s1 * s1 * d),
        shape=LayerShape("stem", filters, seq=image_size, recompute=recompute))]
    c_in, size, idx = filters, s2, 0
    for i, blocks in enumerate(STAGE_SIZES[depth]):
        f = filters * 2**i
        for j in range(blocks):
            stride = 2 if i > 0 and j == 0 else 1
            ops.append(bottleneck(idx, c_in, f, width_factor, size, stride, d, recompute))
            c_in, size, idx = 4 * f, _out(size, stride), idx + 1
    # head: average pool, dense with bias, fp32 softmax cross-entropy; not rematerialised
    ops.append(Operator(
        "head", flops=3 * 2.0 * c_in * num_classes, params=float(c_in * num_classes + num_classes),
        out_bytes=0.0, traffic_bytes=float(c_in * size * size * d), traffic_sharded_bytes=float(3 * 4 * num_classes),
        tp_comm_bytes=float(2 * c_in * d), comm_calls=2, stored_bytes=float(c_in * size * size * d),
        shape=LayerShape("pool_head", c_in, seq=size, vocab=num_classes)))
    return tuple(ops)
