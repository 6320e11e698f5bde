"""Checkpoint weights kept as stored (GGUF Q4_K, AutoAWQ int4 g128, bitsandbytes NF4) times
bf16 activations: emulate against the bf16 floor and against dequantize-then-dot, timed on
the CPU and compiled (never run) for TPUs.

Run as ``python -m benchmarks.quantized`` from the repository root; ``--quick`` for one
shape (64x4096x4096) and 3 repeats; ``--help`` for ``--shapes``, ``--schemes``,
``--generations``, ``--no-cpu`` and ``--no-tpu`` (:mod:`benchmarks.harness` owns the rest).

The weights (K x N logical, made from a fixed seed, built as the importers build them):

  q4_k           GGUF Q4_K: random 144-byte super-blocks (d, dmin set to small f16 values)
                 read by ``emulate.importers.ggml.parse_blocks`` and made a QArray by
                 ``emulate.importers.gguf.to_qarray``: (N, K), 4-bit codes packed along
                 K, 6-bit sub-block scales and mins times the f16 d and -dmin
  q4_k_no_mins   the same QArray with its offsets (the mins) removed
  q6_k, q5_k,    GGUF Q6_K (6-bit codes, zero point 32, int8 sub-block scales), Q5_K,
  q3_k, q2_k     Q3_K (zero point 4) and Q2_K, built as q4_k is (:func:`k_quant_weight`)
  awq_g128       AutoAWQ GEMM int4, group 128: uint4 codes, f16 scales and 4-bit zero
                 points per group, as ``emulate.importers.as_qarray.to_qarray`` packs them
  awq_g128_no_zeros  the same QArray without its zero points
  nf4_b64        bitsandbytes NF4, blocks of 64 along K: uint4 codes into the NF4 table,
                 f32 absmax per block (``to_qarray`` of the parts ``read_bnb_4bit`` gives)
  nf4_dq         the same with bitsandbytes' double quantization: uint8 absmax codes
                 into a 256-entry table, an f32 scale per 256 of them, an offset
  nvfp4          NVIDIA NVFP4 (``emulate.quantize(w, emulate.mx.NVFP4, axis=0)``): e2m1
                 codes packed along K, an e4m3 scale per 16 rows and column, an f32
                 tensor scale
  fp8_block128   DeepSeek-V3 FP8: e4m3fn codes (one a byte, finite), one f32 scale per
                 128 x 128 block, in the parts ``parse_fp8_blocks`` returns

and the contenders, one jitted program each:

  (a) floor        ``lax.dot_general`` of x and the weight decoded to bf16 up front
                   (bf16 x bf16, f32 result; one program per layout and shape)
  (b) dequantize   ``lax.dot_general(x, emulate.dequantize(q, to=bf16), ...)``: the
                   weight dequantized inside the program, then a bf16 dot (what a user
                   writes; it rounds the values to bf16, so it is less accurate than (c))
  (c) emulate      ``emulate.dot_general(x, q, ..., preferred_element_type=f32,
                   target=T)``, mode fast, the QArray as stored, on the XLA route
                   (``emulate.use_route("xla")``: by default the kernel, which is (d))
  (d) pallas       ``emulate.pallas.matmul(x, w, target=T, out_dtype=f32)`` on
                   ``w = emulate.pallas.prepare_weight(q)`` (GGUF rows: of ``q.T``), made
                   once and kept (the same bytes); TPUs only (on the CPU it would run in
                   interpret mode); "not built" where the kernel refuses the scheme

On the CPU (target ``cpu``) each is timed (harness interleaving); on each TPU generation
it is compiled with the real compiler for a compile-only device and the compiled
program's ``cost_analysis()`` (bytes accessed, the compiler's time estimate
"optimal_seconds") and ``memory_analysis()`` (temporaries, argument and output bytes) are
read, as :mod:`benchmarks.tpu` does; for (d), a Pallas kernel the compiler does not look
into, the kernel's own HBM traffic is counted from its block shapes and grid
(:func:`benchmarks.pallas_traffic.kernel_traffic`) and added to the compiler's bytes for
the ops around it, and there is no estimate. Stored bytes are the weight as stored
(``QArray.nbytes``) plus the activations (bf16) and the result (f32).

On every TPU generation each program is also timed by the bundle model
(:mod:`benchmarks.bundle_columns`: :func:`emulate.compiler.estimate_compiled` replays
libtpu's final bundle schedule of every kernel and fusion, calibrated where a real chip
was timed), printed per generation beside the stored bytes at the HBM bandwidth and the
matrix units' feed floor (K x N weight elements at the rate a core's units take them in,
:meth:`emulate.compiler.Generation.feed_seconds`); the
run then happens in a process whose libtpu dumps its schedules (the harness starts one;
``--no-bundles`` leaves the columns out).

The offset term's cost is (c) (and (d)) of a scheme with zero points or mins over the
same contender on the QArray without them (time on the CPU, estimate and bytes on a TPU;
bytes alone for (d)).

Goals (issue 24, item 6), read from (c) and (d): the offset term at most 1.10x (the
estimate on v5e; bytes for (d)); temporaries at most 25% of one bf16 copy of the weight;
bytes accessed (for (d): kernel traffic plus the compiler's bytes outside it) at most
1.1x the operands as stored plus the result (the weight crosses HBM once as stored).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import emulate
import emulate.mx
import emulate.pallas
from benchmarks import bundle_columns, harness, provenance, tables, timing, units
from benchmarks.cases import SHAPES, goal, parse_names, parse_shapes, shape_of
from benchmarks.contenders import scheme_programs
from benchmarks.pallas_traffic import compiled_figures, kernel_calls, kernel_traffic
from benchmarks.qweights import CPU_SCHEMES, SCHEMES, Case, Scheme
from benchmarks.schemes import pallas_weight, stored_bytes, weight_shape
from emulate import compiler

BF16 = jnp.bfloat16
F32 = jnp.float32
QUICK_SHAPES: tuple[tuple[int, int, int], ...] = ((64, 4096, 4096),)
GENERATIONS = ("tpu_v2", "tpu_v3", "tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e", "tpu_v7x")

OFFSET_LIMIT = 1.10  # (c) with offsets / (c) without, the compiler's estimate on v5e
TEMP_LIMIT = 0.25  # temporaries / one bf16 copy of the weight (2*K*N bytes)
BYTES_LIMIT = 1.1  # bytes accessed / (weight as stored + activations + result)


CONTENDERS = {
    "floor": "(a) bf16 x bf16",
    "dequantize": "(b) dequantize + dot",
    "emulate": "(c) emulate",
    "pallas": "(d) pallas",
}
#: Every scheme a TPU row may name: :data:`SCHEMES` and the conventions
#: ``benchmarks.qweights`` builds for the CPU benchmark only (GGUF Q4_0, Q8_0, IQ4_XS,
#: MXFP4; GPTQ act-order), which ``--schemes`` takes with ``--no-cpu``.
ALL_SCHEMES = {**SCHEMES, **CPU_SCHEMES}
#: Timed on the CPU: (d) would run in Pallas' interpret mode there.
CPU_CONTENDERS = ("floor", "dequantize", "emulate")


# ---------------------------------------------------------------------------------------
# The programs


def _specs(tree: Any) -> tuple[Any, list[jax.ShapeDtypeStruct]]:
    """A pytree's structure and its leaves as ShapeDtypeStructs. A QArray (or Packed) is
    passed by its leaves: it has ``shape`` and ``dtype`` itself (its logical ones), so a
    compile helper mapping over leaves would take it for one array."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, [jax.ShapeDtypeStruct(np.shape(x), x.dtype) for x in leaves]


