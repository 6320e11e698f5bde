"""Float formats built from their parameters: :func:`float_format` (the parameters gfloat's
``FormatInfo`` takes: width, precision, bias, signedness, infinities, NaN codes, negative
zero, subnormals) and :func:`p3109`, the IEEE P3109 formats (``p3109_k8p3se`` ...) as
gfloat 0.5 defines them.

Such a format has no numpy dtype: its values travel as ``uint8`` codes (or
:class:`emulate.Packed` below 8 bits), as float6 codes do, and those of 9 to 16 bits
(the wide P3109 formats) as ``uint16`` codes, and its oracle is the numpy decoder of
:mod:`emulate.reference.codes`, built from the record. Nothing here needs JAX.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from emulate.format_record import F32_MIN_NORMAL, Format, int8_scale

__all__ = ["P3109_BINARY8", "float_format", "p3109"]

_F32_ONLY = "emulate decodes into float32 (JAX holds no float64 without x64, and no TPU has it)"


@dataclasses.dataclass(frozen=True)
class _FloatLayout:
    """A narrow float format's code layout, its arguments checked: what
    :func:`float_format` builds the record from.

    Attributes:
      bits, signed, infinities, high_nans: as passed.
      t: trailing significand bits (``precision - 1``); ``e_bits``: exponent bits.
      bias: the exponent bias (IEEE's default resolved).
      neg_zero: the sign-bit-only code is -0 (always, for unsigned formats).
      mag_mask: every bit but the sign; ``max_code``: the largest finite magnitude.
      subnormals: exponent field 0 holds subnormals (else normal values, code 0 zero).
    """

    bits: int
    signed: bool
    infinities: bool
    high_nans: int
    t: int
    e_bits: int
    bias: int
    neg_zero: bool
    mag_mask: int
    max_code: int
    subnormals: bool

    def value(self, mag: int) -> float:
        """The value of a magnitude code (the code without its sign bit)."""
        e, m = mag >> self.t, mag & ((1 << self.t) - 1)
        if e == 0 and (self.subnormals or mag == 0):
            return math.ldexp(m, 1 - self.bias - self.t)
        return math.ldexp((1 << self.t) + m, e - self.bias - self.t)

    @property
    def quantum(self) -> float:
        """The power of two every value is a multiple of: the smallest positive value, or
        without subnormals ``2**(-bias - t)``, below it."""
        return self.value(1) if self.subnormals else math.ldexp(1.0, -self.bias - self.t)


def _check_float_arguments(name: Any, ints: dict[str, Any], flags: dict[str, Any]) -> None:
    """:func:`float_format`'s name, int arguments (``bits``, ``precision``, ``high_nans``)
    and flags, checked for type and range in the order its docstring lists them."""
    if not isinstance(name, str) or not name or not all(c.isalnum() or c == "_" for c in name):
        raise ValueError(
            f"name: expected a non-empty name of letters, digits and '_', got {name!r}"
        )
    for arg, v in ints.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{arg}: expected an int, got {type(v).__name__} {v!r}")
    for arg, b in flags.items():
        if not isinstance(b, (bool, np.bool_)):
            raise TypeError(f"{arg}: expected True or False, got {type(b).__name__} {b!r}")
    bits, precision = ints["bits"], ints["precision"]
    if not 2 <= bits <= 16:
        raise ValueError(f"bits: a format is stored in 2 to 16 bits, got {bits}")
    if not 1 <= precision <= bits:
        raise ValueError(f"precision: expected 1 to {bits} (the storage bits), got {precision}")
    if not flags["subnormals"] and precision == 1:
        raise ValueError(
            "subnormals: a precision-1 format without subnormals has no zero (gfloat 0.5 "
            "decodes its code 0 as 2**-bias, as float8_e8m0fnu's); emulate builds formats "
            "without subnormals whose code 0 is zero: use precision 2 or more, or "
            "subnormals=True (at precision 1 it holds zero and the same powers of two)"
        )


def _float_layout(
    bits: int,
    precision: int,
    bias: int | None,
    signed: bool,
    infinities: bool,
    high_nans: int,
    negative_zero: bool,
    subnormals: bool,
) -> _FloatLayout:
    """The layout of checked arguments; raises on a bias of the wrong type, NaN and Inf
    codes that leave no finite nonzero code, values float32 cannot hold
    (:func:`_float32_range_error`), and a bias above 126 for a format without subnormals
    with a trailing significand."""
    sign_bits = 1 if signed else 0
    t = precision - 1
    e_bits = bits - sign_bits - t
    if bias is None:
        bias = (1 << (e_bits - 1)) - 1 if e_bits > 0 else 0
    if isinstance(bias, bool) or not isinstance(bias, (int, np.integer)):
        raise TypeError(f"bias: expected an int, got {type(bias).__name__} {bias!r}")
    mag_mask = (1 << (bits - sign_bits)) - 1
    max_code = mag_mask - high_nans - (1 if infinities else 0)
    if high_nans < 0 or max_code < 1:
        raise ValueError(
            f"high_nans: {high_nans} NaN codes{' and an Inf' if infinities else ''} leave no "
            f"finite nonzero code among the {mag_mask + 1} magnitudes"
        )
    # Every value is a multiple of the quantum; without subnormals it lies below ``tiny``.
    outside = _float32_range_error(t, bias, max_code, 1 - bias - t if subnormals else -bias - t)
    if outside:
        raise ValueError(f"bias: {bias} puts values outside float32 (its {outside}); {_F32_ONLY}")
    if not subnormals and t > 0 and 127 - bias < 1:
        raise ValueError(
            f"bias: {bias} is too large for a format without subnormals with a trailing "
            "significand (at most 126)"
        )
    return _FloatLayout(
        bits=bits,
        signed=signed,
        infinities=infinities,
        high_nans=high_nans,
        t=t,
        e_bits=e_bits,
        bias=bias,
        neg_zero=bool(negative_zero) or not signed,
        mag_mask=mag_mask,
        max_code=max_code,
        subnormals=bool(subnormals),
    )


def _special_codes(lay: _FloatLayout) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(NaN codes, Inf codes), sorted: the top ``high_nans`` magnitudes of each sign, the
    one below them if ``infinities``, and the sign-bit-only code where it is no -0."""
    sign = 1 << (lay.bits - 1)
    nan = [c for c in range(lay.mag_mask - lay.high_nans + 1, lay.mag_mask + 1)]
    inf = [lay.max_code + 1] if lay.infinities else []
    if lay.signed:
        nan += [c | sign for c in nan]
        inf += [c | sign for c in inf]
        if not lay.neg_zero:
            nan.append(sign)
    return tuple(sorted(nan)), tuple(sorted(inf))


def float_format(
    name: str,
    *,
    bits: int,
    precision: int,
    bias: int | None = None,
    signed: bool = True,
    infinities: bool = False,
    high_nans: int = 0,
    negative_zero: bool = True,
    subnormals: bool = True,
) -> Format:
    """The record of a narrow float format, built from gfloat's ``FormatInfo`` parameters.

    Codes are ``[sign] exponent trailing-significand``, most significant first. Counting
    magnitudes (the code without its sign bit) from the top: the ``high_nans`` largest are
    NaN, the next one is +-Inf if ``infinities``; every smaller one is finite. Exponent field
    0 holds zero and the subnormals ``m * 2**(1 - bias - (precision - 1))``; with
    ``subnormals=False``, code 0 (and the sign-bit-only code) is zero and every other code
    of exponent field 0 is normal, ``(1 + m / 2**t) * 2**-bias`` (``t = precision - 1``),
    as gfloat 0.5 decodes ``FormatInfo(has_subnormals=False)``: ``2**-bias`` has no code
    and the smallest positive value is ``(1 + 2**-t) * 2**-bias``. Rounding below that
    smallest value goes between 0 and it (docs/numerics.md, "Formats without
    subnormals").

    Args:
      name: the registry name: lower case letters, digits and ``_``; no alias or name of
        another format (checked by :func:`emulate.formats.register`).
      bits: storage width, 2 to 16 (codes of 9 to 16 bits travel as uint16).
      precision: significand bits including the implicit one, 1 to ``bits``;
        ``precision - 1`` trailing bits are stored (a signed 8-bit format of precision 8
        has no exponent field: every value is subnormal).
      bias: exponent bias; default IEEE's ``2**(exponent_bits - 1) - 1``.
      signed: whether the top bit is a sign.
      infinities: whether +-Inf have codes (gfloat's ``Domain.Extended``).
      high_nans: NaN codes at the top of each sign's magnitudes (gfloat's
        ``num_high_nans``).
      negative_zero: whether the sign-bit-only code is -0 (True) or a NaN (False: fnuz,
        P3109). Ignored for unsigned formats.
      subnormals: whether exponent field 0 holds subnormals (default) or normal values
        (above; precision 2 or more).

    Raises:
      TypeError: an argument of the wrong type.
      ValueError: an impossible record, saying which argument and why: no exponent or
        significand field fits, no finite nonzero code is left, or values that float32
        cannot hold (above its max, or below 2**-149: emulate decodes into float32);
        the ``1 <= 127 - bias`` limit of the decoder for formats without subnormals with
        a trailing significand; ``subnormals=False`` at precision 1 (no zero: gfloat
        decodes code 0 as ``2**-bias``).
    """
    _check_float_arguments(
        name,
        {"bits": bits, "precision": precision, "high_nans": high_nans},
        {
            "signed": signed,
            "infinities": infinities,
            "negative_zero": negative_zero,
            "subnormals": subnormals,
        },
    )
    lay = _float_layout(
        bits, precision, bias, signed, infinities, high_nans, negative_zero, subnormals
    )
    top, tiny = lay.value(lay.max_code), lay.value(1)
    nan, inf = _special_codes(lay)
    exact = (
        tuple(w for w, digits in (("bfloat16", 8), ("float32", 24)) if lay.t + 1 <= digits)
        if tiny >= F32_MIN_NORMAL
        else ()
    )
    return Format(
        name=name,
        bits=int(bits),
        is_float=True,
        signed=bool(signed),
        exponent_bits=lay.e_bits,
        mantissa_bits=lay.t,
        bias=int(lay.bias),
        max=top,
        min=-top if signed else 0.0,
        min_normal=math.ldexp(1.0, 1 - lay.bias) if subnormals else tiny,
        min_subnormal=tiny,
        has_subnormals=bool(subnormals),
        has_inf=bool(infinities),
        nan_codes=nan,
        inf_codes=inf,
        signed_zero=bool(signed) and lay.neg_zero,
        exact_in=exact,
        int8_scale=int8_scale(top, lay.quantum),
        xla_storable=False,
    )


def _float32_range_error(t: int, bias: int, max_code: int, low_exp: int) -> str:
    """Why float32 cannot hold every finite value of a float format with ``t`` trailing
    significand bits, exponent ``bias``, largest finite magnitude code ``max_code`` and
    quantum ``2**low_exp`` (every value a multiple of it), in words; ``""`` where it can:
    the largest value below 2**128 and the quantum at least 2**-149 (a float32 denormal,
    which XLA may flush, but whose bits the decoder builds exactly). Integer arithmetic
    only: the exponents of a 16-bit format with a 15-bit exponent field overflow float64."""
    top_exp = max(max_code >> t, 1) - bias  # max < 2**(top_exp + 1)
    if top_exp > 127:
        return f"largest value at least 2**{top_exp}, above float32's max (below 2**128)"
    if low_exp < -149:
        return f"quantum 2**{low_exp}, below float32's smallest denormal 2**-149"
    return ""


def p3109(precision: int, *, bits: int = 8, signed: bool = True, extended: bool = True) -> Format:
    """An IEEE P3109 format as gfloat 0.5's ``format_info_p3109(k, p, signedness, domain)``
    defines it, named as gfloat names it: ``p3109_k{bits}p{precision}{s|u}{e|f}``.

    Signed formats have bias ``2**(bits - precision - 1)`` (floored), their NaN at the
    would-be -0 code ``0x80`` and no negative zero; unsigned ones bias
    ``2**(bits - precision)`` and their NaN at the top code. ``extended`` formats put
    +-Inf just below (``0x7f``/``0xff`` signed, ``0xfe`` unsigned); finite ones have none.
    Formats of 9 to 16 bits store their codes as uint16.

    Raises:
      ValueError: ``bits`` outside 2 to 16 (P3109 defines wider formats; emulate's codes
        are uint8 or uint16, so they are not built), ``precision`` outside 1 to ``bits``,
        a format whose values float32 cannot hold (an exponent field of 9 bits or more,
        such as ``p3109_k16p1se``'s values up to 2**16383: emulate decodes into float32),
        or the 2-bit signed extended formats (``p3109_k2p1se``, ``p3109_k2p2se``), whose
        four codes are 0, +Inf, NaN and -Inf: no finite nonzero value.
    """
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 2 <= bits <= 16:
        raise ValueError(
            f"bits: P3109 formats of 2 to 16 bits are built (codes in uint8 or uint16); "
            f"wider ones are not, got {bits!r}"
        )
    if isinstance(precision, bool) or not isinstance(precision, (int, np.integer)):
        raise TypeError(f"precision: expected an int, got {type(precision).__name__}")
    if not 1 <= precision <= bits:
        raise ValueError(
            f"precision: a {bits}-bit P3109 format has precision 1 to {bits}, got {precision}"
        )
    bias = int(2.0 ** (bits - precision - 1)) if signed else 1 << (bits - precision)
    name = f"p3109_k{bits}p{precision}{'s' if signed else 'u'}{'e' if extended else 'f'}"
    if bits == 2 and signed and extended:
        raise ValueError(
            f"{name} is not built: its four codes are 0, +Inf, NaN and -Inf, no finite "
            "nonzero value (gfloat's format_info_p3109 describes the same codes), and "
            "emulate builds formats that hold at least one"
        )
    t, magnitudes = precision - 1, 1 << (bits - 1 if signed else bits)
    top_code = magnitudes - 1 - (0 if signed else 1) - int(extended)
    outside = _float32_range_error(t, bias, top_code, 1 - bias - t)
    if outside:
        raise ValueError(
            f"{name} is not built: its exponent bias is {bias}, which makes its {outside}; "
            f"{_F32_ONLY}"
        )
    return float_format(
        name,
        bits=bits,
        precision=precision,
        bias=bias,
        signed=signed,
        infinities=extended,
        high_nans=0 if signed else 1,
        negative_zero=False,
    )


#: The binary8 P3109 formats, as gfloat 0.5's ``p3109_binary8_formats`` lists them
#: (every other ``p3109_k{k}p{p}{s|u}{e|f}`` is built on first use of its name).
P3109_BINARY8: tuple[str, ...] = (
    "p3109_k8p1se",
    "p3109_k8p1ue",
    "p3109_k8p3se",
    "p3109_k8p3sf",
    "p3109_k8p3ue",
    "p3109_k8p3uf",
    "p3109_k8p4se",
    "p3109_k8p4sf",
    "p3109_k8p4ue",
    "p3109_k8p4uf",
    "p3109_k8p7sf",
    "p3109_k8p8uf",
)
