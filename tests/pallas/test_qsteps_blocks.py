"""emulate.pallas.matmul with scale blocks of several columns (emulate.pallas.qsteps):
FP8 e4m3 weights with one scale per 128 x 128 block, in TPU interpret mode on the CPU.

* sums that every f32 order keeps exact (int8 activations, e4m3 or int4 codes, powers
  of two): bit for bit ``emulate.dot_general`` and an integer oracle;
* within ``gamma_(K + S + 4) * sum |x w|`` of the exact sum over emulate.reference's
  dequantized values (float64), for K not a multiple of 128, N with a partial last block,
  K = 128, M = 1, blocks of 256 and 384 columns (the output block's lanes cut at
  ``gcd(bn, C)``), float32 and bfloat16 scales, unprepared and prepared (the QArray's
  bytes);
* hypothesis: e4m3 special codes (+-0, +-448, subnormals, NaN: its column NaN) and
  scales (0, negative, powers of two far from 1) placed anywhere;
* a NaN scale makes exactly its block's columns NaN (a one-hot dot would spread it);
* a DeepSeek-V3 style checkpoint read by the importer, against an oracle of the file's
  bytes (ml_dtypes codes times ``np.kron``-repeated scales, float64);
* refusals: blocks not a multiple of 128 columns; zero points, offsets or two-level
  scales with column blocks, each named;
* compile-only, the real TPU compiler, compatibility mode on and off: prepared 128 x 128
  (float32 scales) and 128 x 384 (bfloat16) FP8 weights with bf16 activations, and int4
  codes in 128 x 256 blocks with int8 activations (the exact route); v5e by default, v2 to
  7x long.

Interpret mode compiles each distinct kernel once (about 2 s here); the hypothesis
examples share one shape (one compile).
"""

from __future__ import annotations

import functools
import math
import pathlib
import sys

import _compile_only as compile_only
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
from emulate import bounds, reference
from emulate.importers import safetensors as S

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "importers"))
from _st_cases import write  # noqa: E402

DN = (((1,), (0,)), ((), ()))
E4M3 = ml_dtypes.float8_e4m3fn
#: e4m3fn codes: +0, -0, 448, -448, the least and the largest subnormal, the least
#: normal, NaN (0x7F and 0xFF).
SPECIAL_CODES = (0x00, 0x80, 0x7E, 0xFE, 0x01, 0x87, 0x08, 0x7F, 0xFF)


