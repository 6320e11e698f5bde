"""The values of a quantized array: :func:`dequantize` and every reader of a part.

Each reader returns float32: :func:`element_values` (the codes' values, through a codebook
or the format's exact decoding), :func:`zero_point_values` and :func:`block_zero_points`,
:func:`scale_values` and :func:`scale_parts` (each block's scale, whole or as ``(m, e)``),
:func:`offset_values`, and :func:`unpermute` (act-order undone). :func:`broadcast_blocks`
repeats a per-block array over its blocks; :func:`block_factors` and
:func:`apply_block_factors` are the per-block steps :func:`dequantize` applies, in its order
of operations (:mod:`emulate.quantized.array`). The readers take a QArray (``q``); they
read its fields and know it by :func:`~emulate.quantized.checks.is_record`, so that the
record's own methods (:meth:`QArray.dequantize`, :meth:`QArray.scale_parts`) can call them.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from emulate import formats
from emulate.codebooks import Codebook
from emulate.numerics import codecs
from emulate.numerics.bits import frexp, pow2_normal
from emulate.numerics.scales import scale_frexp
from emulate.numerics.storage import Packed, unpack_codes
from emulate.quantized.checks import grid_shape, is_int, is_record

__all__ = [
    "apply_block_factors",
    "block_factors",
    "block_zero_points",
    "broadcast_blocks",
    "code_values",
    "dequantize",
    "element_values",
    "inverse_permutation",
    "offset_values",
    "scale_parts",
    "scale_values",
    "unpermute",
    "zero_point_values",
]


def broadcast_blocks(s: jax.Array, block: tuple[int, ...], shape: tuple[int, ...]) -> jax.Array:
    """Repeat a per-block array over its blocks and cut it to ``shape``.

    Each blocked axis is broadcast along a new axis beside it and merged with it: a
    broadcast and a reshape, which XLA fuses. ``jnp.repeat`` is a gather on XLA:TPU, whose
    result is written out (docs/performance.md, "Quantized weights from checkpoints")."""
    for d, b in enumerate(block):
        if b > 1:
            n = s.shape[d]
            s = jnp.expand_dims(s, d + 1)
            s = jnp.broadcast_to(s, s.shape[: d + 1] + (b,) + s.shape[d + 2 :])
            s = s.reshape(s.shape[:d] + (n * b,) + s.shape[d + 2 :])
    return s[tuple(slice(0, n) for n in shape)]


def inverse_permutation(perm: jax.Array) -> jax.Array:
    """``inv`` with ``inv[perm[j]] == j`` (along the last axis)."""
    n = perm.shape[-1]
    ar = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), perm.shape)
    return (
        jnp.zeros(perm.shape, jnp.int32).at[..., perm].set(ar)
        if perm.ndim == 1
        else (jnp.argsort(perm, axis=-1).astype(jnp.int32))
    )


def zero_point_values(zp: Any, grid: tuple[int, ...]) -> jax.Array | None:
    """The zero points as float32 per block (shape ``grid``), None for none. Exact for
    integers below 2**24 in magnitude."""
    if zp is None:
        return None
    if is_int(zp):
        return jnp.full(grid, float(zp), jnp.float32)
    if isinstance(zp, Packed):
        return codecs.decode(unpack_codes(zp), zp.format_name, to=jnp.float32)
    zp = jnp.asarray(zp)
    if zp.dtype.itemsize < 4 and zp.dtype.name not in ("int4", "uint4", "int2", "uint2"):
        return zp.astype(jnp.float32)
    return zp.astype(jnp.int32).astype(jnp.float32)


def element_values(codes: jax.Array, f: formats.Format, cb: Codebook | None) -> jax.Array:
    """The float32 value of every code: ``cb[code]`` with a codebook (unsigned codes), the
    format's exact decoding otherwise."""
    if cb is None:
        return codecs.decode(codes, f.name, to=jnp.float32)
    idx = codecs.decode(codes, f.name, to=jnp.int32)
    table = jnp.asarray(cb.array()).astype(jnp.float32)
    return jnp.take(table, idx, axis=0, mode="clip")


def scale_values(q: Any) -> jax.Array:
    """Each block's scale in float32 (a QArray of scales: its dequantized values)."""
    if is_record(q.scales):
        return _dequantize(q.scales, "float32")
    return codecs.decode(q.scales, q.scale_format, to=jnp.float32)


