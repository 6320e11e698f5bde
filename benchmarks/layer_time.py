"""Timed on a real TPU: one Llama-3-8B-shaped decoder layer's seven projections, three ways.

The projections (q, k, v, o, gate, up, down; K x N 4096x4096, 4096x1024 twice, 4096x4096,
4096x14336 twice, 14336x4096) multiply bf16 activations of M rows by

* ``bf16``: dense bfloat16 weights through ``jnp.matmul`` (the model a port replaces);
* ``xla``: GGUF Q4_K QArrays (:func:`benchmarks.qweights.q4_k_weight`, as loaded) through
  ``emulate.matmul`` under ``emulate.use_route("xla")``, the route every front end took
  before the kernel route;
* ``kernel``: the same QArrays prepared once (:func:`emulate.prepare_weights`) through
  ``emulate.matmul`` with the default route, which on a TPU is ``emulate.pallas.matmul``.

Run as ``python -m benchmarks.layer_time`` on a machine whose JAX backend is a TPU
(``--rows`` the values of M, ``--repeats``, ``--hbm-gbs``). Each contender is one program
calling the layer :data:`LOOP` times in a ``fori_loop`` (each call's input depends on the
previous output, so no call is hoisted), timed with ``block_until_ready`` after two
warm-up runs; the figure is the median over ``--repeats`` runs divided by :data:`LOOP`. It
prints one line per (M, contender) with the ratio to ``bf16`` and the time HBM needs to
read each contender's weights at ``--hbm-gbs`` (default 819, TPU v5e). Nothing here runs
in a test.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import emulate
from benchmarks import harness
from benchmarks.chip_programs import PROJECTIONS, layer
from benchmarks.qweights import q4_k_weight

#: Layer calls per timed program.
LOOP = 20


def _looped(ws: dict[str, Any]) -> Callable[[jax.Array], jax.Array]:
    def run(x: jax.Array) -> jax.Array:
        def body(_, c):
            return layer(x + (c * 0).astype(x.dtype), ws)[:, : x.shape[1]] * 0 + c

        return jax.lax.fori_loop(0, LOOP, body, jnp.zeros(x.shape, jnp.float32))

    return jax.jit(run)


def _seconds(fn: Callable[[jax.Array], jax.Array], x: jax.Array, repeats: int) -> float:
    for _ in range(2):
        jax.block_until_ready(fn(x))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(x))
        times.append((time.perf_counter() - t0) / LOOP)
    return statistics.median(times)


def _nbytes(tree: Any) -> int:
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in jax.tree.leaves(tree))


def run(args: argparse.Namespace) -> harness.Report:
    """Time the three contenders at each M; the report."""
    rng = np.random.default_rng(0)
    quantized = {n: q4_k_weight(k, nn, rng).T for n, k, nn in PROJECTIONS}  # (K, N)
    prepared = emulate.prepare_weights(quantized)
    dense = {
        n: jnp.asarray(rng.standard_normal((k, nn), np.float32) * 0.02, jnp.bfloat16)
        for n, k, nn in PROJECTIONS
    }
    kind = jax.devices()[0].device_kind
    lines = [f"`{args.command}`: {jax.default_backend()} {kind}, {args.repeats} repeats", ""]
    rows = []
    for m in args.rows:
        x = jnp.asarray(rng.standard_normal((m, 4096)), jnp.bfloat16)
        floor = None
        for name, ws, route in (
            ("bf16", dense, "auto"),
            ("xla", quantized, "xla"),
            ("kernel", prepared, "auto"),
        ):
            with emulate.use_route(route):
                s = _seconds(_looped(ws), x, args.repeats)
            floor = floor or s
            read = _nbytes(ws) / (args.hbm_gbs * 1e9)
            rows.append({"M": m, "contender": name, "median_s": s, "weight_bytes": _nbytes(ws)})
            lines.append(
                f"M={m:4d} {name:7s} {s * 1e6:9.1f} us/layer  {s / floor:6.2f}x bf16  "
                f"weights {_nbytes(ws) / 1e6:7.1f} MB (HBM read {read * 1e6:7.1f} us)"
            )
    data = {"benchmark": "layer_time", "command": args.command, "device": kind, "rows": rows}
    return harness.Report(data, "\n".join(lines) + "\n")


def flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rows", type=lambda v: [int(m) for m in v.split(",")], default=[1, 64],
        help="values of M, comma-separated (1,64)",
    )  # fmt: skip
    p.add_argument("--hbm-gbs", type=float, default=819.0, help="HBM bandwidth, GB/s (v5e)")


BENCHMARK = harness.Benchmark(
    name="layer_time",
    description=__doc__.splitlines()[0],
    run=run,
    flags=flags,
    repeats=(5, 5),
    writes=False,
)
main = BENCHMARK.main

if __name__ == "__main__":
    main()
