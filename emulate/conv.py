"""Drop-in ``conv_general_dilated`` for operands of any format, on any target.

The same plans as :mod:`emulate.dot`: a convolution is a contraction over the input
features and the window, ``K = in_features_per_group * prod(window)``. When the plan's
K-chunk is shorter than that, the input features are cut into slices whose sums stay
exact, and the slice results are combined exactly.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from emulate import accumulate
from emulate.dot import (
    Operand,
    _compute,
    _describe,
    _hashable,
    _plan_for,
    check_k,
    finish,
    operand,
    per_platform,
)
from emulate.plan import Plan

__all__ = ["conv_general_dilated"]


def _tuple(x: Any) -> Any:
    if x is None or isinstance(x, str):
        return x
    return tuple(_tuple(v) if isinstance(v, (list, tuple)) else int(v) for v in x)


def conv_general_dilated(
    lhs: Any,
    rhs: Any,
    window_strides: Any,
    padding: Any,
    lhs_dilation: Any = None,
    rhs_dilation: Any = None,
    dimension_numbers: Any = None,
    feature_group_count: int = 1,
    batch_group_count: int = 1,
    precision: Any = None,
    preferred_element_type: Any = None,
    *,
    target: Any = None,
    mode: str = "fast",
    lhs_format: Any = None,
    rhs_format: Any = None,
) -> jax.Array:
    """``jax.lax.conv_general_dilated`` for operands of any format, on any target.

    Arguments as in ``lax.conv_general_dilated``; ``target``, ``mode`` and the formats as in
    :func:`emulate.dot_general`. The result dtype and the numerics contract are those of
    :func:`emulate.dot_general` with ``K = in_features_per_group * prod(window)``.

    Raises:
      ValueError: rank or feature-count mismatches (naming both operands and the target);
        an exact plan whose window alone exceeds the exact K-chunk, or that needs chunking
        with ``feature_group_count`` or ``batch_group_count`` above 1 (not built).
    """
    a = operand(lhs, lhs_format, arg="lhs")
    b = operand(rhs, rhs_format, arg="rhs")
    where = _describe(a, b, target)
    if len(a.shape) != len(b.shape) or len(a.shape) < 3:
        raise ValueError(f"lhs, rhs: convolution operands need the same rank, at least 3; {where}")
    dn = lax.conv_dimension_numbers(a.shape, b.shape, dimension_numbers)
    in_l = a.shape[dn.lhs_spec[1]]
    in_r = b.shape[dn.rhs_spec[1]]
    if in_l != in_r * feature_group_count:
        raise ValueError(
            f"lhs, rhs: lhs has {in_l} input features, rhs expects {in_r} x "
            f"feature_group_count {feature_group_count}; {where}"
        )
    p = _plan_for(a, b, target, preferred_element_type, mode)
    if p.slicing is not None:
        raise NotImplementedError(
            f"mode='exact' convolution of {p.lhs} x {p.rhs} is not built yet (dot_general, "
            "matmul and einsum have it); use mode='fast'"
        )
    window = math.prod(b.shape[d] for d in dn.rhs_spec[2:])
    k = in_r * window
    check_k(p, k)
    slice_features = None
    if p.k_chunk is not None and k > p.k_chunk:
        if feature_group_count != 1 or batch_group_count != 1:
            raise ValueError(
                f"feature_group_count: an exact {p.lhs} x {p.rhs} convolution with K = {k} "
                f"needs chunking, which is not built for grouped convolutions; {where}"
            )
        slice_features = p.k_chunk // window
        if slice_features == 0:
            raise ValueError(
                f"rhs: the window ({window} taps) alone exceeds the exact K-chunk "
                f"{p.k_chunk} of {p.lhs} x {p.rhs}; {where}"
            )
    params = dict(
        window_strides=_tuple(window_strides),
        padding=_tuple(padding),
        lhs_dilation=_tuple(lhs_dilation),
        rhs_dilation=_tuple(rhs_dilation),
        dimension_numbers=dn,
        feature_group_count=int(feature_group_count),
        batch_group_count=int(batch_group_count),
        precision=_hashable(precision),
    )
    return _run_conv(p, a, b, slice_features, tuple(sorted(params.items())))


@functools.partial(jax.jit, static_argnames=("p", "slice_features", "params"))
def _run_conv(p: Plan, lhs: Operand, rhs: Operand, slice_features, params) -> jax.Array:
    return per_platform(
        p, functools.partial(_conv, slice_features=slice_features, params=params), lhs, rhs
    )


def _conv(p: Plan, lhs: Operand, rhs: Operand, *, slice_features, params) -> jax.Array:
    kw = dict(params)
    dn = kw["dimension_numbers"]
    x = _compute(lhs, p.lhs_compute, p.lhs_scale)
    w = _compute(rhs, p.rhs_compute, p.rhs_scale)
    acc_dtype = jnp.dtype(p.accumulator)
    scale = p.lhs_scale + p.rhs_scale
    if slice_features is None:
        return finish(p, lax.conv_general_dilated(x, w, preferred_element_type=acc_dtype, **kw))
    n = x.shape[dn.lhs_spec[1]]
    partials = []
    for start in range(0, n, slice_features):
        stop = min(start + slice_features, n)
        xs = lax.slice_in_dim(x, start, stop, axis=dn.lhs_spec[1])
        ws = lax.slice_in_dim(w, start, stop, axis=dn.rhs_spec[1])
        part = lax.conv_general_dilated(xs, ws, preferred_element_type=acc_dtype, **kw)
        if part.dtype != jnp.int32:
            part = (part * jnp.float32(2.0**scale)).astype(jnp.int32)
        partials.append(part)
    hi, lo = accumulate.combine_chunks(jnp.stack(partials), axis=0)
    return accumulate.round_limbs(hi, lo, scale, p.out)
