"""Operands before decoding, and their decoding into the types a plan names.

An :class:`Operand` is what a front end hands the engine: the value as the caller stored it
(``uint8`` codes, an array of a wide type or of a low-precision dtype XLA can hold, or a
:class:`~emulate.numerics.storage.Packed` array) and its format's name. Decoding happens
inside the jitted program (:func:`decode_to`), so a decode can fuse with what reads it, or
be cut into tiles (:mod:`emulate.engine.tiled`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NoReturn, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats, targets
from emulate.formats import Format, FormatLike
from emulate.numerics import codecs
from emulate.numerics.pytree import PytreeRecord
from emulate.numerics.storage import Packed, from_codes, is_array, to_codes, unpack_codes
from emulate.quantized.array import QArray
from emulate.targets import TargetLike

__all__ = [
    "Operand",
    "OperandLike",
    "XLA_CONVERTS",
    "Precision",
    "decode_to",
    "describe",
    "exact_inputs",
    "operand",
    "refuse_non_array",
    "xla_convert",
]

#: What ``lax.dot_general`` takes as ``precision`` (a list of two is made a tuple, to hash:
#: :func:`emulate.engine.args.precision_arg`).
Precision: TypeAlias = (
    None | str | lax.Precision | tuple[str, str] | tuple[lax.Precision, lax.Precision]
)


@dataclasses.dataclass(frozen=True)
class Operand(PytreeRecord, data=("value",), static=("format_name",)):
    """An operand before decoding: codes, a wide-typed array or a Packed array, and its format.

    Attributes:
      value: ``uint8`` codes (``uint16``/``uint32`` never occur: wide types are kept as
        arrays of their own dtype), an array of a wide type, an array of a low-precision
        dtype that XLA holds (bitcast to codes where it is decoded), or a Packed array.
      format_name: the format of ``value``'s elements.
    """

    value: Any
    format_name: str

    @property
    def format(self) -> Format:
        return formats.get(self.format_name)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    def unpacked(self) -> jax.Array:
        """The elements ready for shape operations: unpacked codes of a low-precision
        format, or the wide array as it is."""
        if isinstance(self.value, Packed):
            return unpack_codes(self.value)
        if self.format.is_low_precision:
            return to_codes(self.value, self.format_name)[0]
        return self.value


#: What :func:`operand` takes: a jax or numpy array (of a format's dtype, or ``uint8``
#: codes), a :class:`~emulate.numerics.storage.Packed` array, or an :class:`Operand`.
OperandLike: TypeAlias = jax.Array | np.ndarray | Packed | Operand


def refuse_non_array(x: Any, arg: str) -> NoReturn:
    """The TypeError for an operand ``arg`` that is no array: a Python scalar or list, None
    (named as None) or any other object."""
    if isinstance(x, (int, float, bool, complex, list, tuple)):
        raise TypeError(
            f"{arg}: expected an array (jax or numpy), a Packed array or uint8 codes "
            f"with {arg}_format=, got {type(x).__name__}"
        )
    got = "None" if x is None else type(x).__name__
    raise TypeError(
        f"{arg}: expected an array (jax or numpy), a QArray, a Packed array or uint8 "
        f"codes with {arg}_format=, got {got}"
    )


def operand(x: OperandLike, fmt: FormatLike | None = None, *, arg: str = "x") -> Operand:
    """Normalise an operand: an array of any registered format (jax or numpy, float6 numpy
    arrays included), ``uint8`` codes with ``fmt``, or a Packed array.

    Raises:
      TypeError: ``x`` is not an array (a Python scalar, a list), or its dtype is no
        matmul operand format; ``arg`` names it.
      ValueError: ``fmt`` disagrees with ``x``'s dtype or with a Packed array's format.
    """
    if isinstance(x, Operand):
        return x
    if isinstance(x, Packed):
        if fmt is not None and formats.get(fmt) != x.format:
            raise ValueError(
                f"{arg}_format: {formats.get(fmt).name} disagrees with the Packed {arg}'s "
                f"format {x.format.name}"
            )
        return Operand(x, x.format_name)
    if not is_array(x):
        refuse_non_array(x, arg)
    dt = np.dtype(x.dtype)
    if fmt is None and dt.name in formats.WIDE:
        return Operand(jnp.asarray(x), dt.name)
    try:
        codes, f = to_codes(x, fmt, arg=arg)
    except TypeError as e:
        raise TypeError(
            f"{e}; the matmul operand types are: {', '.join(formats.MATMUL_OPERANDS)}"
        ) from None
    if not f.is_low_precision:
        return Operand(jnp.asarray(x), f.name)
    if fmt is None and f.xla_storable and not isinstance(x, np.ndarray):
        # Keep a jax array of the format's own dtype as it is: it is bitcast to codes where
        # it is decoded, so a tiled decode reads it tile by tile instead of first writing a
        # full uint8 copy of it.
        return Operand(x, f.name)
    return Operand(codes, f.name)


#: The formats whose XLA convert to bf16 / f32 a TPU target takes in place of the bit decode
#: (:func:`decode_to` with ``target=``), where the program is lowered for a TPU and the
#: operand is held in the format's own dtype (or as 8-bit codes): on these targets the
#: compiler's estimate for a dot fed by the convert is lower (libtpu 0.0.42.1), and the
#: convert is exact for every code. Integers of at most 8 bits are exact by construction
#: (the LLO sign-extends and converts s32 -> f32). The float converts were read from the LLO
#: (``--xla_jf_dump_llo_text``): on v2 they become integer shifts and masks into the f32
#: bits, one f32 subtraction of a normal number for the subnormal codes (nothing to flush)
#: and a sign OR, as the bit decode does; e4m3fn's NaN code becomes the quiet NaN of its
#: sign, e5m2's NaN codes keep their payload (re-made quiet NaNs of their sign by
#: :func:`xla_convert`). Not taken: floats on v3 (the same lowering, equal estimates), and
#: anything from v4 on, where the bit decode fuses into the dot and XLA's convert makes the
#: compiler tile the weight as in its own mixed dot (4.2x the estimate for bf16 x int8).
#: See docs/performance.md, issue 27.
XLA_CONVERTS: dict[str, frozenset[str]] = {
    "tpu_v2": frozenset({"int8", "int4", "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn"}),
    "tpu_v3": frozenset({"int8", "int4"}),
}


def decode_to(op: Operand, compute: str, scale: int, *, target: str | None = None) -> jax.Array:
    """``op``'s values exactly in the plan's ``compute`` type.

    ``compute`` equal to the operand's own format hands it over as it is (a native pair);
    "int8" multiplies exact-class values by ``2**scale`` first (integers then); "bfloat16"
    and "float32" decode exactly: by XLA's own convert where lowered for a TPU and
    :data:`XLA_CONVERTS` lists the format for ``target`` (the plan's target; None: the bit
    decode), by the codec's bit decode otherwise. Wide operands are converted with ``astype``.
    """
    f = op.format
    if not f.is_low_precision:
        return op.value if op.value.dtype == jnp.dtype(compute) else op.value.astype(compute)
    if compute == f.name:
        if not isinstance(op.value, Packed) and op.value.dtype == f.dtype:
            return op.value
        return from_codes(op.unpacked(), f)
    if compute == "int8":
        if f.is_integer:
            return codecs.decode(op.value, f.name, to=jnp.int8)
        v = codecs.decode(op.value, f.name, to=jnp.float32) * jnp.float32(2.0**scale)
        return v.astype(jnp.int8)  # exact: every value * 2**scale is an integer in int8
    out = jnp.dtype(compute)
    v = _as_dtype(op) if f.name in XLA_CONVERTS.get(target or "", ()) else None
    if v is not None:

        def bits(v):
            return codecs.decode(v, f.name, to=out)

        def convert(v):
            return xla_convert(v, f.name, out)

        return lax.platform_dependent(v, tpu=convert, default=bits)
    if f.is_integer:
        return _integer_to_float(op, compute)
    return codecs.decode(op.value, f.name, to=out)


def _as_dtype(op: Operand) -> jax.Array | None:
    """``op``'s value as an array of its format's own dtype (8-bit codes bitcast), or None
    where it is not one (a Packed array, 4-bit codes)."""
    f = op.format
    v = op.value
    if isinstance(v, Packed) or not f.xla_storable:
        return None
    if v.dtype == f.dtype:
        return v
    return lax.bitcast_convert_type(v, f.dtype) if f.bits == 8 else None


def xla_convert(v: jax.Array, fmt: str, to: Any) -> jax.Array:
    """``v`` (an array of ``fmt``'s dtype, or its 8-bit codes) by XLA's own convert into
    ``to`` (bfloat16 or float32). A format with several NaN codes of one sign (e5m2) has
    its NaNs made the quiet NaN of their sign (0x7FC00000 / 0x7FC0), as the bit decode and
    ml_dtypes give them: XLA:TPU's convert keeps their payload (e5m2 0x7D becomes the
    signalling 0x7FA00000). Exact where the backend's convert is (:data:`XLA_CONVERTS`);
    named for tests, which run it on the CPU, whose convert proves nothing for a TPU."""
    f = formats.get(fmt)
    if v.dtype != f.dtype:
        v = lax.bitcast_convert_type(v, f.dtype)
    out = jnp.dtype(to)
    d = v.astype(out)
    if f.high_nans > 1:
        u, sign, qnan = (
            (jnp.uint32, 0x80000000, 0x7FC00000)
            if out.itemsize == 4
            else (jnp.uint16, 0x8000, 0x7FC0)
        )
        b = lax.bitcast_convert_type(d, u)
        b = jnp.where(d != d, (b & u(sign)) | u(qnan), b)
        d = lax.bitcast_convert_type(b, out)
    return d


def _integer_to_float(op: Operand, compute: str) -> jax.Array:
    """Integer codes as bf16 or f32 values: by the codec's bit construction where lowered
    for the CPU (XLA:CPU's int -> float convert is slower), by XLA's own convert of the
    int32 values elsewhere. Both are exact: every value of an integer format of at most 8
    bits is an integer below 2**8, which the convert cannot round, and no integer operand
    is subnormal, so a flushing backend changes nothing."""
    out = jnp.dtype(compute)

    def bits(v):
        return codecs.decode(v, op.format_name, to=out)

    def convert(v):
        return codecs.decode(v, op.format_name, to=jnp.int32).astype(out)

    return lax.platform_dependent(op.value, cpu=bits, default=convert)


def exact_inputs(lhs: Operand, rhs: Operand) -> tuple[jax.Array, jax.Array]:
    """The operands of a sliced exact contraction: wide operands as they are (their bits
    are read; a convert to f32 may flush subnormals on XLA's CPU backend), low-precision
    ones decoded to f32 (exact for every format)."""
    a, b = (
        op.value if not op.format.is_low_precision else decode_to(op, "float32", 0)
        for op in (lhs, rhs)
    )
    return a, b


def describe(a: Operand | QArray, b: Operand | QArray, target: TargetLike) -> str:
    """``lhs FMT[shape], rhs FMT[shape], target NAME``: the tail of the engine's messages."""
    t = targets.current_target(target)
    return (
        f"lhs {a.format_name}{list(a.shape)}, rhs {b.format_name}{list(b.shape)}, target {t.name}"
    )
