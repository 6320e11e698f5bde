"""The rounding modes of encode, against gfloat 0.5 (graphcore-research/gfloat, the
test extra's oracle), the numpy oracle and Fractions.

Conformance: every bf16 value and an f32 sample (random bit patterns: NaN, Inf,
subnormals, overflow; every tie of the format and its f32 neighbours; values past the
range) rounded by emulate.encode gives gfloat's code, in every mode, with and without
saturation; stochastic rounding with gfloat's result for the same random integers
(``RoundMode.Stochastic``, srbits = the top bits of ``jax.random.bits(key)``). The
differences are emulate's documented choices, listed in tests/_gfloat_cases.py
(docs/numerics.md, "Rounding modes").

The CI run takes every format in one mode (the modes rotate over the formats, so each
mode meets one or two) and fewer examples of the explicit random bits and of
increments_below (``examples``); ``EMULATE_LONG_TESTS=1`` takes every format in every
mode and more examples.
"""

from __future__ import annotations

import fractions
import functools
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _gfloat_cases import (
    FLOATS,
    INTS,
    KEY,
    RANDOM_BITS,
    assert_codes_match,
    cases,
    codes_of,
    comparable,
    f32_sample,
    gfloat_info,
    gfloat_round,
    mode_kwargs,
)
from _record_formats import CHECKED, gfloat_values, nan_as_one, register_user_formats
from _record_formats import gfloat_info as record_info
from _sweeps import examples
from gfloat import RoundMode, encode_ndarray, round_ndarray
from gfloat.formats import format_info_ocp_int8
from hypothesis import given, settings
from hypothesis import strategies as st

import emulate
from emulate import formats
from emulate.numerics.rounding import ROUNDINGS, STOCHASTIC, increments, random_integers
from emulate.reference import rounding as reference_rounding


@pytest.mark.parametrize("name, mode, saturate", cases(FLOATS))
def test_encode_gives_gfloat_code(name, mode, saturate):
    f = formats.get(name)
    fi = gfloat_info(f)
    x = f32_sample(f)
    got = codes_of(emulate.encode(x, name, saturate=saturate, **mode_kwargs(mode)))
    srbits = np.asarray(random_integers(KEY, x.shape, RANDOM_BITS))
    keep, sat, gmode = comparable(f, x, mode, saturate)
    want = gfloat_round(fi, x[keep], gmode, sat, srbits[keep])
    assert_codes_match(got[keep], want, fi, x[keep], f)


@pytest.mark.parametrize(
    "mode",
    [
        m if m in ("toward_negative", "stochastic") else pytest.param(m, marks=pytest.mark.long)
        for m in ROUNDINGS
    ],
)
def test_int8_gives_gfloat_ocp_int8(mode):
    """gfloat's ocp_int8 is int8 with six fraction bits (MXINT8's element): encoding
    ``64 x`` into int8 (saturating; gfloat raises on overflow otherwise) is its rounding
    of ``x``, for every bf16 value but NaN (gfloat has none there)."""
    x = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
    x = x[~np.isnan(x)]
    with np.errstate(over="ignore"):
        x64 = x * 64
    got = np.asarray(emulate.encode(x64, "int8", saturate=True, **mode_kwargs(mode)))
    # x * 64 overflows to Inf for |x| > 2**122, which saturates as x does
    srbits = np.asarray(random_integers(KEY, x.shape, RANDOM_BITS))
    want = gfloat_round(format_info_ocp_int8, x, mode, True, srbits) * 64
    np.testing.assert_array_equal(got.astype(np.float64), want)


@pytest.mark.parametrize("name, mode, saturate", cases(INTS))
def test_integers_match_the_oracle(name, mode, saturate):
    """int4, uint4, int8, uint8 in every mode: emulate.encode equals
    emulate.reference_rounding.encode (itself checked against Fractions) on the sample."""
    x = f32_sample(formats.get("int8"))
    got = np.asarray(emulate.encode(x, name, saturate=saturate, **mode_kwargs(mode)))
    r = np.asarray(random_integers(KEY, x.shape, RANDOM_BITS))
    want = reference_rounding.encode(
        x,
        name,
        saturate=saturate,
        rounding=mode,
        random_values=r if mode in STOCHASTIC else None,
        random_bits=RANDOM_BITS if mode in STOCHASTIC else None,
    )
    np.testing.assert_array_equal(got.astype(np.int64), want.astype(np.int64))


