"""Every checkpoint convention of docs/quantized.md's table times bf16 activations on the
CPU: emulate against the f32 dot on the pre-decoded exact weight, the bf16 floor,
dequantize-then-dot, reading the stored bytes, and (for M = 2 to 16) its own M = 1 time
(issues 38 and 50).

Run as ``python -m benchmarks.qcpu`` from the repository root; ``--quick`` for M = 1
and 64 at 4096 x 4096 and 3 repeats; ``--shapes``, ``--schemes`` (names of
:data:`benchmarks.qweights.CPU_SCHEMES`) and ``--repeats`` (the harness's).

Per shape, one interleaved group (harness timing: every case once per round) of:

  floor        ``lax.dot_general`` of x and a bf16 weight decoded up front (bf16 x bf16,
               f32 result), one per layout ((K, N) and GGUF's (N, K))
  f32          ``lax.dot_general`` of x (cast to f32 in the program) and an f32 weight
               decoded up front, one per layout: the dot on the pre-decoded exact weight
               (the contract keeps the weight's exact values, which bf16 may not hold)
  read         the sum of a uint64 array as large as the largest stored weight of the
               group, on numba's threads: a pure read of those bytes, scaled to each
               weight's stored bytes (:func:`read_bytes`; before 2026-12-06 15:30 UTC half
               the time of XLA's ``u + 1`` copy, which writes a fresh output too and ran at
               2-5 GB/s against this read's 30 GB/s: ratios to it were 3-7x too kind)
  dequantize   ``lax.dot_general(x, emulate.dequantize(q, to=bf16))`` in one program
  emulate      ``emulate.dot_general(x, q, ..., preferred_element_type=f32)``: the CPU
               kernel (:mod:`emulate.cpu`: the few-rows kernel up to
               :data:`emulate.cpu.route.MAX_ROWS` rows, the many-rows one above), or XLA's
               tiled route where the kernel does not take the weight
  emulate_m1   (1 < M <= MAX_ROWS) the same call on the first row of x alone
  xla          the same call with the CPU kernel off (``use_cpu_kernel(False)``): XLA's
               tiled route (:mod:`emulate.engine.qtiled`), the route before the kernel

Each row carries the 1-minute load average before and after its group was timed (the
development machine is shared: ratios within a group are comparable, absolute times
across groups less so).

Goals (issue 50): at M = 1 every convention's emulate at most 2x the time to read its
stored bytes at 4096 x 14336 and 3x at 4096 x 4096; at M = 2 to 16 at most 1.3x its own
M = 1 time; at M >= 64 at most 1.1x the f32 dot on the pre-decoded exact weight.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numba
import numpy as np
from jax import lax

import emulate
from benchmarks import harness, provenance, timing, units
from benchmarks.cases import goal, parse_names, parse_shapes, shape_of
from benchmarks.qweights import CPU_SCHEMES, KN, NK, Case
from emulate.cpu.route import MAX_ROWS

BF16 = jnp.bfloat16
F32 = jnp.float32
SHAPES = tuple((m, 4096, n) for n in (4096, 14336) for m in (1, 4, 16, 64, 512))
QUICK_SHAPES = ((1, 4096, 4096), (16, 4096, 4096), (64, 4096, 4096))
F32_LIMIT = 1.1  # emulate / the f32 dot on the pre-decoded exact weight, M >= 64
READ_LIMITS = {4096: 3.0, 14336: 2.0}  # emulate / reading the stored bytes, M = 1, by N
ROWS_LIMIT = 1.3  # emulate / its M = 1 time, 1 < M <= MAX_ROWS


def _dot(dn: Any) -> Callable[..., jax.Array]:
    return jax.jit(lambda x, w: lax.dot_general(x, w, dn, preferred_element_type=F32))


def _dot_f32(dn: Any) -> Callable[..., jax.Array]:
    return jax.jit(
        lambda x, w: lax.dot_general(
            x.astype(F32), w, dn, lax.Precision.HIGHEST, preferred_element_type=F32
        )
    )


def _dequantize_dot(dn: Any) -> Callable[..., jax.Array]:
    return jax.jit(
        lambda x, q: lax.dot_general(
            x, emulate.dequantize(q, to=BF16), dn, preferred_element_type=F32
        )
    )


def _emulate(dn: Any) -> Callable[..., jax.Array]:
    return jax.jit(lambda x, q: emulate.dot_general(x, q, dn, preferred_element_type=F32))


@numba.njit(parallel=True, cache=True)
def read_bytes(words: np.ndarray) -> int:
    """Every byte of ``words`` (uint64) read once: their sum, on numba's threads."""
    total = np.uint64(0)
    for i in numba.prange(words.shape[0]):
        total += words[i]
    return total


