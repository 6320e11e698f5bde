"""Timed on a real TPU: emulate.pallas.matmul on prepared checkpoint weights vs bf16.

``emulate.pallas.matmul`` on checkpoint weights prepared once (the schemes of
:mod:`benchmarks.qweights` as :func:`benchmarks.schemes.pallas_weight` prepares them,
:mod:`benchmarks.quantized`'s contender (d)) against the bf16 x bf16 floor of the same
shape, and each scheme with its offset term against the same weight without it.

Run as ``python -m benchmarks.pallas_qtime --no-json`` on a machine whose JAX backend is
a TPU (``--target`` names its generation, default tpu_v5e; ``--shape MxKxN``, default
64x4096x4096; ``--repeats``). Prints one line per contender: the median and min over
``--repeats`` runs (each ``block_until_ready``, after two warm-up runs) of one program that
calls the contender :data:`LOOP` times, divided by that count, and the ratios. The floor's
figure can come out below the time HBM needs for its weight (XLA may keep what a loop
reuses): compare (d) with (d); the floor is a reference at M = 1 at best. Nothing here
runs in a test (timings are no unit test's business).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import emulate
import emulate.pallas
from benchmarks import harness
from benchmarks.cases import parse_shape
from benchmarks.chip_programs import looped
from benchmarks.qweights import SCHEMES
from benchmarks.schemes import offset_pairs, pallas_weight

#: Calls per timed program: one call costs a few hundred microseconds of dispatch on the
#: lent machine, more than the kernel.
LOOP = 50


def _looped(f):
    """``f(x, w)`` called :data:`LOOP` times in one jitted program
    (:func:`benchmarks.chip_programs.looped`: each call's x depends on the previous
    result, so no call is hoisted out of the loop)."""
    return jax.jit(functools.partial(looped, call=f, loop=LOOP))


def _time(fn, *args, repeats: int) -> tuple[float, float]:
    """(median, min) seconds of one call of ``fn``'s function (``fn`` from :func:`_looped`)."""
    for _ in range(2):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t0) / LOOP)
    return statistics.median(times), min(times)


def run(args: argparse.Namespace) -> harness.Report:
    """Time (a) and (d) for every scheme on this machine's TPU; the report."""
    m, k, n = args.shape
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((k, n)), jnp.bfloat16)
    floor = _looped(lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32))
    f_med, f_min = _time(floor, x, w, repeats=args.repeats)
    kind = jax.devices()[0].device_kind
    lines = [
        f"`{args.command}`: {kind}, {m}x{k}x{n}, {args.repeats} repeats",
        "",
        f"(a) bf16 x bf16: median {f_med * 1e6:.1f} us, min {f_min * 1e6:.1f} us",
    ]
    rows = [{"contender": "floor", "median_s": f_med, "min_s": f_min}]
    call = _looped(
        lambda x, q: emulate.pallas.matmul(x, q, target=args.target, out_dtype=jnp.float32)
    )
    got = {}
    for name, scheme in SCHEMES.items():
        try:
            q = pallas_weight(scheme, scheme.build(k, n, np.random.default_rng(0)))
        except NotImplementedError as e:
            lines.append(f"(d) {name}: not built ({str(e)[:60]})")
            continue
        med, mn = _time(call, x, q, repeats=args.repeats)
        got[name] = med
        rows.append({"contender": "pallas", "pair": name, "median_s": med, "min_s": mn})
        lines.append(
            f"(d) {name}: median {med * 1e6:.1f} us ({med / f_med:.2f}x (a)), "
            f"min {mn * 1e6:.1f} us; weight {q.nbytes / 1e6:.2f} MB"
        )
    for base, name, ratio in offset_pairs(got):
        lines.append(f"offset term {base} / {name}: {ratio:.3f}")
    data = {"benchmark": "pallas_qtime", "command": args.command, "device": kind, "rows": rows}
    return harness.Report(data, "\n".join(lines) + "\n")


def flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="tpu_v5e", help="the TPU's generation (tpu_v5e)")
    p.add_argument("--shape", type=parse_shape, default=(64, 4096, 4096), help="MxKxN")


BENCHMARK = harness.Benchmark(
    name="pallas_qtime",
    description=__doc__.splitlines()[0],
    run=run,
    flags=flags,
    repeats=(7, 7),
    writes=False,
)
main = BENCHMARK.main

if __name__ == "__main__":
    main()
