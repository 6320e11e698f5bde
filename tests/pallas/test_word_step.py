"""emulate.pallas.word_step: emulate.pallas.matmul at decode (4- and 6-bit weights read in
whole words, group partial sums on the matrix unit), in TPU interpret mode on the CPU, on each
of its decodes (f32 and a pack: v5e; bfloat16 arithmetic: v6e; piece order and f32
activations: v2 and f32 x): bit for bit against an exact float64 oracle where every
partial sum is exact (integer-valued activations, power-of-two scales, zero points,
two-level scales and mins, a ragged K, N and last tile, two K steps), within the bound of
emulate.bounds otherwise, NaN scales kept in their column; float4_e2m1fn weights (MXFP4,
NVFP4: every code at every nibble of a word, e8m0 scales 2**-127 and NaN, e4m3 scales at
their largest, subnormal and NaN, a tensor scale) bit for bit against emulate.reference's
values; NF4 (a 16-entry table) within the bound; GGUF Q6_K-like 6-bit weights (every code
at every nibble and crumb, int8 scale codes at their extremes, d subnormal, large and
NaN) bit for bit (random GGUF Q6_K blocks against gguf.quants within the bound:
tests/pallas/test_qweight_codes.py), compiled by the real compiler; which calls take the
step. The real
compiler compiles the MXFP4 and NVFP4 steps in tests/test_tpu_compile.py (qarray-fp4-*)."""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest

import emulate
import emulate.pallas
from emulate import bounds, codebooks, compiler, formats, reference
from emulate.pallas import matmul_args, matmul_config, word_step

DN = (((1,), (0,)), ((), ()))


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _config(x, w, target):
    a = matmul_args.matmul_args(x, w, target=target, out_dtype="float32")
    return matmul_config.config(
        r=a.compute, t=a.target, m=a.m, n=a.n, k=a.k, stored=a.stored,
        w_passthrough=a.passthrough, block_shape=None, interpret=True,
        x_dtype=a.x.dtype.name, scaling=a.scaling, out=a.out, codebook=a.codebook,
    )  # fmt: skip