def _by_leaves(fn: Callable[..., Any], treedef: Any) -> Callable[..., Any]:
    def call(x, leaves):
        return fn(x, jax.tree.unflatten(treedef, leaves))

    return call


# ---------------------------------------------------------------------------------------
# TPU: the compiler's view


def compile_row(
    scheme: Scheme,
    contender: str,
    generation: str,
    shape: tuple[int, int, int],
    weight: Any,
    stored: int,
) -> dict[str, Any]:
    """Compile one contender for one generation; one result row (no ratios yet)."""
    m, k, n = shape
    row: dict[str, Any] = {
        "platform": generation,
        "pair": scheme.name,
        "contender": contender,
        "M": m,
        "K": k,
        "N": n,
        "stored_bytes": stored,
        "status": "ok",
        "reason": "",
    }
    treedef, leaves = _specs(weight)
    fn = _by_leaves(scheme_programs(scheme.dn, generation)[contender], treedef)
    x = jax.ShapeDtypeStruct((m, k), BF16)
    t0 = time.perf_counter()
    try:
        compiled, timed = bundle_columns.compile_timed(
            lambda: compiler.compile(fn, x, leaves, target=generation), generation
        )
    except timing.COMPILE_REFUSALS as e:
        row.update(status="refused", reason=timing.short_error(e))
        return row
    finally:
        row["compile_s"] = time.perf_counter() - t0
    row |= compiled_figures(compiled) | timed
    row |= bundle_columns.floors(generation, stored, k * n)
    if kernel_calls(compiled):
        # a Pallas kernel: the compiler's bytes cover the ops around it, not the kernel
        traffic = kernel_traffic(fn, [x, leaves], generation)
        row["kernel_bytes"] = traffic["bytes"]
        row["bytes_outside_kernel"] = row["bytes_accessed"]
        row["bytes_accessed"] = traffic["bytes"] + (row["bytes_accessed"] or 0)
        row["estimate_outside_kernel_s"] = row["estimate_s"]
        row["estimate_s"] = None
    add_derived(row)
    return row


