"""The oracle of the rounding modes: :func:`encode` in float64 numpy, by value.

Independent of :mod:`emulate.numerics` (no JAX, no bit tricks): each finite value is
written as ``s * 2**q``, ``q`` the exponent of the target's quantum at that magnitude, and
the fraction of ``s`` decides the rounding. Results are arrays of the format's ml_dtypes
type; the special values follow the same table as :func:`emulate.encode` (ml_dtypes'
casts: docs/numerics.md), which this module writes out case by case.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from emulate import formats
from emulate.formats import FormatLike
from emulate.reference.codes import encode_values

__all__ = ["ROUNDINGS", "encode"]

#: The modes, as :data:`emulate.numerics.rounding.ROUNDINGS` (the test of this module
#: checks that the two lists agree).
ROUNDINGS = (
    "nearest_even",
    "nearest_away",
    "toward_zero",
    "toward_positive",
    "toward_negative",
    "stochastic",
    "stochastic_odd",
    "stochastic_fast",
    "stochastic_fastest",
)


def encode(
    x: npt.ArrayLike,
    fmt: FormatLike,
    *,
    saturate: bool = False,
    rounding: str = "nearest_even",
    random_values: npt.ArrayLike | None = None,
    random_bits: int | None = None,
) -> np.ndarray:
    """Round ``x`` into ``fmt`` by ``rounding``; the oracle of :func:`emulate.encode`.

    Args:
      x: float values (any numpy float type; float64 is rounded once, directly).
      fmt: a low-precision format (float, integer or float8_e8m0fnu).
      saturate: as :func:`emulate.encode`.
      rounding: one of :data:`ROUNDINGS`.
      random_values, random_bits: for the stochastic modes: each element's random
        integer ``r`` in ``[0, 2**random_bits)`` (an array of ``x``'s shape; gfloat's
        ``srbits``) and the width ``n``. With ``delta`` the dropped fraction, the
        magnitude goes up when (gfloat's ``RoundMode`` of the same name, its float64
        arithmetic included):

        - "stochastic": ``d + r >= 2**n``, ``d`` = ``delta * 2**n`` rounded to an
          integer, ties to even;
        - "stochastic_odd": the same with ties to odd;
        - "stochastic_fast": ``delta + (r + 1/2) * 2**-n >= 1`` in float64;
        - "stochastic_fastest": ``delta + r * 2**-n >= 1`` in float64.

    Returns:
      An array of ``fmt``'s ml_dtypes (or numpy integer) type, ``x``'s shape; for a format
      without one (:attr:`~emulate.formats.Format.has_dtype` False) its codes (uint8;
      uint16 for 9 to 16 bits).
    """
    f = formats.get(fmt)
    if not f.is_low_precision:
        raise ValueError(f"fmt: expected a low-precision format, got {f.name}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding: expected one of {ROUNDINGS}, got {rounding!r}")
    with np.errstate(invalid="ignore"):
        v = np.asarray(x).astype(np.float64)
    r = None
    if rounding.startswith("stochastic"):
        if random_values is None or random_bits is None:
            raise ValueError(f"random_values, random_bits: needed by rounding={rounding!r}")
        r = np.broadcast_to(np.asarray(random_values, np.float64), v.shape)
    if f.is_float and not f.has_dtype and rounding == "nearest_even":
        # The record's table: a tie goes to the even code, which for a format without
        # trailing significand bits (P3109 p1) is the even exponent, not the even quantum.
        return encode_values(v, f, saturate=saturate)
    negative = np.signbit(v)
    with np.errstate(invalid="ignore", over="ignore"):
        if f.is_integer:
            return _integer(v, negative, f, saturate, rounding, r, random_bits)
        if not f.has_zero:
            return _e8m0(v, negative, saturate, rounding, r, random_bits)
        return _float(v, negative, f, saturate, rounding, r, random_bits)


def _up(s: np.ndarray, negative: np.ndarray, rounding: str, r, n) -> np.ndarray:
    """The magnitude ``s >= 0`` rounded to an integer (float64) by ``rounding``."""
    k = np.floor(s)
    delta = s - k
    if rounding == "nearest_even":
        up = (delta > 0.5) | ((delta == 0.5) & (np.fmod(k, 2) == 1))
    elif rounding == "nearest_away":
        up = delta >= 0.5
    elif rounding == "toward_zero":
        up = np.zeros(s.shape, bool)
    elif rounding == "toward_positive":
        up = (delta > 0) & ~negative
    elif rounding == "toward_negative":
        up = (delta > 0) & negative
    elif rounding == "stochastic_fast":
        up = delta + (0.5 + r) * 2.0**-n >= 1.0  # float64, as gfloat
    elif rounding == "stochastic_fastest":
        up = delta + r * 2.0**-n >= 1.0
    else:
        scaled = np.ldexp(delta, n)
        d = np.rint(scaled)  # numpy's rint: ties to even
        if rounding == "stochastic_odd":
            low = np.floor(scaled)
            frac = scaled - low
            d = low + ((frac > 0.5) | ((frac == 0.5) & (np.fmod(low, 2) == 0)))
        up = d + r >= 2.0**n
    return k + up


def _up_below(a, below, negative, smallest: float, rounding: str, r, n) -> np.ndarray:
    """Where ``a`` (``below``: ``0 <= a < smallest``) rounds up to ``smallest``, by the
    exact fraction ``delta = a / smallest`` (Fractions): to nearest with ties to 0 (the
    even code), ties away, directed by the sign, or, with ``y = delta * 2**n``, when
    ``rnd(y) + r >= 2**n`` (``rnd``: nearest even, nearest odd, half up, down for the four
    stochastic modes). :func:`emulate.numerics.rounding.increments_below`'s rule."""
    up = np.zeros(a.shape, bool)
    for i in zip(*np.nonzero(below)):
        delta = Fraction(float(a[i])) / Fraction(smallest)
        if rounding in ("nearest_even", "nearest_away"):
            tie_up = rounding == "nearest_away"
            up[i] = delta > Fraction(1, 2) or (delta == Fraction(1, 2) and tie_up)
        elif rounding.startswith("toward"):
            up[i] = (
                delta > 0
                and rounding != "toward_zero"
                and (bool(negative[i]) == (rounding == "toward_negative"))
            )
        else:
            y = delta * 2**n
            low = math.floor(y)
            frac = y - low
            carry = {
                "stochastic": frac > Fraction(1, 2) or (frac == Fraction(1, 2) and low % 2 == 1),
                "stochastic_odd": frac > Fraction(1, 2)
                or (frac == Fraction(1, 2) and low % 2 == 0),
                "stochastic_fast": frac >= Fraction(1, 2),
                "stochastic_fastest": False,
            }[rounding]
            up[i] = low + carry + int(r[i]) >= 2**n
    return up


