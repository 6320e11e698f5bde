"""The bundle model's figures for the compile-only benchmarks (:mod:`benchmarks.quantized`,
:mod:`benchmarks.models`): a program's time from its compiler schedule, beside the bytes
floor (stored bytes at the HBM bandwidth) and the matrix units' feed floor (each weight
element through a unit once, ``mxu_size`` elements a cycle per unit).

The time comes from :func:`emulate.compiler.estimate_compiled`, so the benchmark runs in
a process whose libtpu dumps its schedules (``harness.Benchmark(dumps=True)`` starts one);
elsewhere (``--no-bundles``) the figures are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import tables, units
from emulate import compiler


def compile_timed(compile_program: Callable[[], Any], target: str) -> tuple[Any, dict[str, Any]]:
    """``compile_program()``'s compiled program and, when this process's libtpu dumps,
    its bundle estimate: ``{"bundle_s": whole program, "bundle_kernel_s": its Mosaic
    kernels}`` (seconds), else ``{}``."""
    if compiler.dump_directory() is None:
        return compile_program(), {}
    compiled, t = compiler.estimate_compiled(compile_program, target)
    return compiled, {"bundle_s": t.seconds, "bundle_kernel_s": t.kernel_seconds}


def floors(target: str, stored_bytes: float, weight_elements: float) -> dict[str, float]:
    """``hbm_s``: ``stored_bytes`` at one TensorCore's HBM bandwidth; ``feed_s``: the
    matrix units' time for ``weight_elements``."""
    g = compiler.generation(target)
    return {"hbm_s": g.hbm_seconds(stored_bytes), "feed_s": g.feed_seconds(weight_elements)}


def add_ratios(rows: list[dict[str, Any]], fields: Sequence[str], base: str) -> None:
    """Each row's ``bundle_s`` over that of the row whose ``contender`` is ``base`` and
    whose ``fields`` match (``bundle_over_base``), and over its ``hbm_s``."""
    index = tables.index(rows, (*fields, "contender"))
    for r in rows:
        if r.get("bundle_s") is None:
            continue
        b = index.get((*(r[f] for f in fields), base))
        r["bundle_over_base"] = units.quotient(
            r["bundle_s"], None if b is None else b.get("bundle_s")
        )
        r["bundle_over_hbm"] = units.quotient(r["bundle_s"], r.get("hbm_s"))


def cell(r: dict[str, Any] | None) -> str:
    """``"205.3 us (1.40x (a), 4.2x HBM)"``, or the row's status."""
    if r is None:
        return ""
    if r.get("status", "ok") != "ok":
        return r["status"]
    if r.get("bundle_s") is None:
        return units.MISSING
    text = f"{units.us(r['bundle_s'])} us"
    notes = []
    if r.get("contender") != "floor" and r.get("bundle_over_base") is not None:
        notes.append(f"{r['bundle_over_base']:.2f}x (a)")
    if r.get("bundle_over_hbm") is not None:
        notes.append(f"{r['bundle_over_hbm']:.1f}x HBM")
    return text + (f" ({', '.join(notes)})" if notes else "")


def table(
    groups: dict[tuple[str, str], dict[str, dict[str, Any]]],
    platform: str,
    titles: dict[str, str],
    contenders: dict[str, str],
) -> list[str]:
    """The bundle model's table for one TPU generation of :mod:`benchmarks.quantized`: a
    row per (scheme, shape) of ``groups`` with the bytes and feed floors and each
    contender's :func:`cell`; nothing where no row has a bundle estimate."""
    if not any(r.get("bundle_s") for by in groups.values() for r in by.values()):
        return []
    lines = [
        f"## {platform}, the bundle model (us; x (a) and x the stored bytes at the HBM "
        "bandwidth; the matrix units' feed floor)",
        "",
        "| scheme | M x K x N | stored / HBM (us) | feed floor (us) | "
        + " | ".join(contenders.values()) + " |",
        "|---|---|---|---|" + "---|" * len(contenders),
    ]  # fmt: skip
    for (name, shape), by in groups.items():
        first = next(iter(by.values()))
        lines.append(
            f"| {titles[name]} | {shape} | {units.us(first.get('hbm_s'))} | "
            f"{units.us(first.get('feed_s'))} | "
            + " | ".join(cell(by.get(k)) for k in contenders) + " |"
        )  # fmt: skip
    return [*lines, ""]
