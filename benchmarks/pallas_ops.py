"""The vector work in emulate.pallas.matmul's kernel body, per scheme (compile-only).

A Pallas kernel gets no time estimate from the compiler; what its K step asks of the
vector unit can still be read from the Mosaic module the kernel lowers to. For each
checkpoint scheme of :mod:`benchmarks.qweights` (prepared once by
:func:`benchmarks.schemes.pallas_weight`, :mod:`benchmarks.quantized`'s contender (d)) at one
shape, this lowers ``emulate.pallas.matmul`` for a compile-only TPU device and counts,
in the kernel body (one K step; Mosaic's own canonicalization not applied): the ops,
the ``tpu.matmul`` ops, and the vector elements produced by every other op (the sum of
their result vectors' sizes: a rough measure of vector-unit work per step). Ratios
between schemes of the same block shape (Q4_K with and without mins; AWQ with and
without zero points) are what to compare; a real chip's time is
:mod:`benchmarks.pallas_qtime`'s business.

Run as ``python -m benchmarks.pallas_ops --no-json`` (``--target``, default tpu_v5e;
``--shape MxKxN``, default 64x4096x4096). Needs libtpu (``pip install "jax[tpu]"``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.sharding import SingleDeviceSharding

import emulate
import emulate.pallas
from benchmarks import harness
from benchmarks.cases import parse_shape
from benchmarks.qweights import SCHEMES
from benchmarks.schemes import offset_pairs, pallas_weight
from emulate.compiler import devices

_OP = re.compile(r'= "?([a-z_]+\.[a-z_.]+)')
_VECTOR = re.compile(r"vector<([0-9x]+)x[a-z]")


def count(module: str) -> dict[str, int]:
    """Ops, matmuls and vector elements produced by the other vector ops of a Mosaic
    module's text (``pallas_call(..., debug=True)``'s print)."""
    ops = matmuls = elems = 0
    for line in module.splitlines():
        m = _OP.search(line)
        if not m:
            continue
        ops += 1
        if m.group(1) == "tpu.matmul":
            matmuls += 1
            continue
        shapes = _VECTOR.findall(line.split("->")[-1])
        if shapes and m.group(1).startswith(("arith.", "math.", "vector.", "tpu.")):
            elems += int(np.prod([int(d) for d in shapes[-1].split("x")]))
    return {"ops": ops, "matmuls": matmuls, "vector_elements": elems}


def _module(target: str, shape: tuple[int, int, int], q) -> str:
    """The Mosaic module text of the (d) kernel on ``q`` for ``target``."""
    m, k, _ = shape
    dev = devices.device(target)
    sh = SingleDeviceSharding(dev)
    x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16, sharding=sh)
    qs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), q)

    def f(x, q):
        return emulate.pallas.matmul(x, q, target=target, out_dtype=jnp.float32, interpret=False)

    orig = pl.pallas_call
    buf = io.StringIO()
    try:
        pl.pallas_call = lambda *a, **kw: orig(*a, **{**kw, "debug": True})
        with contextlib.redirect_stdout(buf), devices.on_device(dev):
            jax.jit(f).lower(x, qs)
    finally:
        pl.pallas_call = orig
    text = buf.getvalue()
    return text[text.find("module") :]


def run(args: argparse.Namespace) -> harness.Report:
    """Count each scheme's kernel body; the report."""
    m, k, n = args.shape
    lines = [
        f"`{args.command}`: {args.target}, {m}x{k}x{n}",
        "",
        "| scheme | ops | tpu.matmul | vector elements (M) |",
        "|---|---|---|---|",
    ]
    rows, got = [], {}
    for name, scheme in SCHEMES.items():
        try:
            q = pallas_weight(scheme, scheme.build(k, n, np.random.default_rng(0)))
        except NotImplementedError:
            continue
        c = count(_module(args.target, args.shape, q))
        got[name] = c["vector_elements"]
        rows.append({"scheme": name, **c})
        lines.append(
            f"| {scheme.title} | {c['ops']} | {c['matmuls']} | {c['vector_elements'] / 1e6:.2f} |"
        )
    lines.append("")
    for base, name, ratio in offset_pairs(got):
        lines.append(f"vector elements {base} / {name}: {ratio:.2f}")
    data = {"benchmark": "pallas_ops", "command": args.command, "rows": rows}
    return harness.Report(data, "\n".join(lines) + "\n")


def flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="tpu_v5e", help="the TPU generation (tpu_v5e)")
    p.add_argument("--shape", type=parse_shape, default=(64, 4096, 4096), help="MxKxN")


BENCHMARK = harness.Benchmark(
    name="pallas_ops",
    description=__doc__.splitlines()[0],
    run=run,
    flags=flags,
    repeats=None,
    writes=False,
)
main = BENCHMARK.main

if __name__ == "__main__":
    main()
