"""Plain-text tables and the short names they use for formats and targets.

Every table emulate prints (``emulate formats``, ``targets``, ``validate``, the target
matrix, :func:`emulate.inspect`'s report) goes through :func:`table`, so they all look
alike: left-aligned columns two spaces apart, no trailing blanks. A matrix of one value per
format and target (native pairs, plan methods) goes through :func:`grid`, which splits
it into column groups that fit :data:`WIDTH`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["WIDTH", "grid", "short_format", "short_target", "table"]

#: The widest line :func:`grid` draws, in characters.
WIDTH = 100

_WIDE_SHORT = {"bfloat16": "bf16", "float32": "f32", "float16": "f16"}


def table(
    rows: Sequence[Mapping[str, str]],
    *,
    columns: Sequence[str] | None = None,
    rule: bool = True,
) -> str:
    """``rows`` (dicts with the same keys) under a header line of the column names:
    ``columns``, or the first row's keys in order. ``rule`` puts a line of dashes under the
    header. Without rows, the header alone (the empty string without ``columns``)."""
    headers = list(columns) if columns is not None else list(rows[0]) if rows else []
    if not headers:
        return ""
    widths = [max([len(h), *(len(str(r[h])) for r in rows)]) for h in headers]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    if rule:
        lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(str(r[h]).ljust(w) for h, w in zip(headers, widths, strict=True)))
    return "\n".join(line.rstrip() for line in lines)


def grid(
    title: str,
    rows: Sequence[str],
    columns: Sequence[tuple[str, str]],
    cells: Mapping[tuple[str, str], str],
    *,
    corner: str = "format",
    width: int = WIDTH,
) -> str:
    """``cells[row, column]`` as titled tables whose lines are at most ``width`` wide.

    ``columns`` are (name, group) pairs, names as they head the columns. All columns go in
    one table if it fits; otherwise one table per group (in the order the groups first
    appear), each cut further where it still does not fit. Every table repeats ``title``
    above it and the ``corner`` column of row names. Tables are separated by a blank line;
    the text ends without a newline.
    """
    first = max([len(corner), *(len(r) for r in rows)])
    widths = {c: 2 + max([len(c), *(len(cells[r, c]) for r in rows)]) for c, _ in columns}
    if first + sum(widths.values()) <= width:
        kinds = [[c for c, _ in columns]]
    else:
        kinds = [
            [c for c, k in columns if k == kind] for kind in dict.fromkeys(k for _, k in columns)
        ]
    groups: list[list[str]] = []
    for names in kinds:
        groups.append([])
        used = first
        for c in names:
            if groups[-1] and used + widths[c] > width:
                groups.append([])
                used = first
            groups[-1].append(c)
            used += widths[c]
    blocks = []
    for group in groups:
        body = table(
            [{corner: r, **{c: cells[r, c] for c in group}} for r in rows], columns=[corner, *group]
        )
        blocks.append(f"{title}\n{body}")
    return "\n\n".join(blocks)


def short_format(name: str) -> str:
    """A format name for a narrow column: the ``float8_``/``float6_``/``float4_`` prefix
    dropped (``e4m3fn``), the wide floats as ``bf16``, ``f16``, ``f32``."""
    if name in _WIDE_SHORT:
        return _WIDE_SHORT[name]
    return name.split("_", 1)[1] if name.startswith(("float8_", "float6_", "float4_")) else name


def short_target(name: str) -> str:
    """A target name for a narrow column: ``tpu_v5e`` -> ``v5e``, ``gpu_sm90`` -> ``sm90``."""
    return name.removeprefix("tpu_").removeprefix("gpu_")
