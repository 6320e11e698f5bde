"""emulate.pallas.matmul with bitsandbytes' double-quantized 4-bit weights (two-level
scales whose codes index a 256-entry table, plus a static offset: emulate.pallas.qoffsets
Level with a codebook), in TPU interpret mode on the CPU, against a float64 oracle of the
weight built from bitsandbytes' float32 formulas (bitsandbytes-foundation/bitsandbytes @
95f9af309d4d5793847169c39288dcd3fcbdf564, bitsandbytes/functional.py ``dequantize_4bit``:
``absmax = dequantize_blockwise(absmax, state2) + offset``, ``dequantize_blockwise``:
``code[A] * absmax2[block]``, then the 4-bit values ``quant_map[c] * absmax[block]``, each
product and the sum rounded to float32): within ``emulate.dot_general``'s bound for a
codebook QArray (``gamma_(K + S + 4)``). Hypothesis draws the shapes (K not a multiple of
64, a partial nested block past 256 groups, nested blocks of several columns spanning
every group as bitsandbytes' layout makes them for K < 16384, M = 1, N odd or past one
output block), the codes (the table's zero entry, -1 and +1, NF4's ends) and special
values (zero and NaN nested scales, +-0 and subnormal activations). A block shape whose
output blocks spread the nested scales from their whole row is refused by the VMEM check
when that row is too long (no kernel runs).
tests/importers/test_conventions_qarray.py runs an imported checkpoint bit for bit;
tests/pallas/test_qgroups.py the decoded scales bit for bit; tests/pallas/test_qoffsets.py
the real TPU compiler.

Each example compiles one kernel in interpret mode (1.5-3.5 s here): two by default,
more under EMULATE_LONG_TESTS=1.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _sweeps import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import emulate
import emulate.pallas
from emulate import bounds, codebooks

DN = (((1,), (0,)), ((), ()))
#: (K, nested block rows, nested block columns): K = 100 (2 groups, a partial last one)
#: with (2, 3) blocks spanning every group; K = 1024 in bitsandbytes' (16, 16) blocks;
#: K = 16448 (257 groups) in (256, 1) blocks, the last one partial.
LAYOUTS = [(100, 2, 3), (1024, 16, 16), (16448, 256, 1)]
_ZERO = 101  # the table's zero entry


def _table(rng) -> np.ndarray:
    t = np.sort(rng.uniform(-1, 1, 256)).astype(np.float32)
    t[[0, _ZERO, 255]] = [-1.0, 0.0, 1.0]
    return t


def _weight(k, n, block, rng, nan_super):
    """(QArray, the oracle's float32 weight (K, N), nested scales, columns of NaN)."""
    bk, bc = block
    g = -(-k // 64)
    table = _table(rng)
    a = rng.integers(0, 256, (g, n))
    a[0, : min(n, 3)] = [0, _ZERO, 255][: min(n, 3)]
    sup = (np.abs(rng.standard_normal((-(-g // bk), -(-n // bc)))) * 0.02).astype(np.float32)
    sup[-1, 0] = 0.0  # absmax = the offset
    if nan_super:
        sup[0, -1] = np.nan
    offset = np.float32(0.0137)
    codes = rng.integers(0, 16, (k, n))
    codes[0, : min(n, 2)] = [0, 15][: min(n, 2)]  # NF4's -1 and +1
    inner = emulate.QArray.from_parts(
        jnp.asarray(a.astype(np.uint8)),
        jnp.asarray(sup),
        block_shape=block,
        codebook=table,
        offsets=float(offset),
    )
    q = emulate.QArray.from_parts(
        emulate.pack(codes.astype(ml_dtypes.uint4), axis=0),
        inner,
        block_shape=(64, 1),
        codebook=codebooks.NF4,
    )
    # bitsandbytes' float32 arithmetic, in the QArray's (K, N) orientation
    s = np.repeat(np.repeat(sup, bk, axis=0), bc, axis=1)[:g, :n]
    with np.errstate(invalid="ignore"):
        absmax = (table[a] * s).astype(np.float32) + offset
        nf4 = codebooks.NF4.array().astype(np.float32)
        w = nf4[codes] * np.repeat(absmax, 64, axis=0)[:k]
    nan_cols = np.flatnonzero(np.isnan(absmax).any(axis=0))
    return q, w.astype(np.float32), nan_cols


@settings(max_examples=examples(2, 25), deadline=None)
@given(
    layout=st.sampled_from(LAYOUTS),
    m=st.sampled_from([1, 4]),
    n=st.sampled_from([1, 5, 33, 300]),  # 300: three output blocks of columns
    nan_super=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_double_quantized_nf4_is_within_the_bound(layout, m, n, nan_super, seed):
    k, bk, bc = layout
    rng = np.random.default_rng(seed)
    q, w, nan_cols = _weight(k, n, (bk, bc), rng, nan_super)
    x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    x[0, :3] = [0.0, -0.0, 2.0**-130]  # a subnormal: flushed, inside the bound's term
    got = np.asarray(emulate.pallas.matmul(x, q, target="tpu_v5e", out_dtype="float32"))
    assert np.all(np.isnan(got[:, nan_cols]))  # a NaN nested scale: its columns, whole
    keep = np.setdiff1d(np.arange(n), nan_cols)
    w, got = w[:, keep].astype(np.float64), got[:, keep].astype(np.float64)
    want = np.asarray(x, np.float64) @ w
    bound = bounds.dot_general_bound(x, w, DN, extra_terms=math.ceil(k / 64) + 4)
    assert np.all(np.abs(got - want) <= bound + np.abs(want) * 2.0**-24)


def test_nested_blocks_of_several_columns_not_spanning_k_are_refused():
    rng = np.random.default_rng(3)
    inner = emulate.QArray.from_parts(
        jnp.asarray(rng.integers(0, 256, (4, 8)).astype(np.uint8)),
        jnp.ones((2, 4), jnp.float32),
        block_shape=(2, 2),
        codebook=_table(rng),
        offsets=0.5,
    )
    q = emulate.QArray.from_parts(
        jnp.zeros((256, 8), ml_dtypes.uint4), inner, block_shape=(64, 1), codebook=codebooks.NF4
    )
    message = (
        r"^w: emulate.pallas.matmul does not decode two-level scales in blocks \(2, 2\) "
        r"\(blocks \(B, 1\), or of several columns spanning every group\) in the kernel; use "
        r"emulate.dot_general for this QArray$"
    )
    with pytest.raises(NotImplementedError, match=message):
        emulate.pallas.prepare_weight(q)


def test_spreading_a_whole_row_of_nested_scales_counts_in_the_vmem_check():
    # bn = 384 and nested scales of 4 columns: no window fits (384 / 4 = 96), so each
    # output block spreads from the whole row of N / 4 scales, a (N / 4, bn) f32 selector:
    # 24 MiB at N = 65536, past tpu_v4's 16 MiB of VMEM. Uncounted, Mosaic refused it
    # (RESOURCE_EXHAUSTED, 16.75M of 16.00M vmem); counted, a ValueError names block_shape
    # before anything compiles (eval_shape: nothing runs).
    k, n = 64, 65536
    inner = emulate.QArray.from_parts(
        jnp.zeros((1, n), jnp.uint8),
        jnp.ones((1, n // 4), jnp.float32),
        block_shape=(1, 4),
        codebook=np.linspace(-1, 1, 256).astype(np.float32),
        offsets=0.01,
    )
    q = emulate.QArray.from_parts(
        emulate.pack(np.zeros((k, n), ml_dtypes.uint4), axis=0),
        inner,
        block_shape=(64, 1),
        codebook=codebooks.NF4,
    )
    x = jax.ShapeDtypeStruct((16, k), jnp.bfloat16)
    message = (
        r"^block_shape: \(16, 384, 256\) needs about \d+ bytes of VMEM \(26738688 of them to "
        r"spread the whole row of 16384 super-block scales of 4 columns each to every output "
        r"block: a bn with bn / 4 a divisor or a multiple of 128 reads a window of them\), "
        r"more than tpu_v4's 16777216; use smaller blocks(\n|$)"  # then jax's traceback note
    )
    for block_shape in ((16, 384, 256), None):  # the default bn = 256 reads windows of 128

        def fn(x, block_shape=block_shape):
            return emulate.pallas.matmul(
                x, q, target="tpu_v4", out_dtype="float32", block_shape=block_shape
            )

        if block_shape is None:
            assert jax.eval_shape(fn, x).shape == (16, n)
            continue
        with pytest.raises(ValueError, match=message):
            jax.eval_shape(fn, x)
