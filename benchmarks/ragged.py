"""Grouped (mixture-of-experts) matmuls, compile-only on TPU generations: the bytes each
route moves, against the stored bytes of the experts that have rows.

Routes: ``emulate.pallas.ragged_dot`` (one grouped kernel reading each routed expert's
weight as stored), ``emulate.ragged_dot``'s XLA route (every row against every expert,
then each row's own), and ``lax.ragged_dot`` on bf16 experts decoded up front (the
obvious alternative, twice the weight bytes in HBM). XLA's numbers are the compiler's
``bytes accessed`` (libtpu's cost analysis); a Pallas call counts in neither bytes nor
flops there, so the kernel's weight traffic is counted from its block specs and schedule
(:func:`emulate.pallas.gmm_kernel.weight_fetches`: the copies the Pallas pipeline makes)
and its activation and output traffic added as one read of x per weight block row and one
write of the output. Nothing runs; the kernel is compiled too, to show that it lowers.

    python -m benchmarks.ragged
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
from jax import lax

import emulate
from benchmarks import harness
from emulate import compiler
from emulate.pallas import gmm_kernel

#: (name, rows, K, N, experts, rows per expert): a decode step (8 tokens x top-2 over 4 of
#: 8 experts) and a prefill (2048 rows over all 8).
CASES = [
    ("decode", 16, 2048, 2048, 8, (4, 4, 4, 4, 0, 0, 0, 0)),
    ("prefill", 2048, 2048, 2048, 8, (256,) * 8),
]
TARGETS = ("tpu_v2", "tpu_v4", "tpu_v5e")
WEIGHTS = ("int8", "float8_e4m3fn")


def _bytes(fn, *specs, target: str) -> float:
    cost = compiler.compile(fn, *specs, target=target).cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["bytes accessed"])


def _with_sizes(fn, group_sizes, lhs, rhs):
    return fn(lhs, rhs, group_sizes)


def _kernel_bytes(rows: int, k: int, n: int, sizes: tuple[int, ...]) -> int:
    """Weight blocks copied (1 byte an element) + x once per (visit, column block) + out."""
    bm, bn, bk = min(256, -(-rows // 16) * 16), min(256, n), min(512, k)
    fetches = gmm_kernel.weight_fetches(list(sizes), rows, k, n, (bm, bn, bk))
    visits = len(fetches) // (-(-k // bk))  # real (visit, column block) pairs
    return len(fetches) * bk * bn + visits * bm * k * 2 + rows * n * 4


def run(args: argparse.Namespace) -> None:
    """Print the table (nothing to write: the figures go to docs/performance.md by hand)."""
    print("| case | target | weights | routed stored | kernel | XLA route | lax bf16 |")
    print("|---|---|---|---|---|---|---|")
    for name, rows, k, n, e, sizes in CASES:
        routed = sum(1 for s in sizes if s) * k * n
        gs = jnp.array(sizes, jnp.int32)
        for target in TARGETS:
            for wname in WEIGHTS:
                x = jax.ShapeDtypeStruct((rows, k), jnp.bfloat16)
                w = jax.ShapeDtypeStruct((e, k, n), jnp.dtype(wname))
                wb = jax.ShapeDtypeStruct((e, k, n), jnp.bfloat16)
                g = jax.ShapeDtypeStruct((e,), jnp.int32)
                kernel = functools.partial(
                    gmm_kernel.ragged_dot, target=target, out_dtype="float32", interpret=False
                )
                compiler.compile(kernel, x, w, g, target=target)  # it lowers and compiles
                xla = functools.partial(
                    emulate.ragged_dot, preferred_element_type=jnp.float32, target=target
                )
                plain = functools.partial(lax.ragged_dot, preferred_element_type=jnp.float32)
                kb = _kernel_bytes(rows, k, n, sizes)
                xb = _bytes(functools.partial(_with_sizes, xla, gs), x, w, target=target)
                pb = _bytes(functools.partial(_with_sizes, plain, gs), x, wb, target=target)
                print(
                    f"| {name} | {target} | {wname} | {routed / 2**20:.1f} MiB | "
                    f"{kb / routed:.2f}x | {xb / routed:.2f}x | {pb / routed:.2f}x |",
                    flush=True,
                )


BENCHMARK = harness.Benchmark(
    name="ragged",
    description=__doc__.splitlines()[0],
    run=run,
    writes=False,
)
main = BENCHMARK.main

if __name__ == "__main__":
    main()