def _xla_route(dn: Any) -> Callable[..., jax.Array]:
    f = _emulate(dn)

    def call(x: jax.Array, q: Any) -> jax.Array:
        with emulate.use_cpu_kernel(False):  # part of jit's key: traced with the kernel off
            return f(x, q)

    return call


def group_cases(
    shape: tuple[int, int, int], names: Sequence[str]
) -> tuple[list[Case], dict[str, int]]:
    """The cases of one shape and each scheme's stored bytes (the QArray's)."""
    m, k, n = shape
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((m, k)), BF16)
    w = jnp.asarray(rng.standard_normal((k, n)), BF16)
    w32 = jnp.asarray(w, F32)
    cases = [
        Case("floor", "kn", _dot(KN), (x, w)),
        Case("floor", "nk", _dot(NK), (x, w.T)),
        Case("f32", "kn", _dot_f32(KN), (x, w32)),
        Case("f32", "nk", _dot_f32(NK), (x, jnp.asarray(w32.T))),
    ]
    stored = {}
    for name in names:
        s = CPU_SCHEMES[name]
        q = s.build(k, n, rng)
        stored[name] = int(q.nbytes)
        cases.append(Case(name, "dequantize", _dequantize_dot(s.dn), (x, q)))
        cases.append(Case(name, "emulate", _emulate(s.dn), (x, q)))
        if 1 < m <= MAX_ROWS:
            cases.append(Case(name, "emulate_m1", _emulate(s.dn), (x[:1], q)))
        cases.append(Case(name, "xla", _xla_route(s.dn), (x, q)))
    words = np.ones(-(-max(stored.values()) // 8), np.uint64)
    cases.append(Case("read", "sum", read_bytes, (words,)))
    return cases, stored


def rows_of(shape: tuple[int, int, int], names: Sequence[str], repeats: int) -> list[dict]:
    """One row per scheme at ``shape``: medians (seconds) of its contenders, the floor of
    its layout and the read of its stored bytes, and the ratios."""
    m, k, n = shape
    cases, stored = group_cases(shape, names)
    load_before = os.getloadavg()[0]
    ran, failed = timing.interleave(cases, repeats)
    load = (round(load_before, 1), round(os.getloadavg()[0], 1))
    med = {c.label: timing.stats(c.times)["median_s"] for c in ran}
    read_all = med.get("read sum")
    read_per_byte = None if read_all is None else read_all / (8 * -(-max(stored.values()) // 8))
    rows = []
    for name in names:
        layout = "nk" if CPU_SCHEMES[name].dn == NK else "kn"
        floor, f32 = med.get(f"floor {layout}"), med.get(f"f32 {layout}")
        emu, deq = med.get(f"{name} emulate"), med.get(f"{name} dequantize")
        xla, emu1 = med.get(f"{name} xla"), med.get(f"{name} emulate_m1")
        read = None if read_per_byte is None else read_per_byte * stored[name]
        rows.append(
            {
                "pair": name,
                "title": CPU_SCHEMES[name].title,
                "M": m,
                "K": k,
                "N": n,
                "stored_bytes": stored[name],
                "load": load,
                "floor_s": floor,
                "f32_s": f32,
                "dequantize_s": deq,
                "emulate_s": emu,
                "emulate_m1_s": emu1,
                "xla_s": xla,
                "read_s": read,
                "emulate_over_floor": _ratio(emu, floor),
                "emulate_over_f32": _ratio(emu, f32),
                "dequantize_over_floor": _ratio(deq, floor),
                "emulate_over_read": _ratio(emu, read),
                "emulate_over_m1": _ratio(emu, emu1),
                "xla_over_read": _ratio(xla, read),
                "xla_over_f32": _ratio(xla, f32),
                "failed": {lab: why for lab, why in failed.items() if lab.startswith(name + " ")},
            }
        )
    return rows


def _load(row: dict[str, Any]) -> str:
    """The 1-minute load average before and after the row's group was timed."""
    load = row.get("load")
    return "?" if not load else f"{load[0]}-{load[1]}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def goals(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 50's CPU goals over ``rows``."""
    out = []
    for n, limit in READ_LIMITS.items():
        one = [r for r in rows if r["M"] == 1 and r["N"] == n and r["emulate_over_read"]]
        out.append(
            goal(
                f"M = 1, N = {n}: emulate / reading the stored bytes",
                "emulate_over_read",
                limit,
                one,
            )
        )
    few = [r for r in rows if 1 < r["M"] <= MAX_ROWS and r["emulate_over_m1"] is not None]
    out.append(goal(f"M = 2..{MAX_ROWS}: emulate / its M = 1", "emulate_over_m1", ROWS_LIMIT, few))
    wide = [r for r in rows if r["M"] >= 64 and r["emulate_over_f32"] is not None]
    out.append(
        goal("M >= 64: emulate / f32 dot, exact weight", "emulate_over_f32", F32_LIMIT, wide)
    )
    return out


def markdown(report: dict[str, Any]) -> str:
    """The tables: per shape and scheme, and the goal rows."""
    out = [
        "| scheme | M x K x N | stored MB | f32 ms | emulate ms | emulate / f32 | "
        "emulate / bf16 floor | emulate / read | emulate / its M = 1 | XLA route / f32 | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        out.append(
            f"| {r['title']} | {shape_of(r)} | {units.mb(r['stored_bytes'])} | "
            f"{units.ms(r['f32_s'])} | {units.ms(r['emulate_s'])} | "
            f"{units.ratio(r['emulate_over_f32'])} | {units.ratio(r['emulate_over_floor'])} | "
            f"{units.ratio(r['emulate_over_read'], 1)} | "
            f"{units.ratio(r.get('emulate_over_m1'))} | "
            f"{units.ratio(r.get('xla_over_f32'))} | {_load(r)} |"
        )
    out += ["", "| goal | limit | worst | where | met |", "|---|---|---|---|---|"]
    for g in report["goals"]:
        worst = units.ratio(g["measured"])
        out.append(f"| {g['goal']} | {g['limit']} | {worst} | {g['worst']} | {g['met']} |")
    return "\n".join(out) + "\n"


def run(args: argparse.Namespace) -> harness.Report:
    shapes = args.shapes or (QUICK_SHAPES if args.quick else SHAPES)
    names = args.schemes or list(CPU_SCHEMES)
    rows: list[dict[str, Any]] = []
    for shape in shapes:
        rows += rows_of(shape, names, args.repeats)
        print(f"done {units.shape_text(shape)}", flush=True)
    report = {"environment": provenance.environment(), "command": args.command, "rows": rows}
    report["goals"] = goals(rows)
    return harness.Report(report, markdown(report), markdown=True)


def flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--shapes",
        type=parse_shapes,
        help="MxKxN[,...] (default: M 1, 4, 16, 64, 512 at K x N 4096x4096 and 4096x14336)",
    )
    p.add_argument(
        "--schemes",
        type=lambda t: parse_names(t, list(CPU_SCHEMES), "--schemes"),
        help=f"comma-separated, of {', '.join(CPU_SCHEMES)} (default all)",
    )


BENCHMARK = harness.Benchmark(
    name="qcpu",
    description=__doc__.splitlines()[0],
    run=run,
    flags=flags,
    repeats=(5, 3),
    quick="M = 1, 16 and 64 at 4096 x 4096, 3 repeats",
)
main = BENCHMARK.main

if __name__ == "__main__":
    raise SystemExit(main())
