"""Line charts as SVG text, for the plots of docs/performance.md: no dependency, and the
same figures give the same bytes (the page's test compares them with the committed files).

:func:`line_chart` draws one panel: a logarithmic x axis (rows M, say), a linear or
logarithmic y axis, one line of markers per series, a legend on the right.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from xml.sax.saxutils import escape

#: Series colours, in order (the Okabe-Ito palette, distinct in colour-blind vision).
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")

_W, _H = 680, 400  # the image
_L, _R, _T, _B = 64, 170, 36, 48  # margins: left (y labels), right (legend), top, bottom


def _number(v: float) -> str:
    """A tick label: three significant digits, no trailing zeros (``1``, ``2.5``, ``1e+03``
    only from 10**6 up)."""
    return f"{v:.3g}" if abs(v) >= 1e6 or v == 0 else f"{v:.3g}".rstrip("0").rstrip(".")


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    """Tick values covering [lo, hi]: powers of 2 (log) or about five round steps."""
    if log:
        a, b = math.floor(math.log2(lo)), math.ceil(math.log2(hi))
        step = max(1, math.ceil((b - a) / 8))
        return [2.0**e for e in range(a, b + 1, step)]
    if hi == lo:
        hi = lo + 1
    raw = (hi - lo) / 5
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    return [first + i * step for i in range(int(math.ceil((hi - first) / step)) + 1)]


def line_chart(
    title: str,
    x_label: str,
    y_label: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    log_y: bool = False,
) -> str:
    """An SVG document: ``series`` (name -> (x, y) points, x > 0, plotted on a log2 x
    axis; y >= 0, or > 0 with ``log_y``) as lines with markers, in :data:`COLOURS` order.
    Past the eighth series the colours repeat with dashed lines. Raises ValueError for no
    points, more than twice as many series as colours, or a point the axes cannot show."""
    points = [p for pts in series.values() for p in pts]
    if not points:
        raise ValueError(f"line_chart {title!r}: no points to draw")
    if len(series) > 2 * len(COLOURS):
        raise ValueError(f"line_chart {title!r}: {len(series)} series, at most {2 * len(COLOURS)}")
    if any(x <= 0 or y < 0 or (log_y and y <= 0) for x, y in points):
        raise ValueError(f"line_chart {title!r}: x must be > 0 and y >= 0 (> 0 on a log axis)")
    xs = _ticks(min(x for x, _ in points), max(x for x, _ in points), log=True)
    ys_lo = min(y for _, y in points) if log_y else 0.0
    ys = _ticks(ys_lo, max(y for _, y in points), log=log_y)
    x0, x1 = math.log2(xs[0]), math.log2(xs[-1])
    y0, y1 = (math.log2(ys[0]), math.log2(ys[-1])) if log_y else (ys[0], ys[-1])
    pw, ph = _W - _L - _R, _H - _T - _B

    def px(x: float) -> float:
        return _L + (0.5 if x1 == x0 else (math.log2(x) - x0) / (x1 - x0)) * pw

    def py(y: float) -> float:
        v = math.log2(y) if log_y else y
        return _T + ph - (0.5 if y1 == y0 else (v - y0) / (y1 - y0)) * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'viewBox="0 0 {_W} {_H}" font-family="sans-serif" font-size="12">',
        f'<rect width="{_W}" height="{_H}" fill="white"/>',
        f'<text x="{_W / 2:.1f}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>',
    ]
    for t in ys:
        y = py(t)
        out.append(f'<line x1="{_L}" y1="{y:.1f}" x2="{_L + pw}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{_L - 6}" y="{y + 4:.1f}" text-anchor="end">{_number(t)}</text>')
    for t in xs:
        x = px(t)
        out.append(f'<line x1="{x:.1f}" y1="{_T}" x2="{x:.1f}" y2="{_T + ph}" stroke="#eee"/>')
        out.append(f'<text x="{x:.1f}" y="{_T + ph + 16}" text-anchor="middle">{_number(t)}</text>')
    out.append(f'<rect x="{_L}" y="{_T}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
    out.append(
        f'<text x="{_L + pw / 2:.1f}" y="{_H - 10}" text-anchor="middle">{escape(x_label)}</text>'
    )
    out.append(
        f'<text transform="translate(16 {_T + ph / 2:.1f}) rotate(-90)" '
        f'text-anchor="middle">{escape(y_label)}</text>'
    )
    for i, (name, pts) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        dash = ' stroke-dasharray="6 3"' if i >= len(COLOURS) else ""
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in sorted(pts))
        out.append(
            f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>'
        )
        out += [
            f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>'
            for x, y in sorted(pts)
        ]
        ly = _T + 10 + 18 * i
        out.append(
            f'<line x1="{_W - _R + 12}" y1="{ly}" x2="{_W - _R + 32}" y2="{ly}" '
            f'stroke="{colour}" stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{_W - _R + 38}" y="{ly + 4}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