def add_derived(row: dict[str, Any]) -> None:
    """The per-row quotients: temporaries over one bf16 copy of the weight (2*K*N bytes),
    bytes accessed over the operands as stored plus the result."""
    row["temp_over_decoded_weight"] = row["temp_bytes"] / (2 * row["K"] * row["N"])
    b = row.get("bytes_accessed")
    row["bytes_over_stored"] = None if b is None else b / row["stored_bytes"]


def tpu_rows(
    generation: str,
    shape: tuple[int, int, int],
    names: Sequence[str],
    log: Callable[[str], None] = lambda s: None,
    contenders: Sequence[str] = tuple(CONTENDERS),
) -> list[dict[str, Any]]:
    """Each of ``contenders`` for every scheme at one shape on one generation. (a) is
    compiled once per weight layout and repeated for each scheme of that layout."""
    m, k, n = shape
    rng = np.random.default_rng(0)
    floors: dict[Any, dict[str, Any]] = {}
    rows = []
    for name in names:
        scheme = ALL_SCHEMES[name]
        q = scheme.build(k, n, rng)
        stored = stored_bytes(q, m, k, n)
        for key in contenders:
            if key == "pallas":
                try:
                    w = pallas_weight(scheme, q)
                except NotImplementedError as e:
                    row = {"platform": generation, "pair": name, "contender": key}
                    row |= {"M": m, "K": k, "N": n, "stored_bytes": stored}
                    row |= {"status": "not built", "reason": timing.short_error(e)}
                else:
                    row = compile_row(scheme, key, generation, shape, w, stored)
            elif key == "floor":
                ws = weight_shape(scheme, k, n)
                if scheme.dn not in floors:
                    w = jax.ShapeDtypeStruct(ws, BF16)
                    floors[scheme.dn] = compile_row(scheme, key, generation, shape, w, stored)
                row = {**floors[scheme.dn], "pair": name, "stored_bytes": stored}
                add_derived(row)
            else:
                row = compile_row(scheme, key, generation, shape, q, stored)
            log(f"  {generation} {name} {shape_of(row)} {key}: {row['status']}")
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------
# CPU: timed


