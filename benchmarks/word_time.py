"""Timed on a real TPU: emulate.pallas.matmul at decode (the word step) against bf16.

Self-contained (jax, numpy and ml_dtypes only: no numba, flax or gguf), for a lent chip,
run from the repository root (emulate need not be installed)::

    python -m benchmarks.word_time --json $OUT/word_time.json --commit <sha>

(``--rows 1,16``, ``--repeats``, ``--hbm-gbs``, ``--schemes``, ``--shapes KxN,...``,
``--no-check``, ``--budget-s``; ``--commit`` defaults to ``git rev-parse HEAD`` where a
git checkout is there). For each scheme and shape it builds a weight with numpy
(:func:`benchmarks.chip_programs.word_weight`: GGUF Q4_K-like two-level scales and mins,
GGUF Q6_K-like 6-bit codes with int8 scales times a float16 d, AWQ-like float16 scales
and packed zero points per 128 rows, plain int4, MXFP4, NVFP4
with its tensor scale, bitsandbytes NF4; the same kernel paths as the checkpoints'
weights), prepares it once, and times one program calling ``emulate.pallas.matmul``
:data:`LOOP` times in a ``fori_loop`` (each call's input depending on the previous
result) against the same loop over ``jnp.dot`` with the bf16 weight, median over
``--repeats`` runs after two warm-ups, divided by :data:`LOOP`; and prints the time HBM
needs to read each weight at ``--hbm-gbs`` (default 819, v5e). It first compares every
kernel's result with the float64 product of the weight's exact values (bit for bit where
every partial sum is exact: integer-valued activations and power-of-two scales; NF4,
whose f32 table makes no sum exact: its largest relative error), on the chip itself
(``--no-check`` skips it). Cases left when ``--budget-s`` seconds have passed (default
420: the default run takes well under that on a v5e) are listed as skipped. It prints
one line per case and writes the raw JSON (device kind, target, jax / jaxlib / libtpu
versions, commit, command, date, every timing) to ``--json``. Nothing here runs in a
test.
"""

from __future__ import annotations

import argparse
import functools
import json
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import emulate
import emulate.pallas
from benchmarks.chip_programs import looped
from benchmarks.chip_programs import word_weight as weight
from benchmarks.provenance import provenance

#: Calls per timed program (one call alone costs hundreds of us of dispatch on a lent chip).
LOOP = 50
SCHEMES = ("q4_k", "q6_k", "awq", "int4", "mxfp4", "nvfp4", "nf4")
#: Schemes whose partial sums cannot all be exact (a codebook's f32 entries): the check
#: reports their largest relative error instead of bits.
_INEXACT = ("nf4",)


def _looped(f: Callable[[jax.Array, Any], jax.Array]) -> Callable[..., jax.Array]:
    return jax.jit(functools.partial(looped, call=f, loop=LOOP))