def offset_values(q: Any) -> jax.Array | None:
    """Each block's offset in float32 (shape of the scales), None without offsets."""
    off = q.offsets
    if off is None:
        return None
    grid = grid_shape(q.shape, q.block_shape)
    if isinstance(off, float):
        return jnp.full(grid, off, jnp.float32)
    if is_record(off):
        return _dequantize(off, "float32")
    return jnp.asarray(off).astype(jnp.float32)


def block_zero_points(q: Any) -> jax.Array | None:
    """Each block's zero point in float32 (shape of the scales), None without."""
    return zero_point_values(q.zero_points, grid_shape(q.shape, q.block_shape))


def scale_parts(q: Any) -> tuple[jax.Array, jax.Array]:
    """See :meth:`QArray.scale_parts`."""
    if is_record(q.scales):
        m, e = frexp(scale_values(q))
    else:  # from the bits: scales below 2**-126 (e8m0's 2**-127, f32 subnormals) survive
        m, e = scale_frexp(q.scales, q.scale_format)
    if q.tensor_scale is not None:
        mt, et = scale_frexp(jnp.asarray(q.tensor_scale, jnp.float32), "float32")
        m, e = m * mt, e + et
    if q.element_exponent:
        e = e + q.element_exponent
    return m, e


def code_values(q: Any) -> jax.Array:
    """``value(code) - zero_point`` of every element in float32, stored order (without
    ``2**element_exponent``, which :func:`scale_parts` carries)."""
    v = element_values(q.unpacked_codes(), q.format, q.codebook)
    return apply_block_factors(v, (block_zero_points(q), None, None, None, None), q.block_shape)


def unpermute(q: Any, v: jax.Array) -> jax.Array:
    """Values in stored order put back in logical order (``q.perm`` undone)."""
    if q.perm is None:
        return v
    assert q.perm_axis is not None
    inv = inverse_permutation(q.perm)
    if inv.ndim == 1:
        return jnp.take(v, inv, axis=q.perm_axis)
    # stacked QArrays: one permutation per index of the leading axes
    ax = v.ndim + q.perm_axis
    lead = inv.ndim - 1
    idx = inv.reshape(inv.shape + (1,) * (v.ndim - ax - 1))
    return jnp.take_along_axis(v, jnp.broadcast_to(idx, v.shape) if lead == ax else idx, axis=ax)


def dequantize(q: Any, to: DTypeLike | None = None) -> jax.Array:
    """The values of ``q`` (:mod:`emulate.quantized.array`): ``(value(code) - zero_point) * (scale *
    tensor_scale) + offset``, the product rounded once to f32 precision (exact for
    power-of-two scales), the sum once, values below 2**-126 flushed to zero as XLA does,
    in logical order (``perm`` undone), then cast to ``to`` (default ``q.dtype``). A NaN
    scale makes its whole block NaN."""
    if not is_record(q):
        raise TypeError(f"q: expected an emulate.QArray, got {type(q).__name__}")
    try:
        dt = q.dtype if to is None else np.dtype(to)
    except TypeError:
        raise TypeError(f"to: expected float32, bfloat16 or float16, got {to!r}") from None
    if dt.name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"to: expected float32, bfloat16 or float16, got {dt.name}")
    return _dequantize(q, dt.name)


def block_factors(q: Any) -> tuple[Any, ...]:
    """Per block, the f32 arrays :func:`apply_block_factors` applies: ``(zero point or None,
    m, 2**e1, 2**e2, offset or None)``, ``m * 2**(e1 + e2)`` the scale (:func:`scale_parts`);
    2**e as two normal powers of two of e's sign (e >= -252: below, every product underflows)."""
    m, e = scale_parts(q)
    e = jnp.maximum(e, -252)
    return block_zero_points(q), m, pow2_normal(e // 2), pow2_normal(e - e // 2), offset_values(q)


def apply_block_factors(v: jax.Array, factors: tuple, block: tuple[int, ...]) -> jax.Array:
    """``(v - z) * m * 2**e1 * 2**e2 + o`` per element in f32 (:func:`block_factors`, each
    broadcast over its ``block``; None: absent); ``v``: the codes' values, stored order."""
    for f, op in zip(factors, (jnp.subtract, jnp.multiply, jnp.multiply, jnp.multiply, jnp.add)):
        if f is not None:
            v = op(v, broadcast_blocks(f, block, v.shape))
    return v


@functools.partial(jax.jit, static_argnames=("to",))
def _dequantize(q: Any, to: str) -> jax.Array:
    v = element_values(q.unpacked_codes(), q.format, q.codebook)
    return unpermute(q, apply_block_factors(v, block_factors(q), q.block_shape)).astype(to)
