"""Which operand pairs each target multiplies natively and which emulate emulates: the
capability matrix, as rows (:func:`capability_matrix`) and as the text ``emulate
targets`` prints first (:func:`render_matrix`), with where each target's native pairs come
from. Read off :meth:`emulate.targets.Target.supports`; nothing here decides a pair."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from emulate import formats as _formats
from emulate import mosaic, tables
from emulate.formats import FormatLike
from emulate.targets import Target, all_targets, get

__all__ = ["CapabilityRow", "capability_matrix", "render_matrix"]


class CapabilityRow(NamedTuple):
    """One (target, format) cell of :func:`capability_matrix`.

    Statuses are ``"native"`` or ``"emulated"``; ``same_type`` is for ``fmt x fmt``,
    ``weight_only`` for ``bfloat16 x fmt`` (bf16 activations, low-precision weights).
    """

    target: str
    format: str
    same_type: str
    weight_only: str


def _status(t: Target, lhs: str, rhs: str) -> str:
    return "native" if t.supports(lhs, rhs) else "emulated"


def _targets_and_formats(
    targets: Iterable[str | Target] | None, formats: Iterable[FormatLike] | None
) -> tuple[list[Target], list[str]]:
    ts = list(all_targets()) if targets is None else [get(t) for t in targets]
    if formats is None:
        return ts, list(_formats.LOW_PRECISION)
    return ts, [_formats.get(f).name for f in formats]


def capability_matrix(
    targets: Iterable[str | Target] | None = None, formats: Iterable[FormatLike] | None = None
) -> list[CapabilityRow]:
    """Native or emulated, per target and format, for ``fmt x fmt`` and ``bfloat16 x fmt``.

    Args:
      targets: names or Targets; default :func:`all_targets`.
      formats: format names, dtypes or Formats; default ``formats.LOW_PRECISION``.

    Returns:
      Rows target-major, in the order given.
    """
    ts, fs = _targets_and_formats(targets, formats)
    return [
        CapabilityRow(t.name, f, _status(t, f, f), _status(t, "bfloat16", f))
        for t in ts
        for f in fs
    ]


def render_matrix(
    targets: Iterable[str | Target] | None = None, formats: Iterable[FormatLike] | None = None
) -> str:
    """:func:`capability_matrix` as plain text: formats as rows, targets as columns.

    A cell reads ``same/weight-only`` with ``N`` native and ``e`` emulated: ``e/N`` means
    ``fmt x fmt`` is emulated but ``bfloat16 x fmt`` native. Columns carry the targets'
    short names (``v5e``, ``sm90``); where all of them do not fit in
    :data:`emulate.tables.WIDTH` characters, the TPUs and the other targets get separate
    tables (:func:`emulate.tables.grid`). Lines under the tables name where each target's
    native pairs come from: the recorded probe of the real TPU compiler, JAX's Pallas TPU
    table, or emulate's builtin profiles. ``emulate targets`` prints this first.

    Args:
      targets, formats: as for :func:`capability_matrix`; repeats are dropped.

    Returns:
      The text, ending with a newline.
    """
    ts, fs = _targets_and_formats(targets, formats)
    ts = list({t.name: t for t in ts}.values())
    fs = list(dict.fromkeys(fs))
    mark = {"native": "N", "emulated": "e"}
    cells = {
        (r.format, tables.short_target(r.target)): f"{mark[r.same_type]}/{mark[r.weight_only]}"
        for r in capability_matrix(ts, fs)
    }
    columns = [(tables.short_target(t.name), "tpu" if t.kind == "tpu" else "other") for t in ts]
    title = "Native operand pairs (N native, e emulated); cell: fmt x fmt / bfloat16 x fmt"
    by_source: dict[str, list[str]] = {}
    for t in ts:
        key = "compiler" if t.rules == "compiler" else t.source
        by_source.setdefault(key, []).append(tables.short_target(t.name))
    lines = [tables.grid(title, fs, columns, cells), ""]
    if "compiler" in by_source:
        lines.append(
            f"real TPU compiler (libtpu {mosaic.recorded().libtpu}, compat off): "
            + ", ".join(by_source["compiler"])
        )
    if "jax" in by_source:
        lines.append(f"read from JAX's Pallas TPU table: {', '.join(by_source['jax'])}")
    if "builtin" in by_source:
        lines.append(f"emulate's builtin profiles: {', '.join(by_source['builtin'])}")
    return "\n".join(lines) + "\n"
