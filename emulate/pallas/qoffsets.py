"""Zero points and offsets of a :class:`emulate.QArray` weight in :func:`emulate.pallas.matmul`.

A weight ``W[k, n] = (q[k, n] - z[g, n]) * s[g, n] + o[g, n]`` (``g`` the group of row
``k``: AutoAWQ / GPTQ / compressed-tensors asymmetric int4, GGUF Q4_0's static 8, GGUF
Q4_1 / Q5_1's ``m``) is contracted as its codes, with per group two terms that need only
the activations' sum over the group's rows, ``X[m, g] = sum_{k in g} x[m, k]``::

    sum_k x[m, k] W[k, n] = sum_g ( (P[m, g, n] - z[g, n] X[m, g]) s[g, n] + X[m, g] o[g, n] )

with ``P`` the group's partial sum of ``x * q`` as the kernel computes it for a plain
weight. Exact pairs (integer codes times integer, float4 or float6 activations) keep
``P - z X`` in int32, exact (the kernel's groups are at most 2048 rows, so no 8-bit zero
point can carry it past int32); other pairs compute it in f32 (``X``: the f32 sum of the
decoded activations). The scales then apply per group in f32 as for a plain weight, the
offset term is added in f32, and the result is rounded once. Scales that do not change
along K make one group spanning K here (so the kernel applies them per K step).

Error (mode "fast" pairs): the f32 accumulator is within ``gamma_(K + S + 5) * sum_k |x_k|
(|q_k s| + |z s| + |o|)`` of the exact sum of the dequantized products (:mod:`emulate.
scaled`'s bound for the same QArray), ``S`` the number of groups or K steps, whichever is
larger; with integer codes, zero points and power-of-two scales, and every partial sum
within 2**24 of the scale's quantum, the result is exact, bit-identical to
:func:`emulate.dot_general`.

What the kernel reads (:class:`AffineParts`, kept in :class:`emulate.pallas.KernelQWeight`
by :func:`emulate.pallas.prepare_weight`, no more bytes than stored): zero points of a
4-bit format (int4 / uint4, an array or Packed along any axis) as their nibbles packed
along the group axis (two groups a byte: the kernel takes a group's nibble from its
byte); int8 / uint8 zero points as stored; an int zero point as a constant. Offsets:
float32 / bfloat16 arrays as stored, float16 ones as their uint16 bits, a float as a
constant.

Not built (NotImplementedError): zero points of other types (int16, int32, 2-bit),
static ones beyond 255 in magnitude, zero points on float codes, zero points or offsets
with ``element_exponent``, offsets with a tensor scale, offsets that are QArrays
(two-level).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats
from emulate.numerics import codecs
from emulate.numerics.storage import Packed, pack, unpack_codes
from emulate.qarray import QArray
from emulate.qparts import is_int

__all__ = [
    "Affine",
    "AffineParts",
    "GroupTerms",
    "as_parts",
    "PARTS",
    "grouped",
    "kernel_arrays",
    "kernel_parts",
    "specs",
]

#: The QArray parts built here (as :func:`emulate.qarray.parts_text` names them).
PARTS = ("zero_points", "offsets")
_MIN_GROUP = 32
#: Zero point types the kernel reads: 4-bit ones packed along the group axis, 8-bit as is.
_ZERO_TYPES = ("int4", "uint4", "int8", "uint8")
_MAX_STATIC_ZERO = 255
_OFFSET_TYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "uint16"}


@dataclasses.dataclass(frozen=True)
class Affine:
    """The static side of a weight's zero points and offsets.

    Attributes:
      zero: "none", "static" (``zero_value``), "array" (``zero_format`` int8 / uint8, one
        byte a group) or "packed" (``zero_format`` int4 / uint4, two groups a byte along
        the group axis, the even group in the low nibble).
      zero_value: the static zero point (code units).
      zero_format: the zero points' format name ("" without an array).
      offset: "none", "static" (``offset_value``) or "array" (``offset_format``).
      offset_value: the static offset.
      offset_format: "float32", "bfloat16" or "float16" (held as uint16 bits).
    """

    zero: str = "none"
    zero_value: int = 0
    zero_format: str = ""
    offset: str = "none"
    offset_value: float = 0.0
    offset_format: str = ""

    @property
    def operands(self) -> int:
        """Kernel operands: one per array part."""
        return int(self.zero in ("array", "packed")) + int(self.offset == "array")


@jax.tree_util.register_pytree_with_keys_class
@dataclasses.dataclass(frozen=True, eq=False)
class AffineParts:
    """Zero points and offsets as the kernel reads them (:class:`Affine`'s arrays).

    Attributes:
      zeros: uint8 / int8 array ``(rows, C)``, ``rows`` the groups (or half of them,
        rounded up, for 4-bit zero points), ``C`` the scales' columns; or None.
      offsets: float32 / bfloat16 / uint16 array of the scales' shape, or None.
      spec: the :class:`Affine` record.
      grid: the scales' shape (groups, columns).
    """

    zeros: Any
    offsets: Any
    spec: Affine
    grid: tuple[int, int]

    def tree_flatten_with_keys(self):
        children = (
            (jax.tree_util.GetAttrKey("zeros"), self.zeros),
            (jax.tree_util.GetAttrKey("offsets"), self.offsets),
        )
        return children, (self.spec, self.grid)

    def tree_flatten(self):
        return (self.zeros, self.offsets), (self.spec, self.grid)

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        for name, v in zip(("zeros", "offsets", "spec", "grid"), (*children, *aux)):
            object.__setattr__(obj, name, v)
        return obj

    @property
    def arrays(self) -> tuple[Any, ...]:
        """The kernel operands, zero points first."""
        return tuple(a for a in (self.zeros, self.offsets) if a is not None)

    @property
    def nbytes(self) -> int:
        return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in self.arrays)


def _refuse(arg: str, what: str) -> None:
    raise NotImplementedError(
        f"{arg}: emulate.pallas.matmul does not decode {what} in the kernel; use "
        "emulate.dot_general for this QArray"
    )


def _zero_parts(q: QArray, grid: tuple[int, int], arg: str) -> tuple[Any, dict]:
    z = q.zero_points
    if z is None:
        return None, {}
    if not q.format.is_integer:
        _refuse(arg, f"zero points on {q.format_name} codes (integer codes are built)")
    if is_int(z):
        if abs(int(z)) > _MAX_STATIC_ZERO:
            _refuse(arg, f"a zero point of {int(z)} (at most {_MAX_STATIC_ZERO} in magnitude)")
        return None, {"zero": "static", "zero_value": int(z)}
    fmt = z.format_name if isinstance(z, Packed) else np.dtype(z.dtype).name
    if fmt not in _ZERO_TYPES:
        _refuse(arg, f"{fmt} zero points (int4, uint4, int8 and uint8 ones are built)")
    if formats.get(fmt).bits == 8:
        return jnp.asarray(z), {"zero": "array", "zero_format": fmt}
    if not (isinstance(z, Packed) and z.axis + 2 == 0):  # nibbles along the group axis
        codes = unpack_codes(z) if isinstance(z, Packed) else jnp.asarray(z)
        z = pack(codes, fmt, axis=0)
    return jnp.asarray(z.data), {"zero": "packed", "zero_format": fmt}


def _offset_parts(q: QArray, arg: str) -> tuple[Any, dict]:
    o = q.offsets
    if o is None:
        return None, {}
    if q.tensor_scale is not None:
        _refuse(arg, "offsets with a tensor scale")
    if isinstance(o, float):
        return None, {"offset": "static", "offset_value": float(o)}
    o = jnp.asarray(o)
    fmt = o.dtype.name
    if fmt != _OFFSET_TYPES[fmt]:
        o = lax.bitcast_convert_type(o, jnp.dtype(_OFFSET_TYPES[fmt]))
    return o, {"offset": "array", "offset_format": fmt}


def kernel_parts(q: QArray, arg: str = "w") -> AffineParts | None:
    """A 2-D QArray's zero points and offsets as the kernel reads them; None without.

    Raises:
      NotImplementedError: a part the kernel does not build (module docstring).
    """
    if not q.is_affine:
        return None
    if q.element_exponent:
        _refuse(arg, "zero points or offsets with an element_exponent")
    k, n = q.shape
    bk, bn = q.block_shape
    grid = (-(-k // bk), -(-n // bn))
    zeros, zs = _zero_parts(q, grid, arg)
    offsets, os_ = _offset_parts(q, arg)
    return AffineParts(zeros, offsets, Affine(**zs, **os_), grid)


def kernel_arrays(w: Any) -> tuple[Any, ...]:
    """The kernel operands of a QArray's or a KernelQWeight's zero points and offsets
    (zero points first; none without)."""
    parts = kernel_parts(w) if isinstance(w, QArray) else getattr(w, "affine", None)
    return () if parts is None else parts.arrays


def as_parts(p: AffineParts) -> dict[str, Any]:
    """``zero_points=`` and ``offsets=`` of the QArray ``p`` was made from (4-bit zero points
    Packed along the group axis, float16 offsets as float16)."""
    a = p.spec
    zp: Any = None
    if a.zero == "static":
        zp = a.zero_value
    elif a.zero == "array":
        zp = p.zeros
    elif a.zero == "packed":
        zp = Packed(jnp.asarray(p.zeros), a.zero_format, -2, p.grid[0])
    off: Any = None
    if a.offset == "static":
        off = a.offset_value
    elif a.offset == "array":
        off = jnp.asarray(p.offsets)
        if a.offset_format == "float16":
            off = lax.bitcast_convert_type(off, jnp.float16)
    return {"zero_points": zp, "offsets": off}


def grouped(k: int, along_k: bool, group: int) -> tuple[int, bool]:
    """``(group, along_k)`` of a weight with zero points or offsets: scales constant along
    K become one group spanning K, rounded up to whole groups of 32 rows."""
    if along_k:
        return group, True
    return max(_MIN_GROUP, -(-k // _MIN_GROUP) * _MIN_GROUP), True


def specs(p: Affine, rows: int, per_column: bool, bn: int) -> list[Any]:
    """The BlockSpecs of the kernel operands (each spans every group; columns as the
    scales')."""
    from jax.experimental import pallas as pl  # noqa: PLC0415 - kernel-side only

    out = []
    if p.zero in ("array", "packed"):
        r = -(-rows // 2) if p.zero == "packed" else rows
        out.append(_spec(pl, r, per_column, bn))
    if p.offset == "array":
        out.append(_spec(pl, rows, per_column, bn))
    return out


def _spec(pl: Any, rows: int, per_column: bool, bn: int) -> Any:
    if per_column:
        return pl.BlockSpec((rows, bn), lambda i, j, k: (0, j))
    return pl.BlockSpec((rows, 1), lambda i, j, k: (0, 0))


# --- in the kernel -----------------------------------------------------------------------


def _select(rows: jax.Array, index: Any) -> jax.Array:
    """Row ``index`` (dynamic) of ``rows`` (R, C) as (1, C): a one-hot sum (exact)."""
    at = lax.broadcasted_iota(jnp.int32, rows.shape, 0) == index
    return jnp.sum(jnp.where(at, rows, jnp.zeros((), rows.dtype)), axis=0, keepdims=True)


def _bytes(block: jax.Array) -> jax.Array:
    """A loaded 8-bit block as int32 byte values (0..255)."""
    return block.astype(jnp.int32) & 0xFF


def _offset_rows(block: jax.Array, fmt: str) -> jax.Array:
    if fmt == "float32":
        return block
    if fmt == "bfloat16":
        return block.astype(jnp.float32)
    c = block.astype(jnp.int32) & 0xFFFF  # float16 as its uint16 bits
    bits = codecs.decode_float_bits(c, formats.get("float16"))
    return lax.bitcast_convert_type(bits, jnp.float32)


class GroupTerms:
    """In the kernel, one K step: the zero-point and offset terms of each group.

    ``refs``: the kernel operands of :class:`AffineParts` (zero points first); ``exact``:
    whether partial sums are exact int32 sums (in quanta of ``2**-lhs_scale``)."""

    def __init__(self, refs: Any, spec: Affine, exact: bool, lhs_scale: int):
        self.spec = spec
        self.exact = exact
        self.lhs_scale = lhs_scale
        refs = list(refs)
        self.zeros = _bytes(refs.pop(0)[...]) if spec.zero in ("array", "packed") else None
        self.offsets = None
        if spec.offset == "array":
            self.offsets = _offset_rows(refs.pop(0)[...], spec.offset_format)
        self.xsum: Any = None

    def _zero(self, index: Any) -> Any:
        """Group ``index``'s zero points as a (1, C) int32 row, or an int."""
        s = self.spec
        if s.zero == "static":
            return s.zero_value
        assert self.zeros is not None
        if s.zero == "packed":
            byte = _select(self.zeros, index // 2)
            v = (byte >> ((index % 2) * 4)) & 0xF
        else:
            v = _select(self.zeros, index)
        if formats.get(s.zero_format).signed:
            half = 1 << (formats.get(s.zero_format).bits - 1)
            v = (v ^ half) - half
        return v

    def subtract_zero(self, part: jax.Array, xs: list[jax.Array], index: Any) -> jax.Array:
        """``part - z X`` for the group ``index``: ``xs``, its decoded x slices (one per
        column plane); ``part`` int32 (exact) or f32. Keeps ``X`` for :meth:`add_offset`."""
        total = None
        for x in xs:
            if jnp.issubdtype(x.dtype, jnp.integer):  # int8: summed in int32 (Mosaic
                # converts only 32-bit integers to float, and folds int8 -> int32 -> f32)
                t = jnp.sum(x.astype(jnp.int32), axis=1, keepdims=True)
            else:  # exact for the integers of an exact route
                t = jnp.sum(x.astype(jnp.float32), axis=1, keepdims=True)
            total = t if total is None else total + t
        assert total is not None
        self.xsum = total if total.dtype == jnp.float32 else total.astype(jnp.float32)
        if self.spec.zero == "none":
            return part
        z = self._zero(index)
        if self.exact:
            return part - total.astype(jnp.int32) * z
        zf = jnp.float32(z) if isinstance(z, int) else z.astype(jnp.float32)
        return part - total * zf

    def add_offset(self, scaled: jax.Array, index: Any) -> jax.Array:
        """``scaled + X o`` for the group ``index`` (after its scale)."""
        s = self.spec
        if s.offset == "none":
            return scaled
        x = self.xsum
        if self.exact and self.lhs_scale:
            x = x * jnp.float32(2.0**-self.lhs_scale)
        if s.offset == "static":
            return scaled + x * jnp.float32(s.offset_value)
        assert self.offsets is not None
        return scaled + x * _select(self.offsets, index)