@functools.partial(jax.jit, static_argnames="n")
def ups_over_every_random_integer(full, shift, n):
    """(q, how many of the 2**n random integers r make full * 2**-shift go up)."""
    r = jnp.arange(1 << n, dtype=jnp.uint32)
    q, up = increments(
        jnp.broadcast_to(full, r.shape),
        jnp.broadcast_to(shift, r.shape),
        jnp.zeros(r.shape, bool),
        "stochastic",
        r,
        n,
    )
    return q[0], jnp.sum(up)


@settings(max_examples=40)
@given(
    full=st.integers(0, (1 << 24) - 1),
    shift=st.integers(0, 40),
    n=st.sampled_from([1, 3, 8]),
)
def test_stochastic_rounds_up_with_the_exact_probability(full, shift, n):
    """Over all ``2**n`` random integers, ``full * 2**-shift`` goes up exactly ``d`` times,
    ``d`` its fraction rounded to ``n`` bits (ties to even) by Fractions; when the fraction
    has at most ``n`` bits the expectation is the value itself (unbiased)."""
    value = fractions.Fraction(full, 1 << shift)
    floor = value.numerator // value.denominator
    delta = value - floor
    d = round(delta * (1 << n))  # Python's round of a Fraction: ties to even
    q, ups = ups_over_every_random_integer(jnp.uint32(full), jnp.int32(shift), n)
    assert int(q) == floor
    assert int(ups) == d
    mean = floor + fractions.Fraction(d, 1 << n)
    if (delta * (1 << n)).denominator == 1:
        assert mean == value
    assert abs(mean - value) <= fractions.Fraction(1, 1 << (n + 1))


@pytest.mark.parametrize(
    "name, value, mode, saturate, want",
    [
        ("float8_e4m3fn", 465.0, "toward_zero", False, 448.0),
        ("float8_e4m3fn", 465.0, "toward_negative", False, 448.0),
        ("float8_e4m3fn", 465.0, "toward_positive", False, np.nan),
        ("float8_e4m3fn", -465.0, "toward_positive", False, -448.0),
        ("float8_e4m3fn", 464.0, "nearest_away", False, np.nan),
        ("float8_e4m3fn", 464.0, "nearest_even", False, 448.0),
        ("float8_e4m3fn", 465.0, "toward_positive", True, 448.0),
        ("float8_e4m3fn", np.inf, "toward_zero", False, np.nan),
        ("float8_e5m2", 1e10, "toward_negative", False, 57344.0),
        ("float8_e5m2", -1e10, "toward_negative", False, -np.inf),
        ("float8_e5m2", np.inf, "toward_zero", False, np.inf),
        ("float8_e5m2", -np.inf, "toward_positive", True, -57344.0),
        ("float4_e2m1fn", 7.0, "toward_positive", False, 6.0),
        ("float4_e2m1fn", -0.1, "toward_zero", False, -0.0),
        ("float4_e2m1fn", 0.1, "toward_positive", False, 0.5),
        ("float8_e4m3fnuz", -0.0009, "toward_zero", False, 0.0),
        ("float8_e8m0fnu", 3.0, "toward_zero", False, 2.0),
        ("float8_e8m0fnu", 3.0, "nearest_even", False, 4.0),
        ("float8_e8m0fnu", 2.0**127 * 1.5, "toward_zero", False, 2.0**127),
        ("float8_e8m0fnu", 2.0**127 * 1.5, "toward_positive", False, np.nan),
        ("int8", 200.7, "toward_zero", True, 127.0),
        ("int8", -2.5, "nearest_away", False, -3.0),
        ("int8", -2.5, "toward_positive", False, -2.0),
        ("uint4", 17.2, "toward_negative", False, 1.0),
    ],
)
def test_overflow_and_zero_in_each_mode(name, value, mode, saturate, want):
    got = emulate.encode(np.float32([value]), name, rounding=mode, saturate=saturate)
    got = np.asarray(emulate.decode(got, name, to=jnp.float32)).astype(np.float64)[0]
    assert got == want or (np.isnan(want) and np.isnan(got))
    assert np.signbit(got) == np.signbit(want) or np.isnan(want)


