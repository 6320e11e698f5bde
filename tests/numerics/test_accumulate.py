"""emulate.accumulate: exact int32-limb combination and the single final rounding.

The oracle is :func:`emulate.reference.round_exact` on the exact total (a Python int) and
Python's own integer sums; nothing here is derived from the code under test.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulate import formats, reference
from emulate.numerics import accumulate

FLOAT_OUTS = ["float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"]
INT_OUTS = ["int32", "int8"]
# lhs_scale + rhs_scale of the exact-class plans: ints 0, e2m1 1 each, e2m3 3 each.
SCALES = range(0, 7)
N = 32  # totals per example: one compiled shape
LIMIT = 2**40  # round_limbs is exact for |total| < 2**40 (|hi| < 2**24)

round_limbs = jax.jit(accumulate.round_limbs, static_argnums=(2, 3))
combine_chunks = jax.jit(accumulate.combine_chunks, static_argnums=(1,))


def limbs(totals: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Python-int totals as (hi, lo) int32 limbs, total = hi * 2**16 + lo, 0 <= lo < 2**16."""
    hi = np.array([t >> 16 for t in totals], np.int32)
    lo = np.array([t & 0xFFFF for t in totals], np.int32)
    return hi, lo


def wrap(total: int, bits: int) -> int:
    """Two's-complement wrap of a Python int into ``bits`` bits."""
    w = total & ((1 << bits) - 1)
    return w - (1 << bits) if w >= 1 << (bits - 1) else w


def _emax(f: formats.Format) -> int:
    return math.frexp(f.max)[1] - 1


@st.composite
def tie(draw, out: str, scale: int) -> int:
    """A total whose value ``total * 2**-scale`` lies exactly halfway between two
    neighbouring values of ``out`` (or between ``max`` and the next binade's first step).

    Neighbours with quantum 2**q: ``j * 2**q`` and ``(j + 1) * 2**q``; their midpoint is
    ``(2j + 1) * 2**(q - 1)``, so total = ``(2j + 1) * 2**(q - 1 + scale)``.
    """
    f = formats.get(out)
    mb = f.mantissa_bits
    q_min = max(1 - scale, f.emin - mb)
    q_max = min(39 - mb - scale, _emax(f) - mb)
    q = draw(st.integers(q_min, q_max))
    if q == f.emin - mb:  # subnormals and the first normal binade share this quantum
        j = draw(st.integers(0, 2 ** (mb + 1) - 1))
    else:
        j = draw(st.integers(2**mb, 2 ** (mb + 1) - 1))
    total = (2 * j + 1) << (q - 1 + scale)
    assert total < LIMIT
    return -total if draw(st.booleans()) else total


def totals(out: str, scale: int) -> st.SearchStrategy[list[int]]:
    any_total = st.integers(-(LIMIT - 1), LIMIT - 1)
    small = st.integers(-(2**12), 2**12)
    edges = st.sampled_from([0, 1, -1, LIMIT - 1, -(LIMIT - 1), 2**31 - 1, -(2**31), 2**24 + 1])
    parts = [any_total, small, edges]
    if out in FLOAT_OUTS:
        parts += [tie(out, scale), tie(out, scale)]  # boosted: about 2 in 5
    return st.lists(st.one_of(parts), min_size=N, max_size=N)


def same_value(got: float, want: float) -> bool:
    if math.isnan(want):
        return math.isnan(got)
    return got == want and math.copysign(1, got) == math.copysign(1, want)


@pytest.mark.parametrize("out", FLOAT_OUTS)
@settings(max_examples=25)
@given(data=st.data())
def test_round_limbs_float_is_one_rounding_of_the_exact_total(out, data):
    scale = data.draw(st.sampled_from(SCALES), label="scale")
    ts = data.draw(totals(out, scale), label="totals")
    hi, lo = limbs(ts)
    got = round_limbs(jnp.asarray(hi), jnp.asarray(lo), scale, out)
    assert got.dtype == formats.get(out).dtype
    g = np.asarray(got).astype(np.float64)
    for t, v in zip(ts, g, strict=True):
        want = reference.round_exact(t, -scale, out)
        assert same_value(float(v), want), (out, scale, t, float(v), want)


@pytest.mark.parametrize("out", INT_OUTS)
@settings(max_examples=15)
@given(ts=totals("int32", 0))
def test_round_limbs_integer_wraps(out, ts):
    hi, lo = limbs(ts)
    got = round_limbs(jnp.asarray(hi), jnp.asarray(lo), 0, out)
    f = formats.get(out)
    assert got.dtype == f.dtype
    assert np.asarray(got).astype(np.int64).tolist() == [wrap(t, f.bits) for t in ts]


@pytest.mark.parametrize(
    "out,total,scale,want",
    [
        # Halfway cases, checked by hand: ties go to the even neighbour.
        ("float32", 2**24 + 1, 0, 2.0**24),
        ("float32", 2**24 + 3, 0, 2.0**24 + 4),
        ("float32", -(2**25 + 2), 0, -(2.0**25)),
        ("bfloat16", 257, 0, 256.0),
        ("bfloat16", 259, 0, 260.0),
        ("bfloat16", (257 << 6) + 1, 6, 258.0),  # just above the tie: rounds up
        ("float16", 2049, 0, 2048.0),
        ("float16", 65520, 0, math.inf),  # halfway between max 65504 and 65536: to Inf
        ("float16", 65519, 0, 65504.0),
        ("float8_e4m3fn", 464, 0, 448.0),  # e4m3fn: 464 -> 448, 465 -> NaN
        ("float8_e4m3fn", 465, 0, math.nan),
        ("float8_e4m3fn", 17 * 2**3, 6, 2.0),  # 17/8: halfway between 2 and 2.25, even 2
        ("float8_e4m3fn", 19 * 2**3, 6, 2.5),  # 19/8: halfway between 2.25 and 2.5, even 2.5
        ("float8_e5m2", 57344 + 4096, 0, math.inf),  # halfway between max and 2**16
        ("float8_e5m2", 5, 2, 1.25),
        ("float8_e5m2", 9, 3, 1.0),  # 9/8 between 1 and 1.25: even is 1.0
    ],
)
def test_round_limbs_hand_checked(out, total, scale, want):
    assert reference.round_exact(total, -scale, out) == want or math.isnan(want)
    hi, lo = limbs([total] * N)
    got = np.asarray(round_limbs(jnp.asarray(hi), jnp.asarray(lo), scale, out))
    v = float(got.astype(np.float64)[0])
    assert same_value(v, want), (v, want)


