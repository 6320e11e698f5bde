"""Format records: the bit layout, range and exact embeddings of every element type.

One frozen :class:`Format` per element type. The low-precision family (``LOW_PRECISION``)
is what ``emulate`` decodes; the wide types (``bfloat16``, ``float16``, ``float32``,
``int32``) are registered too so that every operand of a matmul has a record.

Numeric fields are derived from ``ml_dtypes.finfo`` / ``ml_dtypes.iinfo``; the NaN and
Inf code sets are read off ml_dtypes by enumerating every code. Nothing here needs JAX.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeAlias

import ml_dtypes
import numpy as np

__all__ = [
    "CODE_FORMATS",
    "F32_MIN_NORMAL",
    "Format",
    "FormatLike",
    "LOW_PRECISION",
    "LOW_PRECISION_OPERANDS",
    "MATMUL_OPERANDS",
    "SCALE_ONLY",
    "WIDE",
    "WIDE_FLOATS",
    "dot_accumulator",
    "dot_result",
    "get",
    "names",
    "preferred_format",
    "result_format",
    "unsigned_dtype",
]


@dataclasses.dataclass(frozen=True)
class Format:
    """One element type.

    Attributes:
      name: canonical name, the ml_dtypes / numpy spelling (``"float8_e4m3fn"``).
      bits: storage width in bits (4, 6, 8, 16 or 32).
      is_float: True for floating-point formats (including the scale type e8m0).
      signed: whether the format has a sign (bit ``bits - 1`` for floats, two's
        complement for integers).
      exponent_bits, mantissa_bits: field widths (0 and ``bits`` for integers).
      bias: exponent bias; a normal code with exponent field ``e`` and mantissa field
        ``m`` has the value ``2**(e - bias) * (1 + m / 2**mantissa_bits)``. 0 for integers.
      max: largest finite value. min: smallest finite value (``-max`` for signed floats,
        0 for unsigned integers, 2**-127 for float8_e8m0fnu, which has no zero).
      min_normal: smallest positive normal value (1 for integers).
      min_subnormal: smallest positive value, the format's quantum (1 for integers).
      has_subnormals: False only for float8_e8m0fnu, whose exponent field 0 is
        the normal value 2**-127.
      has_inf: whether some code decodes to infinity.
      nan_codes, inf_codes: the codes (as unsigned ints of ``bits`` bits) that decode
        to NaN and to +-Inf. float32's 2**24 NaN codes are not listed (``has_nan`` is
        still True).
      signed_zero: whether a negative zero code exists (False for the ``fnuz`` formats,
        whose would-be -0 code is their only NaN).
      exact_in: names of the wider types that hold every finite value exactly.
      int8_scale: ``k`` such that ``value * 2**k`` is an int8 for every finite value,
        or None: the integer-scaled plan (int4 k=0, e2m1 k=1, e2m3 k=3).
      xla_storable: whether XLA can hold arrays of this dtype (float6 cannot on CPU:
        carry those as uint8 codes or :class:`emulate.Packed`).
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
        """The numpy / ml_dtypes dtype of this format."""
        return np.dtype(_DTYPES[self.name])

    @property
    def is_integer(self) -> bool:
        return not self.is_float

    @property
    def is_low_precision(self) -> bool:
        """A format emulate decodes: ``LOW_PRECISION`` and the integer ``CODE_FORMATS``."""
        return self.name in LOW_PRECISION or self.name in CODE_FORMATS

    @property
    def code_mask(self) -> int:
        return (1 << self.bits) - 1

    @property
    def has_nan(self) -> bool:
        return bool(self.nan_codes) or self.bits == 32 and self.is_float

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal value (``min_normal == 2**emin``)."""
        return (0 if self.has_subnormals else -1) + 1 - self.bias

    @property
    def max_code(self) -> int:
        """Largest code (sign bit clear) whose value is finite: the code of ``max``."""
        return int(np.asarray(self.max, self.dtype).reshape(1).view(unsigned_dtype(self.bits))[0])

    @property
    def packable(self) -> bool:
        """Whether :func:`emulate.pack` stores it densely: every format narrower than a byte
        (2, 3, 4, 5 and 6 bits)."""
        return self.bits < 8

    def __repr__(self) -> str:
        return f"Format({self.name!r})"


def unsigned_dtype(bits: int) -> np.dtype:
    """The unsigned numpy dtype that holds a ``bits``-bit code or word: uint8 for 2 to 8
    bits (one code per byte), uint16 for 16, uint32 for 32."""
    if 2 <= bits <= 8:
        return np.dtype(np.uint8)
    return np.dtype({16: np.uint16, 32: np.uint32}[bits])


_DTYPES: dict[str, Any] = {
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

#: The formats ``emulate`` decodes, in the order tables list them.
LOW_PRECISION: tuple[str, ...] = (
    "int4",
    "uint4",
    "int8",
    "uint8",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3b11fnuz",
    "float8_e3m4",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float4_e2m1fn",
    "float8_e8m0fnu",
)

#: Integer code formats of 2, 3, 5 and 6 bits, ``intN`` in two's complement and ``uintN``:
#: the element formats of quantized checkpoints (GGUF K-quants, 2- and 3-bit GPTQ) and of
#: their sub-block scales and zero points. A :class:`emulate.QArray` stores them as uint8 codes
#: or :class:`emulate.Packed`; a matmul reads their values as int8 (every one fits). They
#: are not operand formats of ``emulate.dot_general`` by themselves.
CODE_FORMATS: tuple[str, ...] = (
    "int2",
    "uint2",
    "int3",
    "uint3",
    "int5",
    "uint5",
    "int6",
    "uint6",
)

#: Types a matrix unit takes as they are; registered so every operand has a record.
WIDE: tuple[str, ...] = ("bfloat16", "float16", "float32", "int32")

#: The wide float types.
WIDE_FLOATS: tuple[str, ...] = ("bfloat16", "float16", "float32")

#: Formats that only scale other values and are never a matmul operand.
SCALE_ONLY: tuple[str, ...] = ("float8_e8m0fnu",)

#: The low-precision formats a matmul takes as an operand: every one but the scale type.
LOW_PRECISION_OPERANDS: tuple[str, ...] = tuple(n for n in LOW_PRECISION if n not in SCALE_ONLY)

#: Every format a matmul takes as an operand: the low-precision ones and the wide types.
MATMUL_OPERANDS: tuple[str, ...] = LOW_PRECISION_OPERANDS + WIDE

#: The smallest normal float32, ``2**-126``: backends that flush denormals read any
#: smaller magnitude as zero.
F32_MIN_NORMAL = 2.0**-126

#: What names a format: a name or alias, a numpy / ml_dtypes / jnp dtype, or a Format.
FormatLike: TypeAlias = str | np.dtype[Any] | type[Any] | Format

_ALIASES = {
    "s4": "int4",
    "u4": "uint4",
    "s8": "int8",
    "u8": "uint8",
    "e4m3": "float8_e4m3fn",
    "e4m3fn": "float8_e4m3fn",
    "fp8": "float8_e4m3fn",
    "e5m2": "float8_e5m2",
    "e4m3fnuz": "float8_e4m3fnuz",
    "e5m2fnuz": "float8_e5m2fnuz",
    "e4m3b11fnuz": "float8_e4m3b11fnuz",
    "e3m4": "float8_e3m4",
    "e2m3": "float6_e2m3fn",
    "e2m3fn": "float6_e2m3fn",
    "e3m2": "float6_e3m2fn",
    "e3m2fn": "float6_e3m2fn",
    "e2m1": "float4_e2m1fn",
    "e2m1fn": "float4_e2m1fn",
    "fp4": "float4_e2m1fn",
    "e8m0": "float8_e8m0fnu",
    "e8m0fnu": "float8_e8m0fnu",
    "bf16": "bfloat16",
    "f16": "float16",
    "fp16": "float16",
    "f32": "float32",
    "fp32": "float32",
    "s32": "int32",
}


def _codes_where(
    dtype: np.dtype, bits: int, pred: Callable[[np.ndarray], np.ndarray]
) -> tuple[int, ...]:
    # ml_dtypes stores 4- and 6-bit types one per byte, the code in the low bits.
    codes = np.arange(1 << bits, dtype=unsigned_dtype(bits))
    with np.errstate(invalid="ignore"):
        values = codes.view(dtype).astype(np.float64)
    return tuple(int(c) for c in codes[pred(values)])


def _make_code_int(name: str) -> Format:
    """An integer code format of ``CODE_FORMATS`` (bits from the name, two's complement)."""
    signed = not name.startswith("u")
    bits = int(name.removeprefix("u").removeprefix("int"))
    hi = (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1
    return Format(
        name=name,
        bits=bits,
        is_float=False,
        signed=signed,
        exponent_bits=0,
        mantissa_bits=bits,
        bias=0,
        max=float(hi),
        min=float(-(1 << (bits - 1)) if signed else 0),
        min_normal=1.0,
        min_subnormal=1.0,
        has_subnormals=False,
        has_inf=False,
        nan_codes=(),
        inf_codes=(),
        signed_zero=False,
        exact_in=("bfloat16", "float32"),
        int8_scale=0,
        xla_storable=False,
    )


def _make(name: str) -> Format:
    if name in CODE_FORMATS:
        return _make_code_int(name)
    dtype = np.dtype(_DTYPES[name])
    bits = dtype.itemsize * 8 if name not in _SUB_BYTE else _SUB_BYTE[name]
    if dtype.kind in "iu" or name in ("int4", "uint4"):
        iinfo = ml_dtypes.iinfo(dtype)
        signed = iinfo.min < 0
        scale = 0 if bits <= 8 and iinfo.max <= 127 else None
        exact: tuple[str, ...] = (
            ("bfloat16", "float32") if bits <= 8 else ("float32",) if bits <= 16 else ()
        )
        return Format(
            name=name,
            bits=bits,
            is_float=False,
            signed=signed,
            exponent_bits=0,
            mantissa_bits=bits,
            bias=0,
            max=float(iinfo.max),
            min=float(iinfo.min),
            min_normal=1.0,
            min_subnormal=1.0,
            has_subnormals=False,
            has_inf=False,
            nan_codes=(),
            inf_codes=(),
            signed_zero=False,
            exact_in=exact,
            int8_scale=scale,
            xla_storable=True,
        )
    info = ml_dtypes.finfo(dtype)
    has_subnormals = float(info.smallest_subnormal) < float(info.smallest_normal)
    bias = (1 - int(info.minexp)) if has_subnormals else -int(info.minexp)
    # float32's codes are not enumerated (2**32); it is IEEE: Inf is 0x7f800000 / 0xff800000.
    nan = _codes_where(dtype, bits, np.isnan) if bits <= 16 else ()
    inf = _codes_where(dtype, bits, np.isinf) if bits <= 16 else (0x7F800000, 0xFF800000)
    signed = name != "float8_e8m0fnu"
    neg_zero_code = 1 << (bits - 1)
    signed_zero = signed and neg_zero_code not in nan
    exact = tuple(w for w in ("bfloat16", "float32") if _fits(info, w))
    scale = _int8_scale(info, bits) if bits <= 8 and signed else None
    return Format(
        name=name,
        bits=bits,
        is_float=True,
        signed=signed,
        exponent_bits=int(info.nexp),
        mantissa_bits=int(info.nmant),
        bias=bias,
        max=float(info.max),
        min=-float(info.max) if signed else float(info.smallest_normal),
        min_normal=float(info.smallest_normal),
        min_subnormal=float(info.smallest_subnormal),
        has_subnormals=has_subnormals,
        has_inf=bool(inf),
        nan_codes=nan,
        inf_codes=inf,
        signed_zero=signed_zero,
        exact_in=exact,
        int8_scale=scale,
        xla_storable=bits != 6,
    )


_SUB_BYTE = {
    "int4": 4,
    "uint4": 4,
    "float4_e2m1fn": 4,
    "float6_e2m3fn": 6,
    "float6_e3m2fn": 6,
}


def _fits(info: ml_dtypes.finfo, wide: str) -> bool:
    w = ml_dtypes.finfo(_DTYPES[wide])
    return (
        int(info.nmant) <= int(w.nmant)
        and float(info.max) <= float(w.max)
        and float(info.smallest_subnormal) >= float(w.smallest_subnormal)
    )


def _int8_scale(info: ml_dtypes.finfo, bits: int) -> int | None:
    """Smallest k with every finite value * 2**k an integer in [-127, 127], or None."""
    quantum = float(info.smallest_subnormal)
    k = 0
    while quantum * 2.0**k < 1:
        k += 1
    return k if float(info.max) * 2.0**k <= 127 else None


@functools.cache
def _registry() -> dict[str, Format]:
    return {n: _make(n) for n in LOW_PRECISION + WIDE + CODE_FORMATS}


def names() -> tuple[str, ...]:
    """Every registered format name: the low-precision family, then the wide types."""
    return LOW_PRECISION + WIDE


def get(fmt: FormatLike, *, arg: str = "fmt") -> Format:
    """Return the :class:`Format` for a name, alias, numpy/ml_dtypes/jnp dtype or Format.

    ``arg`` names the argument in the messages (``"lhs_format: unknown format ..."``), so
    that callers need not re-word them.

    Raises:
      TypeError: ``fmt`` is not a name, dtype or Format (None included: numpy would read
        it as float64).
      ValueError: for a name or dtype that is not a registered format; the message lists
        the known names.
    """
    if isinstance(fmt, Format):
        return fmt
    if fmt is None or isinstance(fmt, (bool, int, float)):
        # np.dtype(None) is float64 and np.dtype(int) is int64: neither is what was meant.
        raise TypeError(
            f"{arg}: expected a format name, a dtype or a Format, got {type(fmt).__name__} {fmt!r}"
        )
    reg = _registry()
    if isinstance(fmt, str):
        key = fmt.strip().lower()
        key = _ALIASES.get(key, key)
        if key in reg:
            return reg[key]
        raise ValueError(f"{arg}: unknown format {fmt!r}; known formats: {', '.join(names())}")
    try:
        dt = np.dtype(fmt)
    except TypeError:
        raise TypeError(
            f"{arg}: expected a format name, a dtype or a Format, got {type(fmt).__name__} {fmt!r}"
        ) from None
    if dt.name in reg:
        return reg[dt.name]
    raise ValueError(
        f"{arg}: dtype {dt.name} is not a supported format; known formats: {', '.join(names())}"
    )


def preferred_format(preferred_element_type: FormatLike) -> Format:
    """``preferred_element_type`` (of a dot or a convolution) read as a format.

    Raises:
      TypeError: it names no type at all (``"junk"``, ``5``), as ``lax.dot_general``
        raises for it.
      ValueError: a dtype that is not a registered format (``complex64``, ``int16``).
    Both messages start ``preferred_element_type:``.
    """
    try:
        return get(preferred_element_type, arg="preferred_element_type")
    except ValueError as e:
        try:
            np.dtype(preferred_element_type)
        except TypeError:
            raise TypeError(str(e)) from None
        raise


def _rank(f: Format) -> tuple[int, int, int, bool]:
    if f.is_float:
        maxexp = int(ml_dtypes.finfo(f.dtype).maxexp)
        return (maxexp, f.mantissa_bits, f.bits, True)
    return (-1, -1, f.bits, f.signed)


def dot_accumulator(lhs: FormatLike, rhs: FormatLike) -> str:
    """The accumulator of a matrix unit's native ``lhs x rhs`` dot: ``"int32"`` for two
    integer operands, ``"float32"`` otherwise (every TPU, GPU and XLA CPU dot)."""
    return "int32" if get(lhs).is_integer and get(rhs).is_integer else "float32"


def dot_result(
    lhs: FormatLike, rhs: FormatLike, preferred_element_type: FormatLike | None = None
) -> Format:
    """The element format ``jax.lax.dot_general`` returns for operands of these formats.

    Mirrors XLA's rule (``primitive_util::HigherPrecisionType``): without
    ``preferred_element_type`` the result is the operand type with the larger
    (max exponent, mantissa bits, bit width, signedness) key; floats outrank integers.
    So int8 x int8 gives int8 (the sum wraps) and e4m3fn x e5m2 gives e5m2.

    Raises:
      TypeError: operands of different types with equal keys and no
        ``preferred_element_type`` (JAX rejects them even with one; emulate accepts
        them then), or an integer result with a narrower ``preferred_element_type``.
      TypeError, ValueError: a ``preferred_element_type`` that is no format
        (:func:`preferred_format`).
    """
    a, b = get(lhs), get(rhs)
    ra, rb = _rank(a), _rank(b)
    if ra == rb and a != b and preferred_element_type is None:
        raise TypeError(
            f"dot_general argument type error: {a.name}, {b.name}; "
            "pass preferred_element_type to choose the result type"
        )
    out = a if ra >= rb else b
    if preferred_element_type is None:
        return out
    pref = preferred_format(preferred_element_type)
    if out.is_integer and pref.bits < out.bits:
        raise TypeError(
            f"preferred_element_type: {pref.name} is narrower than the result type {out.name}"
        )
    return pref


def result_format(
    lhs: FormatLike, rhs: FormatLike, preferred_element_type: FormatLike | None = None
) -> Format:
    """The format emulate rounds a dot's (or a convolution's) sum into: :func:`dot_result`'s,
    except that an integer result needs integer operands.

    ``lax.dot_general`` converts a float sum to an integer ``preferred_element_type``
    (toward zero); ``lax.conv_general_dilated`` refuses it with a TypeError, and so does
    emulate, whose contract rounds the sum once. The plans (:func:`emulate.plan`), the
    oracle (:mod:`emulate.reference`) and the front ends all read the result here.

    Raises:
      TypeError: as :func:`dot_result`, or an integer result of a float operand.
      ValueError: as :func:`preferred_format`.
    """
    a, b = get(lhs, arg="lhs"), get(rhs, arg="rhs")
    out = dot_result(a, b, preferred_element_type)
    if out.is_integer and not (a.is_integer and b.is_integer):
        raise TypeError(
            f"preferred_element_type: an integer result ({out.name}) needs integer operands, "
            f"got {a.name} x {b.name}"
        )
    return out