def stochastic_encode(x, key, bits=8, fmt="float8_e4m3fn"):
    return emulate.encode(x, fmt, rounding="stochastic", key=key, random_bits=bits)


def test_stochastic_is_a_function_of_key_values_and_shape():
    x = jnp.linspace(-3, 3, 1024, dtype=jnp.float32) * 1.0001
    k1, k2 = jax.random.key(1), jax.random.key(2)
    a = codes_of(stochastic_encode(x, k1))
    np.testing.assert_array_equal(a, codes_of(stochastic_encode(x, k1)))
    np.testing.assert_array_equal(a, codes_of(jax.jit(stochastic_encode)(x, k1)))
    assert (a != codes_of(stochastic_encode(x, k2))).sum() > 100
    raw = codes_of(stochastic_encode(x, jax.random.PRNGKey(1)))
    np.testing.assert_array_equal(
        raw, codes_of(stochastic_encode(x, jax.random.wrap_key_data(jax.random.PRNGKey(1))))
    )


def test_stochastic_under_vmap_is_the_loop():
    x = jnp.float32([[0.3, 1.1, -2.7, 5.0e-3], [7.0, -0.2, 100.1, 1e-5]])
    keys = jax.random.split(jax.random.key(5), 2)
    by_key = jax.vmap(stochastic_encode)(x, keys)
    loop = [stochastic_encode(x[i], keys[i]) for i in range(2)]
    np.testing.assert_array_equal(codes_of(by_key), codes_of(jnp.stack(loop)))
    shared = jax.vmap(stochastic_encode, in_axes=(0, None))(x, keys[0])
    loop = [stochastic_encode(x[i], keys[0]) for i in range(2)]
    np.testing.assert_array_equal(codes_of(shared), codes_of(jnp.stack(loop)))


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(rounding="up"), ValueError, "rounding: expected one of ('nearest_even', "),
        (dict(rounding="stochastic", random_bits=8), ValueError,
         "key: rounding='stochastic' needs a jax.random key (jax.random.key(seed)), or the "
         "random integers themselves as rbits=; the same key gives the same rounding"),
        (dict(rounding="stochastic_fast", key=KEY, rbits=np.zeros(1, np.int32), random_bits=8),
         ValueError, "key, rbits: give one source of random bits, got both"),
        (dict(rounding="stochastic_odd", rbits=np.array([0, 256]), random_bits=8), ValueError,
         "rbits: expected integers in [0, 2**8) (random_bits=8), got values from 0 to 256"),
        (dict(rounding="stochastic_odd", rbits=np.array([-1]), random_bits=8), ValueError,
         "rbits: expected integers in [0, 2**8) (random_bits=8), got values from -1 to -1"),
        (dict(rounding="stochastic", rbits=np.float32([1.0]), random_bits=8), TypeError,
         "rbits: expected an integer array, got dtype float32"),
        (dict(rounding="stochastic", rbits=np.zeros((2, 3), np.int32), random_bits=8),
         ValueError, "rbits: shape (2, 3) does not broadcast to x's shape (1,)"),
        (dict(rbits=np.zeros(1, np.int32)), ValueError,
         "rbits: only the stochastic modes (stochastic, stochastic_odd, stochastic_fast, "
         "stochastic_fastest) use it, got rounding='nearest_even'"),
        (dict(rounding="stochastic", key=KEY), ValueError,
         "random_bits: rounding='stochastic' needs the number of random bits per element, 1 to 32"),
        (dict(rounding="stochastic", key=KEY, random_bits=0), ValueError,
         "random_bits: expected 1 to 32, got 0"),
        (dict(rounding="stochastic", key=KEY, random_bits=33), ValueError,
         "random_bits: expected 1 to 32, got 33"),
        (dict(rounding="stochastic", key=KEY, random_bits=8.0), TypeError,
         "random_bits: expected an int from 1 to 32, got float 8.0"),
        (dict(rounding="stochastic", key=KEY, random_bits=True), TypeError,
         "random_bits: expected an int from 1 to 32, got bool True"),
        (dict(rounding="stochastic", key=7, random_bits=8), TypeError,
         "key: expected a jax.random key (jax.random.key(seed) or "
         "jax.random.PRNGKey(seed)), got int"),
        (dict(rounding="stochastic", key=jax.random.split(KEY, 2), random_bits=8), ValueError,
         "key: expected one key (shape ()), got a key array of shape (2,)"),
        (dict(key=KEY), ValueError,
         "key: only the stochastic modes (stochastic, stochastic_odd, stochastic_fast, "
         "stochastic_fastest) use it, got rounding='nearest_even'"),
        (dict(rounding="toward_zero", random_bits=4), ValueError,
         "random_bits: only the stochastic modes (stochastic, stochastic_odd, "
         "stochastic_fast, stochastic_fastest) use it, got rounding='toward_zero'"),
    ],
)  # fmt: skip
def test_bad_rounding_arguments_name_themselves(kwargs, error, message):
    with pytest.raises(error, match="^" + re.escape(message)):
        emulate.encode(np.float32([1.0]), "float8_e4m3fn", **kwargs)


