"""A session's validation report: JSON and one self-contained HTML page.

Every test has a status (:data:`STATUSES`: pytest's outcome, expected failures told
apart), whether or not it called :func:`emulate.testing.check_function`. The HTML holds,
per check: its seed, examples, max ulps, the largest err/bound, a plot as inline SVG (for
a bounded contract a histogram of the per-example err/bound; for an exact one, which has
no err/bound, a bar plot of passed and failed examples), and the reproducer of any
failure. No script, no external asset: it reads the same without a network.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from typing import Any

from emulate.testing.harness import CheckResult

__all__ = ["STATUSES", "histogram_svg", "outcomes_svg", "render_html", "render_json"]

_BINS = 10

#: A test's status: pytest's outcome, with expected failures (``pytest.mark.xfail``) told
#: apart: "xfailed" (failed as expected), "xpassed" (passed though expected to fail).
STATUSES = ("passed", "failed", "xfailed", "xpassed", "skipped")

Entries = Sequence[tuple[str, CheckResult]]
Tests = Sequence[tuple[str, str]]


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


def _test_rows(entries: Entries, tests: Tests | None) -> dict[str, tuple[str, int]]:
    """Test id -> (status, number of checks): the ``tests`` given, in their order, then
    the tests of ``entries`` not among them ("failed" if one of their checks failed, else
    "passed").

    Raises:
      ValueError: a status not in :data:`STATUSES`.
    """
    counts: dict[str, int] = {}
    failed: set[str] = set()
    for t, r in entries:
        counts[t] = counts.get(t, 0) + 1
        if not r.ok:
            failed.add(t)
    rows = {}
    for t, status in tests or ():
        if status not in STATUSES:
            raise ValueError(f"tests: status of {t!r}: expected one of {STATUSES}, got {status!r}")
        rows[t] = (status, counts.get(t, 0))
    for t, n in counts.items():
        rows.setdefault(t, ("failed" if t in failed else "passed", n))
    return rows


def render_json(entries: Entries, tests: Tests | None = None) -> str:
    """The entries ``(test id, result)`` and the tests ``(test id, status)`` as JSON:
    ``{"tests": [{"test", "status", "checks"}], "checks": [{"test", "status", ...}]}``,
    every check with its test's status (a test of ``entries`` not in ``tests``: "failed"
    if one of its checks failed, else "passed")."""
    rows = _test_rows(entries, tests)
    listed = [{"test": t, "status": s, "checks": n} for t, (s, n) in rows.items()]
    checks = [{"test": t, "status": rows[t][0], **r.to_json()} for t, r in entries]
    return json.dumps({"tests": listed, "checks": checks}, indent=1) + "\n"


def _cell(v: Any) -> str:
    return html.escape("-" if v is None else str(v))


def _summary(entries: Entries, rows: dict[str, tuple[str, int]]) -> str:
    """ "N checks, F failed" (checks of expected failures counted apart), then the tests
    per status."""
    expected = sum(not r.ok and rows[t][0] == "xfailed" for t, r in entries)
    failed = sum(not r.ok for _, r in entries) - expected
    words = f"{len(entries)} checks, {failed} failed"
    if expected:
        words += f", {expected} failed as expected (xfail)"
    per = [f"{sum(s == k for s, _ in rows.values())} {k}" for k in STATUSES]
    return f"<p>{html.escape(words)}</p><p>{len(rows)} tests: {', '.join(per)}</p>"


def _check_row(i: int, test: str, r: CheckResult, status: str) -> str:
    worst = max(r.ratios) if r.ratios else None
    verdict = "ok" if r.ok else "FAILED"
    cells = (
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
    return (
        "<tr>"
        + "".join(f"<td>{_cell(v)}</td>" for v in cells)
        + f'<td class="{verdict.lower()}"><a href="#c{i}">{verdict}</a></td>'
        + f'<td class="{status}">{status}</td></tr>'
    )


def render_html(entries: Entries, *, title: str = "emulate", tests: Tests | None = None) -> str:
    """One HTML page for the entries ``(test id, result)`` and the tests ``(test id,
    status)``: a summary, a table with a row per check (its verdict, ok or FAILED, and its
    test's status) and per test without checks, then a section per check with its plot
    (:func:`histogram_svg` or :func:`outcomes_svg`) and, for a failure, its report and
    reproducer."""
    rows = _test_rows(entries, tests)
    table, sections = [], []
    for i, (test, r) in enumerate(entries):
        table.append(_check_row(i, test, r, rows[test][0]))
        body = [f'<section id="c{i}"><h2>{html.escape(test)}</h2>']
        body.append(f"<p>{html.escape(r.name)}: {r.examples} examples, seed {r.seed}</p>")
        body.append(_plot(r))
        if not r.ok:
            body.append(f"<pre class=failure>{html.escape(r.failure or '')}</pre>")
            body.append(f"<pre class=repro>{html.escape(r.reproducer or '')}</pre>")
        body.append("</section>")
        sections.append("".join(body))
    for test, (status, n) in rows.items():
        if not n:  # a test that checked without check_function (pallas.check, asserts)
            blank = "".join("<td>-</td>" for _ in range(8))
            table.append(
                f"<tr><td>{_cell(test)}</td>{blank}<td>no check_function</td>"
                f'<td class="{status}">{status}</td></tr>'
            )
    columns = (
        "test",
        "lhs",
        "rhs",
        "contract",
        "target",
        "seed",
        "examples",
        "max ulps",
        "err/bound",
        "check",
        "status",
    )
    head = "<tr>" + "".join(f"<th>{h}</th>" for h in columns) + "</tr>"
    style = (
        "body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;font-size:14px}"
        ".failed{color:#c0392b;font-weight:bold}.ok,.passed{color:#1e8449}"
        ".xfailed,.skipped{color:#7f8c8d}.xpassed{color:#b9770e;font-weight:bold}"
        "pre{background:#f6f6f6;padding:8px;white-space:pre-wrap;font-size:12px}"
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset=utf-8><title>{html.escape(title)} "
        f"validation report</title><style>{style}</style></head><body>"
        f"<h1>{html.escape(title)} validation report</h1>{_summary(entries, rows)}"
        f"<table>{head}{''.join(table)}</table>{''.join(sections)}</body></html>\n"
    )
