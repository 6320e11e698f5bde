"""The TPU programs, as the real TPU compiler sees them, on a machine without a TPU.

Run as ``python -m benchmarks.tpu`` (from the repo root; needs libtpu, which the ``test``
extra brings: ``pip install -e .[test]``). ``--quick`` compiles one shape without mode
"exact" (a few minutes); see ``--help`` for ``--generations``, ``--shapes``, ``--formats``,
``--contenders`` and ``--exact-shapes`` (:mod:`benchmarks.harness` owns the common flags).

For every TPU generation the installed libtpu offers a compile-only device for
(:func:`emulate.compiler.generations`), the shapes and operand pairs of
``benchmarks.matmul`` (:mod:`benchmarks.cases`: bf16 activations times int8, packed int4,
float8_e4m3fn, float8_e5m2, packed float4_e2m1fn weights; int8 x int8; e4m3fn x e4m3fn),
it compiles, and never runs:

  (a) floor        ``jnp.dot(x_bf16, w_bf16, preferred_element_type=f32)``, both operands
                   decoded to bf16 up front (the same program for every pair of a shape)
  (b) astype       ``jnp.dot(x.astype(bf16), w.astype(bf16), preferred_element_type=f32)``
  (c) xla          ``lax.dot_general`` on the raw dtypes (int32 for int8 x int8);
                   "refused" with the compiler's first line where XLA:TPU refuses it
  (d) fast         ``emulate.dot_general(..., target=GEN)``, mode fast, the weight as
                   stored (4-bit weights ``emulate.pack(w, axis=0)``), on the XLA route
                   (``emulate.use_route("xla")``: by default a TPU target's weight goes
                   to the kernel, which is (f))
  (e) exact        the same with ``mode="exact"`` (by default at ``--exact-shapes`` only:
                   XLA:TPU takes seconds to minutes for each of these programs)
  (f) pallas       ``emulate.pallas.matmul(x, w, target=GEN)``, the weight as the user
                   keeps it for the kernel: 8-bit weights as they are, 4-bit weights
                   ``emulate.pallas.prepare_weight(w)`` (the K-planar layout, the bytes
                   of the packed weight); "n/a" with the reason where the kernel does not
                   apply
  (g) pallas_q     the same kernel on a block-scaled QArray of the weight, prepared once
                   (``emulate.pallas.prepare_weight(q)``, a ``KernelQWeight``): one scale
                   per 128 rows of K and column, float16 for integer weights (GPTQ / AWQ
                   style), float8_e8m0fnu for float weights (OCP MX style), f32 result

and reads, from the compiled program: ``cost_analysis()`` "bytes accessed", "flops" and
the compiler's own time estimate ("optimal_seconds"), and ``memory_analysis()``
temporaries, argument and output bytes. Ratios are to (a) of the same generation and
shape. The estimate is the compiler's cost model, not a measurement; and a Pallas kernel
is a custom call the compiler does not look into, so for (f) the benchmark adds the
kernel's own HBM traffic, counted from its block shapes and grid (:func:`kernel_traffic`).

Writes JSON (default ``benchmarks/results/tpu.json``), a markdown table beside it
(``.md``, also printed) and, if matplotlib is installed (the ``bench`` extra), a plot of
the ratios per generation (``.png``); without matplotlib it says so and skips the plot.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax.numpy as jnp

from benchmarks import harness, plots, provenance, tables, tpu_goals, units
from benchmarks.cases import (
    PAIRS,
    SHAPES,
    Contender,
    Pair,
    parse_names,
    parse_pairs,
    parse_shapes,
    present,
    shape_of,
)
from benchmarks.contenders import tpu_programs
from benchmarks.pallas_traffic import (
    compiled_figures,
    kernel_calls,
    kernel_traffic,
)
from emulate import compiler

BF16 = jnp.bfloat16
F32 = jnp.float32

#: Mode "exact" is compiled at these shapes only, unless --exact-shapes says otherwise.
EXACT_SHAPES: tuple[tuple[int, int, int], ...] = ((64, 4096, 4096),)
QUICK_SHAPES: tuple[tuple[int, int, int], ...] = ((64, 4096, 4096),)

CONTENDERS = (
    Contender("floor", "(a) bf16 pre-decoded", "bf16 x bf16 dot on operands decoded up front"),
    Contender("astype", "(b) astype + dot", "x.astype(bf16), w.astype(bf16), then the dot"),
    Contender("xla", "(c) XLA mixed dot", "lax.dot_general on the raw dtypes"),
    Contender("fast", "(d) emulate fast", "emulate.dot_general, mode fast, target GEN"),
    Contender("exact", "(e) emulate exact", "emulate.dot_general, mode exact, target GEN"),
    Contender("pallas", "(f) emulate.pallas.matmul", "one Pallas kernel, target GEN"),
    Contender(
        "pallas_q",
        "(g) pallas.matmul, QArray",
        "the kernel on the weight with scales per 128 rows and column, prepared once",
    ),
)
LABELS = {c.key: c.label for c in CONTENDERS}


# ---------------------------------------------------------------------------------------
# The programs


# ---------------------------------------------------------------------------------------
# What the compiler says


def _refusal(e: BaseException) -> str:
    return compiler.first_line(f"{e}") or type(e).__name__


def measure_one(
    pair: Pair,
    shape: tuple[int, int, int],
    generation: str,
    contender: str,
    fn: Callable[..., Any],
    specs: tuple[Any, ...],
) -> dict[str, Any]:
    """Compile one contender for one generation; one result row (no ratios yet)."""
    m, k, n = shape
    row: dict[str, Any] = {
        "generation": generation,
        "pair": pair.name,
        "lhs": pair.lhs,
        "rhs": pair.rhs,
        "packed": pair.packed and contender in ("fast", "exact", "pallas", "pallas_q"),
        "M": m,
        "K": k,
        "N": n,
        "contender": contender,
        "status": "ok",
        "reason": "",
    }
    t0 = time.perf_counter()
    try:
        compiled = compiler.compile(fn, *specs, target=generation)
    except NotImplementedError as e:
        row.update(status="not built", reason=_refusal(e))
        return row
    except (ValueError, TypeError) as e:  # emulate's own refusal of the case
        row.update(status="n/a", reason=_refusal(e))
        return row
    except Exception as e:  # noqa: BLE001 - XLA:TPU or Mosaic refusing the program
        row.update(status="refused", reason=_refusal(e))
        return row
    finally:
        row["compile_s"] = time.perf_counter() - t0
    row |= compiled_figures(compiled, flops=True)
    row["stored_bytes"] = row["argument_bytes"] + row["output_bytes"]
    row["temp_over_decoded_weight"] = row["temp_bytes"] / (2 * k * n)
    row["custom_calls"] = kernel_calls(compiled)
    row["bytes"] = row["bytes_accessed"]
    row["bytes_source"] = "compiler"
    if row["custom_calls"]:
        row["temp_outside_kernel"] = row["temp_bytes"]
        traffic = kernel_traffic(fn, specs, generation)
        row["kernel"] = traffic
        # The compiler's figure covers the ops around the kernel but not the kernel.
        row["bytes"] = traffic["bytes"] + (row["bytes_accessed"] or 0)
        row["bytes_source"] = "kernel blocks + compiler (outside the kernel)"
        row["estimate_outside_kernel_s"] = row["estimate_s"]
        row["estimate_s"] = None
    if row["bytes"] is not None:
        row["bytes_over_stored"] = row["bytes"] / row["stored_bytes"]
    return row


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Ratios of bytes and estimate to (a) of the same generation and shape, and of the
    estimate to (c) of the same pair."""
    shape = ("generation", "M", "K", "N")
    pair = ("generation", "pair", "M", "K", "N")
    floors = tables.index(rows, shape, "floor")
    xlas = tables.index(rows, pair, "xla")
    fasts = tables.index(rows, pair, "fast")
    q = units.quotient
    for r in rows:
        if r["status"] != "ok":
            continue
        f = floors.get(tuple(r[k] for k in shape))
        x = xlas.get(tuple(r[k] for k in pair))
        r["bytes_ratio"] = q(r.get("bytes"), f and f.get("bytes"))
        r["estimate_ratio"] = q(r.get("estimate_s"), f and f.get("estimate_s"))
        r["estimate_over_xla"] = q(r.get("estimate_s"), x and x.get("estimate_s"))
        if r["contender"] == "exact":
            d = fasts.get(tuple(r[k] for k in pair))
            r["estimate_over_fast"] = q(r.get("estimate_s"), d and d.get("estimate_s"))
            r["exact_temp_over_decoded_weight"] = r["temp_over_decoded_weight"]


