"""Brute force for the oracle's tests: format values from the bit fields of each code.

The brute force here shares nothing with ``emulate.reference``: values come from the bit
fields of each code, exact sums from plain loops over ``fractions.Fraction``, and rounding
from picking the nearest of the output format's enumerated values (or of the codes next to
a first guess, for 16- and 32-bit formats).
"""

from __future__ import annotations

import bisect
import functools
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

from emulate import formats

SMALL_FLOATS = (
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3b11fnuz",
    "float8_e3m4",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float4_e2m1fn",
)
WIDE_FLOATS = ("bfloat16", "float16", "float32")
ROUNDING_TARGETS = SMALL_FLOATS + WIDE_FLOATS
DOT_FORMATS = tuple(n for n in formats.LOW_PRECISION if n != "float8_e8m0fnu") + (
    "bfloat16",
    "float32",
)
PREFERRED = (
    "float32",
    "bfloat16",
    "float16",
    "float8_e4m3fn",
    "float8_e5m2",
    "float6_e3m2fn",
    "float4_e2m1fn",
    "int32",
)

# (exponent bits, mantissa bits, bias, special-value rule), written from the format specs.
FIELDS = {
    "float8_e4m3fn": (4, 3, 7, "fn"),
    "float8_e5m2": (5, 2, 15, "ieee"),
    "float8_e4m3fnuz": (4, 3, 8, "fnuz"),
    "float8_e5m2fnuz": (5, 2, 16, "fnuz"),
    "float8_e4m3b11fnuz": (4, 3, 11, "fnuz"),
    "float8_e3m4": (3, 4, 3, "ieee"),
    "float6_e2m3fn": (2, 3, 1, "none"),
    "float6_e3m2fn": (3, 2, 3, "none"),
    "float4_e2m1fn": (2, 1, 1, "none"),
    "bfloat16": (8, 7, 127, "ieee"),
    "float16": (5, 10, 15, "ieee"),
    "float32": (8, 23, 127, "ieee"),
}
INTEGERS = {"int4": (4, True), "uint4": (4, False), "int8": (8, True), "uint8": (8, False)}
DTYPES = {
    n: np.dtype(getattr(ml_dtypes, n) if hasattr(ml_dtypes, n) else getattr(np, n))
    for n in (*FIELDS, *INTEGERS, "float8_e8m0fnu", "int32")
}


def bits_of(name: str) -> int:
    if name in FIELDS:
        e, m, _, _ = FIELDS[name]
        return 1 + e + m
    if name in INTEGERS:
        return INTEGERS[name][0]
    return {"float8_e8m0fnu": 8, "int32": 32}[name]


def code_dtype(name: str) -> np.dtype:
    return np.dtype({8: np.uint8, 16: np.uint16, 32: np.uint32}[max(8, bits_of(name))])


def field_value(name: str, code: int) -> float:
    """The value of a code, from its bit fields alone."""
    if name in INTEGERS:
        bits, signed = INTEGERS[name]
        return float(code - (1 << bits) if signed and code >> (bits - 1) else code)
    if name == "float8_e8m0fnu":
        return math.nan if code == 0xFF else math.ldexp(1.0, code - 127)
    e_bits, m_bits, bias, rule = FIELDS[name]
    bits = 1 + e_bits + m_bits
    sign = -1.0 if code >> (bits - 1) else 1.0
    magnitude = code & ((1 << (bits - 1)) - 1)
    exp, man = magnitude >> m_bits, magnitude & ((1 << m_bits) - 1)
    if rule == "fnuz" and code == 1 << (bits - 1):
        return math.nan
    if rule == "fn" and magnitude == (1 << (bits - 1)) - 1:
        return math.nan
    if rule == "ieee" and exp == (1 << e_bits) - 1:
        return sign * math.inf if man == 0 else math.nan
    if exp == 0:
        return sign * math.ldexp(man, 1 - bias - m_bits)
    return sign * math.ldexp((1 << m_bits) + man, exp - bias - m_bits)


