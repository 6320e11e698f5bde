"""emulate.pallas.matmul with QArray weights that have zero points and offsets
(emulate.pallas.qoffsets), in TPU interpret mode on the CPU: bit for bit against
emulate.dot_general and an exact integer oracle where both are exact (integer codes and zero
points, power-of-two scales); within ``gamma_(K + S + 5) * sum|x| (|q s| + |z s| + |o|)``
of the float64 sum of the dequantized values otherwise (zero points of both signs, float16
offsets, a ragged last group, K = 1); NaN and Inf scales; prepared weights (no more bytes,
the same bits, the gradient); refusals by name; and, compile-only, the real TPU compiler on
v4, v5e, v5p, v6e and 7x with Mosaic's compatibility mode on and off (bitsandbytes' double
quantization among the schemes; its numbers: tests/pallas/test_qoffsets_bnb.py).

Interpret mode compiles each distinct kernel once (about 2-4 s here), so the default run
takes one case per scheme (the NaN test reuses the Q4_1-like case's kernel); the bf16
Q4_K, prepared-weight and other bounded cases, the comparisons with emulate.dot_general
(which its own tests check against the same oracles) and the compile-only programs past
AWQ g128 on 7x, Q4_K on v5e and bitsandbytes NF4 on v6e run under EMULATE_LONG_TESTS=1.
"""

from __future__ import annotations

import zlib

import _compile_only as compile_only
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _sweeps import LONG

import emulate
import emulate.pallas
from emulate import bounds, codebooks, formats
from emulate.pallas import qoffsets

DN = (((1,), (0,)), ((), ()))


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _int_codes(fmt: str, shape, rng) -> np.ndarray:
    f = formats.get(fmt)
    v = rng.integers(int(f.min), int(f.max) + 1, shape)
    v[rng.random(shape) < 0.1] = int(f.min)
    v[rng.random(shape) < 0.1] = int(f.max)
    return v


