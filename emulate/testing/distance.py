"""Distances between results and exact values: units in the last place, and the interval a
bounded result must lie in (the numbers behind :mod:`emulate.testing.comparison`'s verdicts).

Floats are compared by *ordinal*: codes mapped to integers that count representable values,
so the distance between two results of one format is their number of steps apart (-0 and +0
both 0; NaN against a number is infinitely far, NaN against NaN 0).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from emulate import reference
from emulate.formats import Format

__all__ = ["dyadic", "needed_bound", "ordinal", "same", "ulp_distance", "within"]


def same(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Element-wise: equal integers, or equal floats (+0 == -0), or both NaN."""
    if got.dtype.kind in "iu":
        return got == want
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    return (np.isnan(g) & np.isnan(w)) | (g == w)


def ordinal(x: np.ndarray, f: Format) -> np.ndarray:
    """Float codes mapped to integers that count representable values (-0 and +0 both 0)."""
    raw = x.view(np.dtype(f"u{x.dtype.itemsize}")).astype(np.int64) & f.code_mask
    sign = 1 << (f.bits - 1)
    mag = raw & (sign - 1)
    return np.where(raw & sign, -mag, mag)


def ulp_distance(got: np.ndarray, want: np.ndarray, f: Format) -> np.ndarray:
    if f.is_integer:
        return np.abs(got.astype(np.int64) - want.astype(np.int64)).astype(np.float64)
    gn, wn = np.isnan(got.astype(np.float64)), np.isnan(want.astype(np.float64))
    dist = np.abs(ordinal(got, f) - ordinal(want, f)).astype(np.float64)
    return np.where(gn & wn, 0.0, np.where(gn | wn, math.inf, dist))


def dyadic(x: Fraction) -> tuple[int, int]:
    """``numerator * 2**exponent`` for a fraction whose denominator is a power of two."""
    den = x.denominator
    assert den & (den - 1) == 0, x
    return x.numerator, -(den.bit_length() - 1)


def from_ordinal(o: int, f: Format, dtype: np.dtype) -> float:
    """The value whose :func:`ordinal` is ``o`` (NaN past the format's codes)."""
    sign = 1 << (f.bits - 1)
    mag = abs(o)
    if mag >= sign:
        return math.nan
    code = mag | (sign if o < 0 else 0)
    uint = np.dtype(f"u{dtype.itemsize}")
    return float(np.asarray(code, uint).reshape(1).view(dtype).astype(np.float64)[0])


def needed_bound(v: npt.ArrayLike, e: Fraction, f: Format) -> Fraction:
    """The smallest bound ``B`` with ``v`` between the roundings of ``e - B`` and ``e + B``.

    ``v`` is a finite value of format ``f``; the values that round to it reach halfway to
    its neighbours (ties ignored), so ``B`` is the distance from ``e`` to the near end of
    that interval, 0 when ``v`` is the rounding of ``e`` itself.
    """
    x = np.asarray(v)
    value = Fraction(float(x))
    if value == e:
        return Fraction(0)
    o = int(ordinal(x.reshape(1), f)[0])
    step = -1 if value > e else 1
    neighbour = from_ordinal(o + step, f, x.dtype)
    if not math.isfinite(neighbour):  # past max: mirror the neighbour on the other side
        neighbour = 2 * float(value) - from_ordinal(o - step, f, x.dtype)
    edge = (value + Fraction(neighbour)) / 2
    return max(Fraction(0), edge - e if value > e else e - edge)


def within(
    got: np.ndarray, exact: np.ndarray, bnd: np.ndarray, f: Format, flushed_nan: np.ndarray
) -> tuple[np.ndarray, list[float], list[tuple[float, float] | None]]:
    """Per element: outside [round(exact - bound), round(exact + bound)]? and the ratios.
    Where the exact sum is +-Inf and ``flushed_nan`` holds, NaN is allowed too."""
    g = got.astype(np.float64).reshape(-1)
    nan_ok = flushed_nan.reshape(-1)
    bad = np.zeros(g.shape, bool)
    ratios: list[float] = []
    allowed: list[tuple[float, float] | None] = []
    for i, (e, bd, v) in enumerate(
        zip(np.asarray(exact, dtype=object).reshape(-1), bnd.reshape(-1), g, strict=True)
    ):
        if not isinstance(e, Fraction):  # NaN / Inf follow IEEE: compare as they are
            bad[i] = not (np.isnan(e) and np.isnan(v) or e == v or nan_ok[i] and np.isnan(v))
            allowed.append(None)
            continue
        if not np.isfinite(bd):
            allowed.append((-math.inf, math.inf))
            continue
        lo = reference.round_exact(*dyadic(e - Fraction(bd)), f)
        hi = reference.round_exact(*dyadic(e + Fraction(bd)), f)
        allowed.append((lo, hi))
        if not np.isfinite(v):
            # Past the format's range the rounding overflows to Inf or (fn/fnuz) NaN.
            bad[i] = np.isfinite(lo) and np.isfinite(hi)
            continue
        lo_ok = lo if np.isfinite(lo) else -math.inf
        hi_ok = hi if np.isfinite(hi) else math.inf
        bad[i] = not lo_ok <= v <= hi_ok
        need = needed_bound(got.reshape(-1)[i], e, f)
        ratios.append(float(need / Fraction(bd)) if bd else (0.0 if need == 0 else math.inf))
    return bad.reshape(got.shape), ratios, allowed