def test_wide_formats_take_only_nearest_even():
    with pytest.raises(ValueError, match="rounding: 'toward_zero' is built for the low-precision"):
        emulate.encode(np.float32([1.0]), "bfloat16", rounding="toward_zero")


@pytest.mark.parametrize(
    "bits", [pytest.param(1, marks=pytest.mark.long), pytest.param(23, marks=pytest.mark.long), 32]
)
def test_stochastic_of_any_width_gives_gfloat_code(bits):
    """random_bits from 1 to 32 (32: every bit of the draw, 2**32 not representable in
    the uint32 arithmetic) against gfloat with the same srbits, float8_e5m2."""
    f = formats.get("float8_e5m2")
    x = f32_sample(f)
    got = codes_of(emulate.encode(x, f.name, rounding="stochastic", key=KEY, random_bits=bits))
    srbits = np.asarray(random_integers(KEY, x.shape, bits)).astype(np.int64)
    with np.errstate(invalid="ignore", over="ignore"):
        want = round_ndarray(
            gfloat_info(f), x.astype(np.float64), RoundMode.Stochastic, False, srbits, bits
        )
    assert_codes_match(got, want, gfloat_info(f), x, f)


register_user_formats()


@pytest.mark.parametrize("name, mode, saturate", cases(CHECKED))
def test_formats_from_parameters_round_as_gfloat_in_every_mode(name, mode, saturate):
    """The P3109 binary8 formats and two user-built ones (e3m3, an unsigned 5-bit float;
    no ml_dtypes type: uint8 codes), the jnp encoder and
    the numpy oracle, against gfloat's round_ndarray. Documented differences
    (docs/numerics.md): NaN codes compared as NaN; unsigned formats give 0 for every
    negative input (-Inf too) in every mode, P3109's Saturate (M_lo), where gfloat 0.5.2
    rounds them as if signed (a negative value no code holds): checked against the rule."""
    f = formats.get(name)
    fi = record_info(f)
    x = f32_sample(f, gfloat_values(f))
    srbits = np.asarray(random_integers(KEY, x.shape, RANDOM_BITS))
    keep = np.ones(x.shape, bool) if f.signed else ~(x < 0)
    want_values = gfloat_round(fi, x[keep], mode, saturate, srbits[keep])
    want = nan_as_one(encode_ndarray(fi, want_values).astype(np.int64), f)
    got = np.asarray(emulate.encode(x, name, saturate=saturate, **mode_kwargs(mode)))
    oracle = reference_rounding.encode(
        x, name, saturate=saturate, rounding=mode, random_values=srbits, random_bits=RANDOM_BITS
    )
    for codes in (got, oracle):
        assert codes.dtype == np.uint8
        assert not codes[~keep & ~np.isnan(x)].any()  # unsigned: negatives give 0
        found = nan_as_one(codes[keep].astype(np.int64), f)
        differ = found != want
        assert not differ.any(), (
            f"{int(differ.sum())} differ: x={x[keep][differ][:6]}, "
            f"got {found[differ][:6]}, gfloat {want[differ][:6]}"
        )