def cpu_rows(shape: tuple[int, int, int], names: Sequence[str], repeats: int) -> list[dict]:
    """Every contender of every scheme at one shape, timed on this CPU (target ``cpu``):
    one row each with the median, min and max seconds (ratios added later)."""
    m, k, n = shape
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((m, k)), BF16)
    cases = []
    stored = {}
    for name in names:
        scheme = SCHEMES[name]
        q = scheme.build(k, n, rng)
        stored[name] = stored_bytes(q, m, k, n)
        progs = scheme_programs(scheme.dn, "cpu")
        w = emulate.dequantize(q, to=BF16)
        for key in CPU_CONTENDERS:
            cases.append(Case(name, key, jax.jit(progs[key]), (x, w if key == "floor" else q)))
    ran, failed = timing.interleave(cases, repeats)
    rows = []
    for c in ran:
        rows.append(
            {
                "platform": "cpu",
                "pair": c.scheme,
                "contender": c.contender,
                "M": m,
                "K": k,
                "N": n,
                "stored_bytes": stored[c.scheme],
                "status": "ok",
                "reason": "",
                **timing.stats(c.times),
            }
        )
    for label, why in failed.items():
        name, contender = label.split(" ")
        rows.append(
            {"platform": "cpu", "pair": name, "contender": contender, "M": m, "K": k, "N": n}
            | {"status": "failed", "reason": why}
        )
    return rows


# ---------------------------------------------------------------------------------------
# Ratios, the offset term, goals


def figure(row: dict[str, Any]) -> float | None:
    """The row's figure of time: the median on the CPU, the compiler's estimate on a TPU."""
    return row.get("median_s") if row["platform"] == "cpu" else row.get("estimate_s")


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's figure (and bytes accessed) over those of (a) and of (b) for the same
    scheme, platform and shape."""
    fields = ("platform", "pair", "M", "K", "N", "contender")
    index = tables.index(rows, fields)
    for r in rows:
        if r["status"] != "ok":
            continue
        for other in ("floor", "dequantize"):
            o = index.get((*(r[f] for f in fields[:-1]), other))
            ok = o is not None
            r[f"over_{other}"] = units.quotient(figure(r), figure(o)) if ok else None
            r[f"bytes_over_{other}"] = (
                units.quotient(r.get("bytes_accessed"), o.get("bytes_accessed")) if ok else None
            )


def offset_costs(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each scheme with a variant without its offset term: (c) with over (c) without,
    and (d) likewise, per platform and shape (the figure, and bytes accessed on a TPU)."""
    mine = {
        (r["platform"], r["pair"], shape_of(r), r["contender"]): r
        for r in rows
        if r["contender"] in ("emulate", "pallas") and r["status"] == "ok"
    }
    out = []
    for (platform, name, shape, contender), r in mine.items():
        base = ALL_SCHEMES[name].base_of
        if base is None or (platform, base, shape, contender) not in mine:
            continue
        with_offsets = mine[(platform, base, shape, contender)]
        out.append(
            {
                "platform": platform,
                "pair": base,
                "contender": contender,
                "without": name,
                "M": r["M"],
                "K": r["K"],
                "N": r["N"],
                "offset_cost": units.quotient(figure(with_offsets), figure(r)),
                "offset_bytes": units.quotient(
                    with_offsets.get("bytes_accessed"), r.get("bytes_accessed")
                ),
            }
        )
    return out


