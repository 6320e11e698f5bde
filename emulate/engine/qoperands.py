"""A QArray's parts as the segment-wise contraction reads them (:mod:`emulate.scaled`).

- :func:`code_operand`: the codes as an :class:`Operand` of a format the plans know:
  codes of the 2- to 6-bit integer formats and integer codebooks as int8 values (every
  one fits), float codebooks as values of the table's own dtype; integer codes with zero
  points as the exact integers ``v - z`` (int8, bfloat16 or float32, whichever holds
  their range), so that no rounding sees ``v`` and ``z`` apart and the contraction's error
  is relative to ``|W|``, not to ``|v s| + |z s|``. The scales stay apart.
- :func:`with_flat_scales`: two-level scales and offsets (QArrays) combined into float32
  per-block arrays, a small array computed at call time.
- :func:`offset_coefficients`: per block, ``c = offset`` (``offset - zero_point * scale``
  for a codebook's zero points) in f32: with
  ``X`` the sum of the other operand's values over a segment, the segment contributes
  ``scale * sum(x * value) + c * X``, so zero points and offsets cost one product of a
  small (rows, segments) array with a (segments, columns) one, and the weight is never
  dequantized.
- :func:`without_perm`: an act-order QArray's permutation moved onto the other operand
  (``x @ W == x[..., perm] @ W_stored``) or onto the result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from emulate import formats
from emulate.engine.operands import Operand, OperandLike, operand
from emulate.numerics import codecs
from emulate.numerics.bits import times_pow2
from emulate.numerics.storage import Packed, to_codes, unpack_codes
from emulate.quantized.array import QArray
from emulate.quantized.checks import is_int
from emulate.quantized.values import (
    block_zero_points,
    broadcast_blocks,
    dequantize,
    element_values,
    inverse_permutation,
    offset_values,
    scale_values,
)

__all__ = [
    "bf16_exact",
    "code_operand",
    "offset_coefficients",
    "wide_values",
    "with_flat_scales",
    "without_perm",
    "zero_points_in_codes",
]


def zero_points_in_codes(q: QArray | None) -> bool:
    """Whether :func:`code_operand` subtracts ``q``'s zero points from its codes (integer
    codes without a codebook): the contraction then reads the exact integers ``v - z``, and
    :func:`offset_coefficients` leaves the zero points out."""
    if q is None or q.zero_points is None:
        return False
    return q.codebook is None and q.format.is_integer


def _range(x: Any) -> tuple[int, int]:
    """The least and greatest value of a zero-point part (an int, an integer array, Packed)."""
    if is_int(x):
        return int(x), int(x)
    name = x.format_name if isinstance(x, Packed) else np.dtype(x.dtype).name
    f = formats.get(name)
    return int(f.min), int(f.max)


def _minus_zero_points(q: QArray) -> Operand:
    """``v - z`` of every element, exact: int8 where the codes' and zero points' ranges
    keep it within int8, bfloat16 within +-256, float32 otherwise (every one exact)."""
    f = q.format
    zlo, zhi = _range(q.zero_points)
    lo, hi = int(f.min) - zhi, int(f.max) - zlo
    z = block_zero_points(q)
    assert z is not None  # zero_points_in_codes
    # small integers in f32: exact
    v = element_values(q.unpacked_codes(), f, None) - broadcast_blocks(z, q.block_shape, q.shape)
    if -128 <= lo and hi <= 127:
        return Operand(v.astype(jnp.int8), "int8")
    if -256 <= lo and hi <= 256:
        return Operand(v.astype(jnp.bfloat16), "bfloat16")
    return Operand(v, "float32")


def code_operand(q: QArray) -> Operand:
    """The codes of ``q`` as an Operand a plan contracts (see the module docstring)."""
    f = q.format
    c = q.codes
    if zero_points_in_codes(q):
        return _minus_zero_points(q)
    if q.codebook is not None:
        cb = q.codebook
        idx = codecs.decode(q.unpacked_codes(), f.name, to=jnp.int32)
        if cb.is_integer and cb.max_abs <= 127:
            return Operand(jnp.take(jnp.asarray(cb.array(), jnp.int8), idx, axis=0), "int8")
        if cb.dtype_name in formats.WIDE_FLOATS:
            table = jnp.asarray(cb.array())
            return Operand(jnp.take(table, idx, axis=0), cb.dtype_name)
        return Operand(element_values(q.unpacked_codes(), f, cb), "float32")
    if f.name in formats.CODE_FORMATS:
        codes = unpack_codes(c) if isinstance(c, Packed) else c
        return Operand(codecs.decode(codes, f.name, to=jnp.int8), "int8")
    if isinstance(c, Packed):
        return Operand(unpack_codes(c), q.format_name)
    if f.is_low_precision:
        return Operand(to_codes(c, f)[0], f.name)
    return Operand(jnp.asarray(c), f.name)


def with_flat_scales(q: QArray) -> QArray:
    """``q`` with two-level scales and offsets (QArrays) replaced by their float32 values
    per block; ``q`` itself when it has neither."""
    changes: dict[str, Any] = {}
    if isinstance(q.scales, QArray):
        changes.update(scales=scale_values(q), scale_format="float32")
    if isinstance(q.offsets, QArray):
        changes.update(offsets=offset_values(q))
    return dataclasses.replace(q, **changes) if changes else q


def offset_coefficients(q: QArray | None) -> jax.Array | None:
    """Per block, ``offset - zero_point * scale * tensor_scale * 2**element_exponent`` in
    float32 (each product and the difference rounded once); None for a QArray without
    zero points or offsets."""
    if q is None or not q.is_affine:
        return None
    z, o = block_zero_points(q), offset_values(q)
    if zero_points_in_codes(q):  # subtracted from the codes, exactly
        z = None
    if z is None and o is None:
        return None
    c = None
    if z is not None:
        m, e = q.scale_parts()
        c = -(times_pow2(z * m, e))
    if o is not None:
        c = o if c is None else o + c
    return c


def bf16_exact(q: QArray | None) -> bool:
    """Whether every value of ``q`` is exact in bfloat16: power-of-two (e8m0) scales, no
    tensor scale, no offsets, and every ``value - zero_point`` exact in bfloat16."""
    if q is None:
        return True
    if (
        q.scale_format != "float8_e8m0fnu"
        or isinstance(q.scales, QArray)
        or q.tensor_scale is not None
        or q.offsets is not None
    ):
        return False
    z = q.zero_points
    if z is not None and not is_int(z):
        return False
    z = int(z or 0)
    if q.codebook is not None:
        vals = np.asarray(q.codebook.values, np.float64) - z
        return bool(np.all(vals.astype(ml_dtypes.bfloat16).astype(np.float64) == vals))
    f = q.format
    if f.is_integer:
        return max(abs(f.min - z), abs(f.max - z)) <= 256
    return z == 0 and "bfloat16" in f.exact_in


def wide_values(x: Operand | QArray) -> jax.Array:
    """A QArray's values (bf16 where that is exact: :func:`bf16_exact`; f32 otherwise), or
    an operand's: a wide float as it is, a low-precision one decoded to bf16 where every
    value is exact in it, f32 otherwise."""
    if isinstance(x, QArray):
        return dequantize(x, to=jnp.bfloat16 if bf16_exact(x) else jnp.float32)
    f = x.format
    if not f.is_low_precision:
        return x.value
    to = jnp.bfloat16 if "bfloat16" in f.exact_in else jnp.float32
    return codecs.decode(x.unpacked(), f.name, to=to)


def _take_operand(x: Operand, idx: jax.Array, axis: int) -> Operand:
    """``x`` gathered along ``axis`` (codes are gathered as they are, unpacked)."""
    v = x.unpacked() if isinstance(x.value, Packed) else x.value
    return Operand(jnp.take(jnp.asarray(v), idx, axis=axis), x.format_name)


def without_perm(
    lhs: OperandLike | QArray,
    rhs: OperandLike | QArray,
    dimension_numbers: lax.DotDimensionNumbers,
) -> tuple[Any, Any, Callable[[jax.Array], jax.Array]]:
    """``(lhs, rhs, restore)`` with no permutation left on a QArray: a permuted
    contracting or batch axis gathers the other operand's paired axis by ``perm``; a
    permuted free or batch axis gathers the result's axis by the inverse (``restore``).
    A QArray paired with another QArray that has a permutation is dequantized instead.
    A permutation with leading stacked axes (QArrays stacked without ``vmap``) is not
    built: NotImplementedError."""
    (lc, rc), (lb, rb) = dimension_numbers
    ops = [lhs, rhs]
    nd = [len(x.shape) for x in ops]
    fixes: list[tuple[int, jax.Array]] = []  # (result axis, inverse permutation)
    for side in (0, 1):
        q = ops[side]
        if not isinstance(q, QArray) or q.perm is None:
            continue
        if q.perm.ndim != 1:
            raise NotImplementedError(
                f"{'lhs' if side == 0 else 'rhs'}: a QArray with one permutation per index "
                "of its leading axes is contracted under jax.vmap over those axes only"
            )
        assert q.perm_axis is not None
        d = q.perm_axis % nd[side]
        mine, theirs = (lc, rc) if side == 0 else (rc, lc)
        mine_b, theirs_b = (lb, rb) if side == 0 else (rb, lb)
        other = ops[1 - side]
        if d in mine or d in mine_b:
            pos = (mine.index(d), theirs) if d in mine else (mine_b.index(d), theirs_b)
            if isinstance(other, QArray):
                ops[side] = operand(
                    dequantize(q, to=jnp.float32), arg="lhs" if side == 0 else "rhs"
                )
                continue
            other_op = other if isinstance(other, Operand) else operand(other, arg="other")
            ops[1 - side] = _take_operand(other_op, q.perm, pos[1][pos[0]])
            if d in mine_b:
                fixes.append((mine_b.index(d), inverse_permutation(q.perm)))
        else:
            free = [a for a in range(nd[side]) if a not in mine and a not in mine_b]
            n_lfree = nd[0] - len(lc) - len(lb)
            out_axis = len(lb) + free.index(d) + (0 if side == 0 else n_lfree)
            fixes.append((out_axis, inverse_permutation(q.perm)))
        ops[side] = dataclasses.replace(q, perm=None, perm_axis=None)

    def restore(y: jax.Array) -> jax.Array:
        for axis, inv in fixes:
            y = jnp.take(y, inv, axis=axis)
        return y

    return ops[0], ops[1], restore
