"""emulate.pallas.matmul with codebook and act-order QArray weights
(emulate.pallas.qcodebook), in TPU interpret mode on the CPU.

The oracle: the table's values looked up in numpy (``table[codes]``), times the scales in
float64 rounded once to float32 (as the checkpoints' decoders compute them), contracted by
emulate.reference; permutations applied by numpy indexing. NF4 (a float32 table, bf16
pieces) within gamma_(K + S + 4) of the exact sum; IQ4_NL with int8 activations (exact,
act-order along K and N) bit for bit, against the oracle and emulate.dot_general; an
int16 table at K = 1 (columns stored permuted) bit for bit, and its gradient; the word
step's decode of NF4 codes (qcodebook.table_tiles) against the table bit for bit.

Each case compiles one kernel in interpret mode (about 2 s); the f16-table and prepared
weight, 256-entry table cases run under EMULATE_LONG_TESTS=1 (marked long).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import emulate
import emulate.pallas
from emulate import bounds, codebooks, formats, reference, targets
from emulate.pallas import qcodebook, words

DN = (((1,), (0,)), ((), ()))


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _values(table, codes, scales, block) -> np.ndarray:
    """The oracle's weight: ``table[codes] * scale`` rounded once to float32."""
    t = np.asarray(table).astype(np.float32).astype(np.float64)
    s = np.repeat(np.repeat(scales.astype(np.float64), block[0], 0), block[1], 1)
    with np.errstate(invalid="ignore"):  # NaN scales
        return (t[codes] * s[: codes.shape[0], : codes.shape[1]]).astype(np.float32)


