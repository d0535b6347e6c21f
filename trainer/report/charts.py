"""The report's charts: self-contained SVG line charts (`line_chart_svg`), no script, no external asset."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Point = tuple[float, float]
Series = list[Point]


# ---------------------------------------------------------------------------------------------- SVG


@dataclass(frozen=True)
class Trace:
    """One series of a chart: a line, a step function (each value holds until the next point) or dots."""

    label: str
    points: Sequence[Point]
    color: str
    dashed: bool = False
    shape: Literal["line", "step", "markers"] = "line"


@dataclass(frozen=True)
class Band:
    """A shaded horizontal band between `low` and `high` over x in [x0, x1]."""

    x0: float
    x1: float
    low: float
    high: float


# Okabe–Ito: distinguishable under the common colour-vision deficiencies.
BLUE, ORANGE, GREEN, VERMILION, PURPLE = "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7"
GREY = "#6B7280"
BAND_FILL = "#009E73"

_MAX_PLOTTED_POINTS = 1200  # per trace; longer series are thinned to per-bucket min and max


@dataclass(frozen=True)
class _Scale:
    left: float
    top: float
    plot_w: float
    plot_h: float
    x0: float
    x1: float
    y_lo: float
    y_hi: float

    def px(self, x: float) -> float:
        return round(self.left + (x - self.x0) / (self.x1 - self.x0) * self.plot_w, 1)

    def py(self, y: float) -> float:
        return round(self.top + (self.y_hi - y) / (self.y_hi - self.y_lo) * self.plot_h, 1)


def _nice_step(span: float, target_ticks: int) -> float:
    """The 1-2-2.5-5 × 10^e tick spacing that gives about target_ticks intervals over span (> 0)."""
    raw = span / target_ticks
    magnitude = 10.0 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * magnitude >= raw * (1 - 1e-9))


def _decimals(step: float) -> int:
    exponent = math.floor(math.log10(step) + 1e-9)
    mantissa = round(step / 10.0**exponent, 6)
    return max(0, -exponent + (1 if mantissa == 2.5 else 0))


def _ticks(lo: float, hi: float, step: float) -> list[tuple[float, str]]:
    """The multiples of step in [lo, hi] with labels, in thousands ("5k") when the axis reaches 10 000."""
    scale, suffix = (1000.0, "k") if max(abs(lo), abs(hi)) >= 10_000 else (1.0, "")
    decimals = _decimals(step / scale)
    ticks = []
    for i in range(math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9) + 1):
        text = f"{i * step / scale:.{decimals}f}"
        ticks.append((i * step, "0" if float(text) == 0 else text + suffix))
    return ticks


def _thin(points: Sequence[Point], limit: int = _MAX_PLOTTED_POINTS) -> Sequence[Point]:
    """At most about `limit` points, keeping each bucket's extremes so that spikes survive."""
    if len(points) <= limit:
        return points
    buckets = limit // 2
    size = len(points) / buckets
    kept: list[Point] = []
    for b in range(buckets):
        chunk = points[int(b * size) : int((b + 1) * size)]
        if chunk:
            kept.extend(sorted({min(chunk, key=lambda p: p[1]), max(chunk, key=lambda p: p[1])}))
    return kept


def _legend_width(label: str) -> float:
    return 30 + 6.8 * len(label) + 22


def _legend_svg(
    traces: Sequence[Trace], band_label: str | None, left: float, width: float
) -> tuple[str, float]:
    """The legend rows above the plot, and their height."""
    entries: list[tuple[str, str, str]] = [("band", BAND_FILL, band_label)] if band_label else []
    for t in traces:
        kind: str = "dash" if t.dashed else t.shape
        entries.append((kind, t.color, t.label) if t.points else (kind, "#C0C4CC", f"{t.label} (no data)"))
    if not entries:
        return "", 0.0
    out: list[str] = []
    x, y = left, 16.0
    for kind, color, label in entries:
        if x > left and x + _legend_width(label) > width:
            x, y = left, y + 22
        if kind == "band":
            out.append(
                f'<rect x="{x}" y="{y - 6}" width="22" height="12" fill="{BAND_FILL}" fill-opacity="0.18" '
                f'stroke="{BAND_FILL}" stroke-opacity="0.5"/>'
            )
        elif kind == "markers":
            out.append(f'<circle cx="{x + 11}" cy="{y}" r="4.5" fill="{color}"/>')
        else:
            dash = ' stroke-dasharray="6 4"' if kind == "dash" else ""
            out.append(
                f'<line x1="{x}" y1="{y}" x2="{x + 22}" y2="{y}" stroke="{color}" stroke-width="2.5"{dash}/>'
            )
        out.append(f'<text x="{x + 30}" y="{y + 4}" fill="#374151">{html.escape(label)}</text>')
        x += _legend_width(label)
    return "".join(out), y + 12