def measure(
    generation: str,
    shape: tuple[int, int, int],
    pair_names: Sequence[str],
    contenders: Sequence[str],
    floor_cache: dict[tuple, dict[str, Any]],
    log: Callable[[str], None] = lambda s: None,
) -> list[dict[str, Any]]:
    """Every contender for every pair at one shape on one generation (ratios not added).

    (a) is one program for all pairs of a shape (both operands bf16); it is compiled once
    per generation and shape and its row repeated for each pair.
    """
    rows = []
    for name in pair_names:
        pair = PAIRS[name]
        progs = tpu_programs(pair, shape, generation)
        for key in contenders:
            cached = ""
            if key == "floor":
                cache_key = (generation, shape)
                cached = " (compiled once per shape)" if cache_key in floor_cache else ""
                if cache_key not in floor_cache:
                    floor_cache[cache_key] = measure_one(pair, shape, generation, key, *progs[key])
                row = {
                    **floor_cache[cache_key],
                    "cached": bool(cached),
                    "pair": pair.name,
                    "lhs": pair.lhs,
                    "rhs": pair.rhs,
                }
            else:
                row = measure_one(pair, shape, generation, key, *progs[key])
            log(
                f"  {generation} {name} {shape[0]}x{shape[1]}x{shape[2]} {key}: "
                f"{row['status']} {row.get('compile_s', 0):.1f} s{cached}"
            )
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------
# Output


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return ""
    if r["status"] != "ok":
        reason = r["reason"] if len(r["reason"]) <= 80 else r["reason"][:77] + "..."
        reason = reason.replace("|", "\\|")
        return f"{r['status']}: {reason}"
    mark = "†" if r.get("kernel") else ""
    parts = [f"{units.mb(r['bytes'])}{mark} MB"]
    if r.get("bytes_ratio") is not None and r["contender"] != "floor":
        parts[0] += f" ({r['bytes_ratio']:.2f}x)"
    if r.get("estimate_s") is not None:
        est = f"{units.us(r['estimate_s'])} us"
        if r.get("estimate_ratio") is not None and r["contender"] != "floor":
            est += f" ({r['estimate_ratio']:.2f}x)"
        parts.append(est)
    elif r.get("kernel"):
        parts.append("no estimate (custom call)")
    else:
        parts.append(f"no estimate (sentinel {r.get('estimate_raw')})")
    parts.append(f"temp {units.mb(r['temp_bytes'])} MB")
    return "; ".join(parts)


