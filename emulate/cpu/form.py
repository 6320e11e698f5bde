"""The CPU kernel's view of a QArray weight: a static :class:`Form`, what the compiled
kernel is specialized for, built by :func:`weight_form` from a 2-D QArray and its
contracting axis (the arrays it reads: :mod:`emulate.cpu.operands`). Plain JAX: nothing
here needs numba, but for 4- and 8-bit table codes, whose form asks numba which
instructions it compiles with (:func:`emulate.cpu.table_lookups`).

Orientations (:class:`Orientation`: the codes as stored; the kernel never transposes them):

- ``ROWS``: the codes are ``(N, K)``, K along the columns (GGUF's rows): one output
  element per stored row, a dot product along the row;
- ``COLUMNS``: the codes are ``(K, N)``: each stored row of codes is added, times
  ``x[k]``, into N accumulators (AWQ, GPTQ, bitsandbytes, NVFP4, FP8 blocks).

A packed weight must be packed along K (the layout :func:`emulate.quantize` gives and the
importers keep); packed along N it is not a form here (the XLA route takes it).

Element loops (:class:`Loop`, :attr:`Form.loop`): ``NIBBLES`` (4-bit codes packed along K,
two a byte), ``BYTES`` (one code a byte), ``GROUPS`` (layout ROWS: 2-, 3-, 5- and 6-bit
codes a byte group at a time: 4 codes in 1 or 3 bytes, 8 in 3 or 5), ``BITS`` (any width,
read as a bit stream); :func:`vector_step` says which run as vector steps.

docs/cpu_kernel.md tells how a form becomes code.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from typing import Any

import jax.numpy as jnp

from emulate import cpu
from emulate.numerics.storage import group_shape
from emulate.quantized.array import QArray
from emulate.quantized.layout import Constant, Layout, Level, Stored, layout_of

__all__ = [
    "CONSTANT",
    "LANES",
    "ConstantFactor",
    "FactorForm",
    "Form",
    "Kind",
    "Orientation",
    "LevelSlots",
    "Loop",
    "Slot",
    "group_geometry",
    "vector_step",
    "weight_form",
]


class _Named(enum.IntEnum):
    """An int the numba code compares with, printed by name (``Kind.SIGNED``: a
    :class:`Form`'s repr, which names its compiled kernel, reads as what it is)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


class Kind(_Named):
    """How a stored code becomes a value (:func:`emulate.cpu.parts.reader`)."""

    UNSIGNED = 0  #: the code's bits, an unsigned integer
    SIGNED = 1  #: two's complement over the code's width
    TABLE = 2  #: the value in the slot's table (float codes, codebook indices)
    FLOAT16 = 3  #: float16 bits
    BFLOAT16 = 4  #: bfloat16 bits
    FLOAT32 = 5  #: float32 bits


class Orientation(_Named):
    """How the codes are stored against the contraction (the kernel never transposes)."""

    ROWS = 0  #: (N, K): a dot product along each stored row (GGUF)
    COLUMNS = 1  #: (K, N): each row of codes, times ``x[k]``, into N sums (AWQ, GPTQ, ...)


class Loop(_Named):
    """The element loop a :class:`Form` compiles (:func:`vector_step` says which run as
    vector steps)."""

    NIBBLES = 0  #: 4-bit codes packed along K, two a byte
    BYTES = 1  #: one code a byte
    BITS = 2  #: any width, read as a bit stream, one code at a time
    GROUPS = 3  #: layout ROWS: 2-, 3-, 5- and 6-bit codes a byte group at a time


#: Groups of codes one vector step of the kernel takes (:mod:`emulate.cpu.lanes`).
LANES = 16


@dataclasses.dataclass(frozen=True)
class Slot:
    """One stored array as the kernel reads it (:mod:`emulate.cpu.parts`): how a code
    becomes a value (``kind``), its width in bits, its packed axis (-1: not packed) and
    the bytes a code takes where not packed."""

    kind: Kind
    bits: int
    axis: int
    width: int

    @property
    def group(self) -> int:
        """Codes a group as the vector steps read them (:func:`group_geometry`)."""
        return group_geometry(self.bits, self.axis != -1)[0]

    @property
    def step(self) -> tuple[int, int, int, int]:
        """The vector steps' compile-time constants for these codes
        (:mod:`emulate.cpu.lanes`): ``(bits, packed, signed, lookup)``, each an int."""
        packed, signed, lookup = self.axis != -1, self.kind == Kind.SIGNED, self.kind == Kind.TABLE
        return self.bits, int(packed), int(signed), int(lookup)


def group_geometry(bits: int, packed: bool) -> tuple[int, int]:
    """``(codes, bytes)`` of one group of codes as the vector steps read them: the
    smallest run of whole bytes that holds whole codes of a bit stream
    (:func:`emulate.numerics.storage.group_shape`), or one code a byte."""
    return group_shape(bits) if packed else (1, 1)


@dataclasses.dataclass(frozen=True)
class LevelSlots:
    """A two-level part (a QArray of scales or offsets over the weight's block grid):
    ``(value(code) - zp) * scale[block] + offset`` with constant ``zp`` and ``offset``."""

    codes: Slot
    scales: Slot | None
    block: tuple[int, int]
    zero_point: bool
    offset: bool


@dataclasses.dataclass(frozen=True)
class ConstantFactor:
    """A factor that is one number for the whole weight (the kernel reads it from its
    float32 constants: :class:`emulate.cpu.operands.Factor`)."""


CONSTANT = ConstantFactor()

#: How the kernel reads one of a weight's factors (zero point, scale, offset): absent, a
#: constant, a stored array, or a two-level part.
FactorForm = Slot | LevelSlots | ConstantFactor | None


@dataclasses.dataclass(frozen=True)
class Form:
    """What one compiled kernel is specialized for (hashable: the compile cache's key)."""

    orientation: Orientation
    loop: Loop
    codes: Slot
    block: tuple[int, int]
    zero_point: Slot | ConstantFactor | None
    scale: Slot | LevelSlots | None
    offset: FactorForm
    #: ``tensor``: a float32 tensor scale multiplies every block's scale (NVFP4);
    #: ``exponent``: each code stands for its value times ``2**exponent`` (the QArray's
    #: element exponent). The product of the two scales and the power of two is taken as
    #: ``dequantize`` takes it (mantissa times mantissa, exponents added:
    #: :func:`emulate.cpu.factors.combined_scale`).
    tensor: bool = False
    exponent: int = 0

    @property
    def name(self) -> str:
        """A name for XLA's FFI registry, one per form and the same in every process (a
        program from JAX's persistent cache calls its kernel by this name)."""
        return "emulate_cpu_gemv_" + hashlib.sha1(repr(self).encode()).hexdigest()[:16]


def _format_slot(fmt: Any, bits: int, axis: int, codebook: Any) -> Slot:
    if codebook is not None or not fmt.is_integer:
        return Slot(Kind.TABLE, bits, axis, 1)
    return Slot(Kind.SIGNED if fmt.signed else Kind.UNSIGNED, bits, axis, 1)


#: numpy dtypes narrower than a byte: XLA:CPU holds them packed two (or four) a byte, which
#: the kernel's byte readers would misread (a QArray keeps such arrays as given).
_SUB_BYTE = frozenset({"int2", "uint2", "int4", "uint4", "float4_e2m1fn"})


def _slot(s: Stored, codebook: Any = None) -> Slot | None:
    """The slot of a stored part (a Packed array, codes of a format of at most a byte, or
    float16 / bfloat16 / float32 / integer values), None where the kernel cannot read it.
    ``codebook``: the table the codes index (codes only)."""
    if len(s.shape) != 2:
        return None
    if s.packed_axis is not None:
        return None if s.bits > 8 else _format_slot(s.format, s.bits, s.packed_axis, codebook)
    dt = s.dtype
    if dt.name in _SUB_BYTE:
        return None
    if s.bits <= 8 and dt.itemsize == 1:  # codes of a format of at most a byte
        return _format_slot(s.format, s.bits, -1, codebook)
    if dt == jnp.float16:
        return Slot(Kind.FLOAT16, 16, -1, 2)
    if dt == jnp.bfloat16:
        return Slot(Kind.BFLOAT16, 16, -1, 2)
    if dt == jnp.float32:
        return Slot(Kind.FLOAT32, 32, -1, 4)
    if dt.kind in "iu" and dt.itemsize in (1, 2, 4):
        kind = Kind.SIGNED if dt.kind == "i" else Kind.UNSIGNED
        return Slot(kind, 8 * dt.itemsize, -1, dt.itemsize)
    return None


def _level(lv: Level) -> LevelSlots | None:
    """A two-level part's :class:`LevelSlots`, None where it has more than a constant zero
    point, a plain scale array and a constant offset."""
    if (
        len(lv.shape) != 2
        or lv.perm is not None
        or lv.tensor is not None
        or lv.exponent
        or isinstance(lv.zero, Stored)
        or isinstance(lv.offset, (Stored, Level))
        or not isinstance(lv.scale, Stored)
    ):
        return None
    codes = _slot(lv.codes, lv.table)
    scales = _slot(lv.scale)
    if codes is None or scales is None:
        return None
    block = (lv.block_shape[0], lv.block_shape[1])
    return LevelSlots(codes, scales, block, lv.zero is not None, lv.offset is not None)


class _Unreadable(Exception):
    """A part the kernel cannot read: the weight is not a form."""


def _factor(part: Constant | Stored | Level | None) -> FactorForm:
    """How the kernel reads ``part`` (a layout's zero points, scales or offsets)."""
    if part is None:
        return None
    if isinstance(part, Constant):
        return CONSTANT
    factor = _level(part) if isinstance(part, Level) else _slot(part)
    if factor is None:
        raise _Unreadable
    return factor


def _looked_up(codes: Slot) -> bool:
    """Whether the kernel looks up ``codes``' values in registers: 4- or 8-bit float codes
    or codebook indices on a host with :func:`emulate.cpu.table_lookups`."""
    return codes.kind == Kind.TABLE and codes.bits in (4, 8) and cpu.table_lookups(codes.bits)


def _loop(lay: Layout, codes: Slot, contracting: int) -> Loop:
    """The element loop of ``lay``'s codes (``codes``) contracted along ``contracting``."""
    bk = lay.block_shape[contracting]
    if codes.axis == -1:
        return Loop.BYTES
    if codes.bits == 4 and bk % 2 == 0 and lay.shape[contracting] % 2 == 0:
        return Loop.NIBBLES
    g = group_shape(codes.bits)[0]
    if contracting == 1 and bk % g == 0 and lay.shape[1] % g == 0:  # Orientation.ROWS
        return Loop.GROUPS
    return Loop.BITS


def weight_form(q: QArray | Layout, contracting: int) -> Form | None:
    """The kernel's form of a 2-D QArray (or its :class:`~emulate.quantized.layout.Layout`)
    contracted along axis ``contracting``, or None where the kernel does not take it:
    stacked or act-order QArrays, codes packed along N, codes wider than a byte, codes that
    are not integers (float formats, codebooks: a table lookup an element, which ran
    slower than XLA's route) unless 4- or 8-bit on a host whose registers hold their table
    (:func:`emulate.cpu.table_lookups`), parts it cannot read, a tensor scale or element
    exponent over two-level scales. Tables serve the per-block parts (float8 scales, a
    codebook of two-level scales)."""
    lay = q if isinstance(q, Layout) else layout_of(q)
    if len(lay.shape) != 2 or lay.perm is not None or contracting not in (0, 1):
        return None
    codes = _slot(lay.codes, lay.table)
    if codes is None or not (codes.kind in (Kind.UNSIGNED, Kind.SIGNED) or _looked_up(codes)):
        # other float codes and codebooks (a table lookup an element: gathers) measured
        # slower in the kernel than on XLA's route (docs/performance.md, "The CPU kernel")
        return None
    if codes.axis not in (-1, contracting) or (codes.axis == -1 and codes.width != 1):
        return None  # packed along N, or wider than a byte
    try:
        zero_point, scale, offset = _factor(lay.zero), _factor(lay.scale), _factor(lay.offset)
    except _Unreadable:
        return None
    if isinstance(zero_point, LevelSlots) or isinstance(scale, ConstantFactor):
        return None
    scaled = lay.tensor is not None or lay.exponent != 0
    if scaled and not isinstance(scale, Slot):
        return None  # the two-level scales' mantissas are flushed first: not built
    orientation = Orientation.ROWS if contracting == 1 else Orientation.COLUMNS
    block = (lay.block_shape[0], lay.block_shape[1])
    loop = _loop(lay, codes, contracting)
    form = Form(
        orientation,
        loop,
        codes,
        block,
        zero_point,
        scale,
        offset,
        lay.tensor is not None,
        int(lay.exponent),
    )
    if codes.kind == Kind.TABLE and not vector_step(form):
        return None  # a table lookup an element: slower than XLA's route
    return form


def vector_step(form: Form) -> bool:
    """Whether the kernel's element loop is the vector step (:mod:`emulate.cpu.lanes`):
    codes a group at a time (:data:`Loop.NIBBLES`, :data:`Loop.BYTES`; layout ROWS also
    :data:`Loop.GROUPS`) and, for layout ROWS, blocks of a multiple or a divisor of
    :data:`LANES` groups. Elsewhere a loop over one code at a time."""
    if form.orientation == Orientation.COLUMNS:
        return form.loop in (Loop.NIBBLES, Loop.BYTES)
    if form.loop == Loop.BITS:
        return False
    per_block = form.block[1] // form.codes.group
    return per_block % LANES == 0 or LANES % per_block == 0
