"""Format records: the bit layout, range and exact embeddings of every element type.

One frozen :class:`Format` per element type. The low-precision family (``LOW_PRECISION``)
is what ``emulate`` decodes; the wide types (``bfloat16``, ``float16``, ``float32``,
``int32``) are registered too so that every operand of a matmul has a record.

Numeric fields of the ml_dtypes types are derived from ``ml_dtypes.finfo`` /
``ml_dtypes.iinfo``; their NaN and Inf code sets are read off ml_dtypes by enumerating
every code. The IEEE P3109 binary8 formats (``P3109_BINARY8``) are registered too, every
other ``p3109_k{k}p{p}{s|u}{e|f}`` of 2 to 16 bits is built on first use of its name, and
any float format of at most 16 bits can be: build its record with :func:`float_format` (or
:func:`p3109`) and :func:`register` it. Nothing here needs JAX.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from typing import Any, TypeAlias

import ml_dtypes
import numpy as np

from emulate.float_format import P3109_BINARY8, float_format, p3109
from emulate.format_record import DTYPES, F32_MIN_NORMAL, WIDE, Format, int8_scale, unsigned_dtype

__all__ = [
    "CODE_FORMATS",
    "F32_MIN_NORMAL",
    "Format",
    "FormatLike",
    "LOW_PRECISION",
    "LOW_PRECISION_OPERANDS",
    "MATMUL_OPERANDS",
    "P3109_BINARY8",
    "SCALE_ONLY",
    "WIDE",
    "WIDE_FLOATS",
    "dot_accumulator",
    "dot_result",
    "float_format",
    "get",
    "names",
    "p3109",
    "preferred_format",
    "promoted",
    "register",
    "registered",
    "result_format",
    "unsigned_dtype",
    "xla_result",
]


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

#: The wide float types.
WIDE_FLOATS: tuple[str, ...] = ("bfloat16", "float16", "float32")

#: Formats that only scale other values and are never a matmul operand.
SCALE_ONLY: tuple[str, ...] = ("float8_e8m0fnu",)

#: The low-precision formats a matmul takes as an operand: every one but the scale type.
LOW_PRECISION_OPERANDS: tuple[str, ...] = tuple(n for n in LOW_PRECISION if n not in SCALE_ONLY)

#: Every format a matmul takes as an operand: the low-precision ones and the wide types.
MATMUL_OPERANDS: tuple[str, ...] = LOW_PRECISION_OPERANDS + WIDE

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
    dtype = np.dtype(DTYPES[name])
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
    scale = (
        int8_scale(float(info.max), float(info.smallest_subnormal))
        if bits <= 8 and signed
        else None
    )
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
    w = ml_dtypes.finfo(DTYPES[wide])
    return (
        int(info.nmant) <= int(w.nmant)
        and float(info.max) <= float(w.max)
        and float(info.smallest_subnormal) >= float(w.smallest_subnormal)
    )


@functools.cache
def _registry() -> dict[str, Format]:
    # Mutated only by register(), which adds names and never replaces one.
    reg = {n: _make(n) for n in LOW_PRECISION + WIDE + CODE_FORMATS}
    reg.update((n, _p3109_of(n)) for n in P3109_BINARY8)
    return reg


_P3109_NAME = re.compile(r"p3109_k([2-9]|1[0-6])p([1-9]|1[0-6])([su])([ef])")
_P3109_WIDE = re.compile(r"p3109_k(1[7-9]|[2-9][0-9]|[1-9][0-9]{2,})p[1-9][0-9]*[su][ef]")


def _p3109_of(name: str) -> Format:
    k, p, s, d = _P3109_NAME.fullmatch(name).groups()  # type: ignore[union-attr]
    return p3109(int(p), bits=int(k), signed=s == "s", extended=d == "e")


def names() -> tuple[str, ...]:
    """Every registered format name: the low-precision family, the P3109 binary8 formats,
    the formats registered with :func:`register` (in order), then the wide types."""
    fixed = set(LOW_PRECISION + P3109_BINARY8 + WIDE + CODE_FORMATS)
    yours = tuple(n for n in _registry() if n not in fixed)
    return LOW_PRECISION + P3109_BINARY8 + yours + WIDE


def registered() -> tuple[str, ...]:
    """The names of the float formats built from parameters: the P3109 ones and yours."""
    return tuple(n for n in names() if not get(n).has_dtype)


def register(fmt: Format) -> Format:
    """Register a format record (from :func:`float_format` or :func:`p3109`) under its name,
    so that every part of emulate finds it by name: decode / encode, Packed, plans, the
    matmuls, QArrays, the oracle, ``emulate.testing`` and the CLI.

    Registering an equal record again is a no-op. Returns the registered record.

    Raises:
      TypeError: ``fmt`` is not a Format.
      ValueError: its name (or its spelling in lower case) is taken by a different
        format or by an alias (``e4m3``, ``fp8`` ...).
    """
    if not isinstance(fmt, Format):
        raise TypeError(
            f"fmt: expected a Format (emulate.formats.float_format(...)), got "
            f"{type(fmt).__name__} {fmt!r}"
        )
    reg = _registry()
    have = reg.get(fmt.name)
    if have == fmt:
        return have
    if have is not None or fmt.name in _ALIASES or fmt.name != fmt.name.strip().lower():
        what = "an alias" if fmt.name in _ALIASES else "a different format"
        if have is None and fmt.name not in _ALIASES:
            what = "not lower case: names are looked up in lower case"
        raise ValueError(f"fmt: the name {fmt.name!r} is {what}; choose another name")
    reg[fmt.name] = fmt
    return fmt


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
    reg = _registry()
    if isinstance(fmt, Format):
        have = reg.get(fmt.name)
        if have is fmt or have == fmt:
            return fmt
        raise ValueError(
            f"{arg}: the format record {fmt.name!r} is not registered"
            + (" (another format has that name)" if have is not None else "")
            + "; pass it to emulate.formats.register first"
        )
    if fmt is None or isinstance(fmt, (bool, int, float)):
        # np.dtype(None) is float64 and np.dtype(int) is int64: neither is what was meant.
        raise TypeError(
            f"{arg}: expected a format name, a dtype or a Format, got {type(fmt).__name__} {fmt!r}"
        )
    if isinstance(fmt, str):
        key = fmt.strip().lower()
        key = _ALIASES.get(key, key)
        if key in reg:
            return reg[key]
        if _P3109_NAME.fullmatch(key):
            try:
                return register(_p3109_of(key))
            except ValueError as e:  # the record says why (it names the format, or not)
                named = str(e).startswith(key)
                raise ValueError(f"{arg}: {e}" if named else f"{arg}: {fmt!r}: {e}") from None
        wide = _P3109_WIDE.fullmatch(key)
        if wide:
            raise ValueError(
                f"{arg}: {fmt!r} is a {wide.group(1)}-bit P3109 format, not built: emulate "
                "builds P3109 formats of 2 to 16 bits (its codes are uint8 or uint16)"
            )
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
        maxexp = math.frexp(f.max)[1]  # ml_dtypes' finfo.maxexp
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
        ``preferred_element_type`` (float8_e5m2 with float8_e5m2fnuz: JAX rejects them
        even with one; emulate accepts them then), or an integer result with a narrower
        ``preferred_element_type``.
      TypeError, ValueError: ``lhs`` or ``rhs`` that is no format (:func:`get`), a
        ``preferred_element_type`` that is no format (:func:`preferred_format`).
    """
    a, b = get(lhs, arg="lhs"), get(rhs, arg="rhs")
    ra, rb = _rank(a), _rank(b)
    if ra == rb and a != b and preferred_element_type is None:
        raise TypeError(
            f"lhs, rhs: {a.name} and {b.name} have no common result type (lax.dot_general "
            "refuses the pair); pass preferred_element_type to choose the result type"
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


def _promotion_kind(name: str) -> tuple[bool, bool, int, bool] | None:
    """(is_float, is_low_precision, bits, signed) of a type jax.numpy's implicit promotion
    takes beside others (the wide types, int8, uint8, int16, int32; a float type XLA holds,
    as the float side of a pair); None for one it takes only beside itself."""
    if name == "int16":  # no format: the result of int8 with uint8
        return False, False, 16, True
    f = get(name)
    if not f.xla_storable or not (f.is_float or name in ("int8", "uint8", "int32")):
        return None
    return f.is_float, f.is_low_precision, f.bits, f.signed


def _promoted_pair(a: str, b: str) -> str | None:
    if a == b:
        return a if a == "int16" or get(a).xla_storable else None
    ka, kb = _promotion_kind(a), _promotion_kind(b)
    if ka is None or kb is None:
        return None
    if ka[0] != kb[0]:  # an integer promotes into any float, float8 included
        return a if ka[0] else b
    if ka[0]:  # two float types: wide ones only
        return None if ka[1] or kb[1] else "float32"  # bf16 with f16, or either with f32
    if ka[3] == kb[3]:
        return a if ka[2] >= kb[2] else b
    signed, unsigned = (ka, kb) if ka[3] else (kb, ka)
    return f"int{min(max(signed[2], 2 * unsigned[2]), 32)}"  # int8 x uint8: int16


def promoted(*types: FormatLike) -> str | None:
    """The type ``jnp.matmul`` and ``jnp.einsum`` return for operands of these types
    (``jnp.result_type`` without x64), or None where jax.numpy has no implicit promotion
    for them (a float8 or float4 type beside another float type; int4 or uint4 beside
    another type; a type XLA cannot hold: float6, the code formats, P3109). Beside
    :func:`dot_result` (``lax.dot_general``'s rule, which the front ends apply where this
    is None), the other half of the one result-type rule: ``bfloat16`` with ``float16``
    gives ``float32`` here, ``bfloat16`` there; ``int8`` with ``uint8`` gives ``int16``
    here (a type emulate has no format for). A QArray counts as its ``dtype``.

    Raises:
      TypeError, ValueError: a type that is no format (:func:`get`).
    """
    names = [get(t, arg="types").name for t in types]
    out: str | None = _promoted_pair(names[0], names[0]) if names else None
    for n in names[1:]:
        if out is None:
            return None
        out = _promoted_pair(out, n)
    return out


def xla_result(f: Format) -> bool:
    """Whether XLA's own dot or convolution can return ``f``: a type XLA holds, a byte or
    wider. XLA:CPU's verifier refuses a sub-byte result (int4, uint4, float4_e2m1fn: "does
    not support custom element sizes", jax 0.10.2, lax's own call included); float6 has
    no XLA type at all. The front ends pass no such call through to JAX: emulate's route
    rounds the sum into a sub-byte type (float6: a ValueError)."""
    return f.xla_storable and f.bits >= 8


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