def _scale(
    traces: Sequence[Trace],
    bands: Sequence[Band],
    y_floor: float | None,
    x_range: tuple[float, float] | None,
    box: tuple[float, float, float, float],
) -> tuple[_Scale, float, float]:
    """The data-to-pixel mapping (y snapped to ticks) and the x and y tick spacings."""
    xs = [p[0] for t in traces for p in t.points] + list(x_range or ())
    ys = [p[1] for t in traces for p in t.points]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    y_lo, y_hi = min([*ys, *(b.low for b in bands)]), max([*ys, *(b.high for b in bands)])
    if y_floor is not None and y_floor <= y_lo:
        y_lo = y_floor
    if y_hi == y_lo:
        pad = max(abs(y_hi) * 0.1, 0.5)
        y_hi += pad
        if y_floor is None or y_lo - pad >= y_floor:
            y_lo -= pad
    y_step = _nice_step(y_hi - y_lo, 5)
    y_lo = math.floor(y_lo / y_step + 1e-9) * y_step
    y_hi = math.ceil(y_hi / y_step - 1e-9) * y_step
    x_step = _nice_step(x1 - x0, 8)
    if x1 - x0 >= 1:
        x_step = max(1.0, x_step)  # steps are integers: no tick between two of them
    return _Scale(*box, x0, x1, y_lo, y_hi), x_step, y_step


def _axes_svg(sc: _Scale, x_step: float, y_step: float, x_label: str, y_label: str, height: float) -> str:
    bottom, right = sc.top + sc.plot_h, sc.left + sc.plot_w
    out = [f'<rect x="{sc.left}" y="{sc.top}" width="{sc.plot_w}" height="{sc.plot_h}" fill="#FCFCFD"/>']
    for v, label in _ticks(sc.y_lo, sc.y_hi, y_step):
        y = sc.py(v)
        out.append(f'<line x1="{sc.left}" y1="{y}" x2="{right}" y2="{y}" stroke="#E9ECF1"/>')
        out.append(f'<line x1="{sc.left - 5}" y1="{y}" x2="{sc.left}" y2="{y}" stroke="#6B7280"/>')
        out.append(f'<text x="{sc.left - 8}" y="{y + 4}" text-anchor="end" fill="#4B5563">{label}</text>')
    for v, label in _ticks(sc.x0, sc.x1, x_step):
        x = sc.px(v)
        out.append(f'<line x1="{x}" y1="{sc.top}" x2="{x}" y2="{bottom}" stroke="#F1F3F6"/>')
        out.append(f'<line x1="{x}" y1="{bottom}" x2="{x}" y2="{bottom + 5}" stroke="#6B7280"/>')
        out.append(f'<text x="{x}" y="{bottom + 18}" text-anchor="middle" fill="#4B5563">{label}</text>')
    out.append(f'<path d="M{sc.left} {sc.top}V{bottom}H{right}" fill="none" stroke="#6B7280"/>')
    out.append(
        f'<text x="{sc.left + sc.plot_w / 2}" y="{height - 8}" text-anchor="middle" fill="#374151" '
        f'font-weight="600">{html.escape(x_label)}</text>'
    )
    cy = sc.top + sc.plot_h / 2
    out.append(
        f'<text x="18" y="{cy}" text-anchor="middle" fill="#374151" font-weight="600" '
        f'transform="rotate(-90 18 {cy})">{html.escape(y_label)}</text>'
    )
    return "".join(out)


def _bands_svg(sc: _Scale, bands: Sequence[Band], label: str) -> str:
    out: list[str] = []
    for b in bands:
        x_a, x_b = sc.px(max(b.x0, sc.x0)), sc.px(min(b.x1, sc.x1))
        y_a, y_b = sc.py(min(b.high, sc.y_hi)), sc.py(max(b.low, sc.y_lo))
        if x_b <= x_a:
            continue
        out.append(
            f'<rect class="band" x="{x_a}" y="{y_a}" width="{round(x_b - x_a, 1)}" '
            f'height="{round(max(y_b - y_a, 0.5), 1)}" fill="{BAND_FILL}" fill-opacity="0.13">'
            f"<title>{html.escape(label)} [{b.low:g}, {b.high:g}]</title></rect>"
        )
        for edge in (y_a, y_b):
            out.append(
                f'<line x1="{x_a}" y1="{edge}" x2="{x_b}" y2="{edge}" stroke="{BAND_FILL}" '
                f'stroke-opacity="0.5" stroke-dasharray="2 3"/>'
            )
    return "".join(out)