def from_codes(name: str, codes) -> np.ndarray:
    return np.asarray(codes, dtype=np.uint64).astype(code_dtype(name)).view(DTYPES[name])


@functools.cache
def value_of(name: str, code: int) -> Fraction:
    with np.errstate(invalid="ignore"):
        return Fraction(float(from_codes(name, [code]).astype(np.float64)[0]))


@functools.cache
def max_code(name: str) -> int:
    """The code of the largest finite value (sign bit clear)."""
    if bits_of(name) <= 8:
        finite = [c for c in range(1 << (bits_of(name) - 1)) if math.isfinite(field_value(name, c))]
        return max(finite)
    return int(np.array(ml_dtypes.finfo(DTYPES[name]).max, DTYPES[name]).view(code_dtype(name)))


@functools.cache
def positive_values(name: str) -> list[Fraction]:
    """Values of codes 0 .. max_code + 1 of a small format, the last one past max."""
    top = max_code(name)
    values = [value_of(name, c) for c in range(top + 1)]
    return [*values, 2 * values[-1] - values[-2]]


def overflow_value(name: str, negative: bool) -> float:
    rule = FIELDS[name][3]
    if rule == "ieee":
        return -math.inf if negative else math.inf
    if rule in ("fn", "fnuz"):
        return math.nan
    top = float(value_of(name, max_code(name)))
    return -top if negative else top


def nearest(x: Fraction, name: str) -> float:
    """Round ``x`` to nearest, ties to the even code, by comparing candidate values."""
    negative, mag = x < 0, abs(x)
    top = max_code(name)
    if bits_of(name) <= 8:
        above = bisect.bisect_left(positive_values(name), mag)
        candidates = [c for c in (above - 1, above) if 0 <= c <= top + 1]
    else:
        with np.errstate(over="ignore"):
            guess = np.array(float(mag)).astype(DTYPES[name]).view(code_dtype(name))
        candidates = [c for c in (int(guess) - 1, int(guess), int(guess) + 1) if 0 <= c <= top + 1]

    def value(code: int) -> Fraction:
        # One code past max: the next value of an unbounded exponent range.
        if code == top + 1:
            return 2 * value_of(name, top) - value_of(name, top - 1)
        return value_of(name, code)

    best = min(candidates, key=lambda c: (abs(value(c) - mag), c & 1))
    if best == top + 1:
        return overflow_value(name, negative)
    result = float(value(best))
    return -result if negative else result


def special_codes(name: str) -> list[int]:
    """NaN, Inf, +-0, +-max, +-smallest subnormal, +-largest subnormal, 1.0 and friends."""
    bits = bits_of(name)
    if name in INTEGERS or name == "int32":
        lo = 1 << (bits - 1)
        return [0, 1, (1 << bits) - 1, lo - 1, lo]
    sign = 1 << (bits - 1)
    m_bits = FIELDS[name][1]
    one = int(np.array(1.0, DTYPES[name]).view(code_dtype(name)))
    picks = [0, 1, (1 << m_bits) - 1, 1 << m_bits, max_code(name), max_code(name) + 1, one]
    return sorted({c | s for c in picks for s in (0, sign)})


def codes_strategy(name: str) -> st.SearchStrategy[int]:
    bits = bits_of(name)
    any_code = st.integers(0, (1 << bits) - 1)
    special = st.sampled_from(special_codes(name))
    if bits <= 8:
        return st.one_of(special, any_code, any_code)
    moderate = st.floats(-4, 4, width=32).map(
        lambda v: int(np.array(v, np.float32).astype(DTYPES[name]).view(code_dtype(name)))
    )
    return st.one_of(special, any_code, moderate, moderate)


def same_float(got: np.ndarray, expected: np.ndarray) -> bool:
    """Equal as values: NaN as a class, the sign of zero ignored."""
    with np.errstate(invalid="ignore"):
        got, expected = got.astype(np.float64), expected.astype(np.float64)
    return got.shape == expected.shape and np.array_equal(got, expected, equal_nan=True)


# ---------------------------------------------------------------------------- decode
