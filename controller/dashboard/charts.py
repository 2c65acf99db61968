"""Server-rendered SVG charts of the dashboard: stacked areas over time (capacity), a line chart
(loss curve) and a Gantt chart (jobs' runs and forecasts). Plain SVG with presentation attributes
and classes (styled by /static/style.css): no script, so the pages' CSP needs no exception.
Every text is escaped here (direction controls shown, text.e); callers pass raw strings.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.controller.dashboard.text import e as escape

W, H = 760, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 12, 34
TIME_STEPS = (10, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400,
              7 * 86400)


def clock(t: float, span: float = 0.0) -> str:
    """UTC wall time, as short as the span allows."""
    fmt = "%m-%d %H:%M" if span > 86400 else "%H:%M:%S" if span < 300 else "%H:%M"
    try:
        return time.strftime(fmt, time.gmtime(t))
    except (OverflowError, OSError, ValueError):  # a time no calendar shows
        return "-"


def nice_step(span: float, ticks: int = 5) -> float:
    raw = span / max(1, ticks)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    return next((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), 10 * mag)


def _time_ticks(t0: float, t1: float) -> list[float]:
    span = t1 - t0
    step = next((s for s in TIME_STEPS if span / s <= 6), TIME_STEPS[-1])
    first = math.ceil(t0 / step) * step
    return [first + i * step for i in range(int((t1 - first) // step) + 1)]


class _Frame:
    """Maps data to the plot area: x over [x0, x1], y over [0, y1]."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float, width: int = W, height: int = H) -> None:
        self.x0, self.x1 = x0, (x1 if x1 > x0 else x0 + 1)
        self.y0, self.y1 = y0, (y1 if y1 > y0 else y0 + 1)
        self.width, self.height = width, height

    def x(self, v: float) -> float:
        return round(LEFT + (v - self.x0) / (self.x1 - self.x0) * (self.width - LEFT - RIGHT), 1)

    def y(self, v: float) -> float:
        return round(self.height - BOTTOM - (v - self.y0) / (self.y1 - self.y0) * (self.height - TOP - BOTTOM), 1)

    def axes(self, xlabel: str, ylabel: str, xticks: Sequence[tuple[float, str]], yticks: Sequence[float]) -> str:
        out = [(f'<line class="axis" x1="{LEFT}" y1="{self.y(self.y0)}" x2="{self.width - RIGHT}" '
               f'y2="{self.y(self.y0)}" stroke="#555"/>'),
               f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{self.y(self.y0)}" stroke="#555"/>']
        for v, label in xticks:
            x = self.x(v)
            out.append(f'<line x1="{x}" y1="{self.y(self.y0)}" x2="{x}" y2="{self.y(self.y0) + 4}" stroke="#555"/>'
                       f'<text class="tick" x="{x}" y="{self.height - BOTTOM + 15}" text-anchor="middle">'
                       f'{escape(label)}</text>')
        for v in yticks:
            y = self.y(v)
            out.append(f'<line class="grid" x1="{LEFT}" y1="{y}" x2="{self.width - RIGHT}" y2="{y}" stroke="#e4e4e4"/>'
                       f'<text class="tick" x="{LEFT - 6}" y="{y + 4}" text-anchor="end">{v:g}</text>')
        out.append(f'<text class="label" x="{(LEFT + self.width - RIGHT) / 2}" y="{self.height - 4}" '
                   f'text-anchor="middle">{escape(xlabel)}</text>')
        out.append(f'<text class="label" x="12" y="{(TOP + self.height - BOTTOM) / 2}" text-anchor="middle" '
                   f'transform="rotate(-90 12 {(TOP + self.height - BOTTOM) / 2})">{escape(ylabel)}</text>')
        return "".join(out)


def _svg(body: str, title: str, width: int = W, height: int = H) -> str:
    return (f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
            f'width="{width}" height="{height}" role="img" aria-label="{escape(title)}">'
            f"<title>{escape(title)}</title>{body}</svg>")


def _yticks(top: float) -> list[float]:
    step = nice_step(top)
    return [i * step for i in range(int(top // step) + 1)]


def stacked_area(title: str, times: Sequence[float], series: Sequence[tuple[str, str, Sequence[float]]],
                 ylabel: str) -> str:
    """Series (name, colour, values at `times`) stacked bottom-up as step areas (a sample holds
    until the next one); the last sample extends to the right edge."""
    if not times:
        return '<p class="empty">No samples yet: the first one is taken at the next scheduling round.</p>'
    t0, t1 = times[0], max(times[-1], times[0] + 60)
    top = max(sum(s[2][i] for s in series) for i in range(len(times)))
    f = _Frame(t0, t1, 0, max(top * 1.1, 1))
    edges = [*times[1:], t1]
    base = [0.0] * len(times)
    body = []
    for name, colour, values in series:
        upper = [b + v for b, v in zip(base, values, strict=True)]
        pts = []
        for i, t in enumerate(times):
            pts += [(f.x(t), f.y(upper[i])), (f.x(edges[i]), f.y(upper[i]))]
        back = []
        for i in range(len(times) - 1, -1, -1):
            back += [(f.x(edges[i]), f.y(base[i])), (f.x(times[i]), f.y(base[i]))]
        d = " ".join(f"{x},{y}" for x, y in pts + back)
        body.append(f'<polygon class="area" points="{d}" fill="{colour}" fill-opacity="0.85">'
                    f"<title>{escape(name)}: {values[-1]:g} now</title></polygon>")
        base = upper
    span = t1 - t0
    axes = f.axes("time (UTC)", ylabel, [(t, clock(t, span)) for t in _time_ticks(t0, t1)], _yticks(f.y1))
    legend = "".join(f'<rect x="{LEFT + 10 + i * 130}" y="{TOP}" width="10" height="10" fill="{c}"/>'
                     f'<text class="tick" x="{LEFT + 24 + i * 130}" y="{TOP + 9}">{escape(n)}</text>'
                     for i, (n, c, _) in enumerate(series))
    return _svg(axes + "".join(body) + legend, title)


def line_chart(title: str, xs: Sequence[float], ys: Sequence[float], xlabel: str, ylabel: str,
               colour: str = "#c0392b") -> str:
    pts = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(y)]
    if len(pts) < 2:
        return f'<p class="empty">{escape(title)}: not enough reports yet.</p>'
    lo, hi = min(y for _, y in pts), max(y for _, y in pts)
    pad = (hi - lo) * 0.1 or abs(hi) * 0.1 or 1.0
    f = _Frame(pts[0][0], pts[-1][0], max(0.0, lo - pad) if lo >= 0 else lo - pad, hi + pad)
    if not (math.isfinite(f.y1 - f.y0) and math.isfinite(f.x1 - f.x0)):  # a worker's 1e308 and -1e308
        return f'<p class="empty">{escape(title)}: the values reported span more than a chart can show.</p>'
    step = nice_step(f.y1 - f.y0)
    yticks = [round(math.ceil(f.y0 / step) * step + i * step, 10)
              for i in range(int((f.y1 - math.ceil(f.y0 / step) * step) // step) + 1)]
    xstep = nice_step(f.x1 - f.x0)
    xticks = [(math.ceil(f.x0 / xstep) * xstep + i * xstep, f"{math.ceil(f.x0 / xstep) * xstep + i * xstep:g}")
              for i in range(int((f.x1 - math.ceil(f.x0 / xstep) * xstep) // xstep) + 1)]
    d = " ".join(f"{f.x(x)},{f.y(y)}" for x, y in pts)
    body = f'<polyline class="line" points="{d}" fill="none" stroke="{colour}" stroke-width="2"/>'
    return _svg(f.axes(xlabel, ylabel, xticks, yticks) + body, title)


@dataclass(frozen=True)
class GanttRow:
    label: str
    href: str
    state: str  # the colour class: pending, running, done, failed, cancelled (pages.BAR_CLASS)
    start: float  # 0 = not started (and not forecast)
    end: float  # 0 = open (runs on: drawn to `now`)
    forecast_from: float = 0.0  # from here on the bar is a forecast (pale, dashed); 0 = none of it
    band: tuple[float, float] | None = None  # the end's band


def gantt(title: str, rows: Sequence[GanttRow], now: float) -> str:
    rows = [r for r in rows if r.start > 0]
    if not rows:
        return '<p class="empty">No job has started or has a forecast yet.</p>'
    ends = [r.end or now for r in rows] + [r.band[1] for r in rows if r.band]
    t0, t1 = min(r.start for r in rows), max([*ends, now]) + 1
    t1 += (t1 - t0) * 0.03
    row_h, head = 22, 8
    height = TOP + head + len(rows) * row_h + BOTTOM
    left = 150
    scale = (W - RIGHT - left) / (t1 - t0)

    def x(t: float) -> float:
        return round(left + (t - t0) * scale, 1)

    body = []
    for i, r in enumerate(rows):
        y = TOP + head + i * row_h
        end = r.end or now
        split = min(max(r.forecast_from, r.start), end) if r.forecast_from else end
        body.append(f'<a href="{escape(r.href)}"><text class="tick" x="{left - 6}" y="{y + 14}" '
                    f'text-anchor="end">{escape(r.label[:22])}</text></a>')
        tip = f"{escape(r.label)}: {clock(r.start, 86401)} - {clock(end, 86401)}"
        for a, b, cls, what in ((r.start, split, f"bar {r.state}", ""),
                                (split, end, f"bar {r.state} forecast", " (forecast)")):
            if b > a or (a == b and not what and not r.forecast_from):
                body.append(f'<rect class="{cls}" x="{x(a)}" y="{y + 3}" width="{max(2.0, x(b) - x(a))}" '
                            f'height="{row_h - 6}"><title>{tip}{what}</title></rect>')
        if r.band:
            lo, hi = x(r.band[0]), x(r.band[1])
            mid = y + row_h / 2
            body.append(f'<line class="band" x1="{lo}" y1="{mid}" x2="{hi}" y2="{mid}" stroke="#333"/>'
                        f'<line class="band" x1="{lo}" y1="{mid - 5}" x2="{lo}" y2="{mid + 5}" stroke="#333"/>'
                        f'<line class="band" x1="{hi}" y1="{mid - 5}" x2="{hi}" y2="{mid + 5}" stroke="#333"/>')
    base = height - BOTTOM
    span = t1 - t0
    ticks = "".join(f'<line x1="{x(t)}" y1="{TOP}" x2="{x(t)}" y2="{base}" stroke="#e4e4e4"/>'
                    f'<text class="tick" x="{x(t)}" y="{base + 15}" text-anchor="middle">{clock(t, span)}</text>'
                    for t in _time_ticks(t0, t1))
    now_line = (f'<line class="now" x1="{x(now)}" y1="{TOP}" x2="{x(now)}" y2="{base}" stroke="#d35400" '
                f'stroke-dasharray="4 3"/><text class="tick" x="{x(now)}" y="{TOP + 6}" text-anchor="middle">now</text>')
    label = (f'<text class="label" x="{(left + W - RIGHT) / 2}" y="{height - 4}" text-anchor="middle">'
             f"time (UTC); pale, dashed: forecast</text>")
    return _svg(ticks + "".join(body) + now_line + label, title, W, height)
