"""The CPU kernel's view of a QArray weight: a static :class:`Form` (what the compiled
kernel is specialized for) and the arrays it reads, built by :func:`weight_form` and
:func:`weight_operands` from a 2-D QArray and its contracting axis. Plain JAX: nothing here
needs numba, but for 4- and 8-bit table codes, whose form asks numba which instructions it
compiles with (:func:`emulate.cpu.table_lookups`).

Layouts (the codes as stored; the kernel never transposes them):

- :data:`ROWS`: the codes are ``(N, K)``, K along the columns (GGUF's rows): one output
  element per stored row, a dot product along the row;
- :data:`COLUMNS`: the codes are ``(K, N)``: each stored row of codes is added, times
  ``x[k]``, into N accumulators (AWQ, GPTQ, bitsandbytes, NVFP4, FP8 blocks).

A packed weight must be packed along K (the layout :func:`emulate.quantize` gives and the
importers keep); packed along N it is not a form here (the XLA route takes it).

Element loops (:attr:`Form.variant`): :data:`NIBBLES` (4-bit codes packed along K, two a
byte), :data:`BYTES` (one code a byte), :data:`GROUPS` (layout ROWS: 2-, 3-, 5- and 6-bit
codes a byte group at a time: 4 codes in 1 or 3 bytes, 8 in 3 or 5), :data:`BITS` (any
width, read as a bit stream); :func:`vector_step` says which run as vector steps.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from emulate import cpu
from emulate.numerics.storage import group_shape
from emulate.quantized.array import QArray
from emulate.quantized.layout import Constant, Layout, Level, Stored, layout_of
from emulate.quantized.values import element_values

__all__ = [
    "BFLOAT16",
    "BITS",
    "BYTES",
    "COLUMNS",
    "FLOAT16",
    "FLOAT32",
    "Form",
    "GROUPS",
    "LANES",
    "LevelSlots",
    "NIBBLES",
    "ROWS",
    "SIGNED",
    "Slot",
    "TABLE",
    "UNSIGNED",
    "group_geometry",
    "slot_widths",
    "vector_step",
    "weight_form",
    "weight_operands",
]

UNSIGNED, SIGNED, TABLE, FLOAT16, BFLOAT16, FLOAT32 = range(6)
#: Groups of codes one vector step of the kernel takes (:mod:`emulate.cpu.lanes`).
LANES = 16
ROWS, COLUMNS = 0, 1
NIBBLES, BYTES, BITS, GROUPS = range(4)
#: The constants' order in the kernel's float32 ``consts``: the weight's zero point and
#: offset, each two-level part's zero point and offset (no tensor scale: :func:`weight_form`
#: refuses tensor scales and element exponents).
CONSTS = ("zp", "offset", "scale_zp", "scale_offset", "offset_zp", "offset_offset")


@dataclasses.dataclass(frozen=True)
class Slot:
    """One stored array as the kernel reads it (:mod:`emulate.cpu.parts`): how a code
    becomes a value (``kind``), its width in bits, its packed axis (-1: not packed) and
    the bytes a code takes where not packed."""

    kind: int
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
        return self.bits, int(self.axis != -1), int(self.kind == SIGNED), int(self.kind == TABLE)


def group_geometry(bits: int, packed: bool) -> tuple[int, int]:
    """``(codes, bytes)`` of one group of codes as the vector steps read them: the
    smallest run of whole bytes that holds whole codes of a bit stream
    (:func:`emulate.numerics.storage.group_shape`), or one code a byte."""
    return group_shape(bits) if packed else (1, 1)


@dataclasses.dataclass(frozen=True)
class LevelSlots:
    """The slots of a two-level part (:class:`emulate.quantized.layout.Level`: a QArray of
    scales or offsets over the weight's block grid): ``(value(code) - zp) * scale[block] +
    offset`` with constant ``zp`` and ``offset``."""

    codes: Slot
    scales: Slot | None
    block: tuple[int, int]
    zero_point: bool
    offset: bool


@dataclasses.dataclass(frozen=True)
class Form:
    """What one compiled kernel is specialized for (hashable: the compile cache's key)."""

    layout: int
    variant: int
    codes: Slot
    block: tuple[int, int]
    zero_point: Slot | str | None  # "const" for a constant zero point
    scale: Slot | LevelSlots | None
    offset: Slot | LevelSlots | str | None

    @property
    def name(self) -> str:
        """A name for XLA's FFI registry, one per form and the same in every process (a
        program from JAX's persistent cache calls its kernel by this name)."""
        return "emulate_cpu_gemv_" + hashlib.sha1(repr(self).encode()).hexdigest()[:16]


def _format_slot(fmt: Any, bits: int, axis: int, codebook: Any) -> Slot:
    if codebook is not None or not fmt.is_integer:
        return Slot(TABLE, bits, axis, 1)
    return Slot(SIGNED if fmt.signed else UNSIGNED, bits, axis, 1)


#: numpy dtypes narrower than a byte: XLA:CPU holds them packed two (or four) a byte, which
#: the kernel's byte readers would misread (a QArray keeps such arrays as given).
_SUB_BYTE = frozenset({"int2", "uint2", "int4", "uint4", "float4_e2m1fn"})


def _slot(s: Stored, codebook: Any = None) -> Slot | None:
    """The slot of a stored part (a Packed array, codes of a low-precision format, or
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
        return Slot(FLOAT16, 16, -1, 2)
    if dt == jnp.bfloat16:
        return Slot(BFLOAT16, 16, -1, 2)
    if dt == jnp.float32:
        return Slot(FLOAT32, 32, -1, 4)
    if dt.kind in "iu" and dt.itemsize in (1, 2, 4):
        return Slot(SIGNED if dt.kind == "i" else UNSIGNED, 8 * dt.itemsize, -1, dt.itemsize)
    return None


def _level(lv: Level) -> LevelSlots | None:
    """A two-level part's :class:`LevelSlots`, None where it has more than one constant
    zero point, a plain scale array and a constant offset."""
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


def _factor(part: Any) -> Slot | LevelSlots | str | None:
    if part is None:
        return None
    if isinstance(part, Constant):
        return "const"
    if isinstance(part, Level):
        return _level(part) or "unreadable"
    return _slot(part) or "unreadable"


def _looked_up(codes: Slot) -> bool:
    """Whether the kernel looks up ``codes``' values in registers: 4- or 8-bit float codes
    or codebook indices on a host with :func:`emulate.cpu.table_lookups`."""
    return codes.kind == TABLE and codes.bits in (4, 8) and cpu.table_lookups()


def weight_form(q: QArray | Layout, contracting: int) -> Form | None:
    """The kernel's form of a 2-D QArray (or its :class:`~emulate.quantized.layout.Layout`)
    contracted along axis ``contracting``, or None where the kernel does not take it:
    stacked or act-order QArrays, codes packed along N, codes wider than a byte, codes that
    are not integers (float formats, codebooks: a table lookup an element, which ran
    slower than XLA's route) unless 4- or 8-bit on a host whose registers hold their table
    (:func:`emulate.cpu.table_lookups`), a tensor scale or element exponent, parts it
    cannot read. Tables serve the per-block parts (float8 scales, a codebook of two-level
    scales)."""
    lay = q if isinstance(q, Layout) else layout_of(q)
    if len(lay.shape) != 2 or lay.perm is not None or contracting not in (0, 1):
        return None
    codes = _slot(lay.codes, lay.table)
    if codes is None or not (codes.kind in (UNSIGNED, SIGNED) or _looked_up(codes)):
        # other float codes and codebooks (a table lookup an element: gathers) measured
        # slower in the kernel than on XLA's route (docs/performance.md, "The CPU kernel")
        return None
    if codes.axis != -1 and codes.axis != contracting:  # packed along K only
        return None
    if codes.axis == -1 and codes.width != 1:
        return None
    layout = ROWS if contracting == 1 else COLUMNS
    bk = lay.block_shape[contracting]
    if codes.axis == -1:
        variant = BYTES
    elif codes.bits == 4 and bk % 2 == 0 and lay.shape[contracting] % 2 == 0:
        variant = NIBBLES
    elif (
        layout == ROWS
        and bk % group_shape(codes.bits)[0] == 0
        and lay.shape[1] % bk == 0
        and not isinstance(_factor(lay.zero), Slot)
    ):
        variant = GROUPS
    else:
        variant = BITS
    if lay.tensor is not None or lay.exponent:
        # one float32 scale a block (scale * tensor scale * 2**e) may leave float32's
        # range where dequantize's mantissa and exponent do not
        return None
    parts = (_factor(lay.zero), _factor(lay.scale), _factor(lay.offset))
    if "unreadable" in parts or isinstance(parts[0], LevelSlots) or parts[1] == "const":
        return None
    block = (lay.block_shape[0], lay.block_shape[1])
    form = Form(layout, variant, codes, block, *parts)  # type: ignore[arg-type]
    if codes.kind == TABLE and not vector_step(form):
        return None  # a table lookup an element: slower than XLA's route
    return form


def vector_step(form: Form) -> bool:
    """Whether the kernel's element loop is the vector step (:mod:`emulate.cpu.lanes`):
    codes a group at a time (:data:`NIBBLES`, :data:`BYTES`; layout ROWS also
    :data:`GROUPS`) and, for layout ROWS, blocks of a multiple or a divisor of
    :data:`LANES` groups. Elsewhere a loop over one code at a time."""
    if form.layout == COLUMNS:
        return form.variant in (NIBBLES, BYTES)
    if form.variant == BITS:
        return False
    per_block = form.block[1] // form.codes.group
    return per_block % LANES == 0 or LANES % per_block == 0


def slot_widths(form: Form) -> tuple[int, ...]:
    """The bytes an element of each of the six slots takes (the kernel reads every slot as
    bytes: XLA passes the arrays as they are, no bitcast)."""

    def width(part: Any, codes: bool) -> int:
        if isinstance(part, LevelSlots):
            part = part.codes if codes else part.scales
        return part.width if isinstance(part, Slot) else 1

    zp, scale, off = form.zero_point, form.scale, form.offset
    return (
        form.codes.width,
        width(zp, True),
        width(scale, True),
        width(scale, False) if isinstance(scale, LevelSlots) else 1,
        width(off, True),
        width(off, False) if isinstance(off, LevelSlots) else 1,
    )


def _table(slot: Slot, fmt: Any, codebook: Any) -> jax.Array:
    """The value of every code (``element_values``: what ``dequantize`` gives)."""
    if slot.kind != TABLE:
        return jnp.zeros((1,), jnp.float32)
    return element_values(jnp.arange(1 << slot.bits, dtype=jnp.uint8), fmt, codebook)


_NO_BYTES = np.zeros((1, 1), np.uint8)
_NO_TABLE = np.zeros((1,), np.float32)


def _slot_arrays(part: Any, slot: Any, codebook: Any = None) -> tuple:
    """A slot's (bytes as XLA holds them, code values) for a stored part; placeholders
    where the slot is absent, constant or two-level."""
    if not isinstance(slot, Slot):
        return (jnp.asarray(_NO_BYTES), jnp.asarray(_NO_TABLE))
    fmt = part.format if slot.kind == TABLE else None
    return (jnp.asarray(part.data), _table(slot, fmt, codebook))


def _constant(part: Any, default: float) -> float:
    return float(part.value) if isinstance(part, Constant) else default


def weight_operands(q: QArray | Layout, form: Form) -> tuple[jax.Array, list[jax.Array]]:
    """The kernel's float32 constants (:data:`CONSTS`) and its six (bytes, table) slots,
    flattened: codes, zero points, scales, a two-level scale's scales, offsets, a
    two-level offset's scales (placeholders where absent)."""
    lay = q if isinstance(q, Layout) else layout_of(q)
    consts = [0.0] * len(CONSTS)
    consts[0] = _constant(lay.zero, 0.0)
    consts[1] = _constant(lay.offset, 0.0)
    slots: list[jax.Array] = []
    slots += _slot_arrays(lay.codes, form.codes, lay.table)
    slots += _slot_arrays(lay.zero, form.zero_point)
    for k, (part, f) in enumerate(((lay.scale, form.scale), (lay.offset, form.offset))):
        if isinstance(f, LevelSlots):
            assert isinstance(part, Level)
            consts[2 + 2 * k] = _constant(part.zero, 0.0)
            consts[3 + 2 * k] = _constant(part.offset, 0.0)
            slots += _slot_arrays(part.codes, f.codes, part.table)
            slots += _slot_arrays(part.scale, f.scales)
        else:
            slots += _slot_arrays(part, f)
            slots += _slot_arrays(None, None)
    return jnp.asarray(consts, jnp.float32), slots
