"""A session's validation report: JSON and one self-contained HTML page.

The HTML holds, per check: its seed, examples, max ulps, the largest err/bound, a plot
as inline SVG (for a bounded contract a histogram of the per-example err/bound; for an
exact one, which has no err/bound, a bar plot of passed and failed examples), and the
reproducer of any failure. No script, no
external asset: it reads the same without a network.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from typing import Any

from emulate.testing.harness import CheckResult

__all__ = ["histogram_svg", "outcomes_svg", "render_html", "render_json"]

_BINS = 10


def histogram_svg(ratios: Sequence[float], *, width: int = 330, height: int = 110) -> str:
    """An inline SVG histogram of err/bound values: 10 bins over ``[0, 1]`` and an 11th,
    red, for values past 1 (failures); each bar's count is written above it."""
    counts = [0] * (_BINS + 1)
    for r in ratios:
        i = _BINS if (math.isinf(r) or r > 1) else min(int(r * _BINS), _BINS - 1)
        counts[i] += 1
    top = max(counts) or 1
    bw = width / (_BINS + 1)
    base = height - 28
    parts = []
    for i, c in enumerate(counts):
        h = (base - 14) * c / top
        colour = "#c0392b" if i == _BINS else "#2e86c1"
        x = i * bw
        parts.append(
            f'<rect x="{x + 1:.1f}" y="{base - h:.1f}" width="{bw - 2:.1f}" height="{h:.1f}" '
            f'fill="{colour}"><title>{c}</title></rect>'
        )
        if c:
            parts.append(
                f'<text x="{x + bw / 2:.1f}" y="{base - h - 3:.1f}" font-size="10" '
                f'text-anchor="middle">{c}</text>'
            )
    parts.append(f'<line x1="0" y1="{base}" x2="{width}" y2="{base}" stroke="#888"/>')
    for label, x in (("0", 0.0), ("0.5", 5 * bw), ("1", _BINS * bw), (">1", _BINS * bw + bw / 2)):
        anchor = "start" if x == 0 else "middle"
        parts.append(
            f'<text x="{x:.1f}" y="{base + 12}" font-size="10" text-anchor="{anchor}">'
            f"{html.escape(label)}</text>"
        )
    parts.append(
        f'<text x="{width / 2:.1f}" y="{height - 2}" font-size="11" text-anchor="middle">'
        "err/bound per example</text>"
    )
    return (
        f'<svg class="hist" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" role="img" aria-label="histogram of err/bound">'
        + "".join(parts)
        + "</svg>"
    )


def outcomes_svg(passed: int, failed: int, *, width: int = 330, height: int = 110) -> str:
    """An inline SVG bar plot of an exact check's examples: passed (green) and failed
    (red), each bar's count written above it.

    Raises:
      ValueError: a negative count.
    """
    if passed < 0 or failed < 0:
        raise ValueError(f"passed, failed: expected counts >= 0, got {passed}, {failed}")
    top = max(passed, failed, 1)
    base, bw = height - 28, width / 4
    parts = []
    for i, (label, count, colour) in enumerate(
        (("passed", passed, "#1e8449"), ("failed", failed, "#c0392b"))
    ):
        h = (base - 14) * count / top
        x = bw / 2 + i * 2 * bw
        parts.append(
            f'<rect x="{x:.1f}" y="{base - h:.1f}" width="{bw:.1f}" height="{h:.1f}" '
            f'fill="{colour}"><title>{label}: {count}</title></rect>'
            f'<text x="{x + bw / 2:.1f}" y="{base - h - 3:.1f}" font-size="10" '
            f'text-anchor="middle">{count}</text>'
            f'<text x="{x + bw / 2:.1f}" y="{base + 12}" font-size="10" '
            f'text-anchor="middle">{label}</text>'
        )
    parts.append(f'<line x1="0" y1="{base}" x2="{width}" y2="{base}" stroke="#888"/>')
    parts.append(
        f'<text x="{width / 2:.1f}" y="{height - 2}" font-size="11" text-anchor="middle">'
        "examples (exact: bit for bit)</text>"
    )
    return (
        f'<svg class="outcomes" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" role="img" aria-label="passed and failed examples">'
        + "".join(parts)
        + "</svg>"
    )


def _plot(r: CheckResult) -> str:
    """The histogram of err/bound for a bounded check, the passed/failed bars for an
    exact one (no err/bound)."""
    if r.contract == "exact" or not r.ratios:
        failed = 0 if r.ok else 1
        return outcomes_svg(max(r.examples - failed, 0), failed)
    return histogram_svg(r.ratios)


def render_json(entries: Sequence[tuple[str, CheckResult]]) -> str:
    """The entries ``(test id, result)`` as JSON: ``{"checks": [...]}``."""
    checks = [{"test": t, **r.to_json()} for t, r in entries]
    return json.dumps({"checks": checks}, indent=1) + "\n"


def _cell(v: Any) -> str:
    return html.escape("-" if v is None else str(v))


def render_html(entries: Sequence[tuple[str, CheckResult]], *, title: str = "emulate") -> str:
    """One HTML page for the entries ``(test id, result)``: a summary table, then a
    section per check with its plot (:func:`histogram_svg` or :func:`outcomes_svg`) and,
    for a failure, its report and reproducer."""
    failed = sum(not r.ok for _, r in entries)
    rows, sections = [], []
    for i, (test, r) in enumerate(entries):
        worst = max(r.ratios) if r.ratios else None
        status = "ok" if r.ok else "FAILED"
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{_cell(v)}</td>"
                for v in (
                    test,
                    r.lhs,
                    r.rhs,
                    r.contract,
                    r.target,
                    r.seed,
                    r.examples,
                    "inf" if math.isinf(r.max_ulps) else f"{r.max_ulps:g}",
                    None if worst is None else f"{worst:.3g}",
                )
            )
            + f'<td class="{status.lower()}"><a href="#c{i}">{status}</a></td></tr>'
        )
        body = [f'<section id="c{i}"><h2>{html.escape(test)}</h2>']
        body.append(f"<p>{html.escape(r.name)}: {r.examples} examples, seed {r.seed}</p>")
        body.append(_plot(r))
        if not r.ok:
            body.append(f"<pre class=failure>{html.escape(r.failure or '')}</pre>")
            body.append(f"<pre class=repro>{html.escape(r.reproducer or '')}</pre>")
        body.append("</section>")
        sections.append("".join(body))
    head = (
        "<tr>"
        + "".join(
            f"<th>{h}</th>"
            for h in (
                "test",
                "lhs",
                "rhs",
                "contract",
                "target",
                "seed",
                "examples",
                "max ulps",
                "err/bound",
                "status",
            )
        )
        + "</tr>"
    )
    style = (
        "body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;font-size:14px}"
        ".failed{color:#c0392b;font-weight:bold}.ok{color:#1e8449}"
        "pre{background:#f6f6f6;padding:8px;white-space:pre-wrap;font-size:12px}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset=utf-8><title>{html.escape(title)} "
        f"validation report</title><style>{style}</style></head><body>"
        f"<h1>{html.escape(title)} validation report</h1>"
        f"<p>{len(entries)} checks, {failed} failed</p>"
        f"<table>{head}{''.join(rows)}</table>{''.join(sections)}</body></html>\n"
    )