def test_round_limbs_beats_a_plain_f32_conversion():
    # 2**30 + 2**22 + 1 lies just above a bf16 tie. Rounding it to f32 first drops the 1
    # and lands on the tie, which then goes to even (2**30); one rounding gives 2**30 + 2**23.
    total = 2**30 + 2**22 + 1
    assert float(np.float32(total)) == 2.0**30 + 2**22  # f32 rounds the 1 away
    assert reference.round_exact(total, 0, "bfloat16") == 2.0**30 + 2**23
    hi, lo = limbs([total] * N)
    got = round_limbs(jnp.asarray(hi), jnp.asarray(lo), 0, "bfloat16")
    assert float(np.asarray(got).astype(np.float64)[0]) == 2.0**30 + 2**23
    naive = jnp.asarray(np.float32(total)).astype(jnp.bfloat16)
    assert float(naive) == 2.0**30


CHUNK_COUNTS = [1, 2, 5, 64]


@settings(max_examples=25)
@given(data=st.data())
def test_combine_chunks_is_the_python_sum(data):
    n = data.draw(st.sampled_from(CHUNK_COUNTS), label="chunks")
    axis = data.draw(st.sampled_from([0, 1]), label="axis")
    shape = (n, 3) if axis == 0 else (3, n)
    word = st.one_of(
        st.integers(-(2**31), 2**31 - 1), st.sampled_from([-(2**31), 2**31 - 1, -1, 0, 0xFFFF])
    )
    vals = data.draw(
        st.lists(word, min_size=3 * n, max_size=3 * n).map(lambda v: np.array(v, np.int64))
    )
    partials = vals.reshape(shape)
    hi, lo = combine_chunks(jnp.asarray(partials.astype(np.int32)), axis)
    hi = np.asarray(hi).astype(np.int64).tolist()
    lo = np.asarray(lo).astype(np.int64).tolist()
    sums = [sum(int(v) for v in col) for col in np.moveaxis(partials, axis, 0).T]
    assert all(0 <= x < 2**16 for x in lo), lo
    assert [h * 2**16 + x for h, x in zip(hi, lo, strict=True)] == sums


@pytest.mark.parametrize("word", [-1, -(2**31), 2**31 - 1, 0xFFFF])
def test_combine_chunks_exact_at_2_to_15_chunks(word):
    # The documented limit: the low limbs of 2**15 chunks sum below 2**31.
    n = 2**15
    partials = jnp.full((n, 2), word, jnp.int32)
    hi, lo = combine_chunks(partials, 0)
    assert [int(h) * 2**16 + int(x) for h, x in zip(hi, lo, strict=True)] == [n * word] * 2
    assert all(0 <= int(x) < 2**16 for x in lo)


@settings(max_examples=20)
@given(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=N, max_size=N))
def test_split_and_normalize_keep_the_total(ts):
    x = jnp.asarray(np.array(ts, np.int64).astype(np.int32))
    hi, lo = accumulate.split(x)
    h = np.asarray(hi).astype(np.int64)
    lo_ = np.asarray(lo).astype(np.int64)
    assert ((h * 2**16 + lo_) == np.array(ts)).all()
    assert ((0 <= lo_) & (lo_ < 2**16)).all()
    # normalize moves whole 2**16 units of an unnormalized low limb into the high limb.
    h2, l2 = accumulate.normalize(hi - 3, lo + 3 * 2**16)
    assert ((np.asarray(h2).astype(np.int64) * 2**16 + np.asarray(l2)) == np.array(ts)).all()
    assert np.array_equal(np.asarray(l2), lo_)


@functools.cache
def _f32_round(out: str):
    return jax.jit(functools.partial(accumulate.round_accumulator, out=out))


@pytest.mark.parametrize("out", ["bfloat16", "float8_e4m3fn", "float4_e2m1fn", "int8", "int32"])
def test_round_accumulator_rounds_once_from_f32_or_wraps_int32(out):
    f = formats.get(out)
    if f.is_integer:
        acc = np.array([0, 1, -1, 127, 128, -129, 2**31 - 1, -(2**31)], np.int32)
        got = np.asarray(_f32_round(out)(jnp.asarray(acc))).astype(np.int64).tolist()
        assert got == [wrap(int(v), f.bits) for v in acc]
        return
    acc = np.array([0.0, 1.0, -3.25, 2.0**-7, 300.5, 5.0, 1e30, -1e30], np.float32)
    got = np.asarray(_f32_round(out)(jnp.asarray(acc))).astype(np.float64)
    for a, v in zip(acc, got, strict=True):
        m, e = math.frexp(float(a))
        want = reference.round_exact(int(m * 2**53), e - 53, out)
        assert same_value(float(v), want) or (a == 0 and v == 0), (out, a, v, want)