def summary(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown lines: per shape, pair and generation, (d) emulate fast's estimate over
    (c)'s and over (a)'s, and its bytes accessed over the operands as stored plus result."""
    gens = list(dict.fromkeys(r["generation"] for r in rows))
    fast = {
        (r["generation"], r["pair"], r["M"], r["K"], r["N"]): r
        for r in rows
        if r["contender"] == "fast"
    }
    if not fast:
        return []
    lines = [
        "## Summary: (d) emulate fast",
        "",
        "Each cell: the compiler's estimate for (d) over that for (c) XLA's mixed dot / over "
        "that for (a); bytes accessed by (d) over the operands as stored plus the result; "
        "temporaries of (d) over one bf16 copy of the weight.",
        "",
        "| pair | M x K x N | " + " | ".join(gens) + " |",
        "|---|---|" + "---|" * len(gens),
    ]
    keys = dict.fromkeys((k[1], k[2], k[3], k[4]) for k in fast)
    for pair, m, k, n in keys:
        cells = []
        for gen in gens:
            r = fast.get((gen, pair, m, k, n))
            if r is None:
                cells.append("")
            elif r["status"] != "ok":
                cells.append(r["status"])
            else:
                x = units.ratio
                cells.append(
                    f"{x(r.get('estimate_over_xla'))} / {x(r.get('estimate_ratio'))}; "
                    f"{x(r.get('bytes_over_stored'))}; {x(r['temp_over_decoded_weight'])}"
                )
        lines.append(f"| {PAIRS[pair].title} | {m}x{k}x{n} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def markdown(report: dict[str, Any]) -> str:
    rows = report["results"]
    env = report["environment"]
    keys = present(rows, CONTENDERS)
    lines = [
        "# TPU compiler benchmark",
        "",
        f"`{report['command']}`, {env['time']}; jax {env['jax']}, libtpu "
        f"{report['libtpu']}, {env['cpu_count']} cores; {report['wall_s']:.0f} s wall "
        f"({report['compile_s']:.0f} s compiling). Nothing ran: every figure is the real "
        "TPU compiler's view of the compiled program on a compile-only device.",
        "",
        "Each cell: bytes accessed (`cost_analysis()['bytes accessed']`) and its ratio to "
        "(a); the compiler's time estimate (`optimal_seconds`) and its ratio to (a); "
        "temporaries (`memory_analysis().temp_size_in_bytes`). † (f): the Pallas kernel's "
        "own HBM traffic from its block shapes and grid plus the compiler's bytes for the "
        "ops around it; the compiler gives no estimate for a Pallas custom call.",
        "",
    ]
    lines += summary(rows)
    for gen in dict.fromkeys(r["generation"] for r in rows):
        lines += [
            f"## {gen}",
            "",
            "| pair | M x K x N | stored MB | " + " | ".join(LABELS[k] for k in keys) + " |",
            "|---|---|---|" + "---|" * len(keys),
        ]
        groups: dict[tuple, dict[str, dict[str, Any]]] = {}
        for r in rows:
            if r["generation"] == gen:
                groups.setdefault((r["pair"], r["M"], r["K"], r["N"]), {})[r["contender"]] = r
        for (pair, *_), by in groups.items():
            any_row = next(iter(by.values()))
            stored = next(
                (
                    by[k]["stored_bytes"]
                    for k in ("fast", "pallas", "pallas_q")
                    if "stored_bytes" in by.get(k, {})
                ),
                None,
            )
            lines.append(
                f"| {PAIRS[pair].title} | {shape_of(any_row)} | {units.mb(stored)} | "
                + " | ".join(_cell(by.get(k)) for k in keys)
                + " |"
            )
        lines.append("")
    for title, goals in (
        ("## Goals: issue 16, emulate fast (d); issue 27, emulate exact (e)", report["goals"]),
        (
            "## Goals (issue 27), emulate.pallas.matmul (f) and on QArray weights (g)",
            report.get("pallas_goals", []),
        ),
    ):
        table = tables.goal_table(title, goals)
        lines += [*table, ""] if table else []
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> Path | None:
    """The PNG: :func:`benchmarks.plots.tpu_figure` of these contenders."""
    return plots.tpu_figure(report, path, CONTENDERS)


# ---------------------------------------------------------------------------------------
# Driver


def run(args: argparse.Namespace) -> harness.Report | None:
    """Compile everything asked for; the report (markdown, JSON and plot). With
    ``--from-json``, compile nothing: redraw an earlier run's markdown and PNG."""
    if args.from_json is not None:
        data = json.loads(args.from_json.read_text())
        report = harness.Report(data, markdown(data), markdown=True, plot=plot)
        print(report.text)
        harness.write(report, args.from_json, with_json=False, plot=args.plot)
        return None
    try:
        offered = compiler.generations()
    except compiler.CompilerUnavailable as e:
        raise harness.Unavailable(str(e)) from e
    try:
        gens = (
            parse_names(args.generations, offered, "--generations") if args.generations else offered
        )
    except argparse.ArgumentTypeError as e:
        raise harness.FlagError(str(e)) from e
    shapes = args.shapes or (QUICK_SHAPES if args.quick else SHAPES)
    contenders = args.contenders or [
        c.key for c in CONTENDERS if not (args.quick and c.key == "exact")
    ]
    exact_shapes: Sequence[tuple[int, int, int]] | None = args.exact_shapes
    env = provenance.environment()
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    floor_cache: dict[tuple, dict[str, Any]] = {}

    def log(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    for gen in gens:
        for shape in shapes:
            keys = [
                c
                for c in contenders
                if c != "exact" or exact_shapes is None or tuple(shape) in exact_shapes
            ]
            rows += measure(gen, shape, args.formats or tuple(PAIRS), keys, floor_cache, log)
    add_ratios(rows)
    data = {
        "benchmark": "tpu",
        "command": args.command,
        "libtpu": compiler.libtpu_version(),
        "generations": list(gens),
        "contenders": {c.key: f"{c.label}: {c.doc}" for c in CONTENDERS},
        "environment": env,
        "load_average_end": provenance.environment()["load_average"],
        "wall_s": time.perf_counter() - t0,
        "compile_s": sum(r.get("compile_s", 0.0) for r in rows if not r.get("cached")),
        "results": rows,
    }
    data["goals"] = tpu_goals.goals(rows)
    data["pallas_goals"] = tpu_goals.pallas_goals(rows)
    return harness.Report(data, markdown(data), markdown=True, plot=plot)


def _exact_shapes(text: str) -> list[tuple[int, int, int]] | None:
    return None if text.strip() == "all" else parse_shapes(text, "--exact-shapes")


def flags(p: argparse.ArgumentParser) -> None:
    """tpu's own flags."""
    p.add_argument("--generations", help="comma-separated TPU targets (default: all offered)")
    p.add_argument(
        "--shapes",
        type=parse_shapes,
        help="MxKxN[,MxKxN...] (default " + ",".join(map(units.shape_text, SHAPES)) + ")",
    )
    p.add_argument(
        "--formats",
        type=parse_pairs,
        help=f"pairs, comma-separated, from: {', '.join(PAIRS)} (default all)",
    )
    keys = [c.key for c in CONTENDERS]
    p.add_argument(
        "--contenders",
        type=lambda s: parse_names(s, keys, "--contenders"),
        help=f"comma-separated, from: {', '.join(keys)} (default all)",
    )
    p.add_argument(
        "--exact-shapes",
        type=_exact_shapes,
        default=list(EXACT_SHAPES),
        help="MxKxN[,...] at which (e) exact is compiled, or 'all' (default "
        + ",".join(map(units.shape_text, EXACT_SHAPES))
        + "; each exact program takes XLA:TPU seconds to minutes)",
    )
    p.add_argument(
        "--from-json",
        type=Path,
        metavar="PATH",
        help="compile nothing: redraw the markdown and the PNG of an earlier run's JSON "
        "(written beside PATH)",
    )


BENCHMARK = harness.Benchmark(
    name="tpu",
    description=__doc__.splitlines()[0],
    run=run,
    flags=flags,
    quick="one shape (64x4096x4096), no mode exact (unless --shapes/--contenders say otherwise)",
    plots=True,
)
main = BENCHMARK.main


if __name__ == "__main__":
    sys.exit(main())