def _weight(k: int, n: int, block, rng, scale_dtype=np.float32):
    """(codes (K, N) e4m3fn, every finite code; scales) of a block-scaled weight."""
    c = rng.integers(0, 256, (k, n)).astype(np.uint8)
    c[(c & 0x7F) == 0x7F] = 0x08  # NaN codes only where a test puts them
    grid = (-(-k // block[0]), -(-n // block[1]))
    s = rng.uniform(0.5, 2.0, grid) * np.exp2(rng.integers(-8, 8, grid))
    s *= np.where(rng.random(grid) < 0.2, -1, 1)
    return c.view(E4M3), s.astype(scale_dtype)


def _check(x, got, codes, scales, block) -> None:
    """``got`` within the bound of the exact sum over the reference's dequantized values;
    NaN exactly in the columns of a NaN weight."""
    wv = reference.dequantize(codes, scales, block).astype(np.float64)
    nan = np.isnan(wv).any(axis=0)
    got = np.asarray(got, np.float64)
    assert np.all(np.isnan(got[:, nan]))
    assert not np.isnan(got[:, ~nan]).any()
    x64 = np.asarray(x, np.float64)
    w = wv[:, ~nan]
    want = x64 @ w
    segments = math.ceil(codes.shape[0] / block[0])
    bound = bounds.dot_general_bound(x64.astype(np.float32), w.astype(np.float32), DN,
                                     extra_terms=segments + 4)  # fmt: skip
    err = np.abs(got[:, ~nan] - want)
    assert np.all(err <= bound + np.abs(want) * 2.0**-24), float(np.max(err - bound))


# (M, K, N, block, scale dtype, target, prepared)
CASES = [
    # K not a multiple of 128, N's last block 72 columns, 3 rows of x
    (3, 300, 200, (128, 128), np.float32, "tpu_v5e", False),
    # K = 128 (one group), M = 1, bfloat16 scales, N = 384 in two output blocks of 256
    (1, 128, 384, (128, 128), ml_dtypes.bfloat16, "tpu_v5e", True),
    # blocks of 384 columns, output blocks of 256: lanes cut at gcd = 128
    (8, 256, 640, (128, 384), np.float32, "tpu_v7x", False),
    # blocks of 256 rows and columns on v2's f32 route, prepared
    pytest.param(16, 512, 1024, (256, 256), np.float32, "tpu_v2", True, marks=pytest.mark.long),
]


@pytest.mark.parametrize("m, k, n, block, sdt, target, prepared", CASES)
def test_fp8_column_blocks_are_within_the_bound(m, k, n, block, sdt, target, prepared):
    rng = np.random.default_rng(m * 1000 + k + n)
    codes, scales = _weight(k, n, block, rng, sdt)
    q = emulate.QArray.from_parts(jnp.asarray(codes), jnp.asarray(scales), block_shape=block)
    w = q
    if prepared:
        w = emulate.pallas.prepare_weight(q)
        assert isinstance(w, emulate.pallas.KernelQWeight) and w.nbytes == q.nbytes
    x = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    x[0, :2] = [0.0, -0.0]
    got = emulate.pallas.matmul(x, w, target=target, out_dtype=jnp.float32)
    assert got.dtype == jnp.float32 and got.shape == (m, n)
    _check(x, got, codes, scales, block)
    assert np.count_nonzero(np.asarray(got)) > got.size // 2  # not a sum of zeros


@pytest.mark.parametrize(
    "fmt, block",
    [("float8_e4m3fn", (128, 128)), pytest.param("int4", (128, 256), marks=pytest.mark.long)],
)
def test_sums_that_are_exact_match_dot_general_and_an_integer_oracle_bit_for_bit(fmt, block):
    # int8 activations in [-8, 8), e4m3 codes of exponents -2 to 2 (or int4 codes, the
    # exact int32 route), power-of-two scales 2**-2 to 2**2: every partial sum is a
    # multiple of 2**-7 of magnitude at most 300 * 8 * 7.5 * 4 < 2**17 (2**24 units), so
    # any order of f32 additions gives the exact sum
    rng = np.random.default_rng(len(fmt))
    m, k, n = 8, 300, 640
    if fmt == "int4":
        v = rng.integers(-8, 8, (k, n))
        codes = emulate.pack(v.astype(ml_dtypes.int4), axis=0)
        num = v * 32  # in units of 2**-5
    else:
        sign = rng.integers(0, 2, (k, n)) << 7
        c = (sign | rng.integers(0x28, 0x50, (k, n))).astype(np.uint8)  # 2**-2 .. 2**2
        c[rng.random((k, n)) < 0.1] = 0x80  # -0
        codes = jnp.asarray(c.view(E4M3))
        num = np.asarray(c.view(E4M3).astype(np.float64) * 32).astype(np.int64)
    grid = (-(-k // block[0]), -(-n // block[1]))
    e = rng.integers(-2, 3, grid)
    q = emulate.QArray.from_parts(codes, np.ldexp(1.0, e).astype(np.float32), block_shape=block)
    xi = rng.integers(-8, 8, (m, k))
    x = xi.astype(np.int8)
    se = np.repeat(np.repeat(e, block[0], 0), block[1], 1)[:k, :n] + 2  # >= 0
    want = ((xi @ (num << se)) / 2.0**7).astype(np.float32)  # exact: |sum| < 2**24 units
    same = emulate.dot_general(x, q, DN, preferred_element_type="float32", target="tpu_v5e")
    np.testing.assert_array_equal(np.asarray(same).view(np.uint32), want.view(np.uint32))
    for w in (q, emulate.pallas.prepare_weight(q)):
        got = emulate.pallas.matmul(x, w, target="tpu_v5e", out_dtype="float32")
        np.testing.assert_array_equal(np.asarray(got).view(np.uint32), want.view(np.uint32))


_HK, _HN = 200, 300  # the hypothesis examples' shape: one compile


@functools.cache
def _hypothesis_base():
    rng = np.random.default_rng(11)
    codes, scales = _weight(_HK, _HN, (128, 128), rng)
    x = rng.standard_normal((2, _HK)).astype(ml_dtypes.bfloat16)
    return codes, scales, x


@settings(max_examples=examples(4, 40), deadline=None)
@given(
    cells=st.lists(
        st.tuples(st.integers(0, _HK - 1), st.integers(0, _HN - 1), st.sampled_from(SPECIAL_CODES)),
        max_size=12,
    ),
    blocks=st.lists(
        st.tuples(
            st.integers(0, 1),
            st.integers(0, 2),
            st.sampled_from([0.0, -0.0, -1.0, 2.0**-20, 2.0**20]),
        ),
        max_size=3,
    ),
)
def test_special_codes_and_scales_follow_the_reference(cells, blocks):
    codes, scales, x = _hypothesis_base()
    c, s = codes.view(np.uint8).copy(), scales.copy()
    for i, j, v in cells:
        c[i, j] = v
    for i, j, v in blocks:
        s[i, j] = v
    c = c.view(E4M3)
    q = emulate.QArray.from_parts(jnp.asarray(c), jnp.asarray(s), block_shape=(128, 128))
    got = emulate.pallas.matmul(x, q, target="tpu_v5e", out_dtype=jnp.float32)
    _check(x, got, c, s, (128, 128))


def test_a_nan_scale_makes_exactly_its_blocks_columns_nan():
    codes, scales, x = _hypothesis_base()
    s = scales.copy()
    s[1, 1] = np.nan  # rows 128..199, columns 128..255
    s[0, 2] = np.inf  # rows 0..127, columns 256..299: Inf or NaN there
    q = emulate.QArray.from_parts(jnp.asarray(codes), jnp.asarray(s), block_shape=(128, 128))
    got = np.asarray(emulate.pallas.matmul(x, q, target="tpu_v5e", out_dtype=jnp.float32))
    assert np.isnan(got[:, 128:256]).all()
    assert not np.isfinite(got[:, 256:]).any()
    assert np.isfinite(got[:, :128]).all()
    _check(x, got[:, :128], codes[:, :128], scales[:, :1], (128, 128))


def test_a_deepseek_checkpoint_through_the_importer(tmp_path):
    # the file as DeepSeek-V3 stores it: weight (N, K) e4m3fn, weight_scale_inv (N/128, K/128)
    rng = np.random.default_rng(12)
    n, k = 320, 272
    w8 = rng.integers(0, 256, (n, k)).astype(np.uint8)
    w8[(w8 & 0x7F) == 0x7F] = 0x7E
    w8 = w8.view(E4M3)
    s = (rng.uniform(1, 2, (3, 3)) * 2.0 ** rng.integers(-10, -4, (3, 3))).astype(np.float32)
    cfg = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    q = S.load_fp8_blocks(
        write(tmp_path, {"l.weight": w8, "l.weight_scale_inv": s}, cfg), "l", layout="in_out"
    )
    x = rng.standard_normal((4, k)).astype(ml_dtypes.bfloat16)
    p = emulate.pallas.prepare_weight(q)
    assert p.nbytes == q.nbytes
    got = np.asarray(
        emulate.pallas.matmul(x, p, target="tpu_v5e", out_dtype=jnp.float32), np.float64
    )
    # the oracle, from the file's arrays alone: (N, K) values, transposed
    wv = (w8.astype(np.float64) * np.kron(s, np.ones((128, 128)))[:n, :k]).T
    want = np.asarray(x, np.float64) @ wv
    bound = bounds.dot_general_bound(np.asarray(x, np.float32), wv.astype(np.float32), DN,
                                     extra_terms=3 + 4)  # fmt: skip
    assert np.all(np.abs(got - want) <= bound + np.abs(want) * 2.0**-24)


def test_blocks_the_kernel_does_not_build_are_refused_by_name():
    x = np.ones((4, 256), ml_dtypes.bfloat16)
    q64 = emulate.QArray.from_parts(
        jnp.ones((256, 256), E4M3), jnp.ones((2, 4), jnp.float32), block_shape=(128, 64)
    )
    q_zero = emulate.QArray.from_parts(
        jnp.ones((256, 256), jnp.uint8),
        jnp.ones((2, 2), jnp.float16),
        block_shape=(128, 128),
        fmt="uint8",
        zero_points=jnp.ones((2, 2), jnp.uint8),
    )
    inner = emulate.QArray.from_parts(
        jnp.ones((2, 2), jnp.uint8), jnp.ones((2, 2), jnp.float16), block_shape=(1, 1), fmt="uint8"
    )
    q_two = emulate.QArray.from_parts(jnp.ones((256, 256), E4M3), inner, block_shape=(128, 128))
    q_offsets = emulate.QArray.from_parts(
        jnp.ones((256, 256), jnp.uint8),
        jnp.ones((2, 2), jnp.float16),
        block_shape=(128, 128),
        fmt="uint8",
        zero_points=3,
        offsets=jnp.ones((2, 2), jnp.float32),
    )
    cases = [
        (q64, r"^w: emulate.pallas.matmul does not decode blocks of 64 columns in the kernel "
              r"\(block_shape \(128, 64\): one scale per column \(G, 1\), per group for all N "
              r"columns \(G, N\) or per block of a multiple of 128 columns are built\); use "
              r"emulate.dot_general for this QArray$"),
        (q_zero, r"^w: emulate.pallas.matmul does not decode zero points in blocks of 128 "
                 r"columns in the kernel"),
        # two-level scales (no zero points, no offsets) are named as what they are
        (q_two, r"^w: emulate.pallas.matmul does not decode two-level scales in blocks of 128 "
                r"columns in the kernel \(zero points, offsets and two-level scales per column "
                r"\(G, 1\) or for all N columns \(G, N\) are built\); use emulate.dot_general "
                r"for this QArray$"),
        (q_offsets, r"^w: emulate.pallas.matmul does not decode zero points and offsets in "
                    r"blocks of 128 columns in the kernel"),
    ]  # fmt: skip
    for q, message in cases:
        with pytest.raises(NotImplementedError, match=message):
            emulate.pallas.matmul(x, q, target="tpu_v5e")
        with pytest.raises(NotImplementedError, match=message):
            emulate.pallas.prepare_weight(q)


# --- compile-only: the real TPU compiler -------------------------------------------------

_CM, _CK, _CN = 64, 1024, 1024
#: scheme: (codes format, block, scale dtype, activations' dtype)
SCHEMES = {
    "fp8-128x128": ("float8_e4m3fn", (128, 128), np.float32, jnp.bfloat16),
    "fp8-128x384-bf16": ("float8_e4m3fn", (128, 384), ml_dtypes.bfloat16, jnp.bfloat16),
    "int4-128x256-int8x": ("int4", (128, 256), np.float32, jnp.int8),  # the exact route
}


@functools.cache
def _prepared(scheme: str):
    fmt, block, sdt, _ = SCHEMES[scheme]
    rng = np.random.default_rng(3)
    if fmt == "int4":
        codes = emulate.pack(rng.integers(-8, 8, (_CK, _CN)).astype(ml_dtypes.int4), axis=0)
    else:
        codes = jnp.asarray(_weight(_CK, _CN, block, rng)[0])
    grid = (-(-_CK // block[0]), -(-_CN // block[1]))
    q = emulate.QArray.from_parts(codes, jnp.asarray(np.ones(grid, sdt)), block_shape=block)
    return jax.tree_util.tree_flatten(emulate.pallas.prepare_weight(q))


def compiled_program(x, *leaves, scheme: str, target: str):
    """emulate.pallas.matmul of the scheme's activations and prepared weight."""
    w = jax.tree_util.tree_unflatten(_prepared(scheme)[1], leaves)
    return emulate.pallas.matmul(x, w, target=target, out_dtype="bfloat16", interpret=False)


def _specs(scheme: str) -> tuple:
    x = jax.ShapeDtypeStruct((_CM, _CK), SCHEMES[scheme][3])
    return (x, *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in _prepared(scheme)[0]))


RUNS = compile_only.runs(
    SCHEMES,
    ("tpu_v2", "tpu_v3", "tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e", "tpu_v7x"),
    {("fp8-128x128", "tpu_v5e")},
)


verdicts = compile_only.fixture("scheme", compiled_program, _specs)


@pytest.mark.parametrize("scheme, target", RUNS)
def test_the_tpu_compiler_compiles_it(verdicts, scheme, target):
    compile_only.assert_compiles(verdicts, scheme, target)
