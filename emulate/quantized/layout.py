"""The kernel-neutral description of a :class:`emulate.QArray`'s parts: :class:`Layout`,
computed once per weight by :func:`layout_of`.

Each part of a QArray (its codes, scales, tensor scale, zero points, offsets, codebook and
permutation) is one of five kinds:

- *absent*: ``None``;
- *constant*: :class:`Constant`, one value for the whole tensor (an int zero point, a
  float offset);
- *stored*: :class:`Stored`, an array as the QArray holds it: the format of its elements,
  its dtype, bits an element, the axis its elements are packed along (an
  :class:`emulate.Packed` array's; None for one element an item of the dtype), its logical
  shape and the block of the weight one entry covers;
- *two-level*: :class:`Level`, a part that is itself a QArray of the scale grid's shape
  (GGUF K-quants' sub-block scales and mins, bitsandbytes' double quantization),
  described by its own layout;
- *table*: a :class:`emulate.codebooks.Codebook` the codes index.

A kernel takes the layout and says only what it refuses and how it lays the parts out
(:func:`emulate.pallas.qweight.split`, :func:`emulate.cpu.form.weight_form`); outside
:mod:`emulate.quantized` and the XLA route's readers no module reads a QArray's parts
itself (``tests/test_layers.py``, ``test_one_reader_of_a_qarrays_parts``).

The layout holds the stored arrays (a part's :attr:`Stored.array`, not compared: two
layouts are equal when they describe the same parts) and is computed once per QArray
object (kept while the QArray lives); a QArray is frozen, so its layout never changes.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import numpy as np

from emulate import formats
from emulate.codebooks import Codebook
from emulate.formats import Format
from emulate.numerics.storage import Packed
from emulate.quantized.checks import grid_shape, is_int, is_record

__all__ = ["Constant", "Layout", "Level", "Part", "Stored", "describe", "kind", "layout_of"]


@dataclasses.dataclass(frozen=True)
class Constant:
    """One value for the whole tensor: an int zero point (code units) or a float offset."""

    value: int | float


@dataclasses.dataclass(frozen=True)
class Stored:
    """An array part as the QArray holds it.

    Attributes:
      format_name: the format of its elements: the QArray's format for the codes, the
        scale format for the scales, the Packed array's format, else the dtype's name
        ("int8", "int32", "float16", ...: it may name no registered format).
      dtype: the dtype of the array as held (uint8 for a Packed array's bytes and for codes
        of a format without a dtype).
      bits: bits an element (the format's, or the dtype's for an unregistered one).
      packed_axis: the axis (counted from the start of :attr:`shape`) along which a Packed
        array packs its elements; None for an array of one element an item.
      shape: the logical shape (a Packed array's elements, not its bytes).
      block: the elements of the weight one entry covers, per axis (1s for the codes).
      array: the array or :class:`emulate.Packed` itself (not compared).
    """

    format_name: str
    dtype: np.dtype
    bits: int
    packed_axis: int | None
    shape: tuple[int, ...]
    block: tuple[int, ...]
    array: Any = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def format(self) -> Format:
        """The elements' :class:`emulate.formats.Format` (ValueError for a dtype that names
        no registered format, such as int16)."""
        return formats.get(self.format_name)

    @property
    def data(self) -> Any:
        """The array as XLA holds it: a Packed array's bytes, else the array."""
        return self.array.data if isinstance(self.array, Packed) else self.array


@dataclasses.dataclass(frozen=True)
class Layout:
    """A QArray's parts, each described once (module docstring).

    Attributes:
      format_name, scale_format, shape, block_shape, dtype: the QArray's.
      codes: the codes (:class:`Stored`).
      scale: the scales: :class:`Stored`, or :class:`Level` (two-level scales).
      tensor: the float32 tensor scale (:class:`Stored`, shape ``()``), or None.
      zero: the zero points: None, :class:`Constant` (an int) or :class:`Stored`.
      offset: the offsets: None, :class:`Constant` (a float), :class:`Stored` or
        :class:`Level` (two-level offsets).
      table: the codebook the codes index, or None.
      perm, perm_axis: the act-order permutation (:class:`Stored`, int32) and its axis
        (negative), or None.
      exponent: the codes' implicit power-of-two scale (``element_exponent``).
    """

    format_name: str
    scale_format: str
    shape: tuple[int, ...]
    block_shape: tuple[int, ...]
    dtype: np.dtype
    codes: Stored
    scale: Stored | Level
    tensor: Stored | None = None
    zero: Constant | Stored | None = None
    offset: Constant | Stored | Level | None = None
    table: Codebook | None = None
    perm: Stored | None = None
    perm_axis: int | None = None
    exponent: int = 0

    @property
    def format(self) -> Format:
        """The codes' :class:`emulate.formats.Format`."""
        return formats.get(self.format_name)

    @property
    def grid(self) -> tuple[int, ...]:
        """The scale grid's shape: ``ceil(shape / block_shape)``."""
        return grid_shape(self.shape, self.block_shape)

    @property
    def two_level(self) -> bool:
        """Whether the scales or the offsets are two-level (:class:`Level`)."""
        return isinstance(self.scale, Level) or isinstance(self.offset, Level)


