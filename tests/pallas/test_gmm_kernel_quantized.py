"""emulate.pallas.ragged_dot with 4-bit and QArray experts, in TPU interpret mode on the
CPU: gpt-oss-style MXFP4 experts (e2m1 codes packed along K, e8m0 scales per 32 rows),
GGUF Q4_K-like experts (6-bit sub-block scales and mins times float16 super-block
scales), AWQ-like int4 experts with zero points, and plain Packed int4 experts (as
stored, as int4 arrays and prepared once). Where the contract says exact (int8
activations, integer or e2m1 codes, power-of-two scales) bit for bit against float64
oracles built from numpy parts and against emulate.ragged_dot's XLA route; otherwise
within emulate.bounds' bound of the float64 product; empty groups and rows past the last
group; the weight blocks fetched (each routed expert once, no unrouted one); refusals by
name; and, compile-only, the real TPU compiler on MXFP4, Q4_K, AWQ and NVFP4 expert stacks
on v4, v5e and v6e under EMULATE_LONG_TESTS=1 (by default tests/test_tpu_compile.py
compiles the grouped kernel on prepared MXFP4 experts: the comment at RUNS).

Each distinct kernel compiles once in interpret mode (a few seconds), so the default run
takes one case per scheme; the int8-row exact test runs MXFP4 and AWQ by default, Q4_K's
two-level experts under EMULATE_LONG_TESTS=1 (the grouped kernel decodes every QArray
through emulate.pallas.qweight, whose two-level scales and mins run in the kernel by
default in tests/pallas/test_qoffsets.py's
test_two_level_scales_and_mins_match_dot_general_bit_for_bit_where_exact)."""

from __future__ import annotations

import _compile_only as compile_only
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import emulate
import emulate.pallas
from emulate import bounds, reference
from emulate.pallas import gmm_kernel

M, K, N, G = 40, 256, 130, 4
SIZES = [9, 0, 20, 5]  # an empty group, groups sharing row tiles, 6 rows past the last
INT8_BLOCKS = (32, 128, 256)  # int8 rows tile by 32; 4-bit K blocks by 256
BF16_BLOCKS = (16, 128, 256)
DN = (((1,), (0,)), ((), ()))


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _rows(a: np.ndarray, group: int, k: int = K) -> np.ndarray:
    """Per-group parts (G, groups, N) repeated over their rows: (G, k, N)."""
    return np.repeat(a, group, axis=1)[:, :k]


