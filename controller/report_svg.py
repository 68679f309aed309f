"""The report's charts: inline SVG bar and line charts (pure functions: numbers in, SVG text out).

Legends sit below the plot area (one row per series), never over the data; a k axis gets whole-number ticks.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")

W, H, PAD_L, PAD_B, PAD_T, PAD_R = 420, 220, 56, 34, 22, 12


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _num(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".") if abs(x) < 1e6 else f"{x:.3g}"


def _integer_ticks(top: float, most: int = 8) -> tuple[float, int]:
    """(axis top, tick count) for whole-number ticks (k): every 1, 2, ... so that at most ``most`` are drawn."""
    top_int = max(1, math.ceil(top))
    every = max(1, math.ceil(top_int / most))
    top_int = every * math.ceil(top_int / every)
    return float(top_int), top_int // every


def _axes(title: str, x_label: str, y_label: str, y_max: float, y_ticks: int = 4, y_fmt=_num,
          height: int = H) -> list[str]:
    out = [(f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height}" width="{W}" height="{height}" '
            'role="img">'),
           f"<title>{esc(title)}</title>",
           f'<text x="{W / 2}" y="14" text-anchor="middle" class="t">{esc(title)}</text>',
           f'<line x1="{PAD_L}" y1="{H - PAD_B}" x2="{W - PAD_R}" y2="{H - PAD_B}" class="ax"/>',
           f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{H - PAD_B}" class="ax"/>',
           f'<text x="{(PAD_L + W - PAD_R) / 2}" y="{H - 4}" text-anchor="middle" class="l">{esc(x_label)}</text>',
           (f'<text x="10" y="{(PAD_T + H - PAD_B) / 2}" text-anchor="middle" class="l" '
            f'transform="rotate(-90 10 {(PAD_T + H - PAD_B) / 2})">{esc(y_label)}</text>')]
    for i in range(y_ticks + 1):
        v = y_max * i / y_ticks
        y = _y(v, y_max)
        out.append(f'<line x1="{PAD_L - 3}" y1="{y:.1f}" x2="{W - PAD_R}" y2="{y:.1f}" class="g"/>')
        out.append(f'<text x="{PAD_L - 5}" y="{y + 3:.1f}" text-anchor="end" class="n">{esc(y_fmt(v))}</text>')
    return out


def _y(v: float, y_max: float) -> float:
    return H - PAD_B - (v / y_max if y_max > 0 else 0.0) * (H - PAD_B - PAD_T)


def _x(v: float, x_min: float, x_max: float) -> float:
    span = (x_max - x_min) or 1.0
    return PAD_L + (v - x_min) / span * (W - PAD_L - PAD_R)


def bar_chart(title: str, labels: Sequence[str], values: Sequence[float], *, x_label: str, y_label: str,
              y_max: float | None = None, errors: Sequence[tuple[float, float]] | None = None,
              percent: bool = False, marker: tuple[float, str] | None = None) -> str:
    """Vertical bars; ``errors`` (low, high) whiskers; ``marker`` (x in label units from 0, text): a line."""
    top = y_max if y_max is not None else max([*values, 1e-9]) * 1.15
    fmt = (lambda v: f"{v * 100:.0f}%") if percent else _num
    out = _axes(title, x_label, y_label, top, y_fmt=fmt)
    n = max(len(values), 1)
    slot = (W - PAD_L - PAD_R) / n
    for i, (label, v) in enumerate(zip(labels, values)):
        x = PAD_L + i * slot + slot * 0.15
        y = _y(v, top)
        out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{slot * 0.7:.1f}" height="{H - PAD_B - y:.1f}" '
                   f'class="b"><title>{esc(label)}: {esc(fmt(v))}</title></rect>')
        out.append(f'<text x="{x + slot * 0.35:.1f}" y="{H - PAD_B + 12}" text-anchor="middle" class="n">'
                   f"{esc(label)}</text>")
        if errors is not None and i < len(errors):
            lo, hi = errors[i]
            cx = x + slot * 0.35
            out.append(f'<line x1="{cx:.1f}" y1="{_y(lo, top):.1f}" x2="{cx:.1f}" y2="{_y(hi, top):.1f}" class="e"/>')
    if marker is not None:
        pos, text = marker
        mx = PAD_L + pos * slot
        out.append(f'<line x1="{mx:.1f}" y1="{PAD_T}" x2="{mx:.1f}" y2="{H - PAD_B}" class="m"/>')
        out.append(f'<text x="{mx + 3:.1f}" y="{PAD_T + 10}" class="n">{esc(text)}</text>')
    out.append("</svg>")
    return "\n".join(out)


LEGEND_ROW = 12


def line_chart(title: str, series: Mapping[str, Sequence[tuple[float, float]]], *, x_label: str, y_label: str,
               step: bool = False, y_max: float | None = None, notes: Mapping[str, str] | None = None,
               integer_y: bool = False) -> str:
    """One polyline per series (``step``: held until the next point); the legend below the plot area, one row
    per series (never over the lines); ``integer_y``: whole-number ticks (k)."""
    points = [p for pts in series.values() for p in pts]
    if not points:
        return f"<p class=\"empty\">{esc(title)}: no data</p>"
    x_min = min(p[0] for p in points)
    x_max = max(p[0] for p in points)
    top = y_max if y_max is not None else max(max(p[1] for p in points) * 1.15, 1e-9)
    ticks = 4
    if integer_y:
        top, ticks = _integer_ticks(max(p[1] for p in points) if y_max is None else y_max)
    legend = len(series) > 1 or bool(notes)
    height = H + (LEGEND_ROW * len(series) + 4 if legend else 0)
    out = _axes(title, x_label, y_label, top, y_ticks=ticks, height=height)
    out.append(f'<text x="{PAD_L}" y="{H - PAD_B + 12}" class="n">{esc(_num(x_min))}</text>')
    out.append(f'<text x="{W - PAD_R}" y="{H - PAD_B + 12}" text-anchor="end" class="n">{esc(_num(x_max))}</text>')
    for i, (name, pts) in enumerate(series.items()):
        colour = PALETTE[i % len(PALETTE)]
        coords: list[str] = []
        last_y = None
        for x, y in sorted(pts):
            px, py = _x(x, x_min, x_max), _y(y, top)
            if step and last_y is not None:
                coords.append(f"{px:.1f},{last_y:.1f}")
            coords.append(f"{px:.1f},{py:.1f}")
            last_y = py
        if len(coords) == 1:
            cx, cy = coords[0].split(",")
            out.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="{colour}"/>')
        else:
            out.append(f'<polyline points="{" ".join(coords)}" fill="none" stroke="{colour}" stroke-width="1.6">'
                       f"<title>{esc(name)}</title></polyline>")
        if legend:
            label = name + (f" ({notes[name]})" if notes and name in notes else "")
            y = H + 2 + LEGEND_ROW * (i + 1)
            out.append(f'<line x1="{PAD_L}" y1="{y - 3}" x2="{PAD_L + 14}" y2="{y - 3}" stroke="{colour}" '
                       f'stroke-width="2"/><text x="{PAD_L + 18}" y="{y}" class="n" fill="{colour}">{esc(label)}</text>')
    out.append("</svg>")
    return "\n".join(out)
