"""Zero points, offsets and two-level scales of a :class:`emulate.QArray` weight in
:func:`emulate.pallas.matmul`: the host side (what the kernel reads, :func:`kernel_parts`,
from the QArray's :class:`~emulate.quantized.layout.Layout`, and the records of its static
side, :class:`Affine` and :class:`KernelLevel`). Their terms in the kernel, per K step:
:class:`emulate.pallas.qsteps.GroupTerms`.

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

Two-level scales and offsets (``s`` or ``o`` a QArray of the scale grid's shape: GGUF
K-quants' ``d * sc`` and ``-dmin * m``, 6-bit codes per 32 rows times a float16 per 256
rows) are decoded in the kernel from their stored codes: a group's code is cut out of
the bytes it spans (the codes packed along the groups, :func:`emulate.pack`'s bit
stream), minus the inner zero point, times its super-block scale, one f32 rounding: the
f32 value :func:`emulate.dequantize` gives it; once per K step for all of the step's
groups, and two-level offsets' term as one dot per step (:mod:`emulate.pallas.qgroups`).
bitsandbytes' double quantization (``absmax`` as uint8 codes into the 256-entry map, a
float32 per 256 codes, an offset) is a two-level part with a table and a static offset
(:class:`KernelLevel`): ``map[c] * a2`` then ``+ offset``, each rounded once to f32 as bnb does;
below K = 16384 its nested blocks span every group and several columns (``(64, 4)`` at
K = 4096), spread to the output block's columns in the kernel. Against
:func:`emulate.dot_general` (bf16 activations x NF4 / FP4): the same f32 absmax; the
results differ only in where f32 sums round, each within dot_general's bound for a
codebook QArray (``gamma_(K + S + 4) * sum |x w|``), bit-identical where every partial
sum is exact (one power-of-two activation a row, say).

Error (mode "fast" pairs, whose decoded codes minus zero points are the exact integers
``q - z``, :func:`emulate.pallas.qsteps.zero_in_codes`): the f32 accumulator is within
``gamma_(K + S + 5) * sum_k |x_k| (|(q_k - z) s| + |o|)`` of the exact sum: without offsets
the plain weight's (:func:`emulate.bounds.qarray_bound`), ``S`` the groups or K steps, whichever
is larger; integer codes, zero points and power-of-two scales with partial sums within
2**24 quanta give the exact result, bit-identical to :func:`emulate.dot_general`.

What the kernel reads (:class:`AffineParts`, kept in :class:`emulate.pallas.KernelQWeight`
by :func:`emulate.pallas.prepare_weight`, no more bytes than stored): zero points of a
2- to 6-bit format (int4 / uint4, the integer code formats int2 ... uint6 of 2- and
3-bit GPTQ; an array or Packed along any axis) packed along the group axis
(:func:`emulate.pack`'s bit stream: the kernel cuts a group's code out of the one or two
bytes it spans); int8 / uint8 zero points as stored; an int zero point as a constant. Offsets:
float32 / bfloat16 arrays as stored, float16 ones as their uint16 bits, a float as a
constant. Two-level parts: their codes packed along the groups (2- to 7-bit) or 8-bit as
stored, the super-block scales as offsets are (two-level scales' codes are the
KernelQWeight's ``scales``).

Not built (NotImplementedError): zero points of other types (int16, int32),
static ones beyond 255 in magnitude, zero points on float codes, any of these parts with
``element_exponent``, offsets with a tensor scale; two-level parts other than integer
codes of at most 8 bits with a static zero point (or unsigned codes into a finite table
with a static offset), in blocks ``(B, 1)`` or of several columns spanning every group,
times float16 / bfloat16 / float32 super-block scales (no further level, array offsets or
tensor scale).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats
from emulate.codebooks import Codebook
from emulate.numerics.pytree import PytreeRecord
from emulate.numerics.storage import Packed, pack, unpack_codes
from emulate.pallas import qgroups
from emulate.pallas.compute import refuse
from emulate.quantized.array import QArray
from emulate.quantized.layout import Constant, Layout, Level, Stored, describe

__all__ = [
    "Affine",
    "AffineParts",
    "KernelLevel",
    "as_parts",
    "grouped",
    "kernel_parts",
    "repacked",
    "spec",
]

_MIN_GROUP = 32
#: Zero point types the kernel reads: 2- to 6-bit ones packed along the group axis, 8-bit
#: as is.
_ZERO_TYPES = ("int4", "uint4", "int8", "uint8", *formats.CODE_FORMATS)
_MAX_STATIC_ZERO = 255
_OFFSET_TYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "uint16"}


@dataclasses.dataclass(frozen=True)
class KernelLevel:
    """A two-level part (:class:`emulate.quantized.layout.Level`) as the kernel decodes it
    (part of its jit key): small-integer codes per group
    (``code_format``, Packed along the groups or 8-bit as stored) minus ``zero``, times a
    scale per ``block`` groups (``super_format``: float16 as uint16 bits, bfloat16,
    float32), one f32 rounding, as :func:`emulate.dequantize` computes them.

    bitsandbytes' double quantization: ``codebook[code] * super + offset`` (the codes
    unsigned indices into a finite table, ``offset`` a static float), the product and the
    sum each rounded once to f32, as :func:`emulate.dequantize` and bitsandbytes compute
    them; ``cols`` > 1: one super-block scale per ``cols`` columns, a block spanning every
    group (``(G, 256 // G)`` blocks of the ``(G, N)`` grid when ``G`` groups divide 256)."""

    code_format: str
    block: int
    super_format: str
    zero: int = 0
    codebook: Codebook | None = None
    offset: float = 0.0
    cols: int = 1


@dataclasses.dataclass(frozen=True)
class Affine:
    """The static side of a weight's zero points and offsets.

    Attributes:
      zero: "none", "static" (``zero_value``), "array" (``zero_format`` int8 / uint8, one
        byte a group) or "packed" (``zero_format`` of 2 to 6 bits, :func:`emulate.pack`'s
        bit stream along the group axis: int4 / uint4 two groups a byte, the even group
        in the low nibble).
      zero_value: the static zero point (code units).
      zero_format: the zero points' format name ("" without an array).
      offset: "none", "static" (``offset_value``), "array" (``offset_format``) or
        "two_level" (``offset_level``).
      offset_value: the static offset.
      offset_format: "float32", "bfloat16" or "float16" (held as uint16 bits).
      offset_level, scale_level: two-level offsets and scales (:class:`KernelLevel`), or None.
    """

    zero: str = "none"
    zero_value: int = 0
    zero_format: str = ""
    offset: str = "none"
    offset_value: float = 0.0
    offset_format: str = ""
    offset_level: KernelLevel | None = None
    scale_level: KernelLevel | None = None

    @property
    def spreads(self) -> tuple[KernelLevel, ...]:
        """The two-level parts whose super-block scales span several columns (offsets,
        then scales): each takes a (1, bn) int32 VMEM scratch, its spread scales."""
        levels = (self.offset_level, self.scale_level)
        return tuple(lv for lv in levels if lv is not None and lv.cols > 1)

    @property
    def operand_cols(self) -> tuple[int, ...]:
        """:attr:`KernelLevel.cols` of each kernel operand in :attr:`operands`' order (1 for
        all but super-block scales of several columns)."""
        lv, sl = self.offset_level, self.scale_level
        out = [1] * int(self.zero in ("array", "packed")) + [1] * int(self.offset == "array")
        return (*out, *([1, lv.cols] if lv is not None else []), *([sl.cols] if sl else []))

    @property
    def operands(self) -> int:
        """Kernel operands: zero points, offsets (two for two-level ones: codes, scales),
        the two-level scales' super-block scales."""
        return (
            int(self.zero in ("array", "packed"))
            + {"array": 1, "two_level": 2}.get(self.offset, 0)
            + int(self.scale_level is not None)
        )


@dataclasses.dataclass(frozen=True, eq=False)
class AffineParts(
    PytreeRecord,
    data=("zeros", "offsets", "offset_supers", "scale_supers"),
    static=("spec", "grid"),
):
    """Zero points and offsets as the kernel reads them (:class:`Affine`'s arrays).

    Attributes:
      zeros: uint8 / int8 array ``(rows, C)``, ``rows`` the groups (or the bytes of their
        packed codes along the groups for 2- to 6-bit zero points), ``C`` the scales'
        columns; or None.
      offsets: float32 / bfloat16 / uint16 array of the scales' shape; two-level ones:
        their codes' bytes (:class:`KernelLevel`); or None.
      spec: the :class:`Affine` record.
      grid: the scales' shape (groups, columns).
      offset_supers, scale_supers: the super-block scales of two-level offsets and scales
        (float16 as uint16 bits), or None. (Two-level scales' codes are the
        KernelQWeight's ``scales``.)
    """

    zeros: Any
    offsets: Any
    spec: Affine
    grid: tuple[int, int]
    offset_supers: Any = None
    scale_supers: Any = None

    @property
    def arrays(self) -> tuple[Any, ...]:
        """The kernel operands in :attr:`Affine.operands`' order."""
        leaves = (self.zeros, self.offsets, self.offset_supers, self.scale_supers)
        return tuple(a for a in leaves if a is not None)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays and of two-level parts' tables (static, as a QArray's)."""
        levels = (self.spec.offset_level, self.spec.scale_level)
        tables = sum(lv.codebook.nbytes for lv in levels if lv and lv.codebook is not None)
        return tables + sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in self.arrays)


def _packed_along_groups(codes: Stored) -> bool:
    """Whether sub-byte codes are stored as the kernel reads them (packed along axis 0)."""
    return isinstance(codes.array, Packed) and codes.packed_axis == 0


def repacked(q: Layout) -> tuple[str, ...]:
    """The parts :func:`kernel_parts` packs again for the kernel (a copy on every call of a
    program that takes the QArray as it is; a prepared weight holds them so): sub-byte zero
    points and two-level codes not packed along the groups."""
    levels = (("two-level scales' codes", q.scale), ("two-level offsets' codes", q.offset))
    parts = [("zero points", q.zero)] + [(name, lv.codes) for name, lv in levels
                                         if isinstance(lv, Level)]  # fmt: skip
    return tuple(
        name
        for name, c in parts
        if isinstance(c, Stored) and c.bits < 8 and not _packed_along_groups(c)
    )


def _along_groups(codes: Stored) -> jax.Array:
    """Codes of at most 7 bits as the kernel reads them: the bytes of :func:`emulate.pack`'s
    bit stream along the group axis (axis 0), as stored where they are so packed."""
    c = codes.array
    if not _packed_along_groups(codes):
        c = pack(
            unpack_codes(c) if isinstance(c, Packed) else jnp.asarray(c), codes.format_name, axis=0
        )
    return jnp.asarray(c.data)


def _zero_parts(q: Layout, arg: str) -> tuple[Any, dict]:
    z = q.zero
    if z is None:
        return None, {}
    if not q.format.is_integer:
        refuse(arg, f"zero points on {q.format_name} codes (integer codes are built)")
    if isinstance(z, Constant):
        if abs(int(z.value)) > _MAX_STATIC_ZERO:
            refuse(arg, f"a zero point of {int(z.value)} (at most {_MAX_STATIC_ZERO} in magnitude)")
        return None, {"zero": "static", "zero_value": int(z.value)}
    assert isinstance(z, Stored)
    if z.format_name not in _ZERO_TYPES:
        refuse(arg, f"{z.format_name} zero points (2- to 8-bit integer ones are built)")
    if z.bits == 8:
        return jnp.asarray(z.array), {"zero": "array", "zero_format": z.format_name}
    return _along_groups(z), {"zero": "packed", "zero_format": z.format_name}


def _as_bits(a: Any) -> tuple[jax.Array, str]:
    """A float32 / bfloat16 / float16 array as the kernel reads it, and its format."""
    a = jnp.asarray(a)
    fmt = a.dtype.name
    if fmt not in _OFFSET_TYPES:
        raise TypeError(f"expected a float32, bfloat16 or float16 array, got {fmt}")
    if fmt != _OFFSET_TYPES[fmt]:
        a = lax.bitcast_convert_type(a, jnp.dtype(_OFFSET_TYPES[fmt]))
    return a, fmt


def _level(inner: Level, arg: str, what: str) -> tuple[jax.Array, jax.Array, KernelLevel]:
    """(codes' bytes along the groups, super-block scales, :class:`KernelLevel`) of a
    two-level part ``inner`` (a QArray of the scale grid's shape)."""
    bk, bn = (int(b) for b in inner.block_shape) if len(inner.shape) == 2 else (0, 0)
    if len(inner.shape) != 2 or bk < 1 or not (bn == 1 or bk >= inner.shape[0]):
        refuse(
            arg,
            f"two-level {what} in blocks {tuple(inner.block_shape)} (blocks (B, 1), or of "
            "several columns spanning every group)",
        )
    cb, f = inner.table, inner.format
    if (
        not f.is_integer
        or f.bits > 8
        or not isinstance(inner.scale, Stored)
        or not (inner.offset is None or (cb is not None and isinstance(inner.offset, Constant)))
        or (cb is not None and (f.signed or inner.zero is not None))
        or (cb is not None and not np.all(np.isfinite(cb.array().astype(np.float32))))
        or inner.perm is not None
        or inner.tensor is not None
        or inner.exponent
        or isinstance(inner.zero, Stored)
        or inner.scale_format not in _OFFSET_TYPES
    ):
        refuse(
            arg,
            f"two-level {what} {describe(inner)} (integer codes of at most 8 bits, a static "
            "zero point, float16 / bfloat16 / float32 super-block scales are built; or "
            "unsigned codes into a finite table with a static offset, as bitsandbytes)",
        )
    data = jnp.asarray(inner.codes.array) if f.bits == 8 else _along_groups(inner.codes)
    supers, sf = _as_bits(inner.scale.array)
    offset = float(inner.offset.value) if isinstance(inner.offset, Constant) else 0.0
    zero = int(inner.zero.value) if isinstance(inner.zero, Constant) else 0
    return data, supers, KernelLevel(f.name, bk, sf, zero, cb, offset, bn)


def _offset_parts(q: Layout, arg: str) -> tuple[tuple[Any, Any], dict]:
    o = q.offset
    if o is None:
        return (None, None), {}
    if q.tensor is not None:
        refuse(arg, "offsets with a tensor scale")
    if isinstance(o, Constant):
        return (None, None), {"offset": "static", "offset_value": float(o.value)}
    if isinstance(o, Level):
        data, supers, level = _level(o, arg, "offsets")
        return (data, supers), {"offset": "two_level", "offset_level": level}
    a, fmt = _as_bits(o.array)
    return (a, None), {"offset": "array", "offset_format": fmt}


def kernel_parts(q: Layout, arg: str = "w") -> tuple[AffineParts | None, jax.Array | None]:
    """A 2-D QArray's zero points, offsets and two-level scales' super-block scales as the
    kernel reads them (None without any), and two-level scales' codes as the kernel reads
    them (the KernelQWeight's ``scales``; None for plain scales), from its layout.

    Raises:
      NotImplementedError: a part the kernel does not build (module docstring).
    """
    two_level = isinstance(q.scale, Level)
    if q.zero is None and q.offset is None and not two_level:
        return None, None
    if q.exponent:
        refuse(arg, "zero points, offsets or two-level scales with an element_exponent")
    zeros, zs = _zero_parts(q, arg)
    (offsets, offset_supers), os_ = _offset_parts(q, arg)
    scale_codes = scale_supers = None
    if isinstance(q.scale, Level):
        scale_codes, scale_supers, level = _level(q.scale, arg, "scales")
        os_["scale_level"] = level
    grid = (q.grid[0], q.grid[1])
    spec = Affine(**zs, **os_)
    return AffineParts(zeros, offsets, spec, grid, offset_supers, scale_supers), scale_codes


def _inner(data: Any, supers: Any, level: KernelLevel, grid: tuple[int, int]) -> QArray:
    f = formats.get(level.code_format)
    codes = jnp.asarray(data) if f.bits == 8 else Packed(jnp.asarray(data), f.name, -2, grid[0])
    sup = jnp.asarray(supers)
    if level.super_format == "float16":
        sup = lax.bitcast_convert_type(sup, jnp.float16)
    return QArray.from_parts(
        codes,
        sup,
        block_shape=(level.block, level.cols),
        zero_points=level.zero or None,
        codebook=level.codebook,
        offsets=level.offset if level.codebook is not None and level.offset else None,
    )


def as_parts(p: AffineParts, scales: Any) -> dict[str, Any]:
    """``zero_points=``, ``offsets=`` (and, for two-level scales, ``scales=`` from the
    KernelQWeight's ``scales``) of the QArray ``p`` was made from (4-bit zero points Packed
    along the group axis, float16 offsets as float16)."""
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
    elif a.offset == "two_level":
        assert a.offset_level is not None
        off = _inner(p.offsets, p.offset_supers, a.offset_level, p.grid)
    out = {"zero_points": zp, "offsets": off}
    if a.scale_level is not None:
        out["scales"] = _inner(scales, p.scale_supers, a.scale_level, p.grid)
    return out


def grouped(k: int, along_k: bool, group: int) -> tuple[int, bool]:
    """``(group, along_k)`` of a weight with zero points or offsets: scales constant along
    K become one group spanning K, rounded up to whole groups of 32 rows."""
    if along_k:
        return group, True
    return max(_MIN_GROUP, -(-k // _MIN_GROUP) * _MIN_GROUP), True


def spec(shape: tuple[int, ...], per_column: bool, bn: int, cols: int = 1) -> Any:
    """The BlockSpec of a per-group kernel operand of ``shape`` (the scales, zero points,
    offsets, super-block scales): every row, the columns of
    the output block (``per_column``) or the one column; super-block scales of ``cols`` >
    1 columns each: the window :func:`emulate.pallas.qgroups.supers_window` gives, or the
    whole row."""
    from jax.experimental import pallas as pl  # noqa: PLC0415 - kernel-side only

    rows, width = shape
    if per_column and cols > 1:
        window = qgroups.supers_window(cols, bn)
        if window is None or width < window[0]:
            return pl.BlockSpec((rows, width), lambda i, j, k: (0, 0))
        w, per = window
        return pl.BlockSpec((rows, w), lambda i, j, k: (0, j // per))
    if per_column:
        return pl.BlockSpec((rows, bn), lambda i, j, k: (0, j))
    return pl.BlockSpec((rows, 1), lambda i, j, k: (0, 0))