def _trace_svg(sc: _Scale, t: Trace) -> str:
    points = _thin(sorted(t.points))
    label = html.escape(t.label)
    dash = ' stroke-dasharray="7 5"' if t.dashed else ""
    out: list[str] = []
    if len(points) > 1:
        if t.shape == "step":
            d = f"M{sc.px(points[0][0])} {sc.py(points[0][1])}" + "".join(
                f"H{sc.px(x)}V{sc.py(y)}" for x, y in points[1:]
            )
            base = sc.py(max(sc.y_lo, 0.0))
            area = f"{d}V{base}H{sc.px(points[0][0])}Z"
            out.append(f'<path d="{area}" fill="{t.color}" fill-opacity="0.12" stroke="none"/>')
            out.append(f'<path d="{d}" fill="none" stroke="{t.color}" stroke-width="2"{dash}>')
        else:
            coords = " ".join(f"{sc.px(x)},{sc.py(y)}" for x, y in points)
            style = ' stroke-opacity="0.5" stroke-dasharray="2 4"' if t.shape == "markers" else dash
            width = 1.5 if t.shape == "markers" or len(points) > 300 else 2
            out.append(
                f'<polyline points="{coords}" fill="none" stroke="{t.color}" stroke-width="{width}" '
                f'stroke-linejoin="round"{style}>'
            )
        out.append(f"<title>{label}</title>{'</path>' if t.shape == 'step' else '</polyline>'}")
    if t.shape == "markers" or len(points) == 1:
        for x, y in points:
            out.append(
                f'<circle cx="{sc.px(x)}" cy="{sc.py(y)}" r="4.5" fill="{t.color}" stroke="#fff" '
                f'stroke-width="1.5"><title>{label}, step {x:g}: {y:.4g}</title></circle>'
            )
    return "".join(out)


def line_chart_svg(
    traces: Sequence[Trace],
    *,
    title: str,
    y_label: str,
    x_label: str = "step",
    bands: Sequence[Band] = (),
    band_label: str = "band",
    y_floor: float | None = None,
    x_range: tuple[float, float] | None = None,
    width: int = 960,
    height: int = 300,
) -> str:
    """An inline SVG line chart: axes with ticks and labels, a legend, shaded bands, no script.

    With no point in any trace it draws an empty frame saying "no data" (and no legend); a trace with one
    point is drawn as a marker; a trace with no point is listed in the legend as "(no data)". `y_floor`
    pins the bottom of the y axis (0 for fractions) when no value lies below it; `x_range` is the least
    x extent (the charts of one page share it so that their steps line up).
    """
    plotted = [t for t in traces if t.points]
    # Without any point the legend would only repeat "no data": the frame says it once.
    legend, legend_h = (
        _legend_svg(traces, band_label if bands else None, 70, width - 20) if plotted else ("", 0.0)
    )
    box = (70.0, legend_h + 12, width - 70.0 - 22, height - legend_h - 12 - 50)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{html.escape(title)}" class="chart" font-size="12">',
        f"<title>{html.escape(title)}</title>",
        legend,
    ]
    if not plotted:
        left, top, plot_w, plot_h = box
        out.append(
            f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#FAFAFB" '
            f'stroke="#E5E7EB" stroke-dasharray="4 4"/><text class="no-data" x="{left + plot_w / 2}" '
            f'y="{top + plot_h / 2 + 6}" text-anchor="middle" fill="#9CA3AF" font-size="16">no data</text>'
            "</svg>"
        )
        return "".join(out)
    sc, x_step, y_step = _scale(plotted, bands, y_floor, x_range, box)
    out.append(_axes_svg(sc, x_step, y_step, x_label, y_label, height))
    out.append(_bands_svg(sc, bands, band_label))
    out.extend(_trace_svg(sc, t) for t in sorted(plotted, key=lambda t: t.shape == "markers"))  # dots on top
    out.append("</svg>")
    return "".join(out)
