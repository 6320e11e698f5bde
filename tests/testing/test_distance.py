"""emulate.testing.distance against the values of every code, enumerated with ml_dtypes."""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from emulate import formats
from emulate.testing.distance import dyadic, needed_bound, ordinal, same, ulp_distance, within


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "bfloat16"])
def test_ordinal_counts_representable_values(name):
    f = formats.get(name)
    codes = np.arange(1 << f.bits, dtype=np.uint16 if f.bits > 8 else np.uint8)
    values = codes.view(f.dtype) if f.bits >= 8 else codes.astype(np.uint8).view(f.dtype)
    with np.errstate(invalid="ignore"):
        finite = values[np.isfinite(values.astype(np.float64))]
    order = np.argsort(finite.astype(np.float64), kind="stable")
    ranks = ordinal(finite[order], f)
    steps = np.diff(ranks)
    v = finite[order].astype(np.float64)
    # one step between neighbouring distinct values, none between -0 and +0
    assert set(steps[v[1:] != v[:-1]].tolist()) == {1}
    assert set(steps[v[1:] == v[:-1]].tolist()) <= {0}


def test_ulp_distance_of_specials_and_integers():
    f = formats.get("float8_e4m3fn")
    x = np.array([1.0, 1.0, np.nan, np.nan, 0.0, 448.0], ml_dtypes.float8_e4m3fn)
    y = np.array([1.125, 1.0, np.nan, 2.0, -0.0, -448.0], ml_dtypes.float8_e4m3fn)
    assert ulp_distance(x, y, f).tolist() == [1.0, 0.0, 0.0, math.inf, 0.0, 252.0]
    ints = formats.get("int32")
    assert ulp_distance(np.int32([5, -3]), np.int32([2, -3]), ints).tolist() == [3.0, 0.0]
    assert same(np.float32([np.nan, 0.0, 1.0]), np.float32([np.nan, -0.0, 2.0])).tolist() == [
        True,
        True,
        False,
    ]


def test_dyadic_and_needed_bound():
    assert dyadic(Fraction(3, 8)) == (3, -3)
    f = formats.get("float8_e4m3fn")
    one = np.asarray(1.0, ml_dtypes.float8_e4m3fn)
    assert needed_bound(one, Fraction(1), f) == 0
    # 1's neighbours in e4m3fn are 0.9375 and 1.125: values within (0.96875, 1.0625) round to 1
    assert needed_bound(one, Fraction(11, 10), f) == Fraction(11, 10) - Fraction(17, 16)
    assert needed_bound(one, Fraction(9, 10), f) == Fraction(31, 32) - Fraction(9, 10)


def test_within_allows_the_rounded_interval_only():
    f = formats.get("float32")
    exact = np.array([Fraction(1), Fraction(1)], dtype=object)
    got = np.float32([1.0 + 2**-23, 1.0 + 2**-21])
    bad, ratios, allowed = within(got, exact, np.array([2.0**-22, 2.0**-22]), f, np.zeros(2, bool))
    assert bad.tolist() == [False, True]
    assert allowed == [(1.0 - 2**-22, 1.0 + 2**-22)] * 2
    # 1 + 2**-23 rounds from 1 + 2**-24 up: it needed a bound of 2**-24
    assert ratios == [0.25, 1.75]  # and 1 + 2**-21 needed 7 * 2**-24
