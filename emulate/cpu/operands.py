"""The arrays the CPU kernel reads, as named records: a :class:`Weight` of
:class:`StoredBytes` parts and :class:`Factor` s, built once from a QArray and its
:class:`~emulate.cpu.form.Form` (:func:`weight_operands`), flattened into XLA's FFI
operands in one order (:func:`wire`, positions :class:`Arg`) and rebuilt from the call
frame once, by the handler (:func:`emulate.cpu.handler.handler`). The kernels read every
part by its role (``weight.scale.stored``), never by position. Plain JAX: the records are
NamedTuples, which numba's compiled code takes as they are.

Every stored part travels as two operands: its raw bytes, as XLA holds the array (no
bitcast: an int8-to-uint8 bitcast made XLA copy 62 MB), read by the kernel as a 2-D
uint8 array; and, for :attr:`~emulate.cpu.form.Kind.TABLE` slots, the float32 value of
every code (what ``dequantize`` gives), else a one-element placeholder. Absent parts are
placeholders too. The constants (a constant factor's value, a two-level part's zero
point and offset, the tensor scale) travel in one float32 vector (:data:`CONSTANTS`).
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from emulate.cpu.form import FactorForm, Form, Kind, LevelSlots, Slot
from emulate.quantized.array import QArray
from emulate.quantized.layout import Constant, Layout, Level, Stored, layout_of
from emulate.quantized.values import element_values

__all__ = [
    "CONSTANTS",
    "Arg",
    "Factor",
    "StoredBytes",
    "Weight",
    "byte_widths",
    "weight_operands",
    "wire",
]


class StoredBytes(NamedTuple):
    """One stored array: ``data`` its bytes (the kernel's view: 2-D uint8; the JAX side:
    the array as stored), ``table`` the float32 value of each code (TABLE slots; else a
    placeholder)."""

    data: Any
    table: Any


class Factor(NamedTuple):
    """One of a weight's block factors (zero point, scale or offset) as the kernel reads it
    (:class:`~emulate.cpu.form.FactorForm` says which fields serve): ``stored`` a stored
    factor, or a two-level part's codes; ``level_scales`` a two-level part's scales;
    ``zero_point`` a two-level part's constant zero point; ``constant`` a constant
    factor's value, or a two-level part's constant offset (float32; 0 where unused)."""

    stored: StoredBytes
    level_scales: StoredBytes
    zero_point: Any
    constant: Any


class Weight(NamedTuple):
    """A QArray weight's parts as the kernel reads them (``tensor``: the tensor scale,
    float32, 1 where the QArray has none)."""

    codes: StoredBytes
    zero_point: Factor
    scale: Factor
    offset: Factor
    tensor: Any


class Arg(enum.IntEnum):
    """The kernel's FFI operands by position (:func:`wire`); a stored part is two operands:
    its bytes at its position, its table after them. The one result is ``out``."""

    X = 0  #: (M, K) float32 activations
    XE = 1  #: x's columns in planes (:func:`emulate.cpu.gemv.kernel`), else (M, 1)
    XSUM = 2  #: (M, blocks along K) block sums of x where the weight has offsets
    CONSTANTS = 3  #: float32 (7,): :data:`CONSTANTS`
    CODES = 4
    ZERO_POINT = 6
    ZERO_POINT_SCALES = 8  #: a placeholder: zero points have no two-level form
    SCALE = 10
    SCALE_SCALES = 12
    OFFSET = 14
    OFFSET_SCALES = 16


#: The float32 constants' order: each factor's (zero point, constant) in
#: :class:`Weight`'s order, then the tensor scale.
CONSTANTS = (
    *(f"{factor}.{c}" for factor in Weight._fields[1:4] for c in Factor._fields[2:]),
    "tensor",
)

_NO_BYTES = np.zeros((1, 1), np.uint8)
_NO_TABLE = np.zeros((1,), np.float32)


def _absent() -> StoredBytes:
    return StoredBytes(jnp.asarray(_NO_BYTES), jnp.asarray(_NO_TABLE))


def _table(slot: Slot, fmt: Any, codebook: Any) -> jax.Array:
    """The value of every code (``element_values``: what ``dequantize`` gives)."""
    if slot.kind != Kind.TABLE:
        return jnp.asarray(_NO_TABLE)
    return element_values(jnp.arange(1 << slot.bits, dtype=jnp.uint8), fmt, codebook)


def _stored(part: Stored | None, slot: Any, codebook: Any = None) -> StoredBytes:
    """``part`` as :class:`StoredBytes` (a placeholder where ``slot`` is no :class:`Slot`:
    the part is absent, constant or two-level)."""
    if part is None or not isinstance(slot, Slot):
        return _absent()
    fmt = part.format if slot.kind == Kind.TABLE else None
    return StoredBytes(jnp.asarray(part.data), _table(slot, fmt, codebook))


def _constant(part: Any) -> float:
    return float(part.value) if isinstance(part, Constant) else 0.0


def _factor(part: Constant | Stored | Level | None, form: FactorForm) -> Factor:
    if isinstance(form, LevelSlots):
        assert isinstance(part, Level)
        return Factor(
            _stored(part.codes, form.codes, part.table),
            _stored(part.scale, form.scales),  # type: ignore[arg-type]
            _constant(part.zero),
            _constant(part.offset),
        )
    stored = _stored(part, form) if isinstance(part, Stored) else _absent()
    return Factor(stored, _absent(), 0.0, _constant(part))


def weight_operands(q: QArray | Layout, form: Form) -> Weight:
    """``q``'s parts (a QArray or its :class:`~emulate.quantized.layout.Layout`) as the
    kernel of ``form`` reads them (``form``: from :func:`emulate.cpu.form.weight_form`)."""
    lay = q if isinstance(q, Layout) else layout_of(q)
    tensor = 1.0 if lay.tensor is None else lay.tensor.array
    return Weight(
        _stored(lay.codes, form.codes, lay.table),
        _factor(lay.zero, form.zero_point),
        _factor(lay.scale, form.scale),
        _factor(lay.offset, form.offset),
        jnp.asarray(tensor, jnp.float32),
    )


def wire(x: jax.Array, xe: jax.Array, xsum: jax.Array, weight: Weight) -> list[jax.Array]:
    """The FFI operands in :class:`Arg`'s order."""
    factors = (weight.zero_point, weight.scale, weight.offset)
    numbers = [c for f in factors for c in (f.zero_point, f.constant)] + [weight.tensor]
    constants = jnp.stack([jnp.asarray(c, jnp.float32) for c in numbers])
    parts = [weight.codes] + [s for f in factors for s in (f.stored, f.level_scales)]
    return [x, xe, xsum, constants] + [a for p in parts for a in p]


def _width(form: FactorForm, scales: bool = False) -> int:
    if isinstance(form, LevelSlots):
        form = form.scales if scales else form.codes
    elif scales:
        return 1
    return form.width if isinstance(form, Slot) else 1


def byte_widths(form: Form) -> tuple[int, ...]:
    """The bytes an element of each stored part takes, in :func:`wire`'s order (codes,
    then each factor's stored array and scales): the kernel reads every part as bytes."""
    factors = (form.zero_point, form.scale, form.offset)
    return (form.codes.width, *(w for f in factors for w in (_width(f), _width(f, True))))