def _awq(k, n, group, rng, *, zero="packed", pow2=True):
    """A uint4 QArray (codes packed along K), float16 scales per ``group`` rows (powers of
    two from 2**-2 to 2**2 with ``pow2``), zero points ("packed" uint4 along N, an int,
    or None). Returns it and W = (q - z) * s in float64 (exact)."""
    groups = -(-k // group)
    codes = rng.integers(0, 16, (k, n))
    if pow2:
        s = np.ldexp(1.0, rng.integers(-2, 3, (groups, n))).astype(np.float16)
    else:
        s = rng.uniform(1e-3, 2.0, (groups, n)).astype(np.float16)
    if zero == "packed":
        z = rng.integers(0, 16, (groups, n))
        zp = emulate.pack(z.astype(ml_dtypes.uint4), axis=1)
    else:
        z, zp = np.full((groups, n), zero or 0), zero
    q = emulate.QArray.from_parts(
        emulate.pack(codes.astype(ml_dtypes.uint4), axis=0),
        s,
        block_shape=(group, 1),
        zero_points=zp,
    )
    rows = np.repeat(np.arange(groups), group)[:k]
    return q, (codes - z[rows]) * s.astype(np.float64)[rows]


def _q4_k(k, n, rng):
    """A GGUF Q4_K-like QArray: uint4 codes, per 32 rows 6-bit scale and min codes packed
    along the groups, per 256 rows power-of-two float16 ``d`` and ``-d/2``. Returns it and
    W = q * sc * d - m * d / 2 in float64 (exact)."""
    groups, supers = -(-k // 32), -(-k // 256)
    codes = rng.integers(0, 16, (k, n))
    sc, mn = rng.integers(0, 64, (groups, n)), rng.integers(0, 64, (groups, n))
    d = np.ldexp(1.0, rng.integers(-1, 2, (supers, n))).astype(np.float16)
    dmin = (-(d.astype(np.float32) / 2)).astype(np.float16)

    def level(c, s):
        six = emulate.pack(c.astype(np.uint8), "uint6", axis=0)
        return emulate.QArray.from_parts(six, s, block_shape=(8, 1))

    q = emulate.QArray.from_parts(
        emulate.pack(codes.astype(ml_dtypes.uint4), axis=0),
        level(sc, d),
        block_shape=(32, 1),
        offsets=level(mn, dmin),
    )
    g = np.repeat(np.arange(groups), 32)[:k]
    dg = np.repeat(d.astype(np.float64), 8, axis=0)[:groups]
    ming = np.repeat(dmin.astype(np.float64), 8, axis=0)[:groups]
    return q, codes * (sc * dg)[g] + (mn * ming)[g]


def _q6_k(k, n, rng, *, codes=None, sc=None, d=None):
    """A GGUF Q6_K-like QArray: uint6 codes with zero point 32, per 16 rows int8 scale
    codes, per 256 rows a float16 ``d`` (powers of two 2**-1 and 1 unless given). Returns it
    and W = (q - 32) * sc * d in float64 (exact)."""
    groups, supers = -(-k // 16), -(-k // 256)
    codes = rng.integers(0, 64, (k, n)) if codes is None else codes
    sc = rng.integers(-128, 128, (groups, n)) if sc is None else sc
    if d is None:
        d = np.ldexp(1.0, rng.integers(-1, 1, (supers, n))).astype(np.float16)
    level = emulate.QArray.from_parts(sc.astype(np.int8), d, block_shape=(16, 1))
    q = emulate.QArray.from_parts(
        emulate.pack(codes.astype(np.uint8), "uint6", axis=0),
        level,
        block_shape=(16, 1),
        zero_points=32,
    )
    g = np.repeat(np.arange(groups), 16)[:k]
    dg = np.repeat(d.astype(np.float64), 16, axis=0)[:groups]
    return q, (codes - 32.0) * (sc * dg)[g]


def _int_x(m, k, rng) -> np.ndarray:
    return rng.integers(-8, 9, (m, k)).astype(ml_dtypes.bfloat16)


# (weight, target, (M, K, N)): every partial sum exact in f32, so the result is the exact
# sum rounded once to f32 on every decode.
EXACT = [
    ("awq", "tpu_v5e", (3, 700, 300)),  # ragged K (a partial tile), N and groups
    ("awq", "tpu_v6e", (3, 700, 300)),  # bfloat16 arithmetic: 128 + c - (128 + z)
    # uint4 - 8 (a static zero point) on the bf16 route
    pytest.param("q4_0", "tpu_v6e", (1, 512, 256), marks=pytest.mark.long),
    ("q4_k", "tpu_v5e", (2, 576, 128)),  # two-level scales and mins, a ragged super-block
    ("int4", "tpu_v2", (16, 2304, 128)),  # piece order, two K steps, a partial last block
    pytest.param("int4", "tpu_v5e", (16, 2304, 128), marks=pytest.mark.long),
    # 6-bit codes (nibbles and crumbs), int8 sub-block scales times d: a ragged K (a
    # partial 512-row tile and super-block); bfloat16 arithmetic; piece order. On v5e by
    # default in test_q6_k_extreme_codes_and_scales_are_bit_for_bit (K = 576: a partial
    # 512-row tile and super-block, every code, extreme scales)
    pytest.param("q6_k", "tpu_v5e", (2, 700, 128), marks=pytest.mark.long),
    pytest.param("q6_k", "tpu_v6e", (3, 700, 128), marks=pytest.mark.long),
    pytest.param("q6_k", "tpu_v2", (16, 2560, 128), marks=pytest.mark.long),
    pytest.param("int6", "tpu_v6e", (2, 700, 256), marks=pytest.mark.long),  # no scales
]


@pytest.mark.parametrize("kind, target, shape", EXACT)
def test_exact_sums_are_bit_for_bit(kind, target, shape):
    m, k, n = shape
    rng = np.random.default_rng(sum(map(ord, kind + target)))
    if kind == "awq":
        w, wv = _awq(k, n, 128, rng)
    elif kind == "q4_0":
        w, wv = _awq(k, n, 32, rng, zero=8)
    elif kind == "q4_k":
        w, wv = _q4_k(k, n, rng)
    elif kind == "int6":  # two's complement 6-bit codes, as uint8
        codes = rng.integers(-32, 32, (k, n))
        w, wv = emulate.pallas.prepare_weight((codes & 63).astype(np.uint8), "int6"), codes
    elif kind == "q6_k":
        w, wv = _q6_k(k, n, rng)
        x = rng.integers(-2, 3, (m, k)).astype(ml_dtypes.bfloat16)  # every sum below 2**24
    else:
        codes = rng.integers(-8, 8, (k, n))
        w, wv = codes.astype(ml_dtypes.int4), codes.astype(np.float64)
    p = emulate.pallas.prepare_weight(w)
    x = x if kind == "q6_k" else _int_x(m, k, rng)
    assert _config(x, p, target).word_step
    got = emulate.pallas.matmul(x, p, target=target, out_dtype="float32")
    want = (np.asarray(x, np.float64) @ wv).astype(np.float32)
    np.testing.assert_array_equal(_bits(got), _bits(want))


def test_q6_k_extreme_codes_and_scales_are_bit_for_bit():
    # every 6-bit code at every row of a word tile (every nibble and crumb of every word),
    # int8 scale codes -128 and 127 in whole columns, d at float16's smallest subnormal
    # (2**-24) and at 2**15 in whole columns, a NaN d (its super-block's 16 groups): the
    # exact sum rounded once to f32 (x in -2..2: every partial sum exact)
    k, n, m = 576, 256, 2
    rng = np.random.default_rng(13)
    r, c = np.meshgrid(np.arange(k), np.arange(n), indexing="ij")
    codes = (r + c) % 64
    sc = rng.integers(-128, 128, (k // 16, n))
    sc[:, 3], sc[:, 4] = -128, 127
    d = np.ldexp(1.0, rng.integers(-1, 1, (3, n))).astype(np.float16)
    d[:, 5], d[:, 6] = np.float16(2.0**-24), np.float16(2.0**15)
    d[1, 9] = np.nan
    w, wv = _q6_k(k, n, rng, codes=codes, sc=sc, d=d)
    x = rng.integers(-2, 3, (m, k)).astype(ml_dtypes.bfloat16)
    p = emulate.pallas.prepare_weight(w)
    assert _config(x, p, "tpu_v5e").word_step
    got = np.asarray(emulate.pallas.matmul(x, p, target="tpu_v5e", out_dtype="float32"))
    with np.errstate(invalid="ignore"):
        want = (np.asarray(x, np.float64) @ wv).astype(np.float32)
    assert np.isnan(got[:, 9]).all() and not np.isnan(np.delete(got, 9, axis=1)).any()
    assert 0 < np.abs(got[:, 5]).max() < 2.0**-2
    np.testing.assert_array_equal(_bits(got), _bits(want))


def _nf4(k, n, rng):
    """A bitsandbytes NF4 QArray (uint4 codes into the NF4 table, every code at every
    nibble of a word; f32 absmax per 64 rows) and its values from emulate.reference."""
    r, c = np.meshgrid(np.arange(k), np.arange(n), indexing="ij")
    codes = ((r + c) % 16).astype(ml_dtypes.uint4)
    absmax = rng.uniform(1e-3, 2.0, (k // 64, n)).astype(np.float32)
    q = emulate.QArray.from_parts(
        emulate.pack(codes, axis=0), absmax, block_shape=(64, 1), codebook=codebooks.NF4
    )
    table = codebooks.NF4.array().astype(np.float32)[codes.astype(np.uint8)]
    return q, reference.dequantize(table, absmax, (64, 1), exact=True)


@pytest.mark.parametrize(
    "kind, x_dtype, target",
    [
        ("nf4", "bfloat16", "tpu_v5e"),  # a select tree per nibble, three bf16 pieces
        pytest.param("awq", "bfloat16", "tpu_v5e", marks=pytest.mark.long),
        pytest.param("awq", "float32", "tpu_v5e", marks=pytest.mark.long),
        # float16 d of a GGUF's size, f32 activations: piece order, K steps of 256 rows
        pytest.param("q6_k", "float32", "tpu_v2", marks=pytest.mark.long),
    ],
)
def test_float_scales_and_activations_are_within_the_bound(kind, x_dtype, target):
    rng = np.random.default_rng(3)
    m, k, n = 4, 256 if kind == "nf4" else 1024, 256  # NF4: one tile (a smaller program)
    group = {"nf4": 64, "q6_k": 16}.get(kind, 128)
    if kind == "nf4":
        w, wv = _nf4(k, n, rng)
    elif kind == "q6_k":
        d = rng.uniform(1e-3, 1.1e-2, (k // 256, n)).astype(np.float16)
        w, wv = _q6_k(k, n, rng, d=d)
    else:
        w, wv = _awq(k, n, 128, rng, pow2=False)
    x = rng.standard_normal((m, k)).astype(np.dtype(formats.get(x_dtype).dtype))
    p = emulate.pallas.prepare_weight(w)
    cfg = _config(x, p, target)
    assert cfg.word_step and word_step.piece_order(cfg) == (x_dtype == "float32")
    got = np.asarray(emulate.pallas.matmul(x, p, target=target, out_dtype="float32"))
    xf = np.asarray(x, np.float64)
    segments = k // group
    bound = bounds.qarray_bound(xf, wv, DN, segments=segments, route="pallas")
    assert np.all(np.abs(got - xf @ wv) <= bound)


@pytest.mark.long  # NaN scales of the e2m1 weights run by default (below)
def test_a_nan_scale_stays_in_its_column():
    rng = np.random.default_rng(4)
    w, wv = _awq(512, 256, 32, rng)
    s = np.asarray(w.scales).copy()
    s[3, 17] = np.nan
    w = emulate.QArray.from_parts(w.codes, s, block_shape=(32, 1), zero_points=w.zero_points)
    x = _int_x(2, 512, rng)
    got = np.asarray(
        emulate.pallas.matmul(
            x, emulate.pallas.prepare_weight(w), target="tpu_v5e", out_dtype="float32"
        )
    )
    assert np.isnan(got[:, 17]).all()
    keep = np.arange(256) != 17
    want = (np.asarray(x, np.float64) @ wv[:, keep]).astype(np.float32)
    np.testing.assert_array_equal(_bits(got[:, keep]), _bits(want))


def test_which_calls_take_the_word_step():
    rng = np.random.default_rng(5)
    q, _ = _awq(512, 256, 32, rng)
    p = emulate.pallas.prepare_weight(q)
    x1, x128 = _int_x(1, 512, rng), _int_x(128, 512, rng)
    assert _config(x1, p, "tpu_v5e").word_step
    assert _config(x1, p, "tpu_v6e").word_step
    assert not _config(x128, p, "tpu_v5e").word_step  # 4 groups a dot x 128 rows > 256
    g128 = emulate.pallas.prepare_weight(_awq(512, 256, 128, rng)[0])
    assert _config(x128, g128, "tpu_v5e").word_step  # one group a dot
    assert not _config(np.ones((1, 512), np.int8), p, "tpu_v5e").word_step  # exact route
    nf4 = emulate.QArray.from_parts(
        q.codes, np.ones((8, 256), np.float32), block_shape=(64, 1), codebook=codebooks.NF4
    )
    assert _config(x1, emulate.pallas.prepare_weight(nf4), "tpu_v5e").word_step  # a table
    e2m1 = emulate.Packed(q.codes.data, "float4_e2m1fn", -2, 512)  # its bytes as e2m1 codes
    mx = emulate.QArray.from_parts(
        e2m1, np.ones((16, 256), ml_dtypes.float8_e8m0fnu), block_shape=(32, 1)
    )
    assert _config(x1, emulate.pallas.prepare_weight(mx), "tpu_v5e").word_step
    nv = emulate.QArray.from_parts(
        e2m1, np.ones((32, 256), ml_dtypes.float8_e4m3fn), block_shape=(16, 1),
        tensor_scale=np.float32(2),
    )  # fmt: skip
    nv = emulate.pallas.prepare_weight(nv)
    assert _config(_int_x(32, 512, rng), nv, "tpu_v5e").word_step  # 8 groups a dot x 32
    assert not _config(_int_x(48, 512, rng), nv, "tpu_v5e").word_step
    q6 = emulate.pallas.prepare_weight(_q6_k(512, 256, rng)[0])  # 16 rows a group
    assert _config(x1, q6, "tpu_v5e").word_step and _config(x1, q6, "tpu_v2").word_step
    assert _config(_int_x(16, 512, rng), q6, "tpu_v6e").word_step  # 16 groups a dot x 16
    assert not _config(_int_x(17, 512, rng), q6, "tpu_v6e").word_step
    six = emulate.pallas.prepare_weight(np.zeros((512, 256), np.uint8), "float6_e2m3fn")
    assert not _config(x1, six, "tpu_v5e").word_step  # 6-bit floats: the per-element kernel


@pytest.mark.parametrize("target", ["tpu_v2", pytest.param("tpu_v3", marks=pytest.mark.long)])
def test_float32_activations_compile_with_the_blocks_the_config_picks(target):
    # An nnx.Linear with dtype=None multiplies f32 activations by a prepared kernel. Mosaic
    # cuts f32 operands of a dot at Precision.HIGHEST into bfloat16 pieces and keeps them
    # live: decode (the word step, a Q4_K weight) and prefill (2048 rows, an AWQ weight:
    # the same blocks, a shorter kernel to compile) must pick blocks whose scoped VMEM fits
    # v2/v3's 16 MiB (before: "Ran out of memory in memory space vmem", 39.5 and 20.3
    # MiB). Compiled by the real TPU compiler, nothing runs; tpu_v3 (the rules and blocks
    # of tpu_v2) under EMULATE_LONG_TESTS=1.
    rng = np.random.default_rng(9)
    for m, q in ((1, _q4_k(4096, 512, rng)[0]), (2048, _awq(4096, 512, 128, rng)[0])):
        w = emulate.pallas.prepare_weight(q)
        x = np.zeros((m, 4096), np.float32)
        assert _config(x, w, target).word_step  # one group a dot at prefill: long rows
        compiler.compile(
            lambda x, w: emulate.pallas.matmul(x, w, out_dtype="float32"),
            jax.ShapeDtypeStruct(x.shape, x.dtype), w, target=target,
        )  # fmt: skip


@pytest.mark.parametrize(
    "target, x_dtype",
    [
        ("tpu_v5e", "bfloat16"),  # f32 halves and a pack
        # bfloat16 arithmetic (the pair's subtraction compiles for 4-bit codes by default)
        pytest.param("tpu_v6e", "bfloat16", marks=pytest.mark.long),
        pytest.param("tpu_v2", "float32", marks=pytest.mark.long),  # piece order, f32 dots
        pytest.param("tpu_v4", "bfloat16", marks=pytest.mark.long),
        pytest.param("tpu_v7x", "bfloat16", marks=pytest.mark.long),
    ],
)
def test_q6_k_word_step_compiles(target, x_dtype):
    # the real TPU compiler (compile-only) takes the 6-bit decode at a decode shape
    w = emulate.pallas.prepare_weight(_q6_k(4096, 512, np.random.default_rng(10))[0])
    x = jax.ShapeDtypeStruct((1, 4096), np.dtype(formats.get(x_dtype).dtype))
    assert _config(np.zeros(x.shape, x.dtype), w, target).word_step
    compiler.compile(
        lambda x, w: emulate.pallas.matmul(x, w, out_dtype="float32"), x, w, target=target
    )


def _every_e2m1_code(k: int, n: int) -> np.ndarray:
    """(k, n) float4_e2m1fn codes: column ``c`` holds code ``(r + c) % 16`` at row ``r``,
    so every code sits at every row of a word-order tile (every nibble of every word)."""
    r, c = np.meshgrid(np.arange(k), np.arange(n), indexing="ij")
    return ((r + c) % 16).astype(np.uint8)


def _e2m1_qarray(codes, scales, group, tensor_scale=None):
    """A QArray of e2m1 ``codes`` (uint8) packed along K, ``scales`` per ``group`` rows,
    and its exact values from emulate.reference (float64, no rounding)."""
    e2m1 = codes.view(ml_dtypes.float4_e2m1fn)
    q = emulate.QArray.from_parts(
        emulate.pack(e2m1, axis=0), scales, block_shape=(group, 1), tensor_scale=tensor_scale
    )
    wv = reference.dequantize(e2m1, scales, (group, 1), exact=True)
    return q, wv


def _x4(m, k, rng) -> np.ndarray:
    """bf16 multiples of 4 (-16 .. 16): every group's partial sum an even integer, so a
    2**-127 scale gives a normal f32 product."""
    return (4 * rng.integers(-4, 5, (m, k))).astype(ml_dtypes.bfloat16)


def test_mxfp4_every_code_and_e8m0_scale_are_bit_for_bit():
    # e8m0 scales 2**-2 .. 2**2, a column of 2**-127 (code 0x00: two normal factors,
    # 2**-64 and 2**-63) and a NaN (0xFF) group: the exact sum rounded once to f32; the
    # bf16 pack decode of TPU v5e
    k, n, m = 256, 256, 2
    rng = np.random.default_rng(11)
    bits = (127 + rng.integers(-2, 3, (k // 32, n))).astype(np.uint8)
    bits[:, 5] = 0x00
    bits[3, 9] = 0xFF
    q, wv = _e2m1_qarray(_every_e2m1_code(k, n), bits.view(ml_dtypes.float8_e8m0fnu), 32)
    x = _x4(m, k, rng)
    p = emulate.pallas.prepare_weight(q)
    assert _config(x, p, "tpu_v5e").word_step
    got = np.asarray(emulate.pallas.matmul(x, p, target="tpu_v5e", out_dtype="float32"))
    with np.errstate(invalid="ignore"):
        want = (np.asarray(x, np.float64) @ wv).astype(np.float32)
    assert np.isnan(got[:, 9]).all() and np.abs(got[:, 5]).max() < 2.0**-110
    np.testing.assert_array_equal(_bits(got), _bits(want))


def test_nvfp4_e4m3_scales_and_tensor_scale_are_bit_for_bit():
    # e4m3 scales in [0.25, 4] (4 significant bits: every group's sum times its scale is
    # exact), a column at the largest (448), one of subnormals (k * 2**-9), a NaN group,
    # and a tensor scale of 0.75 applied to the f32 sum once; the bfloat16-arithmetic
    # decode of TPU v6e
    k, n, m = 256, 128, 2
    rng = np.random.default_rng(12)
    values = reference.decode(np.arange(256, dtype=np.uint8), "float8_e4m3fn", to=np.float64)
    usual = np.flatnonzero((values >= 0.25) & (values <= 4)).astype(np.uint8)
    bits = rng.choice(usual, (k // 16, n))
    bits[:, 3] = 0x7E  # 448
    bits[:, 7] = rng.integers(1, 8, k // 16)  # subnormals
    bits[2, 11] = 0x7F  # NaN
    scales = bits.view(ml_dtypes.float8_e4m3fn)
    q, wv = _e2m1_qarray(_every_e2m1_code(k, n), scales, 16, tensor_scale=np.float32(0.75))
    x = _x4(m, k, rng)
    p = emulate.pallas.prepare_weight(q)
    assert _config(x, p, "tpu_v6e").word_step
    got = np.asarray(emulate.pallas.matmul(x, p, target="tpu_v6e", out_dtype="float32"))
    with np.errstate(invalid="ignore"):
        want = ((np.asarray(x, np.float64) @ wv) * 0.75).astype(np.float32)
    assert np.isnan(got[:, 11]).all() and not np.isnan(np.delete(got, 11, axis=1)).any()
    np.testing.assert_array_equal(_bits(got), _bits(want))
