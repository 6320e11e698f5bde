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

The MXFP4 cases are gpt-oss-20B-shaped (32 experts, top-4, the gate/up projection: K =
2880, N = 2 * 2880): e2m1 codes packed along K with e8m0 scales per 32 rows, as the
checkpoint stores them; the kernel's traffic adds the scale blocks it copies (all of an
expert's groups for a column block, on each visit) and counts partial edge blocks by
their real bytes. ``--mxfp4`` runs only those.

    python -m benchmarks.ragged [--mxfp4] [--json PATH]
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

import emulate
from benchmarks import harness
from benchmarks.tables import markdown_table
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
#: gpt-oss-20B-like MXFP4 experts: (name, rows, K, N, experts, rows per expert): one token
#: (top-4 of 32) and 16 tokens spread over 16 experts.
MXFP4_CASES = [
    ("decode 1 token", 4, 2880, 5760, 32, (1, 1, 1, 1) + (0,) * 28),
    ("decode 16 tokens", 64, 2880, 5760, 32, (4,) * 16 + (0,) * 16),
]
MXFP4_TARGETS = ("tpu_v2", "tpu_v5e")
#: the MXFP4 kernel's blocks (bm, bn, bk): 16 rows (each visit reads its row tile of x
#: again for each column block: a short tile and wide columns keep that small), 512
#: columns, 512 rows of K (16 groups of 32)
MXFP4_BM, MXFP4_BN, MXFP4_BK = 16, 512, 512


def _bytes(fn, *specs, target: str) -> float:
    cost = compiler.compile(fn, *specs, target=target).cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["bytes accessed"])


def _with_sizes(fn, group_sizes, lhs, rhs):
    return fn(lhs, rhs, group_sizes)


