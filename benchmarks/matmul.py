"""Emulated low-precision matmuls side by side with what a user would do instead.

Run as ``python -m benchmarks.matmul`` (from the repo root); ``--quick`` for a run of
under a minute; ``--help`` for the flags (:mod:`benchmarks.harness` owns the common
ones). For each shape (M, K, N) and operand pair it times, in one process and
interleaved (A B C A B C ... after two warm-up calls each):

  (a) floor        both operands decoded to bf16 once, up front (not timed);
                   ``jnp.dot(x, w_bf16, preferred_element_type=f32)``
  (b) astype       ``jnp.dot(x.astype(bf16), w.astype(bf16), preferred_element_type=f32)``
                   on the weight in its own dtype (int4/fp4 unpacked, one byte an element)
  (c) xla          ``lax.dot_general`` on the raw dtypes, preferred f32 (int32 for int8 x
                   int8); "n/a (does not compile: ...)" where XLA rejects it
  (d) fast         ``emulate.dot_general(x, w, dn, preferred_element_type=..., target="cpu")``
                   with the weight as stored (4-bit weights ``emulate.pack(w, axis=0)``)
  (d') fast, unpacked  the same on the unpacked 4-bit array (4-bit weights only), to split
                   the cost of unpacking from the cost of decoding
  (e) exact        the same with ``mode="exact"``; "n/a" where it is not built
  (f) decode only  ``emulate.decode(w, to=bf16)`` of the weight as (d) takes it, no dot
                   (bf16-activation pairs only): what the decode alone costs
  (g) copy         ``x + 1`` on a uint32 array of as many bytes as the packed weight
                   (packed pairs at M = 1 only), as benchmarks.decode's copy: it reads
                   and writes every byte, so half its time is the time to read the packed
                   weight at the copy bandwidth, the floor of a memory-bound matvec

Every contender is ``jax.jit(f).lower(x, w).compile()``-d once; the compiled program is
what is timed, and its ``memory_analysis().temp_size_in_bytes`` is the "temp" figure.
Ratios are medians over the floor's median. Weight bytes are the bytes of the weight as
that contender's compiled program takes it: ``memory_analysis().argument_size_in_bytes``
less the activations' bytes. (XLA on the CPU stores int4 and float4_e2m1fn arrays two
elements a byte, although ``jax.Array.nbytes`` counts one byte an element; a
:class:`emulate.Packed` weight's figure equals its ``nbytes``.)

Writes JSON (default ``benchmarks/results/matmul.json``), a markdown table beside it
(``.md``, also printed) and, if matplotlib is installed (the ``bench`` extra), a plot of
ratio against M per pair (``.png``).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import emulate
from benchmarks import harness, plots, provenance, units
from benchmarks.cases import (
    PAIRS,
    SHAPES,
    WEIGHT_ONLY,
    Contender,
    Pair,
    goal,
    parse_pairs,
    parse_shapes,
    present,
    shape_of,
)
from benchmarks.contenders import pair_programs
from benchmarks.timing import interleave, minor_faults, short_error, stats, timed_call
from emulate import formats

BF16 = jnp.bfloat16
F32 = jnp.float32

QUICK_SHAPES: tuple[tuple[int, int, int], ...] = ((1, 1024, 1024), (64, 1024, 1024))
QUICK_PAIRS = ("float8_e4m3fn", "int4")


CONTENDERS = (
    Contender("floor", "(a) bf16 pre-decoded", "bf16 x bf16 dot on operands decoded up front"),
    Contender("astype", "(b) astype + dot", "x.astype(bf16), w.astype(bf16), then the dot"),
    Contender("xla", "(c) XLA dot", "lax.dot_general on the raw dtypes"),
    Contender("fast", "(d) emulate fast", "emulate.dot_general, mode fast, target cpu"),
    Contender("fast_unpacked", "(d') fast, unpacked", "(d) on the unpacked 4-bit array"),
    Contender("exact", "(e) emulate exact", "emulate.dot_general, mode exact, target cpu"),
    Contender("decode", "(f) decode only", "emulate.decode(w, to=bf16), no dot"),
    Contender("copy", "(g) copy", "x + 1 on uint32 words of the packed weight's bytes"),
)
LABELS = {c.key: c.label for c in CONTENDERS}


def _values(fmt: str, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Realistic values of ``fmt`` (no NaN or Inf): normals scaled into the format's range,
    uniform integers over the whole range."""
    f = formats.get(fmt)
    if f.is_integer:
        return rng.integers(int(f.min), int(f.max) + 1, size=shape).astype(f.dtype)
    scale = {"bfloat16": 1.0, "float4_e2m1fn": 2.0}.get(fmt, 8.0)
    return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(f.dtype)


