"""benchmarks.pallas_traffic counts a Pallas kernel's HBM copies as Pallas TPU makes them:
checked on a hand-made kernel whose copies follow from the pipelining rule by hand."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from benchmarks.pallas_traffic import estimate_seconds, kernel_traffic

GEN = "tpu_v5e"


def _copy_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = x_ref[...] + w_ref[...]


def test_kernel_traffic_counts_a_copy_per_change_of_block_index():
    # Grid (2, 3), row-major: x's block index (i, 0) changes twice, w's (0, j) on every
    # one of the 6 steps, the output's (i, j) on every step too.
    bm, bn = 8, 128
    x_spec = pl.BlockSpec((bm, bn), lambda i, j: (i, 0))
    w_spec = pl.BlockSpec((bm, bn), lambda i, j: (0, j))
    o_spec = pl.BlockSpec((bm, bn), lambda i, j: (i, j))

    def fn(x, w):
        return pl.pallas_call(
            _copy_kernel,
            out_shape=jax.ShapeDtypeStruct((2 * bm, 3 * bn), jnp.float32),
            grid=(2, 3),
            in_specs=[x_spec, w_spec],
            out_specs=o_spec,
        )(x, w)

    specs = (
        jax.ShapeDtypeStruct((2 * bm, bn), jnp.float32),
        jax.ShapeDtypeStruct((bm, 3 * bn), jnp.float32),
    )
    got = kernel_traffic(fn, specs, GEN)
    block = bm * bn * 4
    assert got["calls"] == 1 and got["grid"] == [[2, 3]]
    assert [b[1] for b in got["blocks"]] == [2, 6, 6]
    assert (got["read"], got["written"]) == ((2 + 6) * block, 6 * block)


def test_estimate_skips_sentinels():
    assert estimate_seconds({"optimal_seconds": 2e-6, "flops": 1.0}) == 2e-6
    assert estimate_seconds({"optimal_seconds": -1.0}) is None
    assert estimate_seconds({"flops": 1.0}) is None
    assert estimate_seconds({"other_seconds": 3.0}) == 3.0
