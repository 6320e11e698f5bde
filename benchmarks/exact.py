"""Cost of mode "exact" against mode "fast", per format pair, in one process.

Run: ``python -m benchmarks.exact``; ``--quick`` for a small shape; ``--help`` for the
flags. Both modes run ``emulate.dot_general`` on the same operands for the same
target, interleaved after warm-up; the ratio is exact / fast of the medians. Each timed
call follows an untimed call of the same program (``--cold`` leaves that out): right after
a mode-exact program of another pair, whose temporaries are tens of MiB, a 1 ms fast call
measured 2 to 2.5x slower here, which says more about the case before it than about it.

``--compile`` times nothing: for each pair and target it lowers and compiles the jitted
mode-exact program (on the CPU) and reports its StableHLO lines and the XLA compile time
(process CPU seconds, the least of ``--repeats`` compiles after clearing JAX's caches).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import emulate
from benchmarks import harness, provenance, tables, timing, units
from benchmarks.cases import DN, parse_shape
from emulate import formats

SHAPE = (64, 4096, 1024)
QUICK_SHAPE = (256, 256, 256)
PAIRS = [
    ("float8_e4m3fn", "float8_e4m3fn"),
    ("float8_e5m2", "float8_e5m2"),
    ("float8_e4m3fn", "float8_e5m2"),
    ("float8_e3m4", "float8_e3m4"),
    ("float6_e3m2fn", "float6_e3m2fn"),
    ("bfloat16", "float8_e4m3fn"),  # activations (standard normal) x float8 weights
    ("bfloat16", "float8_e5m2"),
]


@dataclasses.dataclass
class Case:
    pair: tuple[str, str]
    target: str
    mode: str
    fn: Callable[..., Any]
    args: tuple
    times: list[float] = dataclasses.field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.pair[0]} x {self.pair[1]} {self.target} {self.mode}"

    warm: bool = True

    def run(self) -> float:
        if self.warm:
            jax.block_until_ready(self.fn(*self.args))
        return timing.timed_call(self.fn, *self.args)


def operand(
    name: str, shape: tuple[int, int], rng: np.random.Generator, far_below: bool = False
) -> np.ndarray:
    f = formats.get(name)
    if not f.is_low_precision:  # a wide activation: standard normal values
        x = rng.standard_normal(shape).astype(np.float32)
        if far_below:  # one element 2**-60 below the rest: a further block of slices runs
            x[0, 0] = 2.0**-60
        return jnp.asarray(x.astype(f.dtype))
    codes = rng.integers(0, 1 << f.bits, shape).astype(np.uint8)
    for bad in f.nan_codes + f.inf_codes:
        codes[codes == bad] = 0
    return jax.device_put(codes) if not f.xla_storable else jnp.asarray(codes.view(f.dtype))


def operand_pairs(args: argparse.Namespace, m: int, k: int, n: int):
    """``(pair, a, b, fa, fb)`` for each pair of ``--pairs``: the (M, K) and (K, N)
    operands (from one seeded generator, in order) and the format each is passed with
    (None where XLA holds it)."""
    rng = np.random.default_rng(0)
    pairs = PAIRS if not args.pairs else [tuple(p.split(":")) for p in args.pairs.split(",")]
    for pair in pairs:
        a = operand(pair[0], (m, k), rng, args.far_below)
        b = operand(pair[1], (k, n), rng, args.far_below)
        fa = pair[0] if not formats.get(pair[0]).xla_storable else None
        fb = pair[1] if not formats.get(pair[1]).xla_storable else None
        yield pair, a, b, fa, fb


def compile_sizes(args: argparse.Namespace) -> harness.Report:
    """StableHLO lines and XLA:CPU compile seconds of each mode-exact program."""
    m, k, n = args.shape or (QUICK_SHAPE if args.quick else SHAPE)
    rows, records = [], []
    for pair, a, b, fa, fb in operand_pairs(args, m, k, n):
        for target in args.targets.split(","):
            seconds = []
            for _ in range(args.repeats):
                jax.clear_caches()
                low = jax.jit(
                    lambda x, y, t=target, fa=fa, fb=fb: emulate.dot_general(
                        x,
                        y,
                        DN,
                        preferred_element_type=jnp.float32,
                        target=t,
                        mode="exact",
                        lhs_format=fa,
                        rhs_format=fb,
                    )
                ).lower(a, b)
                start = time.process_time()
                low.compile()
                seconds.append(time.process_time() - start)
            lines = len(low.as_text().splitlines())
            rows.append([f"{pair[0]} x {pair[1]}", target, str(lines), f"{min(seconds):.2f}"])
            records.append(dict(pair=pair, target=target, lines=lines, compile_s=min(seconds)))
    text = [
        f"mode exact programs, (M, K, N) = ({m}, {k}, {n}), f32 result: StableHLO lines and "
        f"XLA compile CPU seconds (least of {args.repeats})",
        tables.text_table(["pair", "target", "lines", "compile s"], rows, right={2, 3}),
    ]
    data = {"command": args.command, "env": provenance.environment(), "rows": records}
    return harness.Report(data, "\n".join(text) + "\n")


def run(args: argparse.Namespace) -> harness.Report:
    """Time both modes for every pair and target; the table and the JSON."""
    if args.compile:
        return compile_sizes(args)
    m, k, n = args.shape or (QUICK_SHAPE if args.quick else SHAPE)
    repeats = args.repeats
    cases = []
    for pair, a, b, fa, fb in operand_pairs(args, m, k, n):
        for target in args.targets.split(","):
            for mode in ("fast", "exact"):
                fn = jax.jit(
                    lambda x, y, t=target, md=mode, fa=fa, fb=fb: emulate.dot_general(
                        x,
                        y,
                        DN,
                        preferred_element_type=jnp.float32,
                        target=t,
                        mode=md,
                        lhs_format=fa,
                        rhs_format=fb,
                    )
                )
                cases.append(Case(pair, target, mode, fn, (a, b), warm=not args.cold))
    ok, failed = timing.interleave(cases, repeats)
    med = {c.label: timing.stats(c.times)["median_s"] for c in ok}
    rows, records = [], []
    for c in ok:
        if c.mode != "exact":
            continue
        fast = med[c.label.replace(" exact", " fast")]
        p = emulate.plan(*c.pair, target=c.target, mode="exact")
        sa, sb = (s.count for s in p.slicings())
        ratio = med[c.label] / fast
        rows.append(
            [
                f"{c.pair[0]} x {c.pair[1]}",
                c.target,
                p.method,
                f"{sa}x{sb}",
                units.ms(fast, places=2),
                units.ms(med[c.label], places=2),
                f"{ratio:.1f}x",
            ]
        )
        records.append(
            dict(
                pair=c.pair,
                target=c.target,
                method=p.method,
                passes=sa * sb,
                fast_s=fast,
                exact_s=med[c.label],
                ratio=ratio,
            )
        )
    lines = [
        f"mode exact against mode fast, (M, K, N) = ({m}, {k}, {n}), f32 result, "
        f"medians of {repeats} interleaved rounds",
        tables.text_table(
            ["pair", "target", "route", "slices", "fast ms", "exact ms", "exact/fast"],
            rows,
            right={4, 5, 6},
        ),
        *(f"failed: {label}: {why}" for label, why in failed.items()),
    ]
    data = {
        "command": args.command,
        "env": provenance.environment(),
        "shape": [m, k, n],
        "rows": records,
    }
    return harness.Report(data, "\n".join(lines) + "\n")


def flags(p: argparse.ArgumentParser) -> None:
    """exact's own flags."""
    p.add_argument(
        "--shape",
        type=parse_shape,
        help=f"MxKxN (default {units.shape_text(SHAPE)}, "
        f"{units.shape_text(QUICK_SHAPE)} with --quick)",
    )
    p.add_argument("--targets", default="tpu_v5e,tpu_v4", help="comma-separated targets")
    p.add_argument(
        "--pairs", default=None, help="comma-separated lhs:rhs pairs (default: all listed)"
    )
    p.add_argument(
        "--far-below",
        action="store_true",
        help="one wide-operand element 2**-60 below its row (the residual path)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="time nothing: each exact program's StableHLO lines and compile seconds",
    )
    p.add_argument(
        "--cold",
        action="store_true",
        help="time each call right after the previous case's (no untimed call before it)",
    )


BENCHMARK = harness.Benchmark(
    name="exact",
    description=__doc__.splitlines()[0],
    run=run,
    flags=flags,
    repeats=(5, 3),
    quick="M = K = N = 256, 3 repeats",
)
main = BENCHMARK.main


if __name__ == "__main__":
    sys.exit(main())