def _directed_down(negative: np.ndarray, rounding: str) -> np.ndarray:
    """Where a finite overflow rounds to +-max (the directed modes, toward zero)."""
    return {
        "toward_zero": np.ones(negative.shape, bool),
        "toward_positive": negative,
        "toward_negative": ~negative,
    }.get(rounding, np.zeros(negative.shape, bool))


def _float(v, negative, f: formats.Format, saturate, rounding, r, n) -> np.ndarray:
    finite = np.isfinite(v)
    a = np.where(finite, np.abs(v), 0.0)
    exp = np.frexp(np.where(a > 0, a, 1.0))[1] - 1
    quantum = np.maximum(exp, f.emin) - f.mantissa_bits
    mag = np.ldexp(_up(np.ldexp(a, -quantum), negative, rounding, r, n), quantum)
    if not f.has_subnormals:  # below the smallest value: 0 or the smallest value
        below = a < f.min_subnormal
        up = _up_below(a, below, negative, f.min_subnormal, rounding, r, n)
        mag = np.where(below, np.where(up, f.min_subnormal, 0.0), mag)
    big = float(f.max)
    over = finite & (mag > big)
    mag = np.where(over & _directed_down(negative, rounding), big, mag)
    if saturate or not (f.has_inf or f.has_nan):
        beyond = big  # overflow and Inf saturate
    else:
        beyond = math.inf if f.has_inf else math.nan
    mag = np.where((mag > big) | ~finite, beyond, mag)
    out = np.where(negative, -mag, mag)
    if not f.signed_zero:  # fnuz: no -0
        out = np.where(out == 0, 0.0, out)
    nan = np.isnan(v)
    if f.has_nan:
        out = np.where(nan, v, out)  # NaN keeps its sign where the format has signed NaNs
    else:  # float6/float4: NaN becomes a zero of the opposite sign (ml_dtypes)
        out = np.where(nan, np.where(negative, 0.0, -0.0), out)
    if f.has_dtype:
        return out.astype(f.dtype)
    # A format without an ml_dtypes type: ``out`` holds representable values (or the
    # specials), whose codes the record's table gives exactly.
    codes = encode_values(out, f)
    if not f.signed:  # every negative input, -Inf too, gives 0 in every mode (P3109)
        codes = np.where(negative & ~nan, 0, codes)
    return codes.astype(f.dtype)


def _integer(v, negative, f: formats.Format, saturate, rounding, r, n) -> np.ndarray:
    a = np.where(np.isfinite(v), np.abs(v), 0.0)
    small = a < 2.0**52
    mag = np.where(small, _up(np.where(small, a, 0.0), negative, rounding, r, n), a)
    value = np.where(negative, -mag, mag)
    value = np.where(np.isnan(v), 0.0, np.where(np.isinf(v), v, value))
    if saturate:
        return np.clip(value, int(f.min), int(f.max)).astype(np.int64).astype(f.dtype)
    # wrap modulo 2**bits; Inf and values beyond first clamped to +-2**31 (float32's
    # nearest to the int32 limits, as emulate.encode clamps before converting)
    ints = np.clip(value, -(2.0**31), 2.0**31).astype(np.int64) & f.code_mask
    if f.signed:
        ints = np.where(ints >= 1 << (f.bits - 1), ints - (1 << f.bits), ints)
    return ints.astype(f.dtype)


def _e8m0(v, negative, saturate, rounding, r, n) -> np.ndarray:
    ok = np.isfinite(v) & (v > 0)
    a = np.where(ok, v, 1.0)
    exp = np.frexp(a)[1] - 1
    s = np.ldexp(a, -exp)  # [1, 2): the quantum is 2**exp; ties go up (1 is odd)
    e = exp + (_up(s, negative, rounding, r, n) - 1).astype(np.int64)
    e = np.maximum(e, -127)  # below 2**-127: 2**-127
    if saturate:
        e = np.minimum(e, 127)
        ok = ok | (np.isposinf(v))
        e = np.where(np.isposinf(v), 127, e)
    codes = np.where(ok & (e <= 127), e + 127, 255).astype(np.uint8)
    return codes.view(formats.get("float8_e8m0fnu").dtype)
