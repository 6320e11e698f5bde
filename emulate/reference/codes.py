"""The oracle for formats ml_dtypes lacks: a numpy decoder and encoder built from the record.

ml_dtypes is the oracle for its own types. A format built with
:func:`emulate.formats.float_format` (the P3109 family, yours) has no ml_dtypes type, so
:mod:`emulate.reference` asks this module: the value of every code computed in Python from
the record's layout (sign bit, exponent field, trailing significand, NaN and Inf codes), and
rounding to nearest by searching that table. No JAX, no codecs; the tests check both
against gfloat.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import numpy.typing as npt

from emulate import formats
from emulate.formats import FormatLike

__all__ = ["code_values", "decode_codes", "encode_values"]


def _magnitude(f: formats.Format, mag: int) -> float:
    """The value the layout gives magnitude code ``mag`` (NaN and Inf codes not applied):
    exponent field 0 holds subnormals, or, without them, zero (code 0) and normals."""
    t = f.mantissa_bits
    e, m = mag >> t, mag & ((1 << t) - 1)
    if e == 0 and (f.has_subnormals or mag == 0):
        return math.ldexp(m, 1 - f.bias - t)
    return math.ldexp((1 << t) + m, e - f.bias - t)


@functools.cache
def _table(name: str) -> np.ndarray:
    f = formats.get(name)
    out = np.empty(1 << f.bits, np.float64)
    for code in range(1 << f.bits):
        v = _magnitude(f, code & f.magnitude_mask)
        negative = f.signed and code > f.magnitude_mask
        if code in f.inf_codes:
            v = math.inf
        out[code] = math.nan if code in f.nan_codes else (-v if negative else v)
    out.setflags(write=False)
    return out


def code_values(fmt: FormatLike) -> np.ndarray:
    """The float64 value of every code of ``fmt`` (a float format without an ml_dtypes
    type), indexed by code: NaN codes NaN, Inf codes +-Inf, the -0 code -0.0."""
    f = formats.get(fmt)
    if f.has_dtype or not f.is_float:
        raise ValueError(
            f"fmt: {f.name} has an ml_dtypes type, which is its oracle; this decoder is for "
            "the formats built with emulate.formats.float_format"
        )
    return _table(f.name)


def decode_codes(codes: npt.ArrayLike, fmt: FormatLike) -> np.ndarray:
    """float64 values of ``codes`` of ``fmt`` (each below ``2**fmt.bits``; uint8, or
    uint16 for a format of 9 to 16 bits)."""
    f = formats.get(fmt)
    return code_values(f)[np.asarray(codes, f.dtype)]


def encode_values(x: npt.ArrayLike, fmt: FormatLike, *, saturate: bool = False) -> np.ndarray:
    """Round float values into ``fmt``'s codes (``fmt.dtype``: uint8, uint16 for 9 to 16
    bits), to nearest with ties to the even
    code, as :func:`emulate.encode` promises.

    Overflow (a value whose rounding with an unbounded exponent exceeds ``max``) and +-Inf
    give +-Inf where the format has it, else its NaN, else +-max; with ``saturate`` always
    +-max. NaN gives the NaN code (without one, a zero of the opposite sign, as ml_dtypes
    casts NaN into float4). A negative value that rounds to
    zero gives -0 where the format has it. Unsigned formats: every negative value, -Inf
    included, gives 0 (P3109's Saturate: ``M_lo``, the smallest finite value), with or
    without ``saturate``; NaN stays NaN.
    """
    f = formats.get(fmt)
    table = code_values(f)
    v = np.asarray(x, np.float64)
    codes = np.arange(f.max_code + 2)  # the finite magnitudes, then one past max
    # The value the first non-finite magnitude would have: rounding there is overflow.
    grid = np.append(np.abs(table[: f.max_code + 1]), _magnitude(f, f.max_code + 1))
    a = np.abs(v)
    with np.errstate(invalid="ignore"):
        hi = np.clip(np.searchsorted(grid, a, side="left"), 1, len(grid) - 1)
        lo = hi - 1
        d_lo, d_hi = a - grid[lo], grid[hi] - a
        up = (d_hi < d_lo) | ((d_hi == d_lo) & (codes[hi] % 2 == 0))
    mag = np.where(a >= grid[-1], len(grid) - 1, np.where(up, hi, lo))
    over = mag > f.max_code
    neg = np.signbit(v)
    if saturate or not (f.has_inf or f.has_nan):
        over_code = f.max_code
    else:
        over_code = f.max_code + 1 if f.has_inf else -1  # -1: NaN
    mag = np.where(over, over_code, mag)
    sign_bit = 1 << (f.bits - 1) if f.signed else 0
    out = np.where(neg & ((mag != 0) | f.signed_zero), mag | sign_bit, mag)
    if f.has_nan:  # a NaN keeps its sign where the format has a -0 (IEEE-like NaN codes)
        signed_nan = np.where(neg & f.signed_zero, f.nan_code | sign_bit, f.nan_code)
        out = np.where((mag == -1) | np.isnan(v), signed_nan, out)
    else:  # as ml_dtypes casts NaN into float6 / float4: a zero of the opposite sign
        out = np.where(np.isnan(v), np.where(neg, 0, sign_bit), out)
    if not f.signed:
        out = np.where(neg & ~np.isnan(v), 0, out)
    return out.astype(f.dtype)
