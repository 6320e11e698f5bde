"""Derivatives of the emulated contractions: the tangent of the plain f32 math.

Every emulated matmul or convolution is bilinear in the *values* of its operands, whatever
route computes it (decoded tiles, exponent slices, exact integer chunks, block scales).
Those routes read their operands through bit operations and integer arithmetic, which
have no derivative, so the routes themselves are not differentiated. :func:`bilinear`
gives a route JAX's rule for a bilinear primitive instead (``jax.custom_jvp``)::

    d(a . b) = da . b + a . db

with the same contraction (dimension numbers, or convolution parameters) applied to
operand values decoded exactly to float32 and tangents converted to float32, summed in
float32 and rounded once into the result's dtype. Every product and sum of the tangent is
an f32 x f32 contraction (native on every target); its accuracy is that of an f32 matmul
at the caller's precision, and it is not part of the exactness contract, which covers the
forward value. Reverse mode transposes this rule, so a cotangent reaches an operand as
``ct . b`` in float32, converted to the operand's own dtype (float8 operands get float8
cotangents, as ``jax.grad`` of ``lax.dot_general`` gives them).

Values are "as the dequantized math": for an :class:`emulate.QArray` the tangent of
``(value(codes) - zero_points) * scales * tensor_scale + offsets`` (codes of a float dtype
carry a tangent; integer, uint8 and Packed codes, zero points and codebooks do not; scales
and offsets that are QArrays carry their own parts' tangents). Integer operands have
none: their tangents are symbolic zeros (``float0``), as JAX gives them, and an integer
result has a ``float0`` tangent.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeAlias

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from emulate.engine.operands import Operand, decode_to
from emulate.numerics import codecs
from emulate.numerics.storage import Packed
from emulate.quantized.array import QArray
from emulate.quantized.values import broadcast_blocks, code_values, dequantize, unpermute

__all__ = ["Contract", "bilinear", "tangent_f32", "values_f32"]

#: The contraction of two float32 arrays, given the route's static arguments.
Contract: TypeAlias = Callable[[Any, jax.Array, jax.Array], jax.Array]
Route: TypeAlias = Callable[[Any, Any, Any], jax.Array]


def _zero(t: Any) -> bool:
    """Whether a tangent leaf is a zero that carries nothing (symbolic, float0 or absent)."""
    if t is None or isinstance(t, SymbolicZero):
        return True
    return np.dtype(t.dtype) == jax.dtypes.float0


def _differentiable(x: Any) -> bool:
    """Whether a code array can carry a tangent: a JAX float dtype, not packed bits."""
    return not isinstance(x, Packed) and jnp.issubdtype(x.dtype, jnp.inexact)


def values_f32(x: Operand | QArray) -> jax.Array:
    """The operand's values in float32: exact decoding of every format; a QArray's
    :func:`emulate.dequantize` values in f32."""
    if isinstance(x, QArray):
        return dequantize(x, to=jnp.float32)
    return decode_to(x, "float32", 0)


def _block_scales(q: QArray, tensor: bool = True) -> jax.Array:
    """Each block's ``scale * tensor_scale * 2**element_exponent`` in f32 (without the
    tensor scale: ``tensor=False``)."""
    if isinstance(q.scales, QArray):
        s = values_f32(q.scales)
    else:
        s = codecs.decode(q.scales, q.scale_format, to=jnp.float32)
    if tensor and q.tensor_scale is not None:
        s = s * jnp.asarray(q.tensor_scale, jnp.float32)
    return s * jnp.float32(2.0**q.element_exponent) if q.element_exponent else s


def _part_tangent(x: Any, t: Any) -> jax.Array | None:
    """The f32 tangent of a per-block part (an array, or a QArray of two-level scales or
    offsets) along ``t``; None where it carries none."""
    if isinstance(x, QArray):
        return tangent_f32(x, t)
    if x is None or isinstance(x, float) or _zero(t):
        return None
    return t.astype(jnp.float32)


def tangent_f32(x: Operand | QArray, t: Operand | QArray) -> jax.Array | None:
    """The float32 tangent of :func:`values_f32` along ``t`` (a tangent with ``x``'s tree
    structure), or None where it is zero. Linear in ``t``."""
    if isinstance(x, QArray):
        assert isinstance(t, QArray)
        parts = []
        block, shape = x.block_shape, x.shape
        if _differentiable(x.codes) and x.codebook is None and not _zero(t.codes):
            s = broadcast_blocks(_block_scales(x), block, shape)
            parts.append(t.codes.astype(jnp.float32) * s)
        codes = code_values(x)  # value - zero point, stored order
        ds = _part_tangent(x.scales, t.scales)
        if ds is not None:
            if x.tensor_scale is not None:
                ds = ds * jnp.asarray(x.tensor_scale, jnp.float32)
            if x.element_exponent:
                ds = ds * jnp.float32(2.0**x.element_exponent)
            parts.append(codes * broadcast_blocks(ds, block, shape))
        if x.tensor_scale is not None and not _zero(t.tensor_scale):
            s = broadcast_blocks(_block_scales(x, tensor=False), block, shape)
            parts.append(codes * s * t.tensor_scale.astype(jnp.float32))
        do = _part_tangent(x.offsets, t.offsets)
        if do is not None:
            parts.append(broadcast_blocks(do, block, shape))
        return unpermute(x, sum(parts[1:], parts[0])) if parts else None
    assert isinstance(t, Operand)
    if not _differentiable(x.value) or _zero(t.value):
        return None
    return t.value.astype(jnp.float32)


def bilinear(route: Route, contract: Contract) -> Route:
    """``route(static, lhs, rhs)`` made differentiable as a bilinear map.

    Args:
      route: computes the emulated result from hashable static arguments and two
        operands (:class:`~emulate.engine.operands.Operand` or :class:`emulate.QArray`).
      contract: ``contract(static, a, b)``, the same contraction on float32 arrays with a
        float32 result (``lax.dot_general`` or ``lax.conv_general_dilated`` with the
        route's dimension numbers and ``preferred_element_type=float32``).

    ``static`` must be hashable (it is a static argument of the tangent's jitted program).
    Call ``route``'s own jitted program inside ``route``: under ``grad`` the forward then
    reuses its compiled program instead of compiling a linearized copy of it.

    Returns:
      A function with ``route``'s signature and forward values, whose JVP (and so, by
      transposition, VJP) is ``contract(da, b) + contract(a, db)`` in float32, rounded
      once into the result's dtype (module docstring). Batching (``vmap``) runs ``route``.
    """
    f = jax.custom_jvp(route, nondiff_argnums=(0,))

    def jvp(static: Any, primals: tuple[Any, Any], tangents: tuple[Any, Any]):
        lhs, rhs = primals
        out = f(static, lhs, rhs)
        if not jnp.issubdtype(out.dtype, jnp.inexact):
            return out, np.zeros(out.shape, jax.dtypes.float0)
        tl, tr = (
            jax.tree_util.tree_map(
                lambda v: None if _zero(v) else v, t, is_leaf=lambda v: isinstance(v, SymbolicZero)
            )
            for t in tangents
        )
        t = _tangent(contract, static, lhs, rhs, tl, tr)
        if t is None:
            return out, jnp.zeros(out.shape, out.dtype)
        return out, t.astype(out.dtype)

    f.defjvp(jvp, symbolic_zeros=True)

    def call(static: Any, lhs: Any, rhs: Any) -> jax.Array:
        # Concrete operands cannot be differentiated: skip custom_jvp's eager dispatch,
        # which costs more than a small jitted call.
        if not any(isinstance(v, jax.core.Tracer) for v in jax.tree_util.tree_leaves((lhs, rhs))):
            return route(static, lhs, rhs)
        return f(static, lhs, rhs)

    return call


@functools.partial(jax.jit, static_argnums=(0, 1))
def _tangent(contract: Contract, static: Any, lhs: Any, rhs: Any, tl: Any, tr: Any):
    """``contract(da, b) + contract(a, db)`` in f32, None where both tangents are zero (one
    jitted program: the route's own forward program is not compiled again under ``grad``)."""
    da, db = tangent_f32(lhs, tl), tangent_f32(rhs, tr)
    terms = []
    if da is not None:
        terms.append(contract(static, da, values_f32(rhs)))
    if db is not None:
        terms.append(contract(static, values_f32(lhs), db))
    if not terms:
        return None
    return terms[0] if len(terms) == 1 else terms[0] + terms[1]