GFLOAT_STOCHASTIC = {
    "stochastic": RoundMode.Stochastic,
    "stochastic_odd": RoundMode.StochasticOdd,
    "stochastic_fast": RoundMode.StochasticFast,
    "stochastic_fastest": RoundMode.StochasticFastest,
}


# 4 examples by default (each rounds every bf16 value and the f32 sample of a format: the
# modes themselves meet every format in the rotating cases above), 12 under
# EMULATE_LONG_TESTS=1.
@settings(max_examples=examples(4, 12), deadline=None)
@given(
    name=st.sampled_from(["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "int8"]),
    mode=st.sampled_from(STOCHASTIC),
    n=st.sampled_from([1, 2, 7, 8, 23, 29, 30, 32]),
    seed=st.integers(0, 2**32 - 1),
)
def test_explicit_rbits_give_gfloat_code_in_each_stochastic_mode(name, mode, n, seed):
    """emulate.encode(rbits=r) and the numpy oracle, every bf16 value and the f32 sample
    (every code of the format reached, each tie and its neighbours), against gfloat's
    round_ndarray with srbits = r (int8 as gfloat's ocp_int8, x scaled by 64)."""
    f = formats.get(name)
    x = f32_sample(formats.get("float8_e4m3fn") if f.is_integer else f)
    x = x[~np.isnan(x)]
    rb = np.random.default_rng(seed).integers(0, 1 << n, x.shape, dtype=np.int64)
    gmode = GFLOAT_STOCHASTIC[mode]
    kw = dict(rounding=mode, random_bits=n)
    sat = f.is_integer or not (f.has_inf or f.has_nan)
    if f.is_integer:
        with np.errstate(over="ignore"):
            x64 = x * 64
        got = np.asarray(emulate.encode(x64, name, saturate=True, rbits=rb, **kw))
        with np.errstate(invalid="ignore", over="ignore"):
            want = round_ndarray(format_info_ocp_int8, x.astype(np.float64), gmode, True, rb, n)
        np.testing.assert_array_equal(got.astype(np.float64), want * 64)
        return
    fi = gfloat_info(f)
    got = codes_of(emulate.encode(x, name, saturate=sat, rbits=rb, **kw))
    ref = codes_of(reference_rounding.encode(x, name, saturate=sat, random_values=rb, **kw))
    with np.errstate(invalid="ignore", over="ignore"):
        want = round_ndarray(fi, x.astype(np.float64), gmode, sat, rb, n)
    assert_codes_match(got, want, fi, x, f)
    assert_codes_match(ref, want, fi, x, f)
    assert len(np.unique(got)) == len(np.unique(codes_of(want.astype(f.dtype))))


def test_fast_modes_keep_gfloat_float64_sum():
    """gfloat tests ``delta + (r + c) * 2**-n >= 1`` in float64, which rounds a sum in
    ``[1 - 2**-54, 1)`` up: float32 values far below float8_e5m2's smallest subnormal
    (a dropped fraction with bits below 2**-54) with ``r`` at the edge, n = 29 to 32."""
    full = np.array([2**24 - 1, 2**24 - 3, 2**23 + 2**22 + 1, 0xFFFFF7], np.float64)
    x = np.concatenate([full * 2.0 ** -(16 + s) for s in range(40, 62)]).astype(np.float32)
    delta = [fractions.Fraction(float(v)) * 2**16 for v in x]
    fi, f, seen = gfloat_info(formats.get("float8_e5m2")), formats.get("float8_e5m2"), 0
    for mode, c in (("stochastic_fast", fractions.Fraction(1, 2)), ("stochastic_fastest", 0)):
        for n in (29, 30, 31, 32):
            room = np.array([(1 << n) - 1 - int(d * 2**n) for d in delta], np.int64)
            exact = [d + (int(r) + c) / 2**n >= 1 for d, r in zip(delta, room)]
            got = codes_of(emulate.encode(x, f.name, rounding=mode, random_bits=n, rbits=room))
            want = round_ndarray(fi, x.astype(np.float64), GFLOAT_STOCHASTIC[mode], False, room, n)
            assert_codes_match(got, want, fi, x, f)
            seen += int(np.sum((want > 0) != np.array(exact)))
    assert seen == 6  # elements where gfloat's float64 sum, not the exact one, decides


@settings(max_examples=examples(3, 6), deadline=None)  # 6 under EMULATE_LONG_TESTS=1
@given(
    width=st.sampled_from([2, 3, 5, 9, 129, (1 << 15) + 1]),
    mode=st.sampled_from(ROUNDINGS),
    n=st.sampled_from([1, 5, 32]),
    data=st.data(),
)
def test_increments_below_goes_up_by_the_exact_fraction(width, mode, n, data):
    """``x = full * 2**-shift`` in ``[0, width)`` goes up to ``width`` (else to 0) by the
    exact fraction ``x / width`` (docs/numerics.md, "Formats without subnormals"), for odd
    widths (``2**t + 1``, 16-bit formats included), thresholds and their neighbours."""
    from emulate.numerics.rounding import increments_below

    n = n if mode in STOCHASTIC else 0
    shift = data.draw(st.integers(-3, 60))

    def below(full: int) -> bool:
        return fractions.Fraction(full, 1) * fractions.Fraction(2) ** -shift < width

    k = st.integers(0, (width << (n + 1)) - 1)  # thresholds width * k / 2**(n+1), +-1
    near = st.tuples(k, st.sampled_from([-1, 0, 1])).map(
        lambda kd: (
            int(fractions.Fraction(kd[0], 1 << (n + 1)) * fractions.Fraction(2) ** shift) + kd[1]
        )
    )
    fulls = st.one_of(near, st.integers(0, (1 << 24) - 1)).filter(
        lambda v: 0 <= v < 1 << 24 and below(v)
    )
    full = data.draw(st.lists(fulls, min_size=8, max_size=8))
    negative = data.draw(st.lists(st.booleans(), min_size=8, max_size=8))
    r = data.draw(st.lists(st.integers(0, (1 << n) - 1), min_size=8, max_size=8))
    got = increments_below(
        jnp.asarray(np.array(full, np.uint32)),
        jnp.full((8,), shift, jnp.int32),
        width,
        jnp.asarray(np.array(negative)),
        mode,
        jnp.asarray(np.array(r, np.uint32)) if n else None,
        n,
    )
    half = fractions.Fraction(1, 2)
    for i, (f_i, neg, r_i) in enumerate(zip(full, negative, r, strict=True)):
        d = fractions.Fraction(f_i) * fractions.Fraction(2) ** -shift / width
        y = d * 2**n
        low = y.numerator // y.denominator
        rnd = {
            "stochastic": round(y),
            "stochastic_odd": low + int(y - low > half or (y - low == half and low % 2 == 0)),
            "stochastic_fast": (y + half).numerator // (y + half).denominator,
            "stochastic_fastest": low,
        }
        want = {
            "nearest_even": d > half,
            "nearest_away": d >= half,
            "toward_zero": False,
            "toward_positive": d > 0 and not neg,
            "toward_negative": d > 0 and neg,
        }.get(mode, mode in rnd and rnd[mode] + r_i >= 2**n)
        assert bool(got[i]) == want, (width, mode, n, shift, f_i, r_i)
