"""QArray's optional parts (issue 24): zero points, offsets, two-level scales, codebooks,
act-order permutations and the 2- to 6-bit integer codes, against a numpy oracle written
from the formula (ml_dtypes for the float formats' values, integer arithmetic for codes,
Fractions for exact sums; never emulate's codecs):

    W = (value(code) - zero_point) * scale + offset,  W[perm[j]] = W_stored[j]

dequantize bit for bit; matmuls on every target plan within the documented bound
(mode "fast") or correctly rounded (mode "exact").
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _sweeps import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import emulate
from emulate import codebooks, formats, reference
from emulate.bounds import UNDERFLOW_PER_TERM, gamma
from emulate.quantized.array import QArray

TARGETS = ("cpu", "tpu_v4", "tpu_v5e", "tpu_v7x")
INT_FORMATS = ("uint2", "int2", "uint3", "int3", "uint4", "int4", "uint5", "int5", "uint6")
INT_FORMATS += ("int6", "uint8", "int8")
# Implicit offsets of unsigned codes as GGUF writes them: q - 2**(bits-1).
MIDPOINT = {"uint4": 8, "uint5": 16, "uint6": 32, "uint3": 4, "uint2": 2, "uint8": 128}


# --- the oracle ---------------------------------------------------------------------------


def _int_values(codes: np.ndarray, name: str) -> np.ndarray:
    f = formats.get(name)
    c = codes.astype(np.int64)
    if f.signed:
        c = np.where(c >= 1 << (f.bits - 1), c - (1 << f.bits), c)
    return c


@dataclasses.dataclass
class Parts:
    """What a test stores, as plain numpy, with the oracle's reading of it."""

    codes: np.ndarray  # uint8 codes (K, N), stored order
    fmt: str
    block: tuple[int, int]
    scales: Any  # numpy array of a scale dtype, or Parts (two-level)
    zero_points: Any = None  # None, int, or int array of the grid's shape
    offsets: Any = None  # None, float, float array, or Parts
    table: Any = None  # a codebooks.Codebook
    perm: Any = None  # permutation of axis 0

    def values(self) -> np.ndarray:
        """value(code) as float32, stored order."""
        if self.table is not None:
            return self.table.array().astype(np.float32)[self.codes]
        f = formats.get(self.fmt)
        if f.is_integer:
            return _int_values(self.codes, self.fmt).astype(np.float32)
        return self.codes.view(f.dtype).astype(np.float32)

    def grid(self) -> tuple[int, ...]:
        return tuple(-(-n // b) for n, b in zip(self.codes.shape, self.block, strict=True))

    def per_block(self, v: Any, dtype=np.float32) -> np.ndarray:
        if isinstance(v, Parts):
            v = v.dequantized()
        arr = np.broadcast_to(np.asarray(v), self.grid()).astype(dtype)
        for d, b in enumerate(self.block):
            arr = np.repeat(arr, b, axis=d)
        return arr[tuple(slice(0, n) for n in self.codes.shape)]

    def scale_values(self) -> np.ndarray:
        if isinstance(self.scales, Parts):
            return self.per_block(self.scales)
        return self.per_block(self.scales.astype(np.float32))

    def stored(self) -> np.ndarray:
        """W_stored in float32, with the documented order of roundings."""
        with np.errstate(invalid="ignore", over="ignore"):
            v = self.values()
            if self.zero_points is not None:
                v = v - self.per_block(self.zero_points)  # exact: small integers
            w = (v * self.scale_values()).astype(np.float32)
            w = np.where(np.abs(w) < 2.0**-126, np.float32(0) * w, w)  # XLA's flushing
            if self.offsets is not None:
                w = (w + self.per_block(self.offsets)).astype(np.float32)
        return w

    def dequantized(self) -> np.ndarray:
        w = self.stored()
        if self.perm is None:
            return w
        out = np.empty_like(w)
        out[self.perm] = w
        return out

    def qarray(self, packed: bool = False, zp_dtype=np.int32) -> QArray:
        codes: Any = self.codes
        f = formats.get(self.fmt)
        if packed and f.packable:
            codes = emulate.pack(self.codes, self.fmt if self.table is None else f.name, axis=0)
        scales = self.scales.qarray() if isinstance(self.scales, Parts) else self.scales
        offsets = self.offsets.qarray() if isinstance(self.offsets, Parts) else self.offsets
        zp = self.zero_points
        if isinstance(zp, np.ndarray):
            zp = zp.astype(zp_dtype)
        return QArray.from_parts(
            codes,
            scales,
            block_shape=self.block,
            fmt=self.fmt,
            zero_points=zp,
            offsets=offsets,
            codebook=self.table,
            perm=self.perm,
            perm_axis=None if self.perm is None else 0,
        )


# --- strategies ---------------------------------------------------------------------------

SHAPES = [(1, 1), (5, 3), (32, 2), (33, 3), (64, 1), (96, 2), (128, 2)]
GROUPS = [1, 4, 16, 32, 64]  # 64: segments long enough for the TPU plans' segment route


@st.composite
def parts(draw, *, specials: bool = False, float_elements: bool = True) -> Parts:
    k, n = draw(st.sampled_from(SHAPES))
    g = draw(st.sampled_from(GROUPS))
    block = (min(g, k), 1)
    grid = (-(-k // block[0]), n)
    kind = draw(st.sampled_from(["int", "codebook"] + (["float"] if float_elements else [])))
    table = None
    if kind == "codebook":
        table = draw(
            st.sampled_from(
                [
                    codebooks.NF4,
                    codebooks.IQ4_NL,
                    codebooks.codebook(np.array([-3, -1.5, 0, 0.25, 1, 2, 5, 7], np.float16)),
                ]
            )
        )
        fmt = f"uint{table.bits}"
    elif kind == "int":
        fmt = draw(st.sampled_from(INT_FORMATS))
    else:
        fmt = draw(st.sampled_from(["float8_e4m3fn", "float4_e2m1fn"]))
    bits = formats.get(fmt).bits
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    codes = rng.integers(0, 1 << bits, (k, n)).astype(np.uint8)
    if fmt == "float8_e4m3fn":
        codes &= 0x77 | 0x80  # finite codes
    zp: Any = None
    if kind != "float":
        zp = draw(
            st.sampled_from(
                [None, MIDPOINT.get(fmt, 1), "array"] if fmt.startswith("u") else [None, -3]
            )
        )
        if zp == "array":
            zp = rng.integers(0, 1 << min(bits, 7), grid)
    scale_kind = draw(st.sampled_from(["float16", "bfloat16", "float32", "e8m0", "two_level"]))
    scales: Any
    if scale_kind == "e8m0":
        scales = rng.integers(110, 140, grid).astype(np.uint8).view(ml_dtypes.float8_e8m0fnu)
    elif scale_kind == "two_level":
        sub = min(2, grid[0])
        super_grid = (-(-grid[0] // sub), n)
        d = (rng.standard_normal(super_grid) * 0.05).astype(np.float16)
        scales = Parts(rng.integers(0, 64, grid).astype(np.uint8), "uint6", (sub, 1), d)
    else:
        dt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
        scales = (rng.standard_normal(grid) * 0.05).astype(dt[scale_kind])
    if specials and scale_kind not in ("e8m0", "two_level") and grid[0] * grid[1] > 1:
        flat = scales.reshape(-1)
        flat[rng.integers(flat.size)] = draw(st.sampled_from([np.nan, np.inf, -np.inf, 0.0]))
    off_kind = draw(st.sampled_from([None, "scalar", "float32", "float16", "two_level"]))
    off: Any = None
    if off_kind == "scalar":
        off = float(np.float32(draw(st.sampled_from([-0.75, 0.125]))))
    elif off_kind in ("float32", "float16"):
        off = (rng.standard_normal(grid) * 0.1).astype(off_kind)  # both signs
    elif off_kind == "two_level":
        sub = min(2, grid[0])
        super_grid = (-(-grid[0] // sub), n)
        dmin = (-np.abs(rng.standard_normal(super_grid)) * 0.01).astype(np.float16)
        off = Parts(rng.integers(0, 64, grid).astype(np.uint8), "uint6", (sub, 1), dmin)
    perm = rng.permutation(k) if draw(st.booleans()) else None
    return Parts(codes, fmt, block, scales, zp, off, table, perm)


# --- dequantize -----------------------------------------------------------------------------


def _bits(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


# 4 examples by default, the ci profile's 20 under EMULATE_LONG_TESTS=1
@settings(deadline=None, max_examples=examples(4, 20))
@given(p=parts(specials=True), packed=st.booleans(), data=st.data())
def test_dequantize_matches_the_formula_bit_for_bit(p, packed, data):
    zp_dtype = data.draw(st.sampled_from([np.int32, np.uint8]))
    q = p.qarray(packed=packed, zp_dtype=zp_dtype)
    got = np.asarray(emulate.dequantize(q, to=jnp.float32))
    want = p.dequantized()
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(_bits(got)[~nan], _bits(want)[~nan])


def test_gguf_style_two_level_block_by_hand():
    # Q4_K-like: W = d*sc*q - dmin*m, sub-blocks of 4 inside super-blocks of 8
    codes = np.array([[0, 15, 8, 1, 2, 3, 4, 5]], np.uint8)  # (N=1, K=8)
    sc = np.array([[3, 63]], np.uint8)
    d = np.array([[0.5]], np.float16)
    m = np.array([[1, 2]], np.uint8)
    neg_dmin = np.array([[-0.25]], np.float16)
    q = QArray.from_parts(
        codes,
        QArray.from_parts(sc, d, block_shape=(1, 2), fmt="uint6"),
        block_shape=(1, 4),
        fmt="uint4",
        offsets=QArray.from_parts(m, neg_dmin, block_shape=(1, 2), fmt="uint6"),
    )
    want = [1.5 * c - 0.25 for c in (0, 15, 8, 1)] + [31.5 * c - 0.5 for c in (2, 3, 4, 5)]
    assert np.asarray(q.dequantize()).tolist() == [want]


def test_nan_and_inf_scales_poison_their_block_only():
    codes = np.array([[8, 9], [7, 8], [1, 2]], np.uint8)  # (K=3, N=2), blocks of 2 along K
    scales = np.array([[np.nan, np.inf], [1.0, -np.inf]], np.float32)
    q = QArray.from_parts(codes, scales, block_shape=(2, 1), fmt="uint4", zero_points=8)
    w = np.asarray(q.dequantize())
    assert np.isnan(w[:2, 0]).all()
    assert w[0, 1] == np.inf and np.isnan(w[1, 1])  # (8-8) * inf is NaN, (9-8) * inf is inf
    assert w[2].tolist() == [-7.0, np.inf]  # (2 - 8) * -inf


def test_empty_and_ragged_blocks():
    q = QArray.from_parts(
        np.zeros((0, 3), np.uint8),
        np.zeros((0, 3), np.float16),
        block_shape=(32, 1),
        fmt="uint4",
        zero_points=np.zeros((0, 3), np.int32),
        offsets=np.zeros((0, 3), np.float32),
    )
    assert q.dequantize().shape == (0, 3)
    x = jnp.ones((2, 0), jnp.bfloat16)
    assert (
        np.asarray(emulate.matmul(x, q, preferred_element_type=jnp.float32)).tolist()
        == [[0.0] * 3] * 2
    )
    # K = 5 in groups of 4: the last block holds one element
    codes = np.arange(5, dtype=np.uint8).reshape(5, 1)
    q = QArray.from_parts(
        codes,
        np.array([[1.0], [2.0]], np.float32),
        block_shape=(4, 1),
        fmt="uint4",
        zero_points=np.array([[1], [3]], np.int32),
        offsets=np.array([[0.5], [-8.0]], np.float32),
    )
    assert np.asarray(q.dequantize())[:, 0].tolist() == [-0.5, 0.5, 1.5, 2.5, -6.0]


# --- matmuls --------------------------------------------------------------------------------


def _exact_sum_and_magnitude(x: np.ndarray, p: Parts) -> tuple[np.ndarray, np.ndarray]:
    """``x @ W`` with ``W = (v - z) * s + o`` exact (Fractions of the stored f32 scale and
    offset values, two-level ones as their f32 values), and ``|x| @ (|v s| + |z s| + |o|)``."""
    v = p.values().astype(np.float64)
    s = p.scale_values().astype(np.float64)
    z = p.per_block(p.zero_points, np.float64) if p.zero_points is not None else 0 * v
    o = p.per_block(p.offsets, np.float64) if p.offsets is not None else 0 * v
    frac = np.vectorize(Fraction, otypes=[object])
    w = (frac(v) - frac(z)) * frac(s) + frac(o)
    mag = np.abs(v * s) + np.abs(z * s) + np.abs(o)
    if p.perm is not None:
        w_log, mag_log = np.empty_like(w), np.empty_like(mag)
        w_log[p.perm], mag_log[p.perm] = w, mag
        w, mag = w_log, mag_log
    exact = frac(x.astype(np.float64)).dot(w)
    return exact, np.abs(x.astype(np.float64)) @ mag


# each example compiles its own programs: 2 by default, 12 under EMULATE_LONG_TESTS=1
@settings(deadline=None, max_examples=examples(2, 12))
@given(p=parts(), target=st.sampled_from(TARGETS), data=st.data())
def test_matmul_within_the_bound_on_every_plan(p, target, data):
    k = p.codes.shape[0]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal((2, k)).astype(ml_dtypes.bfloat16)
    q = p.qarray(packed=data.draw(st.booleans()))
    y = np.asarray(emulate.matmul(jnp.asarray(x), q, target=target, preferred_element_type="f32"))
    exact, mag = _exact_sum_and_magnitude(x, p)
    segments = -(-k // p.block[0])
    bound = gamma(k + segments + 5) * mag * (1 + 1e-12) + (k + segments + 5) * UNDERFLOW_PER_TERM
    err = np.abs(np.vectorize(lambda a, b: float(Fraction(float(a)) - b))(y, exact))
    assert (err <= bound).all(), (err.max(), bound.min())


# each example compiles a mode-"exact" program of its own (2-9 s of XLA CPU): 2 by
# default, 24 under EMULATE_LONG_TESTS=1
@settings(deadline=None, max_examples=examples(2, 24))
@given(p=parts(), target=st.sampled_from(TARGETS))
def test_exact_mode_rounds_the_dequantized_values_once(p, target):
    k = p.codes.shape[0]
    x = (np.arange(2 * k).reshape(2, k) % 7 - 3).astype(ml_dtypes.bfloat16) / 4
    q = p.qarray()
    y = emulate.matmul(jnp.asarray(x), q, target=target, mode="exact", preferred_element_type="f32")
    want = reference.dot_general(x, p.dequantized(), (((1,), (0,)), ((), ())), "float32")
    np.testing.assert_array_equal(_bits(y), _bits(want))


def test_integer_parts_are_exact_in_fast_mode():
    # int8 activations, AWQ-style uint4 codes, integer zero points, power-of-two scales:
    # every segment sum and its offset term are integers, so "fast" is exact too.
    rng = np.random.default_rng(7)
    k, n = 256, 4
    codes = rng.integers(0, 16, (k, n)).astype(np.uint8)
    zp = rng.integers(0, 16, (2, n))
    s = rng.integers(125, 130, (2, n)).astype(np.uint8).view(ml_dtypes.float8_e8m0fnu)
    q = QArray.from_parts(codes, s, block_shape=(128, 1), fmt="uint4", zero_points=zp)
    x = rng.integers(-8, 9, (3, k)).astype(np.int8)  # every partial sum exact in f32
    w = (codes.astype(np.int64) - np.repeat(zp, 128, 0)) * np.repeat(s.astype(np.float64), 128, 0)
    want = (x.astype(np.float64) @ w).astype(np.float32)
    for target in TARGETS:
        y = emulate.matmul(jnp.asarray(x), q, target=target, preferred_element_type="f32")
        np.testing.assert_array_equal(np.asarray(y), want)


def test_ignoring_the_permutation_misses_the_bound_by_orders_of_magnitude():
    rng = np.random.default_rng(3)
    k, n = 256, 8
    p = Parts(
        rng.integers(0, 16, (k, n)).astype(np.uint8),
        "uint4",
        (64, 1),  # long segments: the TPU plans contract codes with the offset term
        (rng.standard_normal((k // 64, n)) * 0.05).astype(np.float16),
        zero_points=rng.integers(0, 16, (k // 64, n)),
        offsets=(rng.standard_normal((k // 64, n)) * 0.1).astype(np.float32),
        perm=rng.permutation(k),
    )
    x = rng.standard_normal((4, k)).astype(ml_dtypes.bfloat16)
    exact, mag = _exact_sum_and_magnitude(x, p)
    bound = gamma(k + k // 64 + 5) * mag
    no_perm = dataclasses.replace(p.qarray(), perm=None, perm_axis=None)
    for target in ("cpu", "tpu_v5e"):
        for q, ok in ((p.qarray(), True), (no_perm, False)):
            y = np.asarray(
                emulate.matmul(jnp.asarray(x), q, target=target, preferred_element_type="f32")
            )
            err = np.abs(y - exact.astype(np.float64))
            if ok:
                assert (err <= bound).all()
            else:
                assert np.median(err / bound) > 1e3


def test_stacked_experts_under_vmap_and_gradients():
    rng = np.random.default_rng(5)
    ps = [
        Parts(
            rng.integers(0, 16, (64, 4)).astype(np.uint8),
            "uint4",
            (32, 1),
            (rng.standard_normal((2, 4)) * 0.1).astype(np.float32),
            zero_points=8,
            offsets=(rng.standard_normal((2, 4)) * 0.1).astype(np.float32),
            table=None,
            perm=rng.permutation(64),
        )
        for _ in range(3)
    ]
    qs = jax.tree.map(lambda *a: jnp.stack(a), *[p.qarray() for p in ps])
    x = jnp.asarray(rng.standard_normal((3, 2, 64)), jnp.float32)
    y = jax.vmap(lambda xe, qe: emulate.matmul(xe, qe, mode="exact"))(x, qs)
    for e, p in enumerate(ps):
        want = reference.dot_general(np.asarray(x[e]), p.dequantized(), (((1,), (0,)), ((), ())))
        np.testing.assert_array_equal(np.asarray(y[e]), want)
    # d/dx sum(x @ W) is each row sum of W; d/d offsets is the column sums of x per block
    q = ps[0].qarray()
    loss = lambda x, q: emulate.matmul(x, q).sum()  # noqa: E731
    gx, gq = jax.grad(loss, argnums=(0, 1), allow_int=True)(x[0], q)
    w = ps[0].dequantized()
    np.testing.assert_allclose(np.asarray(gx), np.broadcast_to(w.sum(1), (2, 64)), rtol=1e-6)
    xs = np.asarray(x[0]).sum(0)[np.asarray(ps[0].perm)]  # stored order
    want_do = np.stack([xs[:32].sum(), xs[32:].sum()])[:, None] * np.ones((1, 4))
    np.testing.assert_allclose(np.asarray(gq.offsets), want_do, rtol=1e-5)


# --- construction and validation --------------------------------------------------------


def test_bits_per_element_counts_every_part():
    k, n = 256, 8
    sc = emulate.pack(np.zeros((n, k // 32), np.uint8), "uint6", axis=1)
    q = QArray.from_parts(
        emulate.pack(np.zeros((n, k), np.uint8), "uint4", axis=1),
        QArray.from_parts(sc, np.zeros((n, 1), np.float16), block_shape=(1, 8)),
        block_shape=(1, 32),
        offsets=QArray.from_parts(sc, np.zeros((n, 1), np.float16), block_shape=(1, 8)),
    )
    assert q.bits_per_element == 4.5  # GGUF Q4_K: 144 bytes per 256 elements
    nf4 = QArray.from_parts(
        np.zeros((k, n), np.uint8),
        np.zeros((k // 64, n), np.float32),
        block_shape=(64, 1),
        codebook=codebooks.NF4,
    )
    assert nf4.format_name == "uint4"
    assert nf4.nbytes == k * n // 2 + k // 64 * n * 4 + 64  # uint4 codes, f32 absmax, table


@pytest.mark.parametrize(
    ("kwargs", "exc", "message"),
    [
        (
            dict(zero_points=np.zeros((3, 2), np.int32)),
            ValueError,
            r"zero_points: expected shape \(2, 2\) \(one zero point per scale block\), "
            r"got \(3, 2\)",
        ),
        (
            dict(zero_points=np.zeros((2, 2), np.float32)),
            TypeError,
            r"zero_points: expected an integer dtype, got float32",
        ),
        (
            dict(offsets=np.zeros((2, 2), np.int8)),
            TypeError,
            r"offsets: dtype int8 is not accepted; accepted: \('float32', 'bfloat16', 'float16'\)",
        ),
        (
            dict(codebook=codebooks.NF4, fmt="uint3"),
            ValueError,
            r"codebook: a table of 16 entries needs unsigned 4-bit codes \(uint4\), got uint3",
        ),
        (dict(perm=np.arange(8)), ValueError, r"^perm_axis: expected the permuted axis"),
        (
            dict(perm=np.zeros(8, np.int32), perm_axis=0),
            ValueError,
            r"^perm: expected a permutation of range\(8\) \(axis -2\)",
        ),
        (dict(perm_axis=0), ValueError, r"^perm_axis: given \(0\) without a perm$"),
    ],
)
def test_bad_parts_name_themselves(kwargs, exc, message):
    kw = dict(block_shape=(4, 1), fmt="uint4") | kwargs
    with pytest.raises(exc, match=message):
        QArray.from_parts(np.zeros((8, 2), np.uint8), np.ones((2, 2), np.float16), **kw)


def test_repr_names_the_parts_and_transpose_moves_them():
    q = QArray.from_parts(
        np.zeros((8, 2), np.uint8),
        np.ones((2, 2), np.float16),
        block_shape=(4, 1),
        fmt="uint4",
        zero_points=np.ones((2, 2), np.int32),
        offsets=0.5,
        perm=np.arange(8)[::-1].copy(),
        perm_axis=0,
    )
    assert "zero_points, offsets, perm" in repr(q)
    t = q.T
    assert t.shape == (2, 8) and t.block_shape == (1, 4) and t.perm_axis == -1
    np.testing.assert_array_equal(np.asarray(t.dequantize()), np.asarray(q.dequantize()).T)


def test_inspect_names_the_parts_per_site():
    q = QArray.from_parts(
        np.zeros((128, 4), np.uint8),
        np.ones((2, 4), np.float16),
        block_shape=(64, 1),
        fmt="uint4",
        zero_points=8,
    )
    x = jnp.ones((2, 128), jnp.bfloat16)
    report = str(emulate.inspect(lambda x, q: emulate.matmul(x, q), x, q, target="tpu_v5e"))
    assert "uint4[128,4]:float16:blocks(64,1)+zero_points" in report
