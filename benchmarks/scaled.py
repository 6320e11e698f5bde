"""Matmul on block-scaled weights (QArray) against what a user would do instead, in one process.

Run: ``python -m benchmarks.scaled``; ``--quick`` for a small shape; ``--help`` for the
flags; ``--json PATH`` writes the figures. bf16 activations (M, K) times a (K, N) weight
quantized with each scheme along K. Contenders, interleaved after warm-up:

- ``dequantized``: the weight dequantized to bf16 once, before timing; a bf16 dot (the floor);
- ``dequantize + dot``: ``emulate.dequantize(w_q, to=bf16)`` then the dot, every call;
- ``emulate fast``: ``emulate.matmul(x, w_q)`` (segment by segment, scales applied to
  segment sums);
- ``emulate exact``: the same with ``mode="exact"``.

Ratios are medians over the floor's median from the same rounds.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import emulate
from benchmarks import harness, provenance, tables, timing, units
from benchmarks.cases import parse_shape
from emulate import mx

SHAPE = (64, 2048, 1024)
QUICK_SHAPE = (16, 512, 256)
SCHEMES = ["MXFP4", "MXFP8_E4M3", "MXINT8", "NVFP4", "INT4_G128"]


@dataclasses.dataclass
class Case:
    scheme: str
    name: str
    fn: Callable[..., Any]
    args: tuple
    times: list[float] = dataclasses.field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.scheme} {self.name}"

    def run(self) -> float:
        return timing.timed_call(self.fn, *self.args)


def cases(scheme: str, m: int, k: int, n: int, target: str) -> list[Case]:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    w = rng.standard_normal((k, n)).astype(np.float32)
    w_q = emulate.quantize(w, mx.SCHEMES[scheme], axis=0)
    w_bf16 = emulate.dequantize(w_q, to=jnp.bfloat16)
    dot = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
    deq = jax.jit(
        lambda a, q: jnp.dot(
            a, emulate.dequantize(q, to=jnp.bfloat16), preferred_element_type=jnp.float32
        )
    )
    out = [
        Case(scheme, "dequantized", dot, (x, w_bf16)),
        Case(scheme, "dequantize + dot", deq, (x, w_q)),
        Case(
            scheme,
            "emulate fast",
            jax.jit(lambda a, q: emulate.matmul(a, q, target=target)),
            (x, w_q),
        ),
    ]
    exact = jax.jit(lambda a, q: emulate.matmul(a, q, target=target, mode="exact"))
    out.append(Case(scheme, "emulate exact", exact, (x, w_q)))
    return out


def run(args: argparse.Namespace) -> harness.Report:
    """Time every scheme's contenders; the table and the JSON."""
    m, k, n = args.shape or (QUICK_SHAPE if args.quick else SHAPE)
    rows: list[list[str]] = []
    record: dict = {
        "command": args.command,
        "environment": provenance.environment(),
        "shape": [m, k, n],
        "results": [],
    }
    for scheme in args.schemes.split(","):
        ran, failed = timing.interleave(cases(scheme, m, k, n, args.target), args.repeats)
        floor = timing.stats(ran[0].times)["median_s"]
        for c in ran:
            st = timing.stats(c.times)
            ratio = st["median_s"] / floor
            rows.append([scheme, c.name, f"{units.ms(st['median_s'], 2)} ms", f"{ratio:.2f}x"])
            record["results"].append({"scheme": scheme, "case": c.name, **st, "ratio": ratio})
        for label, why in failed.items():
            rows.append([scheme, label, "n/a", why])
    text = "\n".join(
        [
            f"bf16 x QArray, M x K x N = {m} x {k} x {n}, target {args.target}",
            tables.text_table(["scheme", "contender", "median", "ratio"], rows, right={2, 3}),
        ]
    )
    return harness.Report(record, text + "\n")


def flags(p: argparse.ArgumentParser) -> None:
    """scaled's own flags."""
    p.add_argument(
        "--shape",
        type=parse_shape,
        help=f"MxKxN (default {units.shape_text(SHAPE)}, "
        f"{units.shape_text(QUICK_SHAPE)} with --quick)",
    )
    p.add_argument("--schemes", default=",".join(SCHEMES))
    p.add_argument("--target", default="cpu")


BENCHMARK = harness.Benchmark(
    name="scaled",
    description=__doc__.splitlines()[0],
    run=run,
    flags=flags,
    repeats=(7, 3),
    quick="16x512x256, 3 repeats",
    writes=False,
)
main = BENCHMARK.main


if __name__ == "__main__":
    sys.exit(main())
