"""Operands before decoding, and their decoding into the types a plan names.

An :class:`Operand` is what a front end hands the engine: the value as the caller stored it
(``uint8`` codes, an array of a wide type or of a low-precision dtype XLA can hold, or a
:class:`~emulate.numerics.storage.Packed` array) and its format's name. Decoding happens
inside the jitted program (:func:`decode_to`), so a decode can fuse with what reads it, or
be cut into tiles (:mod:`emulate.engine.tiled`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeAlias, cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats, targets
from emulate.formats import Format, FormatLike
from emulate.numerics import codecs
from emulate.numerics.storage import Packed, from_codes, is_array, to_codes, unpack_codes
from emulate.quant import QArray
from emulate.targets import TargetLike

__all__ = [
    "Operand",
    "OperandLike",
    "Precision",
    "decode_to",
    "describe",
    "exact_inputs",
    "hashable_precision",
    "operand",
]

#: What ``lax.dot_general`` takes as ``precision`` (a list is made a tuple, to hash).
Precision: TypeAlias = (
    None | str | lax.Precision | tuple[str, str] | tuple[lax.Precision, lax.Precision]
)


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class Operand:
    """An operand before decoding: codes, a wide-typed array or a Packed array, and its format.

    Attributes:
      value: ``uint8`` codes (``uint16``/``uint32`` never occur: wide types are kept as
        arrays of their own dtype), an array of a wide type, an array of a low-precision
        dtype that XLA holds (bitcast to codes where it is decoded), or a Packed array.
      format_name: the format of ``value``'s elements.
    """

    value: Any
    format_name: str

    def tree_flatten(self) -> tuple[tuple[Any], str]:
        return (self.value,), self.format_name

    @classmethod
    def tree_unflatten(cls, aux: str, children: tuple[Any, ...]) -> Operand:
        return cls(children[0], aux)

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
        if isinstance(x, (int, float, bool, complex, list, tuple)):
            raise TypeError(
                f"{arg}: expected an array (jax or numpy), a Packed array or uint8 codes "
                f"with {arg}_format=, got {type(x).__name__}"
            )
        raise TypeError(f"{arg}: expected an array, got {type(x).__name__}")
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


def decode_to(op: Operand, compute: str, scale: int) -> jax.Array:
    """``op``'s values exactly in the plan's ``compute`` type.

    ``compute`` equal to the operand's own format hands it over as it is (a native pair);
    "int8" multiplies exact-class values by ``2**scale`` first (integers then); "bfloat16"
    and "float32" decode exactly. Wide operands are converted with ``astype``.
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
    if f.is_integer:
        return _integer_to_float(op, compute)
    return codecs.decode(op.value, f.name, to=jnp.dtype(compute))


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


def hashable_precision(precision: Precision | list[str] | list[lax.Precision]) -> Precision:
    """``precision`` with a list made a tuple, so that it can be a jit static argument."""
    if isinstance(precision, list):
        return cast(Precision, tuple(precision))
    return precision