def _per_group(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """float64 ragged product: rows of group g times w[g], rows past the last group 0."""
    out, start = np.zeros((x.shape[0], w.shape[2])), 0
    for g, size in enumerate(SIZES):
        out[start : start + size] = x[start : start + size].astype(np.float64) @ w[g]
        start += size
    return out


def _mxfp4(rng, k: int = K) -> tuple[emulate.QArray, np.ndarray]:
    """gpt-oss-style experts: e2m1 codes packed along K, e8m0 scales 2**-2 .. 2**2 per 32
    rows and column. Returns the QArray and its values in float64 (exact)."""
    codes = rng.integers(0, 16, (G, k, N)).astype(np.uint8).view(ml_dtypes.float4_e2m1fn)
    e = rng.integers(-2, 3, (G, k // 32, N))
    scales = np.ldexp(1.0, e).astype(ml_dtypes.float8_e8m0fnu)
    q = emulate.QArray.from_parts(
        emulate.pack(codes, axis=1), jnp.asarray(scales), block_shape=(1, 32, 1)
    )
    return q, codes.astype(np.float64) * _rows(np.ldexp(1.0, e), 32, k)


def _q4_k(rng) -> tuple[emulate.QArray, np.ndarray]:
    """GGUF Q4_K-like experts: uint4 codes, per 32 rows a 6-bit scale and min code (packed
    along the groups), per 256 rows power-of-two float16 ``d`` and ``dmin = -d / 2``.
    Returns the QArray and W = q * sc * d + mn * dmin in float64 (exact)."""
    groups, supers = K // 32, K // 256
    codes = rng.integers(0, 16, (G, K, N))
    sc, mn = rng.integers(0, 64, (2, G, groups, N))
    d = np.ldexp(1.0, rng.integers(-1, 2, (G, supers, N))).astype(np.float16)
    dmin = (-d / 2).astype(np.float16)

    def level(c, s):
        six = emulate.pack(c.astype(np.uint8), "uint6", axis=1)
        return emulate.QArray.from_parts(six, jnp.asarray(s), block_shape=(1, 8, 1))

    q = emulate.QArray.from_parts(
        emulate.pack(codes.astype(ml_dtypes.uint4), axis=1),
        level(sc, d),
        block_shape=(1, 32, 1),
        offsets=level(mn, dmin),
    )
    d64, dmin64 = (np.repeat(a.astype(np.float64), 8, axis=1) for a in (d, dmin))
    return q, codes * _rows(sc * d64, 32) + _rows(mn * dmin64, 32)


def _awq(rng) -> tuple[emulate.QArray, np.ndarray]:
    """AWQ-like experts: uint4 codes packed along K, uint4 zero points packed along N,
    power-of-two float16 scales per 128 rows. Returns the QArray and (q - z) * s."""
    groups = K // 128
    codes = rng.integers(0, 16, (G, K, N))
    z = rng.integers(0, 16, (G, groups, N))
    s = np.ldexp(1.0, rng.integers(-2, 3, (G, groups, N))).astype(np.float16)
    q = emulate.QArray.from_parts(
        emulate.pack(codes.astype(ml_dtypes.uint4), axis=1),
        jnp.asarray(s),
        block_shape=(1, 128, 1),
        zero_points=emulate.pack(z.astype(ml_dtypes.uint4), axis=2),
    )
    return q, (codes - _rows(z, 128)) * _rows(s.astype(np.float64), 128)


_SCHEMES = {"mxfp4": _mxfp4, "q4_k": _q4_k, "awq": _awq}


@pytest.mark.parametrize(
    "scheme", [pytest.param(s, marks=pytest.mark.long) if s == "q4_k" else s for s in _SCHEMES]
)
def test_qarray_experts_with_int8_rows_are_exact_bit_for_bit(scheme) -> None:
    rng = np.random.default_rng(len(scheme))
    q, wv = _SCHEMES[scheme](rng)
    xi = rng.integers(-8, 8, (M, K))  # every partial sum exact in f32
    x, gs = jnp.asarray(xi.astype(np.int8)), jnp.array(SIZES)
    got = gmm_kernel.ragged_dot(
        x, q, gs, target="tpu_v5e", out_dtype="float32", block_shape=INT8_BLOCKS, interpret=True
    )
    want = _per_group(xi, wv).astype(np.float32)  # exact in float64, rounded once
    np.testing.assert_array_equal(_bits(got), _bits(want))
    if scheme == "mxfp4":  # the XLA route of the front end: the same bits
        xla = emulate.ragged_dot(x, q, gs, preferred_element_type="float32", target="tpu_v5e")
        np.testing.assert_array_equal(_bits(got), _bits(xla))


def test_a_ragged_last_k_block_is_masked_as_stored_and_prepared() -> None:
    # K = 320, as gpt-oss's 2880 a ragged last K block (64 of 256 rows; 10 groups of 32)
    rng = np.random.default_rng(11)
    q, wv = _mxfp4(rng, k=320)
    xi = rng.integers(-8, 8, (M, 320))
    want = _bits(_per_group(xi, wv).astype(np.float32))
    kw = dict(target="tpu_v5e", out_dtype="float32", block_shape=INT8_BLOCKS, interpret=True)
    x, gs = jnp.asarray(xi.astype(np.int8)), jnp.array(SIZES)
    np.testing.assert_array_equal(_bits(gmm_kernel.ragged_dot(x, q, gs, **kw)), want)
    p = gmm_kernel.prepare_experts(q)  # K-planar: K padded to 512 rows of code 0
    np.testing.assert_array_equal(_bits(gmm_kernel.ragged_dot(x, p, gs, **kw)), want)


def test_mxfp4_experts_with_bf16_rows_are_within_the_bound() -> None:
    rng = np.random.default_rng(7)
    q, wv = _mxfp4(rng)
    x = rng.standard_normal((M, K)).astype(ml_dtypes.bfloat16)
    kw = dict(target="tpu_v5e", out_dtype="float32", block_shape=BF16_BLOCKS, interpret=True)
    got = np.asarray(gmm_kernel.ragged_dot(jnp.asarray(x), q, jnp.array(SIZES), **kw))
    start = 0
    for g, size in enumerate(SIZES):
        rows = slice(start, start + size)
        exact = np.asarray(x[rows], np.float64) @ wv[g]
        bound = bounds.dot_general_bound(  # 8 groups of 32 rows: S + 4 roundings more
            np.asarray(x[rows], np.float32), np.abs(wv[g]), DN, extra_terms=8 + 4
        )
        # (not emulate.pallas.matmul's bits: it takes the word step for MXFP4, which scales
        # group partial sums; the grouped kernel does not: both within the bound)
        assert (np.abs(got[rows] - exact) <= bound).all()
        start += size
    assert (got[start:] == 0).all() and np.count_nonzero(got[:start]) > got[:start].size // 2


def test_packed_int4_experts_are_the_oracles_bits_as_stored_and_prepared() -> None:
    rng = np.random.default_rng(3)
    w = rng.integers(-8, 8, (G, K, N))
    w4 = w.astype(ml_dtypes.int4)
    x = rng.integers(-128, 128, (M, K)).astype(np.int8)
    kw = dict(target="tpu_v5e", out_dtype="int32", block_shape=INT8_BLOCKS, interpret=True)
    want = reference.ragged_dot(x, w.astype(np.int8), SIZES, "int32")
    packed = emulate.pack(jnp.asarray(w4), axis=1)
    prepared = gmm_kernel.prepare_experts(packed)
    assert prepared.data.shape == packed.data.shape  # K = 256: whole tiles, the same bytes
    for experts in (packed, jnp.asarray(w4), prepared):
        got = gmm_kernel.ragged_dot(jnp.asarray(x), experts, jnp.array(SIZES), **kw)
        np.testing.assert_array_equal(np.asarray(got), want)


def test_prepared_qarray_experts_keep_the_bits() -> None:
    # the exact sums, as the QArray as stored gives them (test_qarray_experts_with_int8_rows_
    # are_exact_bit_for_bit[awq]: the same weight form and call)
    rng = np.random.default_rng(1)
    q, wv = _awq(rng)
    xi = rng.integers(-8, 8, (M, K))
    x = jnp.asarray(xi.astype(np.int8))
    kw = dict(target="tpu_v5e", out_dtype="float32", block_shape=INT8_BLOCKS, interpret=True)
    p = gmm_kernel.prepare_experts(q)
    assert isinstance(p, emulate.pallas.KernelQWeight) and p.nbytes == q.nbytes  # the same bytes
    b = gmm_kernel.ragged_dot(x, p, jnp.array(SIZES), **kw)
    want = _per_group(xi, wv).astype(np.float32)  # exact in float64, rounded once
    np.testing.assert_array_equal(_bits(b), _bits(want))


def test_no_rows_routed_reads_nothing_and_gives_zeros() -> None:
    q, _ = _mxfp4(np.random.default_rng(5))
    x = jnp.ones((M, K), jnp.int8)
    got = gmm_kernel.ragged_dot(
        x, q, jnp.zeros(G, jnp.int32), target="tpu_v5e", out_dtype="float32",
        block_shape=INT8_BLOCKS, interpret=True,
    )  # fmt: skip
    assert (np.asarray(got) == 0).all()
    # no visit: the pipeline still copies its first step's block per column block (the
    # last expert's, as the schedule repeats its last entry), and nothing more
    assert gmm_kernel.weight_fetches([0] * G, M, K, N, INT8_BLOCKS) == [
        (G - 1, 0, 0),
        (G - 1, 0, 1),
    ]


@pytest.mark.parametrize("sizes", [[1, 0, 2, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 4]])
def test_a_decode_step_reads_each_routed_expert_once_and_no_other(sizes) -> None:
    # gpt-oss-20B-like: top-4 of 32 experts for one token is 4 rows; here 8 experts
    k, n, blocks = 2880, 5760, (32, 256, 256)
    got = gmm_kernel.weight_fetches(sizes, 32, k, n, blocks)
    routed = {e for e, s in enumerate(sizes) if s}
    want = {(e, kb, j) for e in routed for kb in range(-(-k // 256)) for j in range(-(-n // 256))}
    assert len(got) == len(set(got)) and set(got) == want


def _nvfp4(rng) -> tuple[emulate.QArray, np.ndarray]:
    """NVFP4 experts: e2m1 codes packed along K, an e4m3fn scale per 16 rows and column,
    one float32 tensor scale (not a power of two) for all the experts. Returns the QArray
    and its values in float64 (exact)."""
    codes = rng.integers(0, 16, (G, K, N)).astype(np.uint8).view(ml_dtypes.float4_e2m1fn)
    mant = rng.choice([1.0, 1.125, 1.5, 1.875], (G, K // 16, N))
    scales = (np.ldexp(1.0, rng.integers(-3, 3, (G, K // 16, N))) * mant).astype(
        ml_dtypes.float8_e4m3fn
    )
    ts = np.float32(0.3)
    q = emulate.QArray.from_parts(
        emulate.pack(codes, axis=1), jnp.asarray(scales), block_shape=(1, 16, 1), tensor_scale=ts
    )
    values = codes.astype(np.float64) * _rows(scales.astype(np.float64), 16) * np.float64(ts)
    return q, values


@pytest.mark.parametrize("out", ["float32", "float16"])  # the tensor scale in / after
def test_nvfp4_experts_with_one_tensor_scale_are_within_the_bound(out) -> None:
    # float32: the kernel applies block and tensor scales and stores the result; float16
    # (Mosaic stores none): the tensor scale is applied to the f32 result after the kernel
    rng = np.random.default_rng(11)
    q, wv = _nvfp4(rng)
    x = rng.standard_normal((M, K)).astype(ml_dtypes.bfloat16)
    kw = dict(target="tpu_v5e", out_dtype=out, block_shape=BF16_BLOCKS, interpret=True)
    got = np.asarray(gmm_kernel.ragged_dot(jnp.asarray(x), q, jnp.array(SIZES), **kw))
    assert got.dtype == np.dtype(out)
    start = 0
    for g, size in enumerate(SIZES):
        rows = slice(start, start + size)
        exact = np.asarray(x[rows], np.float64) @ wv[g]
        bound = bounds.dot_general_bound(  # 16 groups of 16 rows, the tensor scale: S + 6
            np.asarray(x[rows], np.float32), np.abs(wv[g]), DN, extra_terms=16 + 6
        )
        if out == "float16":  # and the result's own rounding
            bound = bound + np.abs(exact) * 2.0**-11
        # (not emulate.pallas.matmul's bits: it takes the word step for NVFP4; the grouped
        # kernel does not: both within the bound)
        assert (np.abs(got[rows].astype(np.float64) - exact) <= bound).all()
        start += size
    assert (got[start:] == 0).all()
    with pytest.raises(NotImplementedError, match=r"^w: stacked experts with a tensor scale"):
        emulate.pallas.prepare_experts(q)


def _refused():
    codes = jnp.ones((G, K, 128), jnp.int8)
    per_32 = jnp.ones((G, K // 32, 128), jnp.float32)
    return [
        (
            emulate.QArray.from_parts(codes, per_32[:, :1], block_shape=(1, K, 1)),
            r"^w: QArray experts with scales constant along K are not built",
        ),
        (
            jnp.ones((K, 128), jnp.int4),
            r"^w: expected \(G, K, N\) experts, got shape \(256, 128\)$",
        ),
        ([1, 2], r"^w: expected \(G, K, N\) experts: an array, uint8 codes"),
    ]


@pytest.mark.parametrize("w, message", _refused())
def test_experts_it_does_not_read_are_refused_by_name(w, message) -> None:
    with pytest.raises((NotImplementedError, ValueError, TypeError), match=message):
        gmm_kernel.ragged_dot(
            jnp.ones((M, K), jnp.bfloat16), w, jnp.ones(G, jnp.int32), target="tpu_v5e"
        )


# The real compiler: a decode-sized MoE step on stacked experts (8 experts, 64 rows).
_E, _M, _K, _N = 8, 64, 2048, 1024
SCHEMES = ("mxfp4", "q4_k", "awq", "nvfp4")


def _specs(scheme: str):
    x = jax.ShapeDtypeStruct((_M, _K), jnp.bfloat16)
    codes = jax.ShapeDtypeStruct((_E, _K // 2, _N), jnp.uint8)
    if scheme == "mxfp4":
        return (x, codes, jax.ShapeDtypeStruct((_E, _K // 32, _N), jnp.float8_e8m0fnu))
    if scheme == "nvfp4":  # e4m3 scales per 16 rows, one float32 tensor scale
        s = jax.ShapeDtypeStruct((_E, _K // 16, _N), jnp.float8_e4m3fn)
        return (x, codes, s, jax.ShapeDtypeStruct((), jnp.float32))
    if scheme == "awq":
        s = jax.ShapeDtypeStruct((_E, _K // 128, _N), jnp.float16)
        return (x, codes, s, jax.ShapeDtypeStruct((_E, _K // 128, _N // 2), jnp.uint8))
    six = jax.ShapeDtypeStruct((_E, _K // 32 * 6 // 8, _N), jnp.uint8)
    sup = jax.ShapeDtypeStruct((_E, _K // 256, _N), jnp.float16)
    return (x, codes, six, sup, six, sup)


def compiled_program(x, codes, *parts, scheme: str, target: str):
    """emulate.pallas.ragged_dot on a stacked QArray of experts, as a checkpoint holds them
    (routing: the first rows to expert 0, the rest spread over the others)."""
    fmt = "float4_e2m1fn" if scheme in ("mxfp4", "nvfp4") else "uint4"
    packed = emulate.Packed(codes, fmt, -2, _K)
    if scheme == "mxfp4":
        q = emulate.QArray.from_parts(packed, parts[0], block_shape=(1, 32, 1))
    elif scheme == "nvfp4":
        q = emulate.QArray.from_parts(
            packed, parts[0], block_shape=(1, 16, 1), tensor_scale=parts[1]
        )
    elif scheme == "awq":
        zp = emulate.Packed(parts[1], "uint4", -1, _N)
        q = emulate.QArray.from_parts(packed, parts[0], block_shape=(1, 128, 1), zero_points=zp)
    else:

        def level(c, s):
            six = emulate.Packed(c, "uint6", -2, _K // 32)
            return emulate.QArray.from_parts(six, s, block_shape=(1, 8, 1))

        q = emulate.QArray.from_parts(
            packed, level(*parts[:2]), block_shape=(1, 32, 1), offsets=level(*parts[2:])
        )
    sizes = jnp.array([_M // 2] + [_M // 2 // (_E - 1)] * (_E - 1))
    return gmm_kernel.ragged_dot(x, q, sizes, target=target, out_dtype="bfloat16", interpret=False)


# Every run is long (EMULATE_LONG_TESTS=1): the MXFP4 kernel (bk = 1024 rows of e2m1 codes)
# takes some 10 s of the compiler for each compatibility setting, and by default
# tests/test_tpu_compile.py compiles the same grouped kernel on MXFP4 experts
# (emulate.ragged_dot's kernel route to emulate.pallas.gmm_kernel: e8m0 scales per 32 rows,
# bk = 1024, bn = 256; prepared-mxfp4-experts on tpu_v5e with compat off, on tpu_v2 and
# tpu_v7x with it on).
RUNS = compile_only.runs(SCHEMES, ("tpu_v4", "tpu_v5e", "tpu_v6e"), set())
verdicts = compile_only.fixture("scheme", compiled_program, _specs)


@pytest.mark.parametrize("scheme, target", RUNS)
def test_the_tpu_compiler_compiles_it(verdicts, scheme, target):
    compile_only.assert_compiles(verdicts, scheme, target)


def test_the_compiled_kernel_of_quantized_experts_needs_a_tpu_in_sight():
    # as emulate.pallas.matmul: interpret=False with no TPU in sight is emulate's message,
    # naming the argument, not Pallas' "Only interpret mode is supported on CPU backend"
    w = np.random.default_rng(0).standard_normal((2, 256, 128)).astype(np.float32)
    q = emulate.quantize(w, "int8", block_shape=32, axis=1)
    x = jnp.ones((4, 256), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"^interpret: False builds the Mosaic kernel of a "):
        emulate.pallas.ragged_dot(
            x, q, jnp.array([2, 2], jnp.int32), target="tpu_v5e", interpret=False
        )
