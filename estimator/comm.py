"""Communication model: collectives and point-to-point per link type (Crius Sec. 5.1).

Crius: "A Codesign of Scheduling and Parallelization for Large Model Training in Heterogeneous
Clusters", arXiv 2024 (arXiv:2403.16125; docs/reference/papers.md).

Crius obtains the latency of communication operators offline, per interconnect, and interpolates by
traffic volume at estimation time ("traffic-based interpolation"). Here:

- `CommTable` holds profiled points (op, link, world size, bytes) -> seconds, as written by
  `python -m tessera.estimator.torch.comm_profile`, and interpolates piecewise-linearly in bytes; a world size that
  was not profiled is derived from the nearest profiled one through the bus-bandwidth factors of the
  nccl-tests convention (all-reduce moves 2(n-1)/n of the buffer per rank, all-gather,
  reduce-scatter and all-to-all (n-1)/n, p2p 1);
- `AlphaBeta` is the analytical fallback: `t = steps * alpha + factor(op, n) * bytes / (bw * eff)`
  with the link bandwidth from the GPU catalog or the cluster's NIC (docs/reference/estimation.md 3.3);
- `CommModel` asks the table first and falls back to the formula, and says which one answered
  (`source` = "profiled:<table>" or "formula:alpha-beta").

Sizes follow nccl-tests: for all-reduce the buffer per rank; for all-gather the gathered (output)
size; for reduce-scatter the input size; for all-to-all the send buffer per rank; for p2p the message.
Pure: no torch, no I/O except the explicit JSON (de)serialisers.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.common.errors import InvalidArgument

COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")
LINK_KINDS: tuple[str, ...] = ("nvlink", "pcie", "ib", "ethernet", "loopback")


class CommError(InvalidArgument, ValueError):
    """Bad input to the communication model; `field` names the field, `reason` says why."""


def _check_op(op: str) -> None:
    if op not in COLLECTIVES:
        raise CommError("op", f"unknown collective {op!r}; known: {', '.join(COLLECTIVES)}")


def bus_factor(op: str, world: int) -> float:
    """Bytes each rank moves over its link, per byte of `nbytes` (nccl-tests busbw convention)."""
    _check_op(op)
    if world < 1:
        raise CommError("world", f"must be >= 1, got {world}")
    if op == "p2p":
        return 1.0
    if world == 1:
        return 0.0
    if op == "all_reduce":
        return 2.0 * (world - 1) / world
    return (world - 1) / world


def latency_steps(op: str, world: int) -> int:
    """Sequential message steps of a ring algorithm (alpha terms)."""
    _check_op(op)
    if op == "p2p":
        return 1
    if world <= 1:
        return 0
    return 2 * (world - 1) if op == "all_reduce" else world - 1


@dataclass(frozen=True)
class Link:
    """One interconnect: nominal bandwidth per direction (GB/s), per-message latency, efficiency.

    `efficiency` is the achievable fraction of the nominal rate (nccl-tests busbw / nominal); it is a
    stated prior, not a measurement, unless `source` says otherwise.
    """

    kind: str
    bandwidth_gbps: float
    latency_s: float = 10e-6
    efficiency: float = 0.8
    source: str = "formula"

    def __post_init__(self) -> None:
        if self.kind not in LINK_KINDS:
            raise CommError("link.kind", f"unknown link kind {self.kind!r}; known: {', '.join(LINK_KINDS)}")
        if self.bandwidth_gbps <= 0:
            raise CommError("link.bandwidth_gbps", f"must be > 0, got {self.bandwidth_gbps}")
        if not 0 < self.efficiency <= 1:
            raise CommError("link.efficiency", f"must be in (0, 1], got {self.efficiency}")
        if self.latency_s < 0:
            raise CommError("link.latency_s", "must be >= 0")

    @property
    def effective_bytes_per_s(self) -> float:
        return self.bandwidth_gbps * 1e9 * self.efficiency


@dataclass(frozen=True)
class CommEstimate:
    seconds: float
    source: str


@dataclass(frozen=True)
class AlphaBeta:
    """Analytical fallback: ring collectives over the slowest link of the group."""

    def time(self, op: str, nbytes: float, world: int, link: Link, sharing: int = 1) -> CommEstimate:
        """Seconds for one collective; `sharing` groups share the link concurrently (e.g. one NIC)."""
        if nbytes < 0:
            raise CommError("nbytes", f"must be >= 0, got {nbytes}")
        if sharing < 1:
            raise CommError("sharing", f"must be >= 1, got {sharing}")
        f = bus_factor(op, world)
        if f == 0.0 or nbytes == 0:
            return CommEstimate(0.0, "formula:alpha-beta")
        t = latency_steps(op, world) * link.latency_s + f * nbytes * sharing / link.effective_bytes_per_s
        return CommEstimate(t, "formula:alpha-beta")


@dataclass(frozen=True)
class CommPoint:
    op: str
    link: str
    world: int
    nbytes: float
    seconds: float


@dataclass
class CommTable:
    """Profiled (op, link, world) -> sorted (bytes, seconds) points with interpolation."""

    name: str = "table"
    meta: dict[str, Any] = field(default_factory=dict)
    _series: dict[tuple[str, str, int], tuple[list[float], list[float]]] = field(default_factory=dict)

    @classmethod
    def from_points(cls, points: Iterable[CommPoint], name: str = "table",
                    meta: Mapping[str, Any] | None = None) -> CommTable:
        acc: dict[tuple[str, str, int], dict[float, float]] = {}
        for p in points:
            _check_op(p.op)
            if p.world < 1:
                raise CommError("world", f"must be >= 1, got {p.world}")
            if p.nbytes < 0 or p.seconds < 0:
                raise CommError("nbytes/seconds", "profiled points must be >= 0")
            acc.setdefault((p.op, p.link, p.world), {})[float(p.nbytes)] = float(p.seconds)
        series = {}
        for k, pts in acc.items():
            xs = sorted(pts)
            series[k] = (xs, [pts[x] for x in xs])
        return cls(name, dict(meta or {}), series)

    @classmethod
    def from_json(cls, data: str | Mapping[str, Any], name: str | None = None) -> CommTable:
        """Parse the JSON written by tessera.estimator.torch.comm_profile (a string or the decoded object)."""
        obj = json.loads(data) if isinstance(data, str) else data
        if not isinstance(obj, Mapping) or "entries" not in obj:
            raise CommError("entries", "a comm table needs an 'entries' list")
        pts = []
        for i, e in enumerate(obj["entries"]):
            try:
                pts.append(CommPoint(str(e["op"]), str(e["link"]), int(e["world"]), float(e["bytes"]),
                                     float(e["seconds"])))
            except (KeyError, TypeError, ValueError) as exc:
                raise CommError(f"entries[{i}]", f"needs op, link, world, bytes, seconds ({exc})") from exc
        meta = {k: v for k, v in obj.items() if k != "entries"}
        return cls.from_points(pts, name or str(meta.get("name", "table")), meta)

    def to_json(self) -> str:
        entries = [
            {"op": op, "link": link, "world": w, "bytes": x, "seconds": y}
            for (op, link, w), (xs, ys) in sorted(self._series.items())
            for x, y in zip(xs, ys)
        ]
        return json.dumps({**self.meta, "name": self.name, "entries": entries}, indent=1)

    def keys(self) -> list[tuple[str, str, int]]:
        return sorted(self._series)

    @staticmethod
    def _interp(xs: list[float], ys: list[float], x: float) -> float:
        if len(xs) == 1:
            return ys[0] if x <= xs[0] or xs[0] == 0 else ys[0] * x / xs[0]
        if x <= xs[0]:
            return ys[0]  # latency floor: smaller messages cost at least the smallest profiled one
        if x >= xs[-1]:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if xs[-1] > xs[-2] else 0.0
            if slope <= 0:
                slope = ys[-1] / xs[-1] if xs[-1] > 0 else 0.0
            return ys[-1] + slope * (x - xs[-1])
        i = bisect_left(xs, x)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)

    def lookup(self, op: str, link: str, world: int, nbytes: float) -> float | None:
        """Interpolated seconds, or None when the table has no point for this op and link."""
        _check_op(op)
        if nbytes < 0:
            raise CommError("nbytes", f"must be >= 0, got {nbytes}")
        key = (op, link, world)
        if key in self._series:
            xs, ys = self._series[key]
            return self._interp(xs, ys, nbytes)
        worlds = [w for (o, lk, w) in self._series if o == op and lk == link]
        if not worlds:
            return None
        f_target = bus_factor(op, world)
        if f_target == 0.0:
            return 0.0
        usable = [w for w in worlds if bus_factor(op, w) > 0]
        if not usable:
            return None
        near = min(usable, key=lambda w: (abs(w - world), w))
        xs, ys = self._series[(op, link, near)]
        # same per-link traffic: scale the buffer so the profiled size moves as many bytes per link
        equiv = nbytes * f_target / bus_factor(op, near)
        return self._interp(xs, ys, equiv)


@dataclass
class CommModel:
    """Profiled table first, alpha-beta fallback; every answer carries its source."""

    table: CommTable | None = None
    fallback: AlphaBeta = field(default_factory=AlphaBeta)

    def time(self, op: str, nbytes: float, world: int, link: Link, sharing: int = 1) -> CommEstimate:
        if world < 1:
            raise CommError("world", f"must be >= 1, got {world}")
        if (op != "p2p" and world == 1) or nbytes == 0:
            return CommEstimate(0.0, "formula:none")
        if self.table is not None:
            t = self.table.lookup(op, link.kind, world, nbytes * sharing)
            if t is not None:
                return CommEstimate(t, f"profiled:{self.table.name}")
        return self.fallback.time(op, nbytes, world, link, sharing)