@dataclasses.dataclass
class Case:
    """One contender on one pair and shape: compiled once, then timed."""

    pair: Pair
    shape: tuple[int, int, int]
    contender: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    compiled: Any = None
    weight_bytes: int | None = None
    temp_bytes: int | None = None
    status: str = "ok"
    reason: str = ""
    times: list[float] = dataclasses.field(default_factory=list)
    faults: list[int] = dataclasses.field(default_factory=list)

    @property
    def label(self) -> str:
        m, k, n = self.shape
        return f"{self.pair.name} {m}x{k}x{n} {self.contender}"

    def compile(self) -> bool:
        """Lower and compile; on failure record why and return False."""
        try:
            lowered = jax.jit(self.fn).lower(*self.args)
        except NotImplementedError as e:
            self.status, self.reason = "n/a", f"not built: {_reason(e)}"
            return False
        except Exception as e:  # noqa: BLE001 - any rejection is a result here
            self.status, self.reason = "n/a", f"does not trace: {_reason(e)}"
            return False
        try:
            self.compiled = lowered.compile()
        except Exception as e:  # noqa: BLE001
            self.status, self.reason = "n/a", f"does not compile: {_reason(e)}"
            return False
        mem = self.compiled.memory_analysis()
        temp = getattr(mem, "temp_size_in_bytes", None) if mem is not None else None
        self.temp_bytes = None if temp is None else int(temp)
        self.weight_bytes = _weight_bytes(mem, self.args)
        return True

    def run(self) -> float:
        before = minor_faults()
        dt = timed_call(self.compiled, *self.args)
        after = minor_faults()
        if before is not None and after is not None:
            self.faults.append(after - before)
        return dt

    def result(self, floor_median: float | None) -> dict[str, Any]:
        m, k, n = self.shape
        r: dict[str, Any] = {
            "pair": self.pair.name,
            "lhs": self.pair.lhs,
            "rhs": self.pair.rhs,
            "packed": self.pair.packed and self.contender in ("fast", "exact"),
            "M": m,
            "K": k,
            "N": n,
            "contender": self.contender,
            "status": self.status,
            "reason": self.reason,
            "weight_bytes": self.weight_bytes,
            "weight_bytes_per_element": None
            if self.weight_bytes is None
            else self.weight_bytes / (k * n),
            "temp_bytes": self.temp_bytes,
            "page_faults_per_call": statistics.median(self.faults[-len(self.times) :])
            if self.faults and self.times
            else None,
            "temp_over_decoded_weight": None
            if self.temp_bytes is None
            else self.temp_bytes / (2 * k * n),
        }
        if self.status == "ok" and self.times:
            s = stats(self.times)
            r.update(s)
            r["times_s"] = self.times
            r["ratio"] = s["median_s"] / floor_median if floor_median else None
            r["ratio_min"] = s["min_s"] / floor_median if floor_median else None
            r["ratio_max"] = s["max_s"] / floor_median if floor_median else None
        return r


def _weight_bytes(mem: Any, args: tuple[Any, ...]) -> int | None:
    """Bytes of the weight (the last argument) as the compiled program takes it.

    XLA's argument bytes less the activations' (which are 8 or 16 bits an element here,
    so ``nbytes`` is exact for them); ``nbytes`` of the weight if XLA does not say.
    """
    total = getattr(mem, "argument_size_in_bytes", None) if mem is not None else None
    if total is None:
        w = args[-1]
        return int(w.nbytes) if hasattr(w, "nbytes") else None
    return int(total) - sum(int(a.nbytes) for a in args[:-1])


def _reason(e: BaseException) -> str:
    """A short reason: the first line, without XLA's status prefix."""
    text = short_error(e, limit=400)
    for prefix in ("INTERNAL: ", "UNIMPLEMENTED: ", "INVALID_ARGUMENT: "):
        text = text.removeprefix(prefix)
    if "is not built yet" in text:  # emulate.plan's message for mode="exact"
        return "exact mode covers only the integer / fp4 / fp6 pairs so far"
    return text if len(text) <= 90 else text[:87] + "..."


