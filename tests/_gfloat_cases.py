"""gfloat as the oracle of the rounding modes: the format descriptions, the value samples
and emulate's documented differences, shared by tests/numerics/test_rounding.py (the jnp
encoder) and tests/reference/test_reference_rounding.py (the numpy oracle).

The differences (docs/numerics.md, "Rounding modes"):

- a NaN result: emulate's code keeps the input's sign and is the quiet NaN ml_dtypes
  writes; gfloat has one NaN code. Compared as "both NaN".
- float6/float4 (no Inf, no NaN) always saturate and turn NaN into a zero; gfloat raises
  there unless ``sat``. Compared against gfloat with ``sat=True``, NaN inputs left out.
- float8_e8m0fnu rounds ties up (ml_dtypes), which is gfloat's TiesToAway for this
  positive format, where gfloat's TiesToEven goes to the even exponent; values below
  2**-127, zero, negatives and NaN (gfloat rounds them outside the format) are left out.
"""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest
from gfloat import Domain, FormatInfo, RoundMode, encode_ndarray, round_ndarray
from gfloat.formats import format_info_ocp_e8m0

from emulate import formats
from emulate.numerics.rounding import ROUNDINGS, STOCHASTIC

GFLOAT_MODES = {
    "nearest_even": RoundMode.TiesToEven,
    "nearest_away": RoundMode.TiesToAway,
    "toward_zero": RoundMode.TowardZero,
    "toward_positive": RoundMode.TowardPositive,
    "toward_negative": RoundMode.TowardNegative,
    "stochastic": RoundMode.Stochastic,
    "stochastic_odd": RoundMode.StochasticOdd,
    "stochastic_fast": RoundMode.StochasticFast,
    "stochastic_fastest": RoundMode.StochasticFastest,
}
FLOATS = [n for n in formats.LOW_PRECISION if formats.get(n).is_float]
INTS = [n for n in formats.LOW_PRECISION if formats.get(n).is_integer]
RANDOM_BITS = 7
KEY = jax.random.key(26)


def gfloat_info(f: formats.Format) -> FormatInfo:
    """gfloat's description of an emulate float format, from the record's fields."""
    if f.name == "float8_e8m0fnu":
        return format_info_ocp_e8m0
    if f.has_inf:
        high_nans = (1 << f.mantissa_bits) - 1  # IEEE-like: every non-zero mantissa
    else:
        high_nans = 1 if f.has_nan and f.signed_zero else 0  # fn: one; fnuz: -0's code
    return FormatInfo(
        f.name,
        f.bits,
        f.mantissa_bits + 1,
        bias=f.bias,
        is_signed=True,
        domain=Domain.Extended if f.has_inf else Domain.Finite,
        has_nz=f.signed_zero,
        num_high_nans=high_nans,
        has_subnormals=True,
        is_twos_complement=False,
    )