def goals(rows: Sequence[dict[str, Any]], offsets: Sequence[dict[str, Any]]) -> list[dict]:
    """Issue 24's goals for (c) and (d), per TPU generation: the offset term (its
    estimate, and its bytes accessed), the temporaries and the bytes accessed (module
    docstring)."""
    out = []
    tpu = [r for r in rows if r["platform"] != "cpu"]
    for gen in dict.fromkeys(r["platform"] for r in tpu):
        for c, tag in (("emulate", "(c)"), ("pallas", "(d)")):
            mine = [o for o in offsets if o["platform"] == gen and o.get("contender") == c]
            # the estimate is the goal's figure; bytes accessed stand beside it, since the
            # compiler gives no estimate for some of these programs (none for a kernel)
            for label, key in (
                (f"offset term: {tag} with / without, estimate", "offset_cost"),
                (f"offset term: {tag} with / without, bytes accessed", "offset_bytes"),
            ):
                got = [o for o in mine if o[key] is not None]
                if got or c == "emulate":
                    out.append(goal(label, key, OFFSET_LIMIT, got, generation=gen))
            fast = [
                r
                for r in tpu
                if r["platform"] == gen and r["contender"] == c and r["status"] == "ok"
            ]
            for label, key, limit in (
                (f"{tag} temporaries / one bf16 copy of the weight", "temp_over_decoded_weight",
                 TEMP_LIMIT),
                (f"{tag} bytes accessed / (operands as stored + result)", "bytes_over_stored",
                 BYTES_LIMIT),
            ):  # fmt: skip
                got = [r for r in fast if r.get(key) is not None]
                if got or c == "emulate":
                    out.append(goal(label, key, limit, got, generation=gen))
    return out


# ---------------------------------------------------------------------------------------
# Output


def _tpu_cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return ""
    if r["status"] != "ok":
        return f"{r['status']}: {r['reason'][:60]}".replace("|", "\\|")
    parts = [f"{units.mb(r['bytes_accessed'])} MB"]
    est = "no estimate" if r["estimate_s"] is None else f"{units.us(r['estimate_s'])} us"
    if r["contender"] != "floor" and r.get("over_floor") is not None:
        est += f" ({r['over_floor']:.2f}x)"
    parts += [est, f"temp {units.mb(r['temp_bytes'])} MB"]
    return "; ".join(parts)


def _cpu_cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return ""
    if r["status"] != "ok":
        return f"{r['status']}: {r['reason'][:60]}".replace("|", "\\|")
    text = f"{units.ms(r['median_s'])} ms"
    if r["contender"] != "floor" and r.get("over_floor") is not None:
        text += f" ({r['over_floor']:.2f}x)"
    return text


def _grouped(rows: Sequence[dict[str, Any]], platform: str) -> dict[tuple, dict[str, dict]]:
    groups: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if r["platform"] == platform:
            groups.setdefault((r["pair"], shape_of(r)), {})[r["contender"]] = r
    return groups


def markdown(report: dict[str, Any]) -> str:
    rows, env = report["results"], report["environment"]
    lines = [
        "# Quantized checkpoint weights (benchmarks/quantized.py)",
        "",
        f"`{report['command']}`, {env['time']}; jax {env['jax']}, libtpu "
        f"{report.get('libtpu')}, {env['cpu_count']} cores, load average "
        f"{env['load_average']}; {report['wall_s']:.0f} s wall.",
        "",
    ]
    head = "| scheme | M x K x N | stored MB | " + " | ".join(CONTENDERS.values()) + " |"
    rule = "|---|---|---|" + "---|" * len(CONTENDERS)
    for platform in dict.fromkeys(r["platform"] for r in rows):
        cpu = platform == "cpu"
        lines += [
            "## CPU, timed (median; ratio to (a))"
            if cpu
            else f"## {platform}, compiled (bytes accessed; estimate and ratio to (a); "
            "temporaries)",
            "",
            head,
            rule,
        ]
        for (name, shape), by in _grouped(rows, platform).items():
            stored = next(iter(by.values())).get("stored_bytes")
            cell = _cpu_cell if cpu else _tpu_cell
            lines.append(
                f"| {ALL_SCHEMES[name].title} | {shape} | {units.mb(stored)} | "
                + " | ".join(cell(by.get(k)) for k in CONTENDERS)
                + " |"
            )
        lines.append("")
        if not cpu:
            titles = {name: ALL_SCHEMES[name].title for name in ALL_SCHEMES}
            lines += bundle_columns.table(_grouped(rows, platform), platform, titles, CONTENDERS)
    if report["offsets"]:
        lines += [
            "## The offset term: (c) or (d) with zero points / mins over the same without",
            "",
            "| platform | scheme | contender | M x K x N | time or estimate | bytes accessed |",
            "|---|---|---|---|---|---|",
        ]
        for o in report["offsets"]:
            lines.append(
                f"| {o['platform']} | {SCHEMES[o['pair']].title} | "
                f"{CONTENDERS[o.get('contender', 'emulate')]} | {shape_of(o)} | "
                f"{units.ratio(o['offset_cost'])} | {units.ratio(o['offset_bytes'])} |"
            )
        lines.append("")
    lines += tables.goal_table(
        "## Goals (issue 24, item 6), (c) emulate and (d) pallas", report["goals"]
    )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------