def _weight(fmt, k, n, group, rng, *, zero, offsets=None, scales="pow2", packed=True):
    """(QArray, codes int64, zero points int64 per block, scales f64, offsets f64 or None).

    zero: "packed" (uint4 zero points packed along N, as AWQ), "int8" (both signs), an int
    (static) or None. scales: "pow2" (2**-2 .. 2**2, float16) or "wide" (float16, 1e-3 ..
    3, a subnormal and 2**15 among them)."""
    f = formats.get(fmt)
    groups = -(-k // group)
    codes = _int_codes(fmt, (k, n), rng)
    if scales == "pow2":
        s = np.ldexp(1.0, rng.integers(-2, 3, (groups, n)))
    else:
        s = rng.uniform(1e-3, 3.0, (groups, n))
        s[0, :2] = [2.0**-24 * 3, 2.0**15]
    s = s.astype(np.float16)
    if zero == "packed":
        z = rng.integers(0, 16, (groups, n))
        zp = emulate.pack(z.astype(ml_dtypes.uint4), axis=1)
    elif zero == "int8":
        z = rng.integers(-100, 101, (groups, n))
        zp = jnp.asarray(z.astype(np.int8))
    elif zero is None:
        z, zp = np.zeros((groups, n), np.int64), None
    else:
        z, zp = np.full((groups, n), zero), zero
    off = None
    if offsets is not None:
        off = (rng.standard_normal((groups, n)) * offsets).astype(np.float16)
    stored = codes.astype(f.dtype)
    stored = emulate.pack(stored, axis=0) if packed and f.bits == 4 else jnp.asarray(stored)
    q = emulate.QArray.from_parts(
        stored,
        jnp.asarray(s),
        block_shape=(group, 1),
        zero_points=zp,
        offsets=None if off is None else jnp.asarray(off),
    )
    return q, codes, z, s.astype(np.float64), None if off is None else off.astype(np.float64)


def _dequantized(codes, z, s, off, group) -> np.ndarray:
    """W = (q - z) * s + o in float64 (exact but for the addition of o)."""
    k = codes.shape[0]

    def rows(a):
        return np.repeat(a, group, axis=0)[:k]

    w = (codes - rows(z)) * rows(s)
    return w if off is None else w + rows(off)


def _bound(x, codes, z, s, off, group, extra) -> np.ndarray:
    """docs/numerics.md's bound for one operand with zero points or offsets."""
    k = codes.shape[0]

    def rows(a):
        return np.repeat(np.abs(a), group, axis=0)[:k]

    mag = np.abs(codes) * rows(s) + rows(z) * rows(s) + (0 if off is None else rows(off))
    return bounds.dot_general_bound(np.asarray(x, np.float32), mag, DN, extra_terms=extra)


# (x format, weight format, target, (M, K, N), group, zero points)
EXACT = [
    # AWQ-like: uint4 codes packed along K, uint4 zero points packed along N, K = 192 (a
    # ragged last group of 64), int8 activations: the exact int32 route.
    ("int8", "uint4", "tpu_v5e", (8, 192, 128), 128, "packed"),
    # int8 zero points of both signs, int8 codes, groups of 32; v4's bf16 route with
    # integer-valued bf16 activations (every f32 partial sum exact).
    pytest.param("bfloat16", "int8", "tpu_v4", (5, 256, 130), 32, "int8", marks=pytest.mark.long),
    # GGUF Q4_0: uint4 codes, the static zero point 8, groups of 32, on 7x (the one default
    # case of a static zero point).
    ("int8", "uint4", "tpu_v7x", (8, 256, 128), 32, 8),
    # K = 1, scales constant along K (one group spanning K): a negative static zero point.
    pytest.param("int8", "int8", "tpu_v5e", (4, 1, 128), 1, -3, marks=pytest.mark.long),
]


@pytest.mark.parametrize("lhs, rhs, target, shape, group, zero", EXACT)
def test_exact_zero_points_match_dot_general_bit_for_bit(lhs, rhs, target, shape, group, zero):
    m, k, n = shape
    rng = np.random.default_rng(zlib.crc32(f"{lhs} {rhs} {target} {zero}".encode()))
    q, codes, z, s, _ = _weight(rhs, k, n, group, rng, zero=zero)
    xi = _int_codes("int8", (m, k), rng)
    x = xi.astype(ml_dtypes.bfloat16 if lhs == "bfloat16" else np.int8)
    got = emulate.pallas.matmul(x, q, target=target, out_dtype="float32")
    # the oracle: integers times powers of two, exact in float64, rounded once to f32
    want = (xi.astype(np.float64) @ _dequantized(codes, z, s, None, group)).astype(np.float32)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    if LONG:  # emulate.dot_general's own tests check it against the same oracle
        same = emulate.dot_general(x, q, DN, preferred_element_type="float32", target=target)
        np.testing.assert_array_equal(_bits(got), _bits(same))


# (weight format, target, (M, K, N), group, zero points, offsets, stored / prepared)
BOUNDED = [
    pytest.param(
        "uint4", "tpu_v5e", (16, 384, 256), 128, "packed", None, "prepared", marks=pytest.mark.long
    ),
    # GGUF Q4_1-like: zero points and float16 offsets in groups of 32, ragged K, v6e
    ("uint4", "tpu_v6e", (8, 200, 128), 32, "int8", 0.05, "stored"),
    pytest.param(
        "int8", "tpu_v4", (8, 256, 128), 256, None, 0.5, "stored", marks=pytest.mark.long
    ),  # offsets alone
]


@pytest.mark.parametrize("rhs, target, shape, group, zero, offsets, how", BOUNDED)
def test_zero_points_and_offsets_are_within_the_bound(rhs, target, shape, group, zero, offsets,
                                                      how):  # fmt: skip
    m, k, n = shape
    rng = np.random.default_rng(zlib.crc32(f"{rhs} {target} {zero} {offsets}".encode()))
    q, codes, z, s, off = _weight(rhs, k, n, group, rng, zero=zero, offsets=offsets,
                                  scales="wide")  # fmt: skip
    w = emulate.pallas.prepare_weight(q) if how == "prepared" else q
    x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    x[0, :3] = [0.0, -0.0, 2.0**-120]
    got = np.asarray(emulate.pallas.matmul(x, w, target=target, out_dtype="float32"))
    wv = _dequantized(codes, z, s, off, group)
    want = np.asarray(x, np.float64) @ wv
    steps = -(-k // 128)
    bound = _bound(x, codes, z, s, off, group, max(-(-k // group), steps) + 5)
    err = np.abs(got.astype(np.float64) - want)
    slack = np.abs(np.asarray(x, np.float64)) @ np.abs(wv) * k * 2.0**-50  # float64 oracle
    assert np.all(err <= bound + slack), float(np.max(err - bound))
    assert np.count_nonzero(got) > got.size // 2


def test_nan_and_inf_scales_reach_their_columns():
    # the kernel of BOUNDED's Q4_1-like case (compiled once for both)
    k, n, group = 200, 128, 32
    codes = np.full((k, n), 5, np.uint8).astype(ml_dtypes.uint4)  # never the zero point
    s = np.full((7, n), 0.5, np.float16)
    s[1, 3], s[0, 5] = np.nan, np.inf
    z = np.full((7, n), 2, np.int8)
    off = np.full((7, n), 0.25, np.float16)
    q = emulate.QArray.from_parts(
        emulate.pack(codes, axis=0), jnp.asarray(s), block_shape=(group, 1),
        zero_points=jnp.asarray(z), offsets=jnp.asarray(off),
    )  # fmt: skip
    x = np.ones((8, k), ml_dtypes.bfloat16)
    got = np.asarray(emulate.pallas.matmul(x, q, target="tpu_v6e", out_dtype="float32"))
    assert np.all(np.isnan(got[:, 3])) and np.all(got[:, 5] == np.inf)
    others = np.delete(got, [3, 5], axis=1)
    np.testing.assert_array_equal(others, np.float32(k * (3 * 0.5 + 0.25)))


@pytest.mark.long  # another kernel (f32 x, the K-planar layout) and the gradient
def test_a_prepared_weight_holds_no_more_bytes_and_gives_the_same_bits():
    rng = np.random.default_rng(11)
    k, n = 512, 256
    q, codes, z, s, _ = _weight("uint4", k, n, 128, rng, zero="packed")
    p = emulate.pallas.prepare_weight(q)
    assert isinstance(p, emulate.pallas.KernelQWeight)
    assert p.nbytes == q.nbytes == k * n // 2 + 4 * n * 2 + 4 * n // 2
    x = jnp.asarray(_int_codes("int8", (8, k), rng), jnp.float32)  # exact f32 sums

    def run(x, w):
        return emulate.pallas.matmul(x, w, target="tpu_v5e", out_dtype="float32")

    np.testing.assert_array_equal(_bits(run(x, q)), _bits(run(x, p)))
    # the gradient is that of the dequantized weight: d/dx sum(x @ W) = row sums of W
    wv = _dequantized(codes, z, s, None, 128)
    dx = jax.grad(lambda x: run(x, p).sum())(x)
    np.testing.assert_array_equal(np.asarray(dx), np.broadcast_to(wv.sum(axis=1), (8, k)))


def _q4_k(k, n, rng, *, mins=True, exact=False):
    """A GGUF Q4_K-like weight (K, N) from numpy parts: uint4 codes, per 32 rows a 6-bit
    scale code and min code (Packed along the groups), per 256 rows a float16 ``d`` and
    ``-dmin`` (powers of two from 2**-1 to 2**1 with ``exact``). Returns the QArray and
    W = q * (sc * d) - m * dmin in float64 (exact)."""
    groups, supers = -(-k // 32), -(-k // 256)
    codes = rng.integers(0, 16, (k, n))
    sc, mn = rng.integers(0, 64, (groups, n)), rng.integers(0, 64, (groups, n))
    if exact:
        d = np.ldexp(1.0, rng.integers(-1, 2, (supers, n))).astype(np.float16)
    else:
        d = (rng.random((supers, n)) * 0.01 + 1e-3).astype(np.float16)
    dmin = (-(d.astype(np.float32) / 2)).astype(np.float16)

    def level(c, s):
        six = emulate.pack(c.astype(np.uint8), "uint6", axis=0)
        return emulate.QArray.from_parts(six, jnp.asarray(s), block_shape=(8, 1))

    q = emulate.QArray.from_parts(
        emulate.pack(codes.astype(ml_dtypes.uint4), axis=0),
        level(sc, d),
        block_shape=(32, 1),
        offsets=level(mn, dmin) if mins else None,
    )
    s64 = np.repeat(sc * np.repeat(d.astype(np.float64), 8, axis=0)[:groups], 32, axis=0)[:k]
    w = codes * s64
    if mins:
        o = mn * np.repeat(dmin.astype(np.float64), 8, axis=0)[:groups]
        w = w + np.repeat(o, 32, axis=0)[:k]
    return q, codes, s64, w


@pytest.mark.long  # by default: Q4_K's exact case below, its compile-only program and
# tests/pallas/test_qgroups.py's bf16 group sums
def test_two_level_scales_and_mins_are_within_the_bound_in_no_more_bytes():
    rng = np.random.default_rng(21)
    k, n, m = 512, 256, 8
    q, codes, s64, wv = _q4_k(k, n, rng)
    p = emulate.pallas.prepare_weight(q)
    assert p.nbytes == q.nbytes  # 6-bit codes stay packed: no more bytes than stored
    x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    got = np.asarray(emulate.pallas.matmul(x, p, target="tpu_v5e", out_dtype="float32"))
    want = np.asarray(x, np.float64) @ wv
    mag = np.abs(codes) * s64 + np.abs(wv - codes * s64)  # |q s| + |o|
    bound = bounds.dot_general_bound(np.asarray(x, np.float32), mag, DN, extra_terms=16 + 5)
    err = np.abs(got.astype(np.float64) - want)
    assert np.all(err <= bound), float(np.max(err - bound))
    assert np.count_nonzero(got) > got.size // 2


def test_two_level_scales_and_mins_match_dot_general_bit_for_bit_where_exact():
    rng = np.random.default_rng(22)
    k, n, m = 576, 128, 8  # 2.25 super-blocks: a ragged last one
    q, _, _, wv = _q4_k(k, n, rng, mins=True, exact=True)  # power-of-two d and dmin
    xi = rng.integers(-8, 8, (m, k))  # every partial sum within 2**24 of the quantum
    x = xi.astype(np.int8)
    got = emulate.pallas.matmul(x, q, target="tpu_v5e", out_dtype="float32")
    want = (xi.astype(np.float64) @ wv).astype(np.float32)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    if LONG:
        same = emulate.dot_general(x, q, DN, preferred_element_type="float32", target="tpu_v5e")
        np.testing.assert_array_equal(_bits(got), _bits(same))


def _refused():
    ones = jnp.ones((256, 128), jnp.int8)
    s = jnp.ones((2, 128), jnp.float16)
    e4 = jnp.ones((256, 128), jnp.float8_e4m3fn)
    return [
        (emulate.QArray.from_parts(e4, s, block_shape=(128, 1), zero_points=1),
         r"^w: emulate.pallas.matmul does not decode zero points on float8_e4m3fn codes \("
         r"integer codes are built\) in the kernel; use emulate.dot_general for this QArray$"),
        (emulate.QArray.from_parts(ones, s, block_shape=(128, 1),
                                   zero_points=jnp.ones((2, 128), jnp.int32)),
         r"^w: emulate.pallas.matmul does not decode int32 zero points \(2- to 8-bit integer "
         r"ones are built\) in the kernel"),
        (emulate.QArray.from_parts(ones, s, block_shape=(128, 1), zero_points=300),
         r"^w: emulate.pallas.matmul does not decode a zero point of 300 \(at most 255 in "
         r"magnitude\) in the kernel"),
        (emulate.QArray.from_parts(ones, s, block_shape=(128, 1), offsets=0.5,
                                   tensor_scale=np.float32(2)),
         r"^w: emulate.pallas.matmul does not decode offsets with a tensor scale in the kernel"),
    ]  # fmt: skip


def test_parts_the_kernel_does_not_build_are_refused_by_name():
    x = np.ones((4, 256), ml_dtypes.bfloat16)
    for q, message in _refused():
        with pytest.raises(NotImplementedError, match=message):
            emulate.pallas.matmul(x, q, target="tpu_v5e")
        with pytest.raises(NotImplementedError, match=message):
            emulate.pallas.prepare_weight(q)


# --- compile-only: the real TPU compiler ------------------------------------------------

_K, _N, _M = 1024, 256, 64
#: N of the bitsandbytes scheme: its 128 nested scales (16 columns each) are read in
#: windows of 128 (emulate.pallas.qgroups.supers_window), one per eight output blocks
_BNB_N = 2048
#: scheme: (x type, weight format, group, zero points, offsets)
SCHEMES = {
    # AWQ g128: K-planar uint4, uint4 zero points packed along the groups, float16 scales
    "awq-g128": ("bfloat16", "uint4", 128, "packed", False),
    # GGUF Q4_1-like: static zero point, float16 offsets, groups of 32
    "q4_1-g32": ("bfloat16", "uint4", 32, 8, True),
    # int8 x int8 with int8 zero points: the exact int32 route
    "int8-zeros": ("int8", "int8", 128, "int8", False),
    # GGUF Q4_K: 6-bit sub-block scales and mins (packed along the groups) times float16
    # super-block scales, decoded in the kernel
    "q4_k": ("bfloat16", "uint4", 32, None, "two_level"),
    # bitsandbytes NF4 with double quantization: uint8 absmax codes into a 256-entry table
    # times a float32 per 256 codes (here (16, 16) blocks: K = 1024), plus an offset
    "bnb-nf4-dq": ("bfloat16", "uint4", 64, None, "bnb"),
}


def _specs(scheme: str):
    lhs, fmt, group, zero, offsets = SCHEMES[scheme]
    g = _K // group
    codes = (_K // 2, _N) if fmt == "uint4" else (_K, _N)
    out = [
        jax.ShapeDtypeStruct((_M, _K), jnp.dtype(lhs)),
        jax.ShapeDtypeStruct(codes, jnp.uint8 if fmt == "uint4" else jnp.int8),
        jax.ShapeDtypeStruct((g, _N), jnp.uint16),
    ]
    if zero == "packed":
        out.append(jax.ShapeDtypeStruct((g // 2, _N), jnp.uint8))
    elif zero == "int8":
        out.append(jax.ShapeDtypeStruct((g, _N), jnp.int8))
    if offsets == "bnb":  # absmax codes in place of the scales, the nested float32 scales
        return (out[0], jax.ShapeDtypeStruct((_K // 2, _BNB_N), jnp.uint8),
                jax.ShapeDtypeStruct((g, _BNB_N), jnp.uint8),
                jax.ShapeDtypeStruct((1, g * _BNB_N // 256), jnp.float32))  # fmt: skip
    if offsets == "two_level":  # scale codes in place of the scales, then the parts
        six = jax.ShapeDtypeStruct((g * 6 // 8, _N), jnp.uint8)
        sup = jax.ShapeDtypeStruct((g // 8, _N), jnp.uint16)
        return (out[0], out[1], six, six, sup, sup)
    if offsets:
        out.append(jax.ShapeDtypeStruct((g, _N), jnp.uint16))
    return tuple(out)


def compiled_program(x, codes, scales, *parts, scheme: str, target: str):
    """emulate.pallas.matmul on a prepared weight (a KernelQWeight) with zero points or
    offsets, as emulate.pallas.prepare_weight holds them."""
    _, fmt, group, zero, offsets = SCHEMES[scheme]
    grid = (_K // group, _N)
    if offsets == "bnb":
        grid = (_K // group, _BNB_N)
        table = codebooks.codebook(np.linspace(-1, 1, 256, dtype=np.float32))
        level = qoffsets.KernelLevel("uint8", grid[0], "float32", 0, table, 0.0137, 256 // grid[0])
        aff = qoffsets.AffineParts(None, None, qoffsets.Affine(scale_level=level), grid,
                                   None, parts[0])  # fmt: skip
        w = emulate.pallas.KernelQWeight(
            emulate.pallas.KernelWeight(codes, fmt, _K), scales, None, fmt, "float32",
            (group, 1), (_K, _BNB_N), np.dtype("bfloat16"), affine=aff, codebook=codebooks.NF4,
        )  # fmt: skip
        return emulate.pallas.matmul(x, w, target=target, out_dtype="float32", interpret=False)
    if offsets == "two_level":
        level = qoffsets.KernelLevel("uint6", 8, "float16")
        spec = qoffsets.Affine(offset="two_level", offset_level=level, scale_level=level)
        aff = qoffsets.AffineParts(None, parts[0], spec, grid, parts[1], parts[2])
        w = emulate.pallas.KernelQWeight(
            emulate.pallas.KernelWeight(codes, fmt, _K), scales, None, fmt, "float32",
            (group, 1), (_K, _N), np.dtype("float32"), affine=aff,
        )  # fmt: skip
        return emulate.pallas.matmul(x, w, target=target, out_dtype="bfloat16", interpret=False)
    spec = qoffsets.Affine(
        zero="packed" if zero == "packed" else "array" if zero == "int8" else "static",
        zero_value=zero if isinstance(zero, int) else 0,
        zero_format={"packed": "uint4", "int8": "int8"}.get(str(zero), ""),
        offset="array" if offsets else "none",
        offset_format="float16" if offsets else "",
    )
    zeros = parts[0] if zero in ("packed", "int8") else None
    aff = qoffsets.AffineParts(zeros, parts[-1] if offsets else None, spec, grid)
    if fmt == "uint4":
        codes = emulate.pallas.KernelWeight(codes, fmt, _K)
    w = emulate.pallas.KernelQWeight(
        codes, scales, None, fmt, "float16", (group, 1), (_K, _N), np.dtype("float32"),
        affine=aff,
    )  # fmt: skip
    return emulate.pallas.matmul(x, w, target=target, out_dtype="bfloat16", interpret=False)


RUNS = compile_only.runs(
    SCHEMES,
    ("tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e", "tpu_v7x"),
    {("awq-g128", "tpu_v7x"), ("q4_k", "tpu_v5e"), ("bnb-nf4-dq", "tpu_v6e")},
)


verdicts = compile_only.fixture("scheme", compiled_program, _specs)


@pytest.mark.parametrize("scheme, target", RUNS)
def test_the_tpu_compiler_compiles_it(verdicts, scheme, target):
    compile_only.assert_compiles(verdicts, scheme, target)
