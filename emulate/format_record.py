"""The format record: :class:`Format` is one element type, its bit layout, range, special
codes and exact embeddings.

:mod:`emulate.formats` builds the records of the ml_dtypes types and keeps the registry;
:mod:`emulate.float_format` builds the record of any narrow float format from its
parameters (the P3109 family, yours). Nothing here needs JAX.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "DTYPES",
    "F32_MIN_NORMAL",
    "Format",
    "WIDE",
    "unsigned_dtype",
]

#: The smallest normal float32, ``2**-126``: backends that flush denormals read any
#: smaller magnitude as zero.
F32_MIN_NORMAL = 2.0**-126

#: Types a matrix unit takes as they are; registered so every operand has a record.
WIDE: tuple[str, ...] = ("bfloat16", "float16", "float32", "int32")

#: The numpy / ml_dtypes dtype of every format that has one (a format built with
#: :func:`float_format` has none: its codes travel as uint8).
DTYPES: dict[str, Any] = {
    "int4": ml_dtypes.int4,
    "uint4": ml_dtypes.uint4,
    "int8": np.int8,
    "uint8": np.uint8,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "float8_e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "float8_e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "float8_e4m3b11fnuz": ml_dtypes.float8_e4m3b11fnuz,
    "float8_e3m4": ml_dtypes.float8_e3m4,
    "float6_e2m3fn": ml_dtypes.float6_e2m3fn,
    "float6_e3m2fn": ml_dtypes.float6_e3m2fn,
    "float4_e2m1fn": ml_dtypes.float4_e2m1fn,
    "float8_e8m0fnu": ml_dtypes.float8_e8m0fnu,
    "bfloat16": ml_dtypes.bfloat16,
    "float16": np.float16,
    "float32": np.float32,
    "int32": np.int32,
    "int2": ml_dtypes.int2,
    "uint2": ml_dtypes.uint2,
    # No numpy type holds 3-, 5- or 6-bit integers: their values fit int8 / uint8, and
    # their codes travel as uint8 (or Packed), as float6 codes do.
    "int3": np.int8,
    "uint3": np.uint8,
    "int5": np.int8,
    "uint5": np.uint8,
    "int6": np.int8,
    "uint6": np.uint8,
}


@dataclasses.dataclass(frozen=True)
class Format:
    """One element type.

    Attributes:
      name: canonical name, the ml_dtypes / numpy spelling (``"float8_e4m3fn"``), gfloat's
        for the P3109 formats (``"p3109_k8p3se"``), yours for a format you register.
      bits: storage width in bits (2 to 16, or 32).
      is_float: True for floating-point formats (including the scale type e8m0).
      signed: whether the format has a sign (bit ``bits - 1`` for floats, two's
        complement for integers).
      exponent_bits, mantissa_bits: field widths (0 and ``bits`` for integers);
        ``mantissa_bits`` is the precision minus one (the trailing significand bits).
      bias: exponent bias; a normal code with exponent field ``e`` and mantissa field
        ``m`` has the value ``2**(e - bias) * (1 + m / 2**mantissa_bits)``. 0 for integers.
      max: largest finite value. min: smallest finite value (``-max`` for signed floats,
        0 for unsigned integers and unsigned floats with a zero, 2**-127 for
        float8_e8m0fnu, which has no zero).
      min_normal: smallest positive normal value (1 for integers); for a format without
        subnormals, its smallest positive value (gfloat's ``smallest_normal``).
      min_subnormal: smallest positive value (1 for integers): the format's quantum
        where it has subnormals; for a format without them, ``min_normal`` (see
        :attr:`quantum`).
      has_subnormals: whether exponent field 0 holds subnormals. False for
        float8_e8m0fnu, whose exponent field 0 is the normal value 2**-127 (it has no
        zero), and for the formats built with ``float_format(..., subnormals=False)``,
        whose code 0 is zero and whose other exponent-field-0 codes are normal, as gfloat
        0.5 decodes ``FormatInfo(has_subnormals=False)``: ``(1 + m/2**t) * 2**-bias``,
        so ``2**-bias`` itself has no code. False for integers.
      has_inf: whether some code decodes to infinity.
      nan_codes, inf_codes: the codes (as unsigned ints of ``bits`` bits) that decode
        to NaN and to +-Inf. float32's 2**24 NaN codes are not listed (``has_nan`` is
        still True).
      signed_zero: whether a negative zero code exists (False for the ``fnuz`` and the
        P3109 formats, whose would-be -0 code is their NaN, and for unsigned formats).
      exact_in: names of the wider types that hold every finite value exactly (as normal
        numbers, for the formats built with :func:`float_format`).
      int8_scale: ``k`` such that ``value * 2**k`` is an int8 for every finite value,
        or None: the integer-scaled plan (int4 k=0, e2m1 k=1, e2m3 k=3).
      xla_storable: whether XLA can hold arrays of this dtype (float6 and the formats
        without a dtype cannot: carry those as uint8 codes or :class:`emulate.Packed`).
    """

    name: str
    bits: int
    is_float: bool
    signed: bool
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max: float
    min: float
    min_normal: float
    min_subnormal: float
    has_subnormals: bool
    has_inf: bool
    nan_codes: tuple[int, ...]
    inf_codes: tuple[int, ...]
    signed_zero: bool
    exact_in: tuple[str, ...]
    int8_scale: int | None
    xla_storable: bool

    @property
    def dtype(self) -> np.dtype:
        """The numpy / ml_dtypes dtype of this format; for a format that has none
        (:attr:`has_dtype` False) the dtype of its codes: ``uint8`` up to 8 bits, ``uint16``
        for 9 to 16."""
        if self.name in DTYPES:
            return np.dtype(DTYPES[self.name])
        return unsigned_dtype(self.bits)

    @property
    def has_dtype(self) -> bool:
        """Whether numpy / ml_dtypes has a type for it (ml_dtypes is then its oracle)."""
        return self.name in DTYPES

    @property
    def is_integer(self) -> bool:
        return not self.is_float

    @property
    def is_low_precision(self) -> bool:
        """A format emulate decodes: every one but the wide types."""
        return self.name not in WIDE

    @property
    def is_scale_only(self) -> bool:
        """A float format with values below 2**-126 (float32 denormals, which XLA's CPU and
        TPU backends flush): it scales other values and is never a matmul operand
        (float8_e8m0fnu, p3109_k8p1ue, the P3109 formats with an 8-bit exponent field such
        as p3109_k16p8se)."""
        return self.is_float and self.is_low_precision and self.min_subnormal < F32_MIN_NORMAL

    @property
    def code_mask(self) -> int:
        return (1 << self.bits) - 1

    @property
    def magnitude_mask(self) -> int:
        """The code bits below the sign bit (all of them for unsigned formats)."""
        return (1 << (self.bits - 1)) - 1 if self.signed else self.code_mask

    @property
    def has_nan(self) -> bool:
        return bool(self.nan_codes) or self.bits == 32 and self.is_float

    @property
    def has_zero(self) -> bool:
        """Whether some code decodes to zero: every format but float8_e8m0fnu."""
        return self.is_integer or self.min <= 0

    @property
    def emin(self) -> int:
        """Exponent of the lowest binade of normal values: ``min_normal == 2**emin``,
        except for a format without subnormals that has a zero, whose code 0 is zero
        (``2**emin`` has no code; its smallest value is ``(1 + 2**-t) * 2**emin``)."""
        return (0 if self.has_subnormals else -1) + 1 - self.bias

    @property
    def quantum(self) -> float:
        """The largest power of two of which every finite value is a multiple: 1 for
        integers, ``min_subnormal`` for floats with subnormals (and float8_e8m0fnu),
        ``2**(emin - mantissa_bits)`` for a format without subnormals (smaller than its
        smallest value, ``(2**mantissa_bits + 1) * quantum``)."""
        if self.is_integer or self.has_subnormals or not self.has_zero:
            return self.min_subnormal
        return math.ldexp(1.0, self.emin - self.mantissa_bits)

    @property
    def high_nans(self) -> int:
        """How many NaN codes sit at the top of the positive codes (gfloat's
        ``num_high_nans``): 3 for e5m2, 1 for e4m3fn and the unsigned P3109 formats, 0 for
        the fnuz and signed P3109 formats, whose NaN is the would-be -0 code."""
        return sum(1 for c in self.nan_codes if c <= self.magnitude_mask)

    @property
    def max_code(self) -> int:
        """Largest code (sign bit clear) whose value is finite: the code of ``max``."""
        if self.is_integer:
            return int(self.max)
        return self.magnitude_mask - self.high_nans - (1 if self.has_inf else 0)

    @property
    def nan_code(self) -> int:
        """The NaN code encoders write (positive where NaN has a sign): the would-be -0 code
        where that is the NaN (fnuz, P3109), the quiet NaN ml_dtypes writes for its
        IEEE-like formats with several NaN codes (e5m2: 0x7e, e3m4: 0x7c), else the
        all-ones magnitude (e4m3fn 0x7f, e8m0 0xff, and every format built from
        parameters: gfloat's NaN code, ``2**bits - 1``, less the sign bit). Meaningless
        where ``has_nan`` is False."""
        neg_zero = 1 << (self.bits - 1)
        if self.signed and neg_zero in self.nan_codes:
            return neg_zero
        if self.has_inf and self.high_nans > 1 and self.has_dtype:  # ml_dtypes' quiet NaN
            return self.max_code + 1 + (1 << (self.mantissa_bits - 1))
        return self.magnitude_mask

    @property
    def packable(self) -> bool:
        """Whether :func:`emulate.pack` stores it: densely, every format narrower than a
        byte; one code a byte, the 8-bit formats without a dtype (a Packed array is then
        what carries their format through the matmuls)."""
        return self.bits < 8 or (self.bits == 8 and not self.has_dtype)

    def __repr__(self) -> str:
        return f"Format({self.name!r})"


# Its public home is emulate.formats, which re-exports it (the API docs list it there once).
Format.__module__ = "emulate.formats"


def unsigned_dtype(bits: int) -> np.dtype:
    """The unsigned numpy dtype that holds a ``bits``-bit code or word: uint8 for 2 to 8
    bits (one code per byte), uint16 for 9 to 16, uint32 for 32."""
    if 2 <= bits <= 8:
        return np.dtype(np.uint8)
    if 9 <= bits <= 16:
        return np.dtype(np.uint16)
    return np.dtype({32: np.uint32}[bits])


def int8_scale(max_value: float, quantum: float) -> int | None:
    """Smallest ``k`` with every multiple of ``quantum`` up to ``max_value``, times
    ``2**k``, an integer in [-127, 127]; None if there is none."""
    k = 0
    while quantum * 2.0**k < 1:
        k += 1
    return k if max_value * 2.0**k <= 127 else None