def _seconds(fn: Callable[..., jax.Array], *args: Any, repeats: int) -> dict[str, Any]:
    """Median, minimum and every time of one call (a program of :data:`LOOP` calls divided
    by LOOP) after two warm-ups, the first of which compiles."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t0) / LOOP)
    return {
        "seconds": statistics.median(times),
        "min_s": min(times),
        "times_s": times,
        "first_call_s": first,
    }


def _nbytes(w: Any) -> int:
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in jax.tree.leaves(w))


def check(schemes: list[str], rows: list[int], target: str | None = None) -> list[dict[str, Any]]:
    """The kernel on this machine against the float64 oracle (module docstring): one row
    per scheme and M, with the count of elements whose bits differ."""
    out = []
    rng = np.random.default_rng(0)
    for kind in schemes:
        for m in rows:
            k, n = 2304, 640  # two K steps, a partial last block, a ragged column block
            w, wv = weight(kind, k, n, rng, pow2=True)
            xi = rng.integers(-8, 9, (m, k))
            x = jnp.asarray(xi.astype(ml_dtypes.bfloat16))
            got = np.asarray(
                emulate.pallas.matmul(
                    x, emulate.pallas.prepare_weight(w), target=target, out_dtype=jnp.float32
                )
            )
            exact = xi.astype(np.float64) @ wv
            want = exact.astype(np.float32)
            same = got.view(np.uint32) == want.view(np.uint32)
            rel = np.abs(got - exact).max() / max(np.abs(exact).max(), 1e-30)
            out.append(
                {
                    "scheme": kind,
                    "m": m,
                    "k": k,
                    "n": n,
                    "differ": int((~same).sum()),
                    "of": same.size,
                    "max_rel_error": float(rel),
                    "exact_sums": kind not in _INEXACT,
                }
            )
    return out


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every case on this machine (module docstring): the report as a JSON-able dict,
    each line logged as it is measured."""
    dev = jax.devices()[0]
    target = args.target or emulate.targets.from_device(dev).name
    data: dict[str, Any] = {
        **provenance("word_time", args.command, args.commit),
        "target": target,
        "loop": LOOP,
        "repeats": args.repeats,
        "hbm_gbs": args.hbm_gbs,
    }
    log(f"{dev.device_kind} ({target}), jax {jax.__version__}, libtpu {data['libtpu']}, "
        f"LOOP {LOOP}, {args.repeats} repeats")  # fmt: skip
    start = time.perf_counter()
    if args.check:
        data["check"] = check(args.schemes, args.rows, target)
        for c in data["check"]:
            verdict = "bit for bit" if not c["differ"] else f"{c['differ']} of {c['of']} differ"
            if not c["exact_sums"]:  # a codebook's f32 entries: rounded partial sums
                verdict = f"largest error {c['max_rel_error']:.2e} of the largest result"
            log(f"check {c['scheme']} M={c['m']}: {verdict}")
    rng = np.random.default_rng(1)
    call = _looped(lambda x, w: emulate.pallas.matmul(x, w, target=target, out_dtype=jnp.float32))
    dense = _looped(lambda x, w: jnp.dot(x, w, preferred_element_type=jnp.float32))
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    for k, n in args.shapes:
        weights: dict[str, Any] = {}
        for m in args.rows:
            if time.perf_counter() - start > args.budget_s:
                skipped += [f"{m}x{k}x{n} {s}" for s in ["bf16", *args.schemes]]
                continue
            x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
            if "bf16" not in weights:
                weights["bf16"] = jnp.asarray(rng.standard_normal((k, n)), jnp.bfloat16)
            bf16 = _seconds(dense, x, weights["bf16"], repeats=args.repeats)
            bf16.update(scheme="bf16", m=m, k=k, n=n, nbytes=k * n * 2)
            rows.append(bf16)
            log(f"{m}x{k}x{n} bf16: {bf16['seconds'] * 1e6:.1f} us "
                f"(HBM {k * n * 2 / args.hbm_gbs / 1e3:.1f} us)")  # fmt: skip
            for kind_ in args.schemes:
                if kind_ not in weights:
                    weights[kind_] = emulate.pallas.prepare_weight(weight(kind_, k, n, rng)[0])
                w = weights[kind_]
                row = _seconds(call, x, w, repeats=args.repeats)
                row.update(scheme=kind_, m=m, k=k, n=n, nbytes=_nbytes(w))
                rows.append(row)
                t, hbm = row["seconds"], row["nbytes"] / (args.hbm_gbs * 1e9)
                log(f"{m}x{k}x{n} {kind_}: {t * 1e6:.1f} us, {t / hbm:.2f}x of its bytes at "
                    f"{args.hbm_gbs:g} GB/s ({hbm * 1e6:.1f} us), "
                    f"{t / bf16['seconds']:.2f}x of bf16")  # fmt: skip
    data.update(rows=rows, skipped=skipped, wall_s=time.perf_counter() - start)
    if skipped:
        log(f"skipped after {args.budget_s:g} s: {', '.join(skipped)}")
    return data


def _shape(s: str) -> tuple[int, int]:
    k, n = s.split("x")
    return int(k), int(n)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=lambda s: [int(v) for v in s.split(",")], default=[1, 16])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--hbm-gbs", type=float, default=819.0)
    p.add_argument("--schemes", type=lambda s: s.split(","), default=list(SCHEMES))
    p.add_argument(
        "--shapes",
        type=lambda s: [_shape(v) for v in s.split(",")],
        default=[(4096, 14336), (14336, 4096)],
    )
    p.add_argument("--check", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--target", default=None, help="the TPU's generation (default: detected)")
    p.add_argument("--json", type=Path, default=None, help="where to write the raw JSON")
    p.add_argument("--commit", default=None, help="the commit measured (default: git's HEAD)")
    p.add_argument("--budget-s", type=float, default=420.0)
    args = p.parse_args(argv)
    args.command = shlex.join([Path(sys.executable).name, "-m", "benchmarks.word_time", *(
        sys.argv[1:] if argv is None else argv)])  # fmt: skip
    data = run(args, lambda line: print(line, flush=True))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.json}", flush=True)


if __name__ == "__main__":
    main()