@dataclasses.dataclass(frozen=True)
class Level(Layout):
    """A two-level part: scales or offsets that are themselves a QArray over the weight's
    scale grid (their values in float32 are the part), described by that QArray's layout:
    its codes, its scales per ``block_shape`` entries of the grid, its zero point, offset,
    table, tensor scale and exponent. GGUF K-quants: 6-bit codes minus nothing, times an
    f16 super-block scale; bitsandbytes: uint8 codes into a 256-entry table, times an f32
    scale, plus a constant offset."""


def describe(lay: Layout) -> str:
    """The QArray ``lay`` describes, as its repr writes it (for messages):
    ``QArray(int4[4096, 4096], scales float16[32, 4096] per block (128, 1), zero_points,
    dtype=bfloat16)``."""
    zero, offset, scale = lay.zero, lay.offset, lay.scale
    named = (
        (f"zero_points={zero.value}" if isinstance(zero, Constant) else "zero_points", zero),
        ("offsets", offset),
        (f"codebook({lay.table.name})" if lay.table is not None else "", lay.table),
        (
            "two_level",
            scale if isinstance(scale, Level) else offset if isinstance(offset, Level) else None,
        ),
        ("perm", lay.perm),
    )
    extra = ", tensor_scale" if lay.tensor is not None else ""
    extra += "".join(f", {name}" for name, part in named if part is not None)
    scales = (
        f"scales {describe(scale)}"
        if isinstance(scale, Level)
        else f"scales {lay.scale_format}{list(scale.shape)}"
    )
    return (
        f"QArray({lay.format_name}{list(lay.shape)}, {scales} per block "
        f"{lay.block_shape}{extra}, dtype={lay.dtype.name})"
    )


#: One part's description: absent (None), constant, stored, two-level or table.
Part = Constant | Stored | Level | Codebook | None


def kind(part: Part) -> str:
    """The kind of a part's description: "absent", "constant", "stored", "two_level" or
    "table"."""
    if part is None:
        return "absent"
    if isinstance(part, Constant):
        return "constant"
    if isinstance(part, Level):
        return "two_level"
    if isinstance(part, Codebook):
        return "table"
    return "stored"


def _stored(x: Any, fmt: str | None, block: tuple[int, ...]) -> Stored:
    """An array or Packed part; ``fmt``: its elements' format (None: the dtype's)."""
    if isinstance(x, Packed):
        f = x.format
        shape = tuple(x.shape)
        return Stored(f.name, np.dtype(np.uint8), f.bits, x.axis % len(shape), shape, block, x)
    dt = np.dtype(x.dtype)
    name = fmt or dt.name
    known = fmt is not None or name in formats.names()
    bits = formats.get(name).bits if known else 8 * dt.itemsize
    return Stored(name, dt, bits, None, tuple(np.shape(x)), block, x)


def _part(x: Any, fmt: str | None, block: tuple[int, ...]) -> Any:
    if x is None:
        return None
    if is_record(x):
        return _layout(x, Level)
    if is_int(x) or isinstance(x, float):
        return Constant(x)
    return _stored(x, fmt, block)


def _layout(q: Any, cls: type[Layout]) -> Any:
    shape, block = tuple(q.shape), tuple(q.block_shape)
    ones = (1,) * len(shape)
    ts, perm = q.tensor_scale, q.perm
    return cls(
        format_name=q.format_name,
        scale_format=q.scale_format,
        shape=shape,
        block_shape=block,
        dtype=np.dtype(q.dtype),
        codes=_stored(q.codes, q.format_name, ones),
        scale=_part(q.scales, q.scale_format, block),
        tensor=None if ts is None else _stored(ts, "float32", shape),
        zero=_part(q.zero_points, None, block),
        offset=_part(q.offsets, None, block),
        table=q.codebook,
        perm=None if perm is None else _stored(perm, None, ones),
        perm_axis=q.perm_axis,
        exponent=int(q.element_exponent),
    )


_LAYOUTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def layout_of(q: Any) -> Layout:
    """The :class:`Layout` of the QArray ``q``: computed on the first call for this QArray
    object, then returned as it is.

    Raises:
      TypeError: ``q`` is not a QArray.
    """
    if not is_record(q):
        raise TypeError(f"q: expected an emulate.QArray, got {type(q).__name__}")
    lay = _LAYOUTS.get(q)
    if lay is None:
        lay = _layout(q, Layout)
        _LAYOUTS[q] = lay
    return lay
