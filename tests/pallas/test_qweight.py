"""emulate.pallas.matmul with QArray weights (emulate.pallas.qweight), in TPU interpret mode
on the CPU: scales constant along K bit for bit against emulate.dot_general and against an
oracle built from emulate.reference (applied outside the kernel after exact limbs, or in
the kernel's last step after an f32 sum); group scales within gamma_(K + S + 4) of the exact
sum of emulate.reference's dequantized values; prepared weights (same bytes, no layout
work per call); NaN scales; the gradient; the parts the kernel does not decode refused by
name.

Interpret mode compiles each distinct kernel once (about 2 s here): each case is another
route, layout or scale kind; more run under EMULATE_LONG_TESTS=1 (marked long, each
with the default case that takes its route).
"""

from __future__ import annotations

import dataclasses
import math
import zlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import emulate
import emulate.mx as mx
import emulate.pallas
from emulate import bounds, formats, reference

DN = (((1,), (0,)), ((), ()))
_SCALE_DTYPES = {
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "float32": np.float32,
    "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu,
}


def _codes(fmt: str, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Codes of ``fmt`` (an ml_dtypes array): uniform over the finite values, a quarter of
    them the extremes, some zeros."""
    f = formats.get(fmt)
    if f.is_integer:
        v = rng.integers(int(f.min), int(f.max) + 1, shape)
        v[rng.random(shape) < 0.2] = int(f.min)
        v[rng.random(shape) < 0.1] = int(f.max)
        v[rng.random(shape) < 0.05] = 0
        return v.astype(f.dtype)
    if f.bits == 8:
        v = rng.integers(0, 256, shape).astype(np.uint8).view(f.dtype)
    else:  # every float4 value, drawn uniformly
        v = np.arange(16, dtype=np.uint8).view(np.uint8)
        v = reference.decode(v, f.name, to=np.float64)
        v = rng.choice(v, shape).astype(f.dtype)
    finite = np.isfinite(v.astype(np.float32))
    return np.where(finite, v, np.zeros((), f.dtype)).astype(f.dtype)


def _scales(
    sf: str, shape: tuple[int, int], rng: np.random.Generator, shift: int = 0
) -> np.ndarray:
    """Scales of ``sf`` over a wide range, with the awkward ones: float16 subnormals and
    2**15, e8m0 exponents from -30 to 30."""
    if sf == "float8_e8m0fnu":
        return np.ldexp(1.0, rng.integers(-30, 31, shape)).astype(ml_dtypes.float8_e8m0fnu)
    s = rng.uniform(0.5, 2.0, shape) * np.exp2(rng.integers(-12, 12, shape))
    s[rng.random(shape) < 0.1] = 2.0**-24 * 5  # a float16 subnormal
    s[rng.random(shape) < 0.1] = 2.0**15
    return (s * 2.0**shift).astype(_SCALE_DTYPES[sf])


def _qarray(fmt, sf, shape, block, rng, packed=True, tensor_scale=None, shift=0):
    codes = _codes(fmt, shape, rng)
    grid = tuple(-(-n // b) for n, b in zip(shape, block))
    scales = _scales(sf, grid, rng, shift)
    stored = emulate.pack(codes, axis=0) if packed and formats.get(fmt).packable else codes
    q = emulate.QArray.from_parts(
        stored if not isinstance(stored, np.ndarray) else jnp.asarray(stored),
        jnp.asarray(scales),
        block_shape=block,
        tensor_scale=tensor_scale,
    )
    return q, codes, scales


def _values(codes, scales, block, tensor_scale=None) -> np.ndarray:
    return reference.dequantize(codes, scales, block, tensor_scale=tensor_scale)


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


# (x format, weight format, scale format, target, out, (M, K, N), block of the scales)
CONSTANT_ALONG_K = [
    # native int8 x int8, one float16 scale per column, rounded into bfloat16: the exact
    # int32 sum (no K here can overflow it) rounded to f32 and scaled in the kernel.
    ("int8", "int8", "float16", "tpu_v5e", "bfloat16", (5, 300, 200), "column"),
    # packed fp4 x fp4 on v4 (bf16 route, exact chunks), e8m0 scales per column.
    pytest.param("float4_e2m1fn", "float4_e2m1fn", "float8_e8m0fnu", "tpu_v4", "float32",
                 (9, 260, 130), "column", marks=pytest.mark.long),
    # int8 x packed int4 on v2 (f32 route), one float32 scale for the tensor, a tensor scale.
    ("int8", "int4", "float32", "tpu_v2", "float32", (8, 384, 128), "tensor"),
    # a float16 result (Mosaic stores none): the exact sum as int32 limbs, the scales and
    # the rounding outside the kernel.
    ("int8", "int8", "float32", "tpu_v5e", "float16", (4, 256, 128), "column"),
    # bf16 activations (integer values: every f32 partial sum exact, in any order): the
    # kernel applies the scales itself at its last K step and stores the result type. The
    # int8 weight with column scales on v5e is long (EMULATE_LONG_TESTS=1): column scales
    # run by default on the fp4 weight below, the int8 weight on v4.
    pytest.param("bfloat16", "int8", "float16", "tpu_v5e", "bfloat16", (5, 300, 200),
                 "column", marks=pytest.mark.long),
    ("bfloat16", "float4_e2m1fn", "float8_e8m0fnu", "tpu_v6e", "float32", (8, 256, 256),
     "column"),
    ("bfloat16", "int8", "bfloat16", "tpu_v4", "float32", (8, 384, 128), "tensor"),
]  # fmt: skip


@pytest.mark.parametrize("lhs, rhs, sf, target, out, shape, kind", CONSTANT_ALONG_K)
def test_scales_constant_along_k_match_dot_general_bit_for_bit(lhs, rhs, sf, target, out, shape,
                                                               kind):  # fmt: skip
    m, k, n = shape
    rng = np.random.default_rng(zlib.crc32(f"{lhs} {rhs} {sf}".encode()))
    block = (k, 1) if kind == "column" else (k, n)
    ts = np.float32(0.75) if kind == "tensor" else None
    shift = -22 if out == "float16" else 0  # float16 results: finite
    q, codes, scales = _qarray(rhs, sf, (k, n), block, rng, tensor_scale=ts, shift=shift)
    x = _codes("int8" if lhs == "bfloat16" else lhs, (m, k), rng)
    if lhs == "bfloat16":
        x = x.astype(ml_dtypes.bfloat16)
    got = emulate.pallas.matmul(x, q, target=target, out_dtype=out)
    same = emulate.dot_general(x, q, DN, preferred_element_type=out, target=target)
    assert np.asarray(got).dtype == np.dtype(formats.get(out).dtype)
    np.testing.assert_array_equal(_bits(got), _bits(same))
    # the oracle: the exact integer sum rounded to f32, times the scale (times the tensor
    # scale, that product rounded to f32 first) rounded to f32, rounded into the result type
    acc = reference.dot_general(x, codes, DN, preferred_element_type="float32").astype(np.float64)
    s = scales.astype(np.float64)
    if ts is not None:
        s = (s * np.float64(ts)).astype(np.float32).astype(np.float64)
    want = (acc * s).astype(np.float32).astype(formats.get(out).dtype)
    np.testing.assert_array_equal(_bits(got), _bits(want))


# (weight format, scale format, target, (M, K, N), block, packed / prepared / as stored)
GROUPS = [
    # long (EMULATE_LONG_TESTS=1): int8 codes as stored with group scales run by default on
    # v7x below (a group longer than the K block), float16 scales with the int4 weight
    pytest.param(
        "int8", "float16", "tpu_v5e", (7, 640, 200), (128, 1), "stored", marks=pytest.mark.long
    ),
    ("int4", "float16", "tpu_v5e", (16, 512, 256), (128, 1), "packed"),  # x column planes
    pytest.param(
        "float4_e2m1fn",
        "float8_e8m0fnu",
        "tpu_v6e",
        (8, 1024, 130),
        (128, 1),
        "prepared",
        marks=pytest.mark.long,
    ),
    ("float8_e4m3fn", "bfloat16", "tpu_v4", (5, 512, 256), (256, 256), "stored"),  # (G, N)
    ("int8", "float32", "tpu_v7x", (8, 2048, 128), (2048 // 2, 1), "stored"),  # G > bk
    # OCP MX blocks of 32: MXFP4 prepared (K-planar), MXFP8 on v2's f32 route
    ("float4_e2m1fn", "float8_e8m0fnu", "tpu_v5e", (8, 512, 256), (32, 1), "prepared"),
    ("float8_e4m3fn", "float8_e8m0fnu", "tpu_v2", (8, 320, 128), (32, 1), "stored"),
]


@pytest.mark.parametrize("rhs, sf, target, shape, block, how", GROUPS)
def test_group_scales_are_within_the_bound(rhs, sf, target, shape, block, how):
    m, k, n = shape
    rng = np.random.default_rng(zlib.crc32(f"{rhs} {sf} {target}".encode()))
    q, codes, scales = _qarray(rhs, sf, (k, n), block, rng, packed=how != "stored")
    w = emulate.pallas.prepare_weight(q) if how == "prepared" else q
    x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    x[0, :3] = [0.0, -0.0, 2.0**-120]  # zeros and a tiny value
    bs = (16, 128, 256) if block[0] > 256 else None  # G = 1024 spans 4 K steps of 256
    got = np.asarray(
        emulate.pallas.matmul(x, w, target=target, out_dtype="float32", block_shape=bs)
    )
    wv = _values(codes, scales, block)
    segments = math.ceil(k / block[0])
    want = reference.dot_general(x, wv, DN, preferred_element_type="float32").astype(np.float64)
    bound = bounds.dot_general_bound(x, wv, DN, extra_terms=segments + 4)
    err = np.abs(got.astype(np.float64) - want)
    # the oracle is the exact sum rounded once: its own error is at most u |want|
    assert np.all(err <= bound + np.abs(want) * 2.0**-24), float(np.max(err - bound))
    assert np.count_nonzero(got) > got.size // 2  # not a sum of zeros


@pytest.mark.parametrize(
    "how, m",
    [
        # M = 48: a block of 48 rows of x (past the 32 rows of the one-dot-per-group step),
        # the tile's rows scaled and one dot per K step, as at M = 256 (long)
        ("packed", 48),
        pytest.param("packed", 256, marks=pytest.mark.long),
        # M = 8: one dot of 16 rows per group
        pytest.param("prepared", 8, marks=pytest.mark.long),
    ],
)
def test_nvfp4_groups_of_16_rows_are_within_the_bound(how, m):
    # NVFP4: e2m1 codes, an e4m3 scale per 16 rows along K and column, an f32 tensor
    # scale; K ragged (17 groups), one NaN scale (its column NaN)
    k, n = 272, 128
    rng = np.random.default_rng(16)
    q = emulate.quantize(rng.standard_normal((k, n)).astype(np.float32), mx.NVFP4, axis=0)
    scales = np.array(q.scales)
    scales[3, 7] = np.uint8(0x7F).view(ml_dtypes.float8_e4m3fn)  # NaN
    q = dataclasses.replace(q, scales=jnp.asarray(scales))
    w = emulate.pallas.prepare_weight(q) if how == "prepared" else q
    x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    got = np.asarray(emulate.pallas.matmul(x, w, target="tpu_v5e", out_dtype="float32"))
    codes = np.asarray(q.unpacked_codes())
    wv = _values(codes, scales, (16, 1), tensor_scale=np.float32(q.tensor_scale))
    assert np.all(np.isnan(got[:, 7]))
    keep = np.delete(np.arange(n), 7)
    got, wv = got[:, keep], wv[:, keep]
    want = reference.dot_general(x, wv, DN, preferred_element_type="float32").astype(np.float64)
    bound = bounds.dot_general_bound(x, wv, DN, extra_terms=k // 16 + 4)
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(err <= bound + np.abs(want) * 2.0**-24), float(np.max(err - bound))
    assert np.count_nonzero(got) > got.size // 2


def test_a_prepared_weight_holds_the_same_bytes_and_gives_the_same_bits():
    rng = np.random.default_rng(5)
    q, _, _ = _qarray("int8", "float16", (512, 256), (128, 1), rng)
    p = emulate.pallas.prepare_weight(q)
    assert isinstance(p, emulate.pallas.KernelQWeight)
    assert p.nbytes == q.nbytes == 512 * 256 + 4 * 256 * 2
    assert np.asarray(p.scales).dtype == np.uint16  # float16 scales as their bits
    np.testing.assert_array_equal(
        np.asarray(p.scales), np.asarray(q.scales).view(np.uint16)
    )  # fmt: skip
    x = rng.standard_normal((8, 512)).astype(ml_dtypes.bfloat16)
    a = emulate.pallas.matmul(x, q, target="tpu_v5e", out_dtype="float32")
    b = emulate.pallas.matmul(x, p, target="tpu_v5e", out_dtype="float32")
    np.testing.assert_array_equal(_bits(a), _bits(b))
    # a packed int4 weight: the K-planar layout, one byte per two codes, as packed
    q4, _, _ = _qarray("int4", "float16", (512, 256), (128, 1), rng)
    p4 = emulate.pallas.prepare_weight(q4)
    assert isinstance(p4.codes, emulate.pallas.KernelWeight)
    assert p4.nbytes == q4.nbytes == 512 * 256 // 2 + 4 * 256 * 2


def test_a_nan_scale_makes_its_group_nan():
    rng = np.random.default_rng(6)
    codes = np.ones((256, 128), np.int8)
    scales = np.full((2, 128), 0.5, np.float16)
    scales[1, 3] = np.nan
    scales[0, 5] = np.inf
    q = emulate.QArray.from_parts(jnp.asarray(codes), jnp.asarray(scales), block_shape=(128, 1))
    x = np.abs(rng.standard_normal((8, 256))).astype(ml_dtypes.bfloat16) + 1
    got = np.asarray(emulate.pallas.matmul(x, q, target="tpu_v5e", out_dtype="float32"))
    assert np.all(np.isnan(got[:, 3])) and np.all(got[:, 5] == np.inf)
    others = np.delete(got, [3, 5], axis=1)
    want = np.float32(0.5) * np.asarray(x, np.float64).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(others, np.broadcast_to(want, others.shape), rtol=2e-6)


def test_the_gradient_is_that_of_the_dequantized_weight():
    # d/dx sum(x @ W) = 1 @ W.T: the row sums of W; int8 codes times powers of two are exact
    # in f32, and so are these sums.
    rng = np.random.default_rng(7)
    codes = _codes("int8", (256, 128), rng)
    scales = np.ldexp(1.0, rng.integers(-4, 5, (2, 128))).astype(ml_dtypes.float8_e8m0fnu)
    q = emulate.QArray.from_parts(jnp.asarray(codes), jnp.asarray(scales), block_shape=(128, 1))
    p = emulate.pallas.prepare_weight(q)
    wv = _values(codes, scales, (128, 1)).astype(np.float64)
    for w in (q, p):
        dx = jax.grad(lambda x, w=w: emulate.pallas.matmul(x, w, target="tpu_v5e").sum())(
            jnp.ones((4, 256), jnp.float32)
        )
        np.testing.assert_array_equal(np.asarray(dx), np.broadcast_to(wv.sum(axis=1), (4, 256)))


def _parts_cases():
    ones = jnp.ones((256, 128), jnp.int8)
    return [
        (emulate.QArray.from_parts(ones, emulate.quantize(np.ones((2, 128), np.float32), "int8",
                                                          axis=0), block_shape=(128, 1)),
         r"^w: emulate.pallas.matmul does not decode two-level scales QArray\(int8\[2, 128\], "
         r"scales float8_e8m0fnu"),
        (emulate.QArray.from_parts(ones, jnp.ones((32, 128), jnp.float16), block_shape=(8, 1)),
         r"^w: emulate.pallas.matmul does not decode groups of 8 rows along K in the kernel "
         r"\(group scales are applied per group of a multiple of 16 rows\); use "
         r"emulate.dot_general for this QArray$"),
        (emulate.QArray.from_parts(ones, jnp.ones((2, 2), jnp.float16), block_shape=(128, 64)),
         r"^w: emulate.pallas.matmul does not decode blocks of 64 columns in the kernel "
         r"\(block_shape \(128, 64\): one scale per column \(G, 1\), per group for all N "
         r"columns \(G, N\) or per block of a multiple of 128 columns are built\)"),
    ]  # fmt: skip


def test_parts_the_kernel_does_not_decode_are_refused_by_name():
    x = np.ones((4, 256), ml_dtypes.bfloat16)
    for q, message in _parts_cases():
        with pytest.raises(NotImplementedError, match=message):
            emulate.pallas.matmul(x, q, target="tpu_v5e")
        with pytest.raises(NotImplementedError, match=message):
            emulate.pallas.prepare_weight(q)


def test_bad_input_names_the_argument():
    rng = np.random.default_rng(8)
    q, _, _ = _qarray("int8", "float16", (256, 128), (128, 1), rng)
    x = np.ones((4, 256), ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match=r"^w_format: int4 disagrees with the QArray w's format "):
        emulate.pallas.matmul(x, q, target="tpu_v5e", w_format="int4")
    with pytest.raises(
        ValueError,
        match=r"^out_dtype: a QArray weight's product is a float; "
        r"expected float32, bfloat16 or float16, got int32$",
    ):
        emulate.pallas.matmul(x, q, target="tpu_v5e", out_dtype="int32")
    q256, _, _ = _qarray("int8", "float16", (512, 128), (256, 1), rng)
    with pytest.raises(
        ValueError,
        match=r"^block_shape: bk = 384 must be a multiple or a "
        r"divisor of the weight's scale groups of 256 rows",
    ):
        emulate.pallas.matmul(
            np.ones((4, 512), ml_dtypes.bfloat16),
            q256,
            target="tpu_v5e",
            block_shape=(16, 128, 384),
        )
    q3 = emulate.quantize(np.ones((2, 256, 128), np.float32), "int8", axis=1)
    with pytest.raises(ValueError, match=r"^w: expected a 2-D \(K, N\) QArray, got shape "):
        emulate.pallas.matmul(x, q3, target="tpu_v5e")


def test_vmap_runs_one_kernel_per_index_with_the_same_bits():
    rng = np.random.default_rng(9)
    q, _, _ = _qarray("int8", "float16", (256, 128), (128, 1), rng)
    p = emulate.pallas.prepare_weight(q)
    xs = rng.standard_normal((3, 8, 256)).astype(ml_dtypes.bfloat16)

    def run(x, w):
        return emulate.pallas.matmul(x, w, target="tpu_v5e", out_dtype="float32")

    each = np.stack([np.asarray(run(x, p)) for x in xs])
    np.testing.assert_array_equal(_bits(jax.vmap(lambda x: run(x, p))(xs)), _bits(each))
    stacked = jax.tree.map(lambda *v: jnp.stack(v), p, p)  # two prepared weights
    both = jax.vmap(lambda w: run(xs[0], w))(stacked)
    np.testing.assert_array_equal(_bits(both), _bits(np.stack([each[0], each[0]])))


# By default each scale dtype and each group length once (64 rows with float32 scales,
# 256 with bfloat16); the other two pairs under EMULATE_LONG_TESTS=1.
@pytest.mark.parametrize(
    "block_rows, scale_dtype",
    [
        (64, np.float32),
        (256, ml_dtypes.bfloat16),
        pytest.param(64, ml_dtypes.bfloat16, marks=pytest.mark.long),
        pytest.param(256, np.float32, marks=pytest.mark.long),
    ],
)
def test_subnormal_scales_keep_their_value(block_rows, scale_dtype):
    # Scales 2**-127 and -3 * 2**-133 (subnormal in f32 and bf16) in groups of 64 rows and
    # per output channel: each group's sum (integer, exact) times its scale is a normal
    # f32 number, so the result is that exact sum; a float operation on the scale would
    # flush it to 0.
    k, n = 256, 128
    codes = np.full((k, n), 100, np.int8)
    codes[:, 1::2] = -7
    grid = (k // block_rows, n)
    s = np.where(np.arange(n) % 3 == 0, 2.0**-127, -3 * 2.0**-133) * np.ones(grid)
    q = emulate.QArray.from_parts(
        jnp.asarray(codes), jnp.asarray(s.astype(scale_dtype)), block_shape=(block_rows, 1)
    )
    x = np.full((2, k), 1000.0, ml_dtypes.bfloat16)
    got = np.asarray(emulate.pallas.matmul(x, q, target="tpu_v5e", out_dtype=jnp.float32))
    exact = 1000.0 * codes.astype(np.float64).sum(axis=0) * s[0]  # every product exact
    want = np.broadcast_to(exact.astype(np.float32), got.shape)
    assert np.abs(want).min() > 2.0**-126  # normal results
    np.testing.assert_array_equal(got, want)


def _answers(a) -> tuple:
    return tuple(a.shape), np.dtype(a.dtype), a.ndim, a.size, a.nbytes


def test_a_prepared_weight_answers_as_its_qarray():
    # shape, dtype, ndim, size, nbytes as the QArray answers them: one weight, then the
    # stacked experts prepare_experts makes (their arrays carry a leading expert axis)
    rng = np.random.default_rng(12)
    q, _, _ = _qarray("int4", "float16", (512, 384), (128, 1), rng)
    p = emulate.pallas.prepare_weight(q)
    assert _answers(p) == _answers(q) == ((512, 384), np.dtype("float32"), 2, 512 * 384,
                                          512 * 384 // 2 + 4 * 384 * 2)  # fmt: skip
    codes = rng.integers(0, 16, (3, 512, 256)).astype(ml_dtypes.uint4)
    z = emulate.pack(rng.integers(0, 16, (3, 4, 256)).astype(ml_dtypes.uint4), axis=2)
    experts = emulate.QArray.from_parts(
        emulate.pack(codes, axis=1), jnp.ones((3, 4, 256), jnp.float16),
        block_shape=(1, 128, 1), zero_points=z, dtype=jnp.bfloat16,
    )  # fmt: skip
    stacked = emulate.pallas.prepare_experts(experts)
    assert _answers(stacked) == _answers(experts) == (
        (3, 512, 256), np.dtype(jnp.bfloat16), 3, 3 * 512 * 256,
        3 * (512 * 256 // 2 + 4 * 256 * 2 + 4 * 256 // 2),
    )  # fmt: skip
    assert "[3, 512, 256]" in repr(stacked)
    # one expert of the stack answers as one expert of the QArray
    assert _answers(jax.tree.map(lambda a: a[1], stacked)) == _answers(experts[1])