def f32_sample(f: formats.Format, values: np.ndarray | None = None) -> np.ndarray:
    """Every bf16 value, then f32 values chosen for ``f``: random bit patterns, each tie
    between neighbouring values and the f32 numbers either side of it, quarter points,
    values past the largest, f32 subnormals and the specials. ``values``: the value of
    every code (float64), where ml_dtypes has no type for ``f``."""
    every_bf16 = np.arange(1 << 16, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
    rng = np.random.default_rng(26)
    random_bits = rng.integers(0, 1 << 32, 4096, dtype=np.uint64).astype(np.uint32)
    if values is None:
        with np.errstate(invalid="ignore"):
            values = np.arange(1 << f.bits, dtype=np.uint8).view(f.dtype).astype(np.float64)
    v = np.unique(values[np.isfinite(values)])
    lo, hi = v[:-1], v[1:]
    ties = ((lo + hi) / 2).astype(np.float32)
    quarters = np.concatenate([lo + (hi - lo) / 4, hi - (hi - lo) / 4]).astype(np.float32)
    top = float(f.max)
    step = top - v[-2]
    beyond = np.minimum([top + step / 2, top + step, 2 * top, 1e30], 3.4e38).astype(np.float32)
    denormal_bits = np.array([1, 0x400000, 0x7FFFFF, 0x3FFFFF], np.uint32)
    specials = np.array([0.0, np.inf, np.nan, 2.0**-127, 2.0**-149], np.float32)
    pos = np.concatenate(
        [
            ties,
            np.nextafter(ties, np.float32(np.inf)),
            np.nextafter(ties, np.float32(-np.inf)),
            quarters,
            beyond,
            denormal_bits.view(np.float32),
            specials,
        ]
    )
    return np.concatenate([every_bf16, random_bits.view(np.float32), pos, -pos])


def cases(names: list[str], *, every_mode: bool = False) -> list:
    """(format, mode, saturate): in CI each format in one mode, the modes rotating over
    the formats (so each meets one or two) and saturation alternating; with
    ``every_mode``, each mode once instead, the formats rotating over the modes. The rest
    of the matrix under the long marker."""
    out = []
    for i, name in enumerate(names):
        for j, m in enumerate(ROUNDINGS):
            for sat in (False, True):
                if every_mode:
                    ci = names[j % len(names)] == name and sat == (j % 2 == 1)
                else:
                    ci = (m, sat) == (ROUNDINGS[i % len(ROUNDINGS)], i % 2 == 1)
                marks = () if ci else pytest.mark.long
                tag = "saturate" if sat else "wrap"
                out.append(pytest.param(name, m, sat, marks=marks, id=f"{name}-{m}-{tag}"))
    return out


def codes_of(a) -> np.ndarray:
    a = np.asarray(a)
    return a if a.dtype == np.uint8 else a.view(np.uint8)


def mode_kwargs(mode: str) -> dict:
    """encode's rounding arguments for ``mode`` (KEY and RANDOM_BITS when stochastic)."""
    extra = dict(key=KEY, random_bits=RANDOM_BITS) if mode in STOCHASTIC else {}
    return dict(rounding=mode, **extra)


def comparable(f: formats.Format, x: np.ndarray, mode: str, saturate: bool):
    """``(keep, sat, gfloat_mode)``: the inputs gfloat can be asked about and how, by the
    documented differences of the module docstring."""
    keep, sat, gmode = np.ones(x.shape, bool), saturate, mode
    if not (f.has_inf or f.has_nan):  # always saturate; NaN -> a zero
        keep, sat = ~np.isnan(x), True
    if f.name == "float8_e8m0fnu":  # positive powers of two; ties up
        keep = (x >= 2.0**-127) & ~np.isnan(x)
        gmode = "nearest_away" if mode == "nearest_even" else mode
    return keep, sat, gmode


def gfloat_round(fi: FormatInfo, x: np.ndarray, mode: str, sat: bool, srbits) -> np.ndarray:
    """gfloat's ``round_ndarray`` of ``x`` (float64) in ``mode``."""
    stochastic = mode in STOCHASTIC
    with np.errstate(invalid="ignore", over="ignore"):
        return round_ndarray(
            fi,
            x.astype(np.float64),
            GFLOAT_MODES[mode],
            sat,
            np.asarray(srbits).astype(np.int64) if stochastic else None,
            RANDOM_BITS if stochastic else 0,
        )


def assert_codes_match(got: np.ndarray, want_values: np.ndarray, fi, x: np.ndarray, f) -> None:
    """Codes ``got`` (uint8) equal gfloat's codes of its rounded values; NaN as NaN."""
    want_nan = np.isnan(want_values)
    want = encode_ndarray(fi, np.where(want_nan, 0.0, want_values)).astype(np.int64)
    got_codes = got.astype(np.int64)
    with np.errstate(invalid="ignore"):
        got_nan = np.isnan(got_codes.astype(np.uint8).view(f.dtype).astype(np.float32))
    differ = np.where(want_nan, ~got_nan, got_codes != want)
    assert not differ.any(), (
        f"{int(differ.sum())} differ; x={x[differ][:6]}, got {got_codes[differ][:6]}, "
        f"gfloat {want[differ][:6]} (values {want_values[differ][:6]})"
    )
