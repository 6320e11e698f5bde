"""The tables the benchmarks print and write: plain text with aligned columns, markdown,
the per-generation goal tables, and the index a ratio looks its denominator up in.
Standard library only (``python -m benchmarks.report`` uses them)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> str:
    """A plain-text table with aligned columns; columns in ``right`` are right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(vals: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(vals, widths))
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """Markdown lines of a table: the header, the rule, one line per row (each cell as
    ``str`` writes it; a ``|`` inside a cell is escaped). A row of the wrong length raises
    ValueError."""
    lines = ["| " + " | ".join(headers) + " |", "|---" * len(headers) + "|"]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(
                f"markdown_table: a row of {len(row)} cells under {len(headers)} headers"
            )
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |")
    return lines


def index(
    rows: Iterable[dict[str, Any]], fields: Sequence[str], contender: str | None = None
) -> dict[tuple, dict[str, Any]]:
    """The rows with status "ok" (and, where given, of ``contender``) by the tuple of
    their ``fields``: what a ratio looks its denominator up in."""
    return {
        tuple(r[f] for f in fields): r
        for r in rows
        if r["status"] == "ok" and (contender is None or r["contender"] == contender)
    }


def goal_table(title: str, goals: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown lines: ``title`` and a table of per-generation goals (``cases.goal`` dicts
    with a "generation"): the limit, the worst figure and where, whether met, and the rows
    that fail it (then those named in an "unestimated" list, as "(no estimate)"). No
    goals: no lines."""
    if not goals:
        return []
    lines = [
        title,
        "",
        "| generation | goal | limit | worst measured | where | met | failing |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in goals:
        if g["measured"] is None:
            lines.append(
                f"| {g['generation']} | {g['goal']} | {g['limit']:g} | not measured | | | |"
            )
            continue
        failing = g["failing"] + [f"{u} (no estimate)" for u in g.get("unestimated", [])]
        lines.append(
            f"| {g['generation']} | {g['goal']} | {g['limit']:g} | {g['measured']:.3g} | "
            f"{g['worst']} | {'yes' if g['met'] else 'no'} | {', '.join(failing)} |"
        )
    return lines
