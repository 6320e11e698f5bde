"""emulate.reference.rounding, the numpy oracle of the rounding modes: against gfloat
(every bf16 value and an f32 sample, every float format, every mode, with and without
saturation: numpy only, so all of it runs in CI), against a brute-force search of the
format's values, and, for stochastic rounding, against exact probabilities by Fractions.
The documented differences from gfloat are those of tests/_gfloat_cases.py."""

from __future__ import annotations

import fractions

import numpy as np
import pytest
from _gfloat_cases import (
    FLOATS,
    RANDOM_BITS,
    assert_codes_match,
    comparable,
    f32_sample,
    gfloat_info,
    gfloat_round,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from emulate import formats
from emulate.numerics import rounding
from emulate.reference import rounding as reference_rounding


def test_the_two_lists_of_modes_agree():
    assert reference_rounding.ROUNDINGS == rounding.ROUNDINGS


@pytest.mark.parametrize("name", FLOATS)
def test_oracle_gives_gfloat_code(name):
    f = formats.get(name)
    fi = gfloat_info(f)
    x = f32_sample(f)
    srbits = np.random.default_rng(7).integers(0, 1 << RANDOM_BITS, x.shape)
    for mode in rounding.ROUNDINGS:
        for saturate in (False, True):
            got = reference_rounding.encode(
                x,
                name,
                saturate=saturate,
                rounding=mode,
                random_values=srbits if mode in rounding.STOCHASTIC else None,
                random_bits=RANDOM_BITS if mode in rounding.STOCHASTIC else None,
            ).view(np.uint8)
            keep, sat, gmode = comparable(f, x, mode, saturate)
            want = gfloat_round(fi, x[keep], gmode, sat, srbits[keep])
            assert_codes_match(got[keep], want, fi, x[keep], f)


def neighbours(name: str, x: float) -> tuple[float, float]:
    """The largest finite value of the format <= x and the smallest >= x (brute force
    over every code; +-Inf past the ends)."""
    f = formats.get(name)
    with np.errstate(invalid="ignore"):
        v = np.arange(1 << f.bits, dtype=np.uint8).view(f.dtype).astype(np.float64)
    v = v[np.isfinite(v)]
    below, above = v[v <= x], v[v >= x]
    return (below.max() if below.size else -np.inf), (above.min() if above.size else np.inf)


@settings(max_examples=60)
@given(
    name=st.sampled_from([n for n in FLOATS if n != "float8_e8m0fnu"]),
    x=st.floats(-600.0, 600.0, width=32) | st.sampled_from([0.3125, -2.75, 448.0, 1e-3]),
)
def test_directed_modes_are_the_neighbours(name, x):
    """toward_negative gives the largest value <= x, toward_positive the smallest >= x,
    toward_zero the one nearer zero: each found by searching every code (inside the
    range; past it the overflow rules apply, checked against gfloat)."""
    lo, hi = neighbours(name, x)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return
    got = {
        m: float(reference_rounding.encode(np.float32([x]), name, rounding=m).astype(np.float64)[0])
        for m in ("toward_negative", "toward_positive", "toward_zero")
    }
    assert got["toward_negative"] == lo
    assert got["toward_positive"] == hi
    assert got["toward_zero"] == (lo if x >= 0 else hi)


@settings(max_examples=40)
@given(
    name=st.sampled_from(["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "int8", "uint4"]),
    x=st.floats(-5.0, 5.0, width=32),
    n=st.sampled_from([1, 2, 5]),
)
def test_stochastic_probability_is_exact(name, x, n):
    """Each of the 2**n random integers once: the mean of the results is the value's
    neighbour below plus (above - below) times d / 2**n, d the fraction of the way
    rounded to n bits, ties to even; the value itself when that fraction has <= n bits."""
    f = formats.get(name)
    x = x if f.signed else abs(x)
    if f.is_integer:
        lo, hi = np.floor(x), np.ceil(x)
    else:
        lo, hi = neighbours(name, x)
    value = fractions.Fraction(float(x))
    r = np.arange(1 << n)
    got = reference_rounding.encode(
        np.full(r.shape, x, np.float32),
        name,
        rounding="stochastic",
        random_values=r,
        random_bits=n,
        saturate=True,
    ).astype(np.float64)
    assert set(got.tolist()) <= {lo, hi}
    if lo == hi:
        assert got.tolist() == [lo] * (1 << n)
        return
    delta = (value - fractions.Fraction(lo)) / (fractions.Fraction(hi) - fractions.Fraction(lo))
    if x < 0:  # the magnitude rounds: "up" is toward lo
        delta = 1 - delta
    d = round(delta * (1 << n))
    away = hi if x >= 0 else lo
    assert int(np.sum(got == away)) == d
    mean = sum(fractions.Fraction(g) for g in got.tolist()) / (1 << n)
    if (delta * (1 << n)).denominator == 1:
        assert mean == value


def test_bad_arguments():
    with pytest.raises(ValueError, match="rounding: expected one of"):
        reference_rounding.encode(np.float32([1.0]), "int8", rounding="up")
    with pytest.raises(ValueError, match="random_values, random_bits: needed by"):
        reference_rounding.encode(np.float32([1.0]), "int8", rounding="stochastic")
    with pytest.raises(ValueError, match="fmt: expected a low-precision format, got bfloat16"):
        reference_rounding.encode(np.float32([1.0]), "bfloat16")
