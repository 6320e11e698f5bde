"""Formats built from parameters for the conformance tests, and gfloat's view of them.

Two user-built formats (a 7-bit e3m3 with one NaN per sign, as e4m3fn has; a 5-bit
unsigned e3m2 with +Inf and a NaN), the P3109 binary8 formats, and their
``gfloat.FormatInfo`` (gfloat 0.5, graphcore-research/gfloat), the oracle these tests
check emulate's codecs and its numpy oracle against. Test data is made here, no files.
"""

from __future__ import annotations

import gfloat
import ml_dtypes
import numpy as np
from gfloat.types import Domain

from emulate import formats
from emulate.formats import Format

#: The user-built formats, as emulate.formats.float_format takes them.
USER = {
    "e3m3": dict(bits=7, precision=4, bias=3, high_nans=1),
    "u5e3m2": dict(bits=5, precision=3, bias=3, signed=False, infinities=True, high_nans=1),
}


def register_user_formats() -> list[str]:
    """Register :data:`USER` (again: equal records are a no-op) and return the names."""
    return [formats.register(formats.float_format(n, **kw)).name for n, kw in USER.items()]


#: What the conformance tests cover by default: gfloat's binary8 P3109 list and USER.
CHECKED = list(formats.P3109_BINARY8) + list(USER)

#: The whole P3109 family gfloat defines for 3 to 8 bits (the long sweep).
FAMILY = [
    f"p3109_k{k}p{p}{s}{d}"
    for k in range(3, 9)
    for p in range(1, k + 1)
    for s in "su"
    for d in "ef"
]


def gfloat_info(f: Format) -> gfloat.FormatInfo:
    """gfloat's FormatInfo for a record built from parameters."""
    return gfloat.FormatInfo(
        f.name,
        k=f.bits,
        precision=f.mantissa_bits + 1,
        bias=f.bias,
        is_signed=f.signed,
        domain=Domain.Extended if f.has_inf else Domain.Finite,
        has_nz=f.signed_zero,
        num_high_nans=f.high_nans,
        has_subnormals=f.has_subnormals,
        is_twos_complement=False,
    )


def gfloat_values(f: Format) -> np.ndarray:
    """float64 value of every code, as gfloat decodes it."""
    fi = gfloat_info(f)
    return np.array([gfloat.decode_float(fi, c).fval for c in range(1 << f.bits)])


def gfloat_codes(f: Format, v: np.ndarray, *, saturate: bool) -> np.ndarray:
    """gfloat's nearest-even code of each float64 value (unsigned formats: v >= 0 only)."""
    fi = gfloat_info(f)
    sat = saturate or not (f.has_inf or f.has_nan)
    return gfloat.encode_ndarray(fi, gfloat.round_ndarray(fi, v, sat=sat)).astype(np.int64)


def nan_as_one(codes: np.ndarray, f: Format) -> np.ndarray:
    """``codes`` with every NaN code replaced by -1 (to compare NaN-ness, not NaN codes)."""
    return np.where(np.isin(codes, f.nan_codes), -1, codes)


def every_bf16() -> np.ndarray:
    """Every bfloat16 value (NaNs, infinities, subnormals) as float64."""
    with np.errstate(invalid="ignore"):
        return np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)


def f32_sample(f: Format, n: int = 4096, seed: int = 0) -> np.ndarray:
    """float32 inputs for ``f`` (as float64): random bit patterns, and around every pair of
    neighbouring finite values the midpoint (a tie) and the float32 values either side of
    it, the overflow threshold included."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    values = np.sort(np.unique(np.abs(gfloat_values(f)[np.isfinite(gfloat_values(f))])))
    # The value one past max: the next binade for a format without trailing bits.
    step = values[-1] if f.mantissa_bits == 0 else values[-1] - values[-2]
    top = values[-1] + step
    mids = np.float32((np.append(values, top)[1:] + np.append(values, top)[:-1]) / 2)
    around = np.concatenate(
        [mids, np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(np.inf))]
    )
    out = np.concatenate([bits.view(np.float32), around, -around])
    with np.errstate(invalid="ignore"):  # the random patterns hold signalling NaNs
        return out.astype(np.float64)