# Driver


def run(args: argparse.Namespace) -> harness.Report:
    """Time on the CPU and compile for each generation; the report."""
    shapes = args.shapes or (QUICK_SHAPES if args.quick else SHAPES)
    names = args.schemes or list(SCHEMES)
    gens: list[str] = []
    libtpu = None
    if not args.no_tpu:
        try:
            offered = compiler.generations()
            libtpu = compiler.libtpu_version()
        except compiler.CompilerUnavailable as e:
            raise harness.Unavailable(f"{e} (or pass --no-tpu)") from e
        try:
            gens = parse_names(args.generations, offered, "--generations")
        except argparse.ArgumentTypeError as e:
            raise harness.FlagError(str(e)) from e
    env = provenance.environment()
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []

    def log(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    for shape in shapes:
        if not args.no_cpu:
            log(f"cpu {units.shape_text(shape)}: timing")
            rows += cpu_rows(shape, names, args.repeats)
        for gen in gens:
            rows += tpu_rows(gen, shape, names, log, args.contenders or tuple(CONTENDERS))
    add_ratios(rows)
    bundle_columns.add_ratios(rows, ("platform", "pair", "M", "K", "N"), "floor")
    offsets = offset_costs(rows)
    data = {
        "benchmark": "quantized",
        "command": args.command,
        "libtpu": libtpu,
        "contenders": CONTENDERS,
        "environment": env,
        "wall_s": time.perf_counter() - t0,
        "results": rows,
        "offsets": offsets,
        "goals": goals(rows, offsets),
    }
    return harness.Report(data, markdown(data), markdown=True)


def flags(p: argparse.ArgumentParser) -> None:
    """quantized's own flags."""
    p.add_argument(
        "--shapes",
        type=parse_shapes,
        help="MxKxN[,MxKxN...] (default "
        + ",".join(map(units.shape_text, SHAPES))
        + "; "
        + ",".join(map(units.shape_text, QUICK_SHAPES))
        + " with --quick)",
    )
    p.add_argument(
        "--schemes",
        type=lambda s: parse_names(s, list(ALL_SCHEMES), "--schemes"),
        help=f"comma-separated, from: {', '.join(ALL_SCHEMES)} (default: {', '.join(SCHEMES)}; "
        "the others on TPUs only, with --no-cpu)",
    )
    p.add_argument(
        "--contenders",
        type=lambda s: tuple(parse_names(s, list(CONTENDERS), "--contenders")),
        help=f"comma-separated TPU contenders, from: {', '.join(CONTENDERS)} (default all)",
    )
    p.add_argument(
        "--generations",
        default=",".join(GENERATIONS),
        help=f"comma-separated TPU targets (default {','.join(GENERATIONS)})",
    )
    p.add_argument("--no-cpu", action="store_true", help="time nothing on the CPU")
    p.add_argument("--no-tpu", action="store_true", help="compile nothing for a TPU")


BENCHMARK = harness.Benchmark(
    name="quantized",
    description=__doc__.splitlines()[0],
    run=run,
    flags=flags,
    repeats=(7, 3),
    quick=f"{units.shape_text(QUICK_SHAPES[0])} only, 3 repeats",
    dumps=True,
)
main = BENCHMARK.main


if __name__ == "__main__":
    sys.exit(main())
