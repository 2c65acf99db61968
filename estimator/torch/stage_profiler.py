"""Crius's single-device profiling: each stage operator built as torch ops and timed on one device.

`StageProfiler` implements tessera.estimator.compute.OperatorProfiler; give it to the Cell estimator
(`CellEstimator(profiler=...)`) or to `compute.profile_stage_compute`. torch is imported when an
operator is first timed, not at import.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tessera.estimator.partition import LayerShape


@dataclass
class StageProfiler:
    """Times operators on one real device with torch: Crius's single-device profiling.

    Each distinct (shape, local samples, tp) is built once as a torch module with the TP-sharded
    dimensions (heads / tp, ffn / tp, vocab / tp; experts / dp under expert parallelism) and timed for
    forward + backward (+ a second forward under recomputation). Results are cached in the instance.
    `dtype` is a torch dtype name ("float16", "bfloat16", "float32"); CPU runs use float32.
    """

    device: str = "cpu"
    dtype: str = "float16"
    repeats: int = 3
    warmup: int = 1
    _cache: dict[tuple[Any, ...], float] = field(default_factory=dict)

    def op_seconds(self, shape: LayerShape, samples: int, dp: int, tp: int) -> float:
        key = (shape, samples, dp, tp)
        if key not in self._cache:
            self._cache[key] = _time_layer(shape, samples, dp, tp, self.device, self.dtype,
                                           self.repeats, self.warmup)
        return self._cache[key]


def _conv_forward(shape: LayerShape, samples: int, tp: int, kw: dict[str, Any], p: Callable[..., Any]) -> Callable[[], Any]:
    """A Wide-ResNet operator (estimator/convnets.py) as torch ops, output channels split over `tp`
    (the 3x3 convolution row-parallel: all its input channels of this rank, every output channel)."""
    import torch  # lazy: only the profiler needs torch

    F = torch.nn.functional

    def bn(y: Any) -> Any:
        return F.batch_norm(y, None, None, training=True)

    size = shape.seq
    if shape.kind == "stem":
        w0 = p(max(1, shape.hidden // tp), 3, 7, 7)
        x = torch.randn(samples, 3, size, size, **kw)
        return lambda: F.max_pool2d(F.relu(bn(F.conv2d(x, w0, stride=2, padding=3))), 3, 2, 1)
    if shape.kind == "pool_head":
        wd = p(max(1, shape.vocab // tp), shape.hidden)
        x = torch.randn(samples, shape.hidden, size, size, **kw).requires_grad_(True)
        return lambda: (x.mean((2, 3)) @ wd.t()).float().logsumexp(-1)
    c_in, f, wf, stride = shape.hidden, shape.ffn, shape.heads, shape.stride
    f_tp, out_tp = max(1, f // tp), max(1, 4 * f // tp)
    w1, w2, w3 = p(f_tp, c_in, 1, 1), p(f * wf, f_tp, 3, 3), p(out_tp, f * wf, 1, 1)
    proj = c_in != 4 * f or stride != 1
    wp = p(out_tp, c_in, 1, 1) if proj else None
    x = torch.randn(samples, c_in, size, size, **kw).requires_grad_(True)

    def fwd() -> Any:
        y = F.relu(bn(F.conv2d(x, w1)))
        y = F.relu(bn(F.conv2d(y, w2, stride=stride, padding=1)))
        y = bn(F.conv2d(y, w3))
        r = bn(F.conv2d(x, wp, stride=stride)) if wp is not None else x[:, :out_tp]
        return F.relu(y + r)

    return fwd


def _time_layer(shape: LayerShape, samples: int, dp: int, tp: int, device: str, dtype_name: str,
                repeats: int, warmup: int) -> float:
    import torch  # lazy: only the profiler needs torch

    dev = torch.device(device)
    dtype = getattr(torch, dtype_name) if dev.type != "cpu" else torch.float32
    h, s = shape.hidden, shape.seq
    heads = max(1, shape.heads // tp)
    hd = max(1, shape.hidden // max(1, shape.heads))
    ffn = max(1, shape.ffn // tp) if shape.ffn else 4 * h // tp
    kw: dict[str, Any] = {"device": dev, "dtype": dtype}

    def p(*dims: int) -> Any:
        return (torch.randn(*dims, **kw) * 0.02).requires_grad_(True)

    if shape.kind in ("stem", "bottleneck", "pool_head"):
        fwd = _conv_forward(shape, samples, tp, kw, p)
    elif shape.kind == "embedding":
        table = p(max(1, shape.vocab // tp), h)
        idx = torch.randint(0, max(1, shape.vocab // tp), (samples, s), device=dev)

        def fwd() -> Any:
            return torch.nn.functional.embedding(idx, table)

    elif shape.kind == "head":
        w = p(max(1, shape.vocab // tp), h)
        x = torch.randn(samples, s, h, **kw)

        def fwd() -> Any:
            return (x @ w.t()).float().logsumexp(-1)

    else:
        wqkv, wo = p(3 * heads * hd, h), p(h, heads * hd)
        moe = shape.kind == "moe" and shape.experts > 0
        # expert parallelism: each DP rank holds experts/dp experts and receives top_k tokens per token
        n_exp = max(1, shape.experts // dp) if moe else 1
        w1, w2 = p(n_exp, h, ffn), p(n_exp, ffn, h)
        wg = p(h, max(1, shape.experts)) if moe else None
        x = torch.randn(samples, s, h, **kw).requires_grad_(True)
        tokens = samples * s * (shape.top_k if moe else 1)

        def fwd() -> Any:
            q, k, v = (x @ wqkv.t()).view(samples, s, 3, heads, hd).unbind(2)
            a = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            y = x + a.transpose(1, 2).reshape(samples, s, heads * hd) @ wo.t()
            y = torch.nn.functional.layer_norm(y, (h,))
            if wg is not None:
                torch.softmax((y @ wg).float(), -1)
            t = y.reshape(-1, h)
            per = max(1, tokens // n_exp)
            t = t.repeat((per * n_exp + t.shape[0] - 1) // t.shape[0], 1)[: per * n_exp].view(n_exp, per, h)
            f = torch.bmm(torch.nn.functional.gelu(torch.bmm(t, w1)), w2)
            return f.float().sum() + y.float().sum()

    def step() -> None:
        out = fwd()
        if shape.recompute:
            with torch.no_grad():
                fwd()
        loss = out.float().sum() if out.requires_grad else None
        if loss is not None:
            loss.backward()

    sync: Callable[[], None] = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return float(statistics.median(times))
