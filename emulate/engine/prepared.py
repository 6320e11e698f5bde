"""A prepared weight, as the XLA route reads it back.

A kernel may keep a weight in its own layout, made once: :func:`emulate.prepare_weights`
(:func:`emulate.pallas.prepare_weight` / ``prepare_experts``) gives a
:class:`emulate.pallas.KernelQWeight` or :class:`emulate.pallas.KernelWeight`, the same
bytes with sub-byte codes in the K-planar layout. Every front end takes such a weight: the
kernel route reads it as it is (:mod:`emulate.routing`), and the XLA route reads it back
here, as the QArray or the codes it was prepared from. A prepared weight says how
(:class:`Prepared`: its own ``read_back``), so this module, on the XLA side, knows no
kernel; the validators (:func:`emulate.engine.args.dot_args`) keep the weight in the call
record beside its :func:`view`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, TypeGuard, runtime_checkable

import jax

from emulate.engine.operands import Operand
from emulate.numerics.storage import pack
from emulate.quantized.array import QArray
from emulate.quantized.layout import layout_of

__all__ = ["Prepared", "is_prepared", "unprepared", "view"]


@runtime_checkable
class Prepared(Protocol):
    """A weight prepared for a kernel (:class:`emulate.pallas.KernelQWeight`,
    :class:`emulate.pallas.KernelWeight`; stacked experts are one of them with a leading
    axis on every leaf, :func:`emulate.pallas.prepare_experts`).

    Attributes:
      format_name: the element format of its codes.
    """

    format_name: str

    def read_back(self) -> QArray | jax.Array:
        """What it was prepared from, as the XLA route reads it: a QArray (sub-byte codes
        one a byte), or a 2-D weight of plain codes as uint8 codes one a byte, (K, N), of
        :attr:`format_name`."""
        ...


def is_prepared(x: Any) -> TypeGuard[Prepared]:
    """Whether ``x`` is a prepared weight (:class:`Prepared`)."""
    return isinstance(x, Prepared)


def unprepared(x: Any) -> Any:
    """A prepared weight as the XLA route reads it: its QArray, or an Operand of its codes;
    stacked experts as the stacked QArray (sub-byte codes packed along K, as
    :func:`emulate.quantize` stores them) or Operand. Anything else as it is."""
    if not is_prepared(x):
        return x
    if len(jax.tree.leaves(x)[0].shape) > 2:  # stacked experts (prepare_experts): each
        q = jax.vmap(unprepared)(x)
        if isinstance(q, QArray) and layout_of(q).codes.packed_axis is None and q.format.bits < 8:
            # packed along K as emulate.quantize stores them: the XLA route's operand (a
            # float4 array in its tiled loop crashes XLA:CPU's elemental emitter, jax 0.10.2)
            q = dataclasses.replace(q, codes=pack(q.codes, axis=-2))
        return q
    back = x.read_back()
    return back if isinstance(back, QArray) else Operand(back, x.format_name)


def view(x: Any) -> Any:
    """A prepared weight's abstract :func:`unprepared` (shapes and dtypes only, nothing
    computed), for a validator's checks; anything else as it is."""
    return jax.eval_shape(unprepared, x) if is_prepared(x) else x
