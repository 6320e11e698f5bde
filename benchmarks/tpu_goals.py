"""The TPU goals of issues 16 and 27, read off ``benchmarks.tpu``'s rows: each limit, and
per generation the worst figure against it (:func:`benchmarks.cases.goal`).

Issue 16 set (d) emulate fast's temporaries, bytes accessed and compiler estimate;
issue 27, (e) emulate exact's estimate and temporaries, and (f) / (g)
emulate.pallas.matmul's HBM traffic and the temporaries outside its kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.cases import goal, shape_of

# The goals of issue 16 for (d) on every generation.
TEMP_LIMIT = 0.25  # temporaries / one bf16 copy of the weight (2*K*N bytes)
BYTES_LIMIT = 1.1  # bytes accessed / (argument bytes + output bytes)
ESTIMATE_LIMIT = 1.0  # estimate / estimate of (c)
# The goals of issue 27 for (f) on every generation.
KERNEL_TRAFFIC_LIMIT = 1.1  # kernel blocks + bytes outside / (weight + activations + result)
OUTSIDE_TEMP_LIMIT = 0.0  # temporaries of the program around the kernel, bytes
# The goals of issue 27 for (e), stated for v5e and printed for every generation.
EXACT_LIMIT = 10.0  # estimate of (e) / estimate of (d), the same pair
EXACT_TEMP_LIMIT = 1.0  # temporaries of (e) / one bf16 copy of the weight


def goals(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The TPU goals per generation: issue 16's for (d) emulate fast (temporaries, bytes
    accessed over the operands as stored plus the result, estimate over (c)), then issue
    27's for (e) emulate exact (:func:`exact_goals`)."""
    out = []
    gens = list(dict.fromkeys(r["generation"] for r in rows))
    fast = [r for r in rows if r["contender"] == "fast" and r["status"] == "ok"]
    for gen in gens:
        mine = [r for r in fast if r["generation"] == gen]
        for label, key, limit in (
            ("temporaries / one bf16 copy of the weight", "temp_over_decoded_weight", TEMP_LIMIT),
            ("bytes accessed / (operands as stored + result)", "bytes_over_stored", BYTES_LIMIT),
            (
                "compiler estimate / that of (c) XLA's mixed dot",
                "estimate_over_xla",
                ESTIMATE_LIMIT,
            ),
        ):
            got = [r for r in mine if r.get(key) is not None]
            out.append(goal(label, key, limit, got, generation=gen))
    return out + exact_goals(rows)


def exact_goals(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 27's goals for (e) emulate exact, per generation where (e) was compiled: its
    estimate over (d)'s for the same pair, and its temporaries over one bf16 copy of the
    weight. A program the compiler gives no estimate for (a sentinel) is left out of the
    first and named in ``unestimated``, and the goal is then not met."""
    out = []
    exact = [r for r in rows if r["contender"] == "exact" and r["status"] == "ok"]
    for gen in dict.fromkeys(r["generation"] for r in exact):
        mine = [r for r in exact if r["generation"] == gen]
        for label, key, limit in (
            ("(e) exact: compiler estimate / that of (d) fast", "estimate_over_fast", EXACT_LIMIT),
            (
                "(e) exact: temporaries / one bf16 copy of the weight",
                "exact_temp_over_decoded_weight",
                EXACT_TEMP_LIMIT,
            ),
        ):
            got = [r for r in mine if r.get(key) is not None]
            g = goal(label, key, limit, got, generation=gen)
            g["unestimated"] = [f"{r['pair']} {shape_of(r)}" for r in mine if r.get(key) is None]
            out.append(g)
    return out


def pallas_goals(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The TPU goals of issue 27 for (f) emulate.pallas.matmul, per generation: its HBM
    traffic (the kernel's blocks plus the compiler's bytes for the ops around it) over the
    weight as stored + the activations once + the result (the program's argument and
    output bytes), and the temporaries outside the kernel. The same for (g), the kernel on
    QArray weights, where (g) was compiled for that generation."""
    out = []
    gens = list(dict.fromkeys(r["generation"] for r in rows))
    for contender, name in (("pallas", "pallas.matmul"), ("pallas_q", "pallas.matmul QArray")):
        kernel = [r for r in rows if r["contender"] == contender and r["status"] == "ok"]
        for gen in gens:
            mine = [r for r in kernel if r["generation"] == gen]
            if contender == "pallas_q" and not mine:
                continue
            for label, key, limit in (
                (
                    f"{name} traffic / (weight as stored + activations once + result)",
                    "bytes_over_stored",
                    KERNEL_TRAFFIC_LIMIT,
                ),
                (f"{name} temporaries outside the kernel (bytes)", "temp_outside_kernel",
                 OUTSIDE_TEMP_LIMIT),
            ):  # fmt: skip
                got = [r for r in mine if r.get(key) is not None]
                out.append(goal(label, key, limit, got, generation=gen))
    return out