def build_cases(pair: Pair, shape: tuple[int, int, int], seed: int = 0) -> list[Case]:
    """The contenders for one pair and shape, on fresh random operands."""
    m, k, n = shape
    rng = np.random.default_rng(seed)
    x_np = _values(pair.lhs, (m, k), rng)
    w_np = _values(pair.rhs, (k, n), rng)
    x = jax.device_put(x_np)
    w = jax.device_put(w_np)
    x_bf16 = jax.device_put(x_np.astype(ml_dtypes.bfloat16))  # exact for every pair here
    w_bf16 = jax.device_put(w_np.astype(ml_dtypes.bfloat16))
    w_emu: Any = jax.block_until_ready(emulate.pack(w, axis=0)) if pair.packed else w
    fn = pair_programs(pair.accumulator, "cpu")

    def decode(w):
        return emulate.decode(w, to=BF16)

    cases = [
        Case(pair, shape, "floor", fn["floor"], (x_bf16, w_bf16)),
        Case(pair, shape, "astype", fn["astype"], (x, w)),
        Case(pair, shape, "xla", fn["xla"], (x, w)),
        Case(pair, shape, "fast", fn["fast"], (x, w_emu)),
    ]
    if pair.packed:
        cases.append(Case(pair, shape, "fast_unpacked", fn["fast"], (x, w)))
    cases.append(Case(pair, shape, "exact", fn["exact"], (x, w_emu)))
    if pair.lhs == "bfloat16":
        cases.append(Case(pair, shape, "decode", decode, (w_emu,)))
    if pair.packed and m == 1:
        nbytes = int(w_emu.nbytes)
        words = jax.device_put(rng.integers(0, 1 << 32, size=-(-nbytes // 4), dtype=np.uint32))
        cases.append(Case(pair, shape, "copy", lambda u: u + 1, (words,)))
    return cases


def measure(pair: Pair, shape: tuple[int, int, int], repeats: int) -> list[dict[str, Any]]:
    """Compile, warm up and time every contender for one pair and shape; one row each."""
    cases = build_cases(pair, shape)
    ready = [c for c in cases if c.compile()]
    _, failed = interleave(ready, repeats, report=False)
    for c in ready:
        if c.label in failed:
            c.status, c.reason = "n/a", f"fails at run time: {failed[c.label]}"
    floor = next((c for c in cases if c.contender == "floor" and c.times), None)
    floor_median = stats(floor.times)["median_s"] if floor else None
    rows = [c.result(floor_median) for c in cases]
    for c in cases:
        c.compiled = None  # let the buffers go before the next group
    return rows


def storage_rows(k: int, n: int) -> list[dict[str, Any]]:
    """Bytes per element of ``emulate.pack(w, axis=0)`` for every packable format."""
    rows = []
    rng = np.random.default_rng(1)
    for name in formats.LOW_PRECISION:
        f = formats.get(name)
        if not f.packable:
            continue
        codes = rng.integers(0, 1 << f.bits, size=(k, n), dtype=np.uint8)
        p = emulate.pack(codes, name, axis=0)
        rows.append(
            {
                "format": name,
                "bits": f.bits,
                "shape": [k, n],
                "packed_bytes": p.nbytes,
                "bytes_per_element": p.nbytes / (k * n),
                "goal_bytes_per_element": f.bits / 8,
            }
        )
    return rows


# ---------------------------------------------------------------------------------------
# Goals


def goals(rows: Sequence[dict[str, Any]], storage: Sequence[dict[str, Any]]) -> list[dict]:
    """Goals 1 to 3 of issue 9 (goal 4 is benchmarks.decode's) and the CPU goals of
    issue 16, measured on these rows."""
    fast = [
        r
        for r in rows
        if r["contender"] == "fast" and r["pair"] in WEIGHT_ONLY and r["status"] == "ok"
    ]
    out = []
    for label, sel, limit in (
        ("emulate fast / floor, M >= 64", lambda r: r["M"] >= 64, 1.25),
        ("emulate fast / floor, M = 1", lambda r: r["M"] == 1, 1.5),
    ):
        got = [r for r in fast if sel(r) and r.get("ratio") is not None]
        out.append(goal(label, "ratio", limit, got, unit="x"))
    temps = [r for r in fast if r["temp_over_decoded_weight"] is not None]
    out.append(
        goal(
            "emulate fast temp / one bf16 copy of the weight",
            "temp_over_decoded_weight",
            0.25,
            temps,
            unit="",
        )
    )
    for bits, limit in ((4, 0.5), (6, 0.75)):
        got = [
            {**s, "pair": s["format"], "M": None, "K": s["shape"][0], "N": s["shape"][1]}
            for s in storage
            if s["bits"] == bits
        ]
        out.append(
            goal(
                f"storage of {bits}-bit formats, bytes/element",
                "bytes_per_element",
                limit,
                got,
                unit="",
            )
        )
    return out + issue16_goals(rows)


def issue16_goals(rows: Sequence[dict[str, Any]]) -> list[dict]:
    """Issue 16's CPU goals: packed int4's ratio over packed fp4's at each shape (at most
    1), and at M = 1 emulate fast's time over the time to read the packed weight at the
    copy bandwidth (half of (g): the copy reads and writes every byte), at most 1.5."""
    ok = {
        (r["pair"], r["M"], r["K"], r["N"], r["contender"]): r
        for r in rows
        if r["status"] == "ok" and r.get("median_s")
    }
    int4_fp4 = []
    read = []
    for (pair, m, k, n, contender), r in ok.items():
        if contender != "fast":
            continue
        fp4 = ok.get(("float4_e2m1fn", m, k, n, "fast"))
        if pair == "int4" and fp4 is not None and r.get("ratio") and fp4.get("ratio"):
            int4_fp4.append({**r, "int4_over_fp4": r["ratio"] / fp4["ratio"]})
        copy = ok.get((pair, m, k, n, "copy"))
        if m == 1 and copy is not None:
            read.append({**r, "over_read": r["median_s"] / (copy["median_s"] / 2)})
    return [
        goal(
            "packed int4 ratio / packed fp4 ratio (issue 16)",
            "int4_over_fp4",
            1.0,
            int4_fp4,
            unit="x",
        ),
        goal(
            "fast, M = 1 / reading the packed weight at copy bandwidth (issue 16)",
            "over_read",
            1.5,
            read,
            unit="x",
        ),
    ]


# ---------------------------------------------------------------------------------------
# Output


def _time_cell(r: dict[str, Any]) -> str:
    if r["status"] != "ok":
        return f"n/a ({r['reason']})"
    span = f"{units.ms(r['min_s'])}-{units.ms(r['max_s'])}"
    if r["contender"] == "floor":
        return f"{units.ms(r['median_s'])} ms ({span})"
    return f"**{r['ratio']:.2f}x** {units.ms(r['median_s'])} ms ({span})"


def _groups(rows: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["pair"], r["M"], r["K"], r["N"]), []).append(r)
    return list(groups.values())


def _memory_table(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[str]:
    """The memory section's lines: temporaries per contender, weight bytes per element
    and page faults per call, one row per pair and shape."""
    lines = [
        "",
        "## Memory",
        "",
        "Compiled temporaries (`memory_analysis().temp_size_in_bytes`) in MB, and in brackets "
        "as a fraction of one bf16 copy of the weight (2*K*N bytes); weight storage in bytes "
        "per element as each contender takes the weight; minor page faults per call (median), "
        "which count the pages of temporaries the allocator returned to the OS after the "
        "previous call and faults in again.",
        "",
        "| pair | M x K x N | " + " | ".join(LABELS[k] for k in keys) + " | weight B/elem "
        "(a) / (b,c) / (d,e) | page faults/call (a) / (d) |",
        "|---|---|" + "---|" * (len(keys) + 2),
    ]
    for g in _groups(rows):
        by = {r["contender"]: r for r in g}
        cells = []
        for k in keys:
            r = by.get(k)
            if r is None or r["temp_bytes"] is None:
                cells.append("" if r is None else "n/a")
            else:
                cells.append(f"{units.mb(r['temp_bytes'])} ({r['temp_over_decoded_weight']:.2f})")
        wb = [by[k]["weight_bytes_per_element"] for k in ("floor", "astype", "fast") if k in by]
        pf = [by[k].get("page_faults_per_call") for k in ("floor", "fast") if k in by]
        lines.append(
            f"| {PAIRS[g[0]['pair']].title} | {shape_of(g[0])} | "
            + " | ".join(cells)
            + " | "
            + " / ".join("?" if v is None else f"{v:g}" for v in wb)
            + " | "
            + " / ".join("?" if v is None else f"{v:.0f}" for v in pf)
            + " |"
        )
    return lines


def _storage_and_goals(report: dict[str, Any]) -> list[str]:
    """The packed-storage and goals sections' lines."""
    lines = [
        "",
        "## Packed storage",
        "",
        "| format | bits | packed bytes / element | goal |",
        "|---|---|---|---|",
    ]
    for s in report["storage"]:
        lines.append(
            f"| {s['format']} | {s['bits']} | {s['bytes_per_element']:g} | "
            f"{s['goal_bytes_per_element']:g} |"
        )
    lines += [
        "",
        "## Goals (issues 9 and 16)",
        "",
        "| goal | limit | worst measured | where | met |",
        "|---|---|---|---|---|",
    ]
    for g in report["goals"]:
        if g["measured"] is None:
            lines.append(f"| {g['goal']} | {g['limit']:g} | not measured | | |")
            continue
        lines.append(
            f"| {g['goal']} | {g['limit']:g}{g['unit']} | {g['measured']:.3g}{g['unit']} | "
            f"{g['worst']} | {'yes' if g['met'] else 'no'} |"
        )
    lines.append("")
    lines.append("Goal 4 (decode throughput) is measured by `python -m benchmarks.decode`.")
    return lines


def markdown(report: dict[str, Any]) -> str:
    rows = report["results"]
    env = report["environment"]
    keys = present(rows, CONTENDERS)
    lines = [
        "# matmul benchmark",
        "",
        f"`{report['command']}`, {env['time']}; jax {env['jax']} on {env['backend']} "
        f"({env['device']}, {env['cpu_count']} cores, {env['machine']}), load average "
        f"{env['load_average']} at the start and {report['load_average_end']} at the end; "
        f"allocator environment {env.get('malloc_env') or 'default'}; "
        f"median of {report['repeats']} interleaved repeats after 2 warm-up calls, "
        "(min-max) in brackets; ratios are to the median of (a).",
        "",
        "## Time",
        "",
        "| pair | M x K x N | " + " | ".join(LABELS[k] for k in keys) + " |",
        "|---|---|" + "---|" * len(keys),
    ]
    for g in _groups(rows):
        by = {r["contender"]: r for r in g}
        cells = [_time_cell(by[k]) if k in by else "" for k in keys]
        lines.append(
            f"| {PAIRS[g[0]['pair']].title} | {shape_of(g[0])} | " + " | ".join(cells) + " |"
        )
    lines += _memory_table(rows, keys) + _storage_and_goals(report)
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> Path | None:
    """The PNG: :func:`benchmarks.plots.matmul_figure` of these contenders."""
    return plots.matmul_figure(report, path, CONTENDERS)


# ---------------------------------------------------------------------------------------
# Driver


def run(args: argparse.Namespace) -> harness.Report:
    """Measure every pair at every shape; the report (markdown, JSON and plot)."""
    shapes = args.shapes or (QUICK_SHAPES if args.quick else SHAPES)
    pair_names = args.formats or (QUICK_PAIRS if args.quick else tuple(PAIRS))
    env = provenance.environment()
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        for name in pair_names:
            t = time.perf_counter()
            rows += measure(PAIRS[name], shape, args.repeats)
            print(
                f"  {name} {units.shape_text(shape)}: {time.perf_counter() - t:.1f} s",
                file=sys.stderr,
            )
    k, n = max((s[1], s[2]) for s in shapes)
    storage = storage_rows(k, n)
    report = {
        "benchmark": "matmul",
        "command": args.command,
        "repeats": args.repeats,
        "statistic": "median of interleaved repeats after 2 warm-up calls; ratio = "
        "median / median of the floor",
        "contenders": {c.key: f"{c.label}: {c.doc}" for c in CONTENDERS},
        "environment": env,
        "load_average_end": provenance.environment()["load_average"],
        "wall_s": time.perf_counter() - t0,
        "results": rows,
        "storage": storage,
    }
    report["goals"] = goals(rows, storage)
    return harness.Report(report, markdown(report), markdown=True, plot=plot)


def flags(p: argparse.ArgumentParser) -> None:
    """matmul's own flags: --shapes and --formats."""
    p.add_argument(
        "--shapes",
        type=parse_shapes,
        help="MxKxN[,MxKxN...] (default " + ",".join(map(units.shape_text, SHAPES)) + ")",
    )
    p.add_argument(
        "--formats",
        type=parse_pairs,
        help=f"weight formats / pairs, comma-separated, from: {', '.join(PAIRS)} "
        "(default all; the bare names have bf16 activations)",
    )


BENCHMARK = harness.Benchmark(
    name="matmul",
    description=__doc__.splitlines()[0],
    run=run,
    flags=flags,
    repeats=(10, 10),
    quick=f"M in (1, 64), K = N = 1024, pairs {', '.join(QUICK_PAIRS)} (unless "
    "--shapes/--formats say otherwise)",
    plots=True,
)
main = BENCHMARK.main


if __name__ == "__main__":
    sys.exit(main())