def _blocks(rows: int, k: int, n: int) -> tuple[int, int, int]:
    """The dense cases' blocks (bm, bn, bk), passed to the kernel and counted."""
    return min(256, -(-rows // 16) * 16), min(256, n), min(512, k)


def _kernel_bytes(rows: int, k: int, n: int, sizes: tuple[int, ...]) -> int:
    """Weight blocks copied (1 byte an element) + x once per (visit, column block) + out."""
    bm, bn, bk = _blocks(rows, k, n)
    fetches = gmm_kernel.weight_fetches(list(sizes), rows, k, n, (bm, bn, bk))
    visits = len(fetches) // (-(-k // bk))  # real (visit, column block) pairs
    return len(fetches) * bk * bn + visits * bm * k * 2 + rows * n * 4


def _ratio(fn, *specs, target: str, routed: int) -> str:
    """``bytes accessed / routed`` of ``fn``, or why the compiler refused it (on v2 the
    XLA route's temporaries for 32 gpt-oss experts pass the core's 8 GiB of HBM)."""
    try:
        return f"{_bytes(fn, *specs, target=target) / routed:.2f}x"
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        return "out of HBM: " + str(e).split("RESOURCE_EXHAUSTED: ")[-1].split(". ")[0]


def _mxfp4(x, codes, scales, group_sizes, fn, k: int):
    """``fn(x, q, group_sizes)`` on the QArray experts the stored arrays make."""
    q = emulate.QArray.from_parts(
        emulate.Packed(codes, "float4_e2m1fn", -2, k), scales, block_shape=(1, 32, 1)
    )
    return fn(x, q, group_sizes)


def _mxfp4_kernel_bytes(rows: int, k: int, n: int, sizes: tuple[int, ...], bm: int) -> int:
    """Weight blocks copied (their real bytes: bk / 2 rows of bytes, edge blocks cut),
    the scale blocks (every group, a column block) copied on each change of expert or
    column block, x once per (visit, column block), the f32 output once."""
    blocks = (bm, MXFP4_BN, MXFP4_BK)
    fetches = gmm_kernel.weight_fetches(list(sizes), rows, k, n, blocks)
    weight = sum(
        (min(MXFP4_BK, k - kb * MXFP4_BK) // 2) * min(MXFP4_BN, n - j * MXFP4_BN)
        for _, kb, j in fetches
    )
    nk = -(-k // MXFP4_BK)
    visits = sum(1 for _, kb, _ in fetches if kb == 0)  # (visit, column block) pairs
    scales = sum(k // 32 * min(MXFP4_BN, n - j * MXFP4_BN) for _, kb, j in fetches if kb == 0)
    assert len(fetches) == visits * nk
    return weight + scales + visits * min(bm, rows) * k * 2 + rows * n * 4


def _xla_route(*args: Any, **kwargs: Any) -> jax.Array:
    """``emulate.ragged_dot`` on its XLA route (on a TPU target route "auto" takes the
    grouped kernel, the column beside it)."""
    with emulate.use_route("xla"):
        return emulate.ragged_dot(*args, **kwargs)


def mxfp4() -> list[dict[str, Any]]:
    """The gpt-oss-like MXFP4 rows: bytes over the routed experts' stored bytes (the XLA
    routes' as text: a ratio, or why the compiler refused)."""
    out = []
    for name, rows, k, n, e, sizes in MXFP4_CASES:
        routed = sum(1 for s in sizes if s) * (k * n // 2 + k // 32 * n)
        gs = jnp.array(sizes, jnp.int32)
        bm = MXFP4_BM
        x = jax.ShapeDtypeStruct((rows, k), jnp.bfloat16)
        codes = jax.ShapeDtypeStruct((e, k // 2, n), jnp.uint8)
        scales = jax.ShapeDtypeStruct((e, k // 32, n), jnp.float8_e8m0fnu)
        wb = jax.ShapeDtypeStruct((e, k, n), jnp.bfloat16)
        for target in MXFP4_TARGETS:
            kernel = functools.partial(
                gmm_kernel.ragged_dot, target=target, out_dtype="float32", interpret=False,
                block_shape=(bm, MXFP4_BN, MXFP4_BK),
            )  # fmt: skip
            kfn = functools.partial(_mxfp4, group_sizes=gs, fn=kernel, k=k)
            compiler.compile(kfn, x, codes, scales, target=target)  # it lowers and compiles
            xla = functools.partial(_xla_route, preferred_element_type=jnp.float32, target=target)
            xb = _ratio(functools.partial(_mxfp4, group_sizes=gs, fn=xla, k=k), x, codes,
                        scales, target=target, routed=routed)  # fmt: skip
            plain = functools.partial(lax.ragged_dot, preferred_element_type=jnp.float32)
            pb = _ratio(functools.partial(_with_sizes, plain, gs), x, wb, target=target,
                        routed=routed)  # fmt: skip
            kb = _mxfp4_kernel_bytes(rows, k, n, sizes, bm)
            out.append({"case": name, "target": target, "weights": "mxfp4",
                        "routed_bytes": routed, "kernel": kb / routed, "xla": xb,
                        "lax_bf16": pb})  # fmt: skip
            print(f"{name} {target}: done", file=sys.stderr, flush=True)
    return out


def dense() -> list[dict[str, Any]]:
    """The one-byte experts' rows: bytes over the routed experts' stored bytes."""
    out = []
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
                    gmm_kernel.ragged_dot, target=target, out_dtype="float32",
                    interpret=False, block_shape=_blocks(rows, k, n),
                )  # fmt: skip
                compiler.compile(kernel, x, w, g, target=target)  # it lowers and compiles
                xla = functools.partial(
                    _xla_route, preferred_element_type=jnp.float32, target=target
                )
                plain = functools.partial(lax.ragged_dot, preferred_element_type=jnp.float32)
                kb = _kernel_bytes(rows, k, n, sizes)
                xb = _bytes(functools.partial(_with_sizes, xla, gs), x, w, target=target)
                pb = _bytes(functools.partial(_with_sizes, plain, gs), x, wb, target=target)
                out.append({"case": name, "target": target, "weights": wname,
                            "routed_bytes": routed, "kernel": kb / routed,
                            "xla": f"{xb / routed:.2f}x",
                            "lax_bf16": f"{pb / routed:.2f}x"})  # fmt: skip
                print(f"{name} {target} {wname}: done", file=sys.stderr, flush=True)
    return out


def table(rows: list[dict[str, Any]], places: int) -> list[str]:
    """Markdown lines of ``rows``: case, target, weights, the routed experts' stored MiB,
    and each route's bytes over them (the kernel's with ``places`` decimals)."""
    heads = ["case", "target", "weights", "routed stored", "kernel", "XLA route", "lax bf16"]
    return markdown_table(heads, [
        (r["case"], r["target"], r["weights"], f"{r['routed_bytes'] / 2**20:.1f} MiB",
         f"{r['kernel']:.{places}f}x", r["xla"], r["lax_bf16"])
        for r in rows
    ])  # fmt: skip


def run(args: argparse.Namespace) -> harness.Report:
    """The one-byte experts' rows (unless ``--mxfp4``), then the MXFP4 rows: their tables
    and the JSON."""
    lines, rows = [], []
    if not args.mxfp4:
        rows += dense()
        lines += [*table(rows, 2), ""]
    mx = mxfp4()
    rows += mx
    lines += table(mx, 3)
    return harness.Report({"benchmark": "ragged", "rows": rows}, "\n".join(lines) + "\n")


def flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mxfp4", action="store_true", help="the gpt-oss-like MXFP4 rows only")


BENCHMARK = harness.Benchmark(
    name="ragged",
    description=__doc__.splitlines()[0],
    run=run,
    flags=flags,
    writes=True,
)
main = BENCHMARK.main

if __name__ == "__main__":
    main()
