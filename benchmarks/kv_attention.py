"""Decode attention over a stored KV cache on every TPU generation, compile-only: what
``emulate.kvcache.attention`` moves against the cache's stored bytes, per cache format.

One layer of a decode step (default Llama-3-8B's: 16 sequences of 4096 tokens, 8 KV heads
of 128, 4 query heads each; every token visible), for each generation and format:

- kernel: the Pallas kernel's HBM traffic from its block specs and grid
  (:func:`benchmarks.pallas_traffic.kernel_traffic`) over the stored bytes it must read
  (K and V codes and scales, + the queries in and the output out);
- temporaries: the compiled program's temporaries (``memory_analysis``) over the stored
  cache (the issue's goal: under 1%);
- xla (with ``--xla``): the same call on the XLA route (``emulate.use_route("xla")``: the
  dequantizing einsums), libtpu's "bytes accessed" over the same ideal.

Run as ``python -m benchmarks.kv_attention --no-json`` (``--generations``, ``--caches``
comma lists; ``--shape B,KV,G,HD,S``; ``--xla``). Needs libtpu; a few seconds a program.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import emulate
from benchmarks import harness, provenance, units
from benchmarks.pallas_traffic import kernel_traffic
from emulate import compiler
from emulate.kvcache import FORMATS, KVCache, attention

GENERATIONS = ("tpu_v2", "tpu_v3", "tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e", "tpu_v7x")
#: batch, KV heads, query heads a KV head, head_dim, tokens (Llama-3-8B at decode-16)
SHAPE = (16, 8, 4, 128, 4096)


def specs(name: str, shape: tuple[int, ...]) -> tuple[Any, Any]:
    """Abstract bf16 queries (B, 1, KV * G, HD) and a one-layer cache of ``name``."""
    b, kv, g, hd, s = shape
    scales = {"k_scales": 1.0, "v_scales": 1.0} if name.endswith("_per_head") else {}
    cache = jax.eval_shape(lambda: KVCache.create(1, b, kv, hd, s, name, **scales))
    return jax.ShapeDtypeStruct((b, 1, kv * g, hd), jnp.bfloat16), cache


def measure(gen: str, name: str, shape: tuple[int, ...], xla: bool = False) -> dict[str, Any]:
    """One row: the kernel's traffic, the kernel program's temporaries and (``xla``) the
    XLA route's bytes for one layer, each against the stored bytes."""
    b, kv, g, hd, s = shape
    q, cache = specs(name, shape)
    stored = cache.nbytes - b * 4  # codes and scales, not the lengths
    ideal = stored + b * kv * g * hd * (2 + 2)  # bf16 queries in, bf16 output out
    visible = np.full((b,), s, np.int32)

    def fn(q: Any, c: Any) -> jax.Array:
        return attention(q, c, 0, visible=jnp.full((b,), s, jnp.int32), target=gen)

    with emulate.use_route("kernel"):
        moved = kernel_traffic(fn, (q, cache), gen, prefetch=lambda e: (visible, np.zeros(1)))
        kernel = compiler.compile(fn, q, cache, target=gen)
    xla_bytes = None
    if xla:
        with emulate.use_route("xla"):
            cost = compiler.compile(fn, q, cache, target=gen).cost_analysis() or {}
        xla_bytes = float(cost.get("bytes accessed") or 0.0)
    mem = kernel.memory_analysis()
    temp = int(mem.temp_size_in_bytes) if mem is not None else 0
    return {
        "generation": gen,
        "cache": name,
        "stored": stored,
        "ideal": ideal,
        "kernel_bytes": moved["bytes"],
        "kernel_over_ideal": moved["bytes"] / ideal,
        "temp": temp,
        "temp_over_cache": temp / stored,
        "xla_bytes": xla_bytes,
        "xla_over_ideal": None if xla_bytes is None else xla_bytes / ideal,
    }


def markdown(data: dict[str, Any]) -> str:
    lines = [f"`{data['command']}` (libtpu {data['libtpu']}; {data['wall_s']:.0f} s)", ""]
    lines += [
        "| generation | cache | stored MiB | kernel bytes / ideal | temporaries / cache | "
        "XLA route bytes / ideal |",
        "|---|---|---|---|---|---|",
    ]
    for r in data["results"]:
        xla = r["xla_over_ideal"]
        lines.append(
            f"| {r['generation']} | {r['cache']} | {r['stored'] / 2**20:.1f} | "
            f"{r['kernel_over_ideal']:.4f} | {100 * r['temp_over_cache']:.2f}% | "
            f"{units.MISSING if xla is None else format(xla, '.2f')} |"
        )
    return "\n".join(lines) + "\n"


def _names(text: str | None, known: tuple[str, ...], flag: str) -> list[str]:
    if text is None:
        return list(known)
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise harness.FlagError(f"{flag}: unknown {bad or text!r}; known: {', '.join(known)}")
    return names


def _shape(text: str | None) -> tuple[int, ...]:
    if text is None:
        return SHAPE
    try:
        shape = tuple(int(v) for v in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 5 or min(shape) <= 0:
        raise harness.FlagError(f"--shape: expected B,KV,G,HD,S of positive ints, got {text!r}")
    return shape


def run(args: argparse.Namespace) -> harness.Report:
    try:
        offered = compiler.generations()
    except compiler.CompilerUnavailable as e:
        raise harness.Unavailable(str(e)) from e
    gens = [g for g in _names(args.generations, GENERATIONS, "--generations") if g in offered]
    caches = _names(args.caches, tuple(FORMATS), "--caches")
    shape = _shape(args.shape)
    t0 = time.perf_counter()
    rows = [measure(g, c, shape, args.xla) for g in gens for c in caches]
    data = {
        "benchmark": "kv_attention",
        "command": args.command,
        "libtpu": compiler.libtpu_version(),
        "shape": shape,
        "environment": provenance.environment(),
        "wall_s": time.perf_counter() - t0,
        "results": rows,
    }
    return harness.Report(data, markdown(data), markdown=True)


def flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--generations", help=f"from: {', '.join(GENERATIONS)} (default all)")
    p.add_argument("--caches", help=f"from: {', '.join(FORMATS)} (default all)")
    p.add_argument("--shape", help="B,KV,G,HD,S (default 16,8,4,128,4096: Llama-3-8B)")
    p.add_argument("--xla", action="store_true", help="also compile the XLA route")


BENCHMARK = harness.Benchmark(
    name="kv_attention",
    description=__doc__.splitlines()[0],
    run=run,
    flags=flags,
)
main = BENCHMARK.main


if __name__ == "__main__":
    import sys

    sys.exit(main())