def _nf4(k, n, block, rng, scales_dtype=np.float32):
    codes = rng.integers(0, 16, (k, n)).astype(np.uint8)
    codes[:, 0] = 7  # NF4's zero
    scales = (rng.random((-(-k // block[0]), n)) + 0.01).astype(scales_dtype)
    q = emulate.QArray.from_parts(
        emulate.pack(codes.astype(ml_dtypes.uint4), axis=0),
        jnp.asarray(scales),
        block_shape=block,
        codebook=codebooks.NF4,
    )
    return q, codes, scales


@pytest.mark.parametrize(
    "target, how",
    [
        ("tpu_v5e", "packed"),  # bf16 pieces, x split into two column planes
        pytest.param("tpu_v4", "prepared", marks=pytest.mark.long),  # K-planar
    ],
)
def test_nf4_group_scales_are_within_the_bound(target, how):
    # bitsandbytes NF4, blocks of 64 along K, f32 absmax; K ragged (320: 5 groups, a
    # partial last K block), a NaN and an Inf scale, zeros and a tiny x
    m, k, n = 8, 320, 130
    rng = np.random.default_rng(24)
    q, codes, scales = _nf4(k, n, (64, 1), rng)
    scales[2, 5], scales[4, 9] = np.nan, np.inf
    q = emulate.QArray.from_parts(
        q.codes, jnp.asarray(scales), block_shape=(64, 1), codebook=codebooks.NF4
    )
    w = emulate.pallas.prepare_weight(q) if how == "prepared" else q
    x = (np.abs(rng.standard_normal((m, k))) + 0.1).astype(ml_dtypes.bfloat16)
    x[0, :3] = [0.0, -0.0, 2.0**-120]
    got = np.asarray(emulate.pallas.matmul(x, w, target=target, out_dtype="float32"))
    wv = _values(codebooks.NF4, codes, scales, (64, 1))
    assert np.all(np.isnan(got[:, 5])) and np.all(np.isnan(got[:, 9]) | np.isinf(got[:, 9]))
    keep = np.setdiff1d(np.arange(n), [5, 9])
    wv, got = wv[:, keep], got[:, keep]
    want = reference.dot_general(x, wv, DN, preferred_element_type="float32").astype(np.float64)
    bound = bounds.dot_general_bound(x, wv, DN, extra_terms=math.ceil(k / 64) + 4)
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(err <= bound + np.abs(want) * 2.0**-24), float(np.max(err - bound))
    assert np.count_nonzero(got[:, 1:]) == got[:, 1:].size  # column 0 is NF4's zero
    np.testing.assert_array_equal(got[:, 0], 0)


def test_iq4_nl_with_int8_activations_and_act_order_is_exact():
    # GGUF IQ4_NL table (int8 values), one float16 scale per column; int8 x: the exact
    # int32 sum, rounded once to f32 and scaled in the kernel, bit for bit. The codes are
    # stored permuted along K (GPTQ act-order), then along N.
    m, k, n = 8, 256, 128
    rng = np.random.default_rng(27)
    codes = rng.integers(0, 16, (k, n)).astype(np.uint8)
    scales = (rng.random((1, n)) * 2.0 ** rng.integers(-8, 8, (1, n))).astype(np.float16)
    x = rng.integers(-128, 128, (m, k)).astype(np.int8)
    x[0] = 127
    table = np.asarray(codebooks.IQ4_NL.array(), np.int64)
    for axis, perm in ((-2, rng.permutation(k)), (-1, rng.permutation(n))):
        q = emulate.QArray.from_parts(
            emulate.pack(codes.astype(ml_dtypes.uint4), axis=0),
            jnp.asarray(scales),
            block_shape=(k, 1),
            codebook=codebooks.IQ4_NL,
            perm=jnp.asarray(perm, jnp.int32),
            perm_axis=axis,
        )
        got = emulate.pallas.matmul(x, q, target="tpu_v5e", out_dtype="float32")
        # logical weight: W[perm[j]] = W_stored[j] along the permuted axis
        logical = np.empty_like(codes)
        if axis == -2:
            logical[perm] = codes
            s = scales
        else:
            logical[:, perm] = codes
            s = np.empty_like(scales)
            s[:, perm] = scales
        acc = reference.dot_general(
            x, table[logical].astype(np.int8), DN, preferred_element_type="int32"
        )
        want = (acc.astype(np.float32).astype(np.float64) * s.astype(np.float64)).astype(np.float32)
        np.testing.assert_array_equal(_bits(got), _bits(want))
        if axis == -2:
            same = emulate.dot_general(x, q, DN, preferred_element_type="float32",
                                       target="tpu_v5e")  # fmt: skip
            np.testing.assert_array_equal(_bits(got), _bits(same))


@pytest.mark.parametrize(
    "bits",
    [4, pytest.param(8, marks=pytest.mark.long)],  # 15 or 255 selects an element
)
def test_an_int16_table_at_k_1_is_exact(bits):
    # uint4 / uint8 codes (one a byte) into int16 values (two bf16 pieces each): with K = 1
    # every product x * v (8 x 15 bits) is exact in f32, so the result is x * v rounded
    # once times the scale. The columns are stored permuted (perm along N); the gradient
    # is that of the logical weight: d/dx sum(x @ W) = the row sum of W.
    rng = np.random.default_rng(28)
    table = (np.linspace(-128, 127, 2**bits).astype(np.int64) * 129).astype(np.int16)
    table[-1] = 32767
    codes = rng.integers(0, 2**bits, (1, 128)).astype(np.uint8)
    scales = np.ldexp(1.0, rng.integers(-6, 6, (1, 128))).astype(np.float32)
    perm = rng.permutation(128)
    q = emulate.QArray.from_parts(
        jnp.asarray(codes),
        jnp.asarray(scales),
        block_shape=(1, 1),
        fmt=f"uint{bits}",
        codebook=table,
        perm=jnp.asarray(perm, jnp.int32),
        perm_axis=-1,
    )
    x = rng.standard_normal((16, 1)).astype(ml_dtypes.bfloat16)
    got = emulate.pallas.matmul(x, q, target="tpu_v5e", out_dtype="float32")
    stored = _values(table, codes, scales, (1, 1)).astype(np.float64)
    logical = np.empty_like(stored)
    logical[:, perm] = stored
    want = (np.asarray(x, np.float64) @ logical).astype(np.float32)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    xf = jnp.asarray(x, jnp.float32)
    dx = jax.grad(lambda x: emulate.pallas.matmul(x, q, target="tpu_v5e").sum())(xf)
    # the row sum, in f32 (gradients are not exact: docs/numerics.md), within 128 roundings
    want_dx = np.broadcast_to(logical.sum(1), (16, 1))
    bound = 128 * 2.0**-24 * np.abs(logical).sum()
    assert np.all(np.abs(np.asarray(dx, np.float64) - want_dx) <= bound)


@pytest.mark.long
def test_a_float16_table_with_a_tensor_scale_is_within_the_bound():
    rng = np.random.default_rng(29)
    table = np.linspace(-3, 3, 16).astype(np.float16)  # 11-bit values: two bf16 pieces
    m, k, n = 8, 256, 128
    codes = rng.integers(0, 16, (k, n)).astype(np.uint8)
    scales = (rng.random((k // 128, n)) + 0.5).astype(np.float32)
    q = emulate.QArray.from_parts(
        emulate.pack(codes.astype(ml_dtypes.uint4), axis=0),
        jnp.asarray(scales),
        block_shape=(128, 1),
        codebook=table,
        tensor_scale=np.float32(0.5),
    )
    x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    got = np.asarray(emulate.pallas.matmul(x, q, target="tpu_v6e", out_dtype="float32"))
    wv = _values(table, codes, scales * np.float32(0.5), (128, 1))
    want = reference.dot_general(x, wv, DN, preferred_element_type="float32").astype(np.float64)
    bound = bounds.dot_general_bound(x, wv, DN, extra_terms=k // 128 + 4)
    assert np.all(np.abs(got - want) <= bound + np.abs(want) * 2.0**-24)


def test_how_each_table_enters_the_kernel():
    v5e, v2 = targets.get("tpu_v5e"), targets.get("tpu_v2")
    bf16, f32, i8 = formats.get("bfloat16"), formats.get("float32"), formats.get("int8")
    nf4 = qcodebook.kernel_codebook(codebooks.NF4, "uint4", bf16, v5e)
    assert (nf4.value_format, nf4.pieces) == ("bfloat16", 3)
    # every NF4 value is the sum of its three truncated bf16 pieces, each of its sign
    t = np.asarray(codebooks.NF4.array(), np.float32)
    p1 = (t.view(np.uint32) & 0xFFFF0000).view(np.float32)
    p2 = ((t - p1).view(np.uint32) & 0xFFFF0000).view(np.float32)
    p3 = t - p1 - p2
    assert np.all(p3.astype(ml_dtypes.bfloat16).astype(np.float32) == p3)
    assert np.all(np.abs(p1) + np.abs(p2) + np.abs(p3) == np.abs(t))
    assert qcodebook.kernel_codebook(codebooks.NF4, "uint4", f32, v5e).value_format == "float32"
    assert qcodebook.kernel_codebook(codebooks.NF4, "uint4", bf16, v2).value_format == "float32"
    iq4 = qcodebook.kernel_codebook(codebooks.IQ4_NL, "uint4", i8, v5e)
    assert (iq4.value_format, iq4.pieces) == ("int8", 1)
    tiny = codebooks.codebook(np.array([1 + 2.0**-20] + [2.0**-130] * 15, np.float32))
    assert qcodebook.kernel_codebook(tiny, "uint4", bf16, v5e).value_format == "float32"
    assert qcodebook.kernel_codebook(None, "uint4", bf16, v5e) is None


def test_a_table_with_nan_or_inf_is_refused():
    table = np.array([0.0] * 15 + [np.inf], np.float32)
    q = emulate.QArray.from_parts(
        jnp.zeros((256, 128), jnp.uint8),
        jnp.ones((1, 128), jnp.float32),
        block_shape=(256, 1),
        codebook=table,
    )
    with pytest.raises(
        NotImplementedError,
        match=r"^w: emulate.pallas.matmul does not decode this codebook in the kernel "
        r"\(Codebook\(table, 16 x float32\) has NaN or Inf entries\); use emulate.dot_general",
    ):
        emulate.pallas.matmul(np.ones((8, 256), ml_dtypes.bfloat16), q, target="tpu_v5e")


@pytest.mark.parametrize("to, piece_order", [("bfloat16", False), ("float32", True)])
def test_table_tiles_are_the_nf4_table_bit_for_bit(to, piece_order):
    # NF4's float32 entries (bitsandbytes' table, emulate.codebooks) for every code at every
    # nibble: three bfloat16 pieces summing to the entry exactly (bf16 routes), or the entry
    # in f32 in piece order (v2 / v3)
    r, c = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    codes = ((r + c) % 16).astype(np.uint8)  # every code at every nibble of a word
    x_format = formats.get("bfloat16" if to == "bfloat16" else "float32")
    kc = qcodebook.kernel_codebook(codebooks.NF4, "uint4", x_format, targets.get("tpu_v5e"))
    decode = jax.jit(
        functools.partial(
            qcodebook.table_tiles, kc=kc, to=to, interpret=True, piece_order=piece_order
        )
    )
    data = emulate.pallas.prepare_weight(codes, "uint4").data
    tiles = [np.asarray(t) for t in decode(jax.jit(words.words)(jnp.asarray(data)))]
    assert len(tiles) == (3 if to == "bfloat16" else 1)
    assert all(t.dtype == np.dtype(to) for t in tiles)
    want = codebooks.NF4.array().astype(np.float32)[codes].astype(np.float64)
    if piece_order:
        want = want[words.piece_rows(256)]
    np.testing.assert_array_equal(sum(t.astype(np.float64) for t in tiles), want)
