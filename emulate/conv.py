"""Drop-in ``conv_general_dilated`` for operands of any format, on any target.

The same plans as :func:`emulate.dot_general`: a convolution is a contraction over the input
features and the window, ``K = in_features_per_group * prod(window)``. When the plan's
K-chunk is shorter than that, the input features are cut into slices whose sums stay
exact, and the slice results are combined exactly.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats
from emulate.engine import exact
from emulate.engine.contract import check_k, combine_chunk_sums, contract_decoded, finish
from emulate.engine.operands import (
    Operand,
    OperandLike,
    Precision,
    decode_to,
    describe,
    exact_inputs,
    hashable_precision,
    operand,
)
from emulate.engine.run import per_platform, plan_for
from emulate.formats import FormatLike
from emulate.planning.plan import Plan
from emulate.targets import TargetLike

__all__ = ["conv_general_dilated"]

_GATHER_TAPS = 64  # windows with more taps are cut into patches by gathers, not slices


def _tuple(x: Any) -> Any:
    if x is None or isinstance(x, str):
        return x
    return tuple(_tuple(v) if isinstance(v, (list, tuple)) else int(v) for v in x)


def conv_general_dilated(
    lhs: OperandLike,
    rhs: OperandLike,
    window_strides: Sequence[int],
    padding: str | Sequence[tuple[int, int]],
    lhs_dilation: Sequence[int] | None = None,
    rhs_dilation: Sequence[int] | None = None,
    dimension_numbers: lax.ConvGeneralDilatedDimensionNumbers = None,
    feature_group_count: int = 1,
    batch_group_count: int = 1,
    precision: Precision = None,
    preferred_element_type: FormatLike | None = None,
    *,
    target: TargetLike = None,
    mode: str | None = None,
    lhs_format: FormatLike | None = None,
    rhs_format: FormatLike | None = None,
) -> jax.Array:
    """``jax.lax.conv_general_dilated`` for operands of any format, on any target.

    Arguments as in ``lax.conv_general_dilated``; ``target``, ``mode`` and the formats as in
    :func:`emulate.dot_general`. The result dtype and the numerics contract are those of
    :func:`emulate.dot_general` with ``K = in_features_per_group * prod(window)``.

    Raises:
      ValueError: rank or feature-count mismatches (naming both operands and the target);
        an exact plan on a native sub-byte pair (int4) whose window alone exceeds the exact
        K-chunk, or that needs chunking with ``feature_group_count`` or
        ``batch_group_count`` above 1 (not built); a contraction beyond the plan's K limit.
    """
    a = operand(lhs, lhs_format, arg="lhs")
    b = operand(rhs, rhs_format, arg="rhs")
    where = describe(a, b, target)
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
    p = plan_for(a, b, target, preferred_element_type, mode)
    window = math.prod(b.shape[d] for d in dn.rhs_spec[2:])
    k = in_r * window
    chunked = p.k_chunk is not None and k > p.k_chunk
    # Patches, then a dot: mode "exact" by exponent slicing, and exact-class plans whose
    # chunks cannot be cut along the input features (groups, or a window longer than the
    # chunk) where the compute types can be moved as plain words.
    patched = p.slicing is not None or (
        chunked
        and (
            feature_group_count != 1
            or batch_group_count != 1
            or (p.k_chunk is not None and p.k_chunk < window)  # chunked: k_chunk is set
        )
        and {p.lhs_compute, p.rhs_compute} <= {"int8", "bfloat16", "float32"}
    )
    check_k(p, k)
    params = dict(
        window_strides=_tuple(window_strides),
        padding=_tuple(padding),
        lhs_dilation=_tuple(lhs_dilation),
        rhs_dilation=_tuple(rhs_dilation),
        dimension_numbers=dn,
        feature_group_count=int(feature_group_count),
        batch_group_count=int(batch_group_count),
        precision=hashable_precision(precision),
    )
    if patched:  # explicit pads and dilations: the patches are cut by hand
        ones = (1,) * (len(a.shape) - 2)
        params.update(
            window_strides=params["window_strides"] or ones,
            padding=_pads(a.shape, b.shape, dn, window_strides, padding, rhs_dilation),
            lhs_dilation=params["lhs_dilation"] or ones,
            rhs_dilation=params["rhs_dilation"] or ones,
        )
        return _run_sliced_conv(p, a, b, tuple(sorted(params.items())))
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
    return _run_conv(p, a, b, slice_features, tuple(sorted(params.items())))


@functools.partial(jax.jit, static_argnames=("p", "slice_features", "params"))
def _run_conv(p: Plan, lhs: Operand, rhs: Operand, slice_features, params) -> jax.Array:
    return per_platform(
        p, functools.partial(_conv, slice_features=slice_features, params=params), lhs, rhs
    )


def _conv(p: Plan, lhs: Operand, rhs: Operand, *, slice_features, params) -> jax.Array:
    kw = dict(params)
    dn = kw["dimension_numbers"]
    x = decode_to(lhs, p.lhs_compute, p.lhs_scale)
    w = decode_to(rhs, p.rhs_compute, p.rhs_scale)
    acc_dtype = jnp.dtype(p.accumulator)
    if slice_features is None:
        return finish(p, lax.conv_general_dilated(x, w, preferred_element_type=acc_dtype, **kw))
    n = x.shape[dn.lhs_spec[1]]
    partials = []
    for start in range(0, n, slice_features):
        stop = min(start + slice_features, n)
        xs = lax.slice_in_dim(x, start, stop, axis=dn.lhs_spec[1])
        ws = lax.slice_in_dim(w, start, stop, axis=dn.rhs_spec[1])
        partials.append(lax.conv_general_dilated(xs, ws, preferred_element_type=acc_dtype, **kw))
    return combine_chunk_sums(p, jnp.stack(partials), axis=0)


def _pads(lshape, rshape, dn, strides, padding, rhs_dilation) -> tuple[tuple[int, int], ...]:
    """Explicit (low, high) pads, as ``lax.conv_general_dilated`` resolves a padding string."""
    nsp = len(lshape) - 2
    if not isinstance(padding, str):
        return tuple((int(lo), int(hi)) for lo, hi in padding)
    rd = _tuple(rhs_dilation) or (1,) * nsp
    window = [(rshape[d] - 1) * r + 1 for d, r in zip(dn.rhs_spec[2:], rd, strict=True)]
    sizes = [lshape[d] for d in dn.lhs_spec[2:]]
    return tuple(
        (int(lo), int(hi))
        for lo, hi in lax.padtype_to_pads(sizes, window, _tuple(strides) or (1,) * nsp, padding)
    )


@functools.partial(jax.jit, static_argnames=("p", "params"))
def _run_sliced_conv(p: Plan, lhs: Operand, rhs: Operand, params) -> jax.Array:
    return per_platform(p, functools.partial(_sliced_conv, params=params), lhs, rhs)


def _sliced_conv(p: Plan, lhs: Operand, rhs: Operand, *, params) -> jax.Array:
    """The windows of the decoded input, moved as bits (no arithmetic, so nothing is
    flushed or rounded), contracted with the weights by :func:`emulate.engine.exact.contract`
    (mode "exact" by slicing) or as the plan's dot (chunked exact-class plans)."""
    kw = dict(params)
    dn = kw["dimension_numbers"]
    if p.slicing is not None:
        x, w = exact_inputs(lhs, rhs)
    else:
        x, w = (
            decode_to(lhs, p.lhs_compute, p.lhs_scale),
            decode_to(rhs, p.rhs_compute, p.rhs_scale),
        )
    x = jnp.transpose(x, dn.lhs_spec)  # (N, C, S...)
    w = jnp.transpose(w, dn.rhs_spec)  # (O, Cg, K...)
    patches = _patches(x, w.shape[2:], kw)  # (N, C, T, P...)
    out_spatial = patches.shape[3:]
    n, c, taps = patches.shape[:3]
    o = w.shape[0]
    g, bg = kw["feature_group_count"], kw["batch_group_count"]
    npos = math.prod(out_spatial)
    if bg > 1:  # lhs batch split into groups (group major), each with O / bg features
        xg = patches.reshape(bg, n // bg, c, taps, npos)
        xg = jnp.transpose(xg, (0, 1, 4, 2, 3)).reshape(bg, (n // bg) * npos, c * taps)
        wg = w.reshape(bg, o // bg, c * taps)
    else:  # input features split into g groups, each with O / g output features
        cg = c // g
        xg = patches.reshape(n, g, cg, taps, npos)
        xg = jnp.transpose(xg, (1, 0, 4, 2, 3)).reshape(g, n * npos, cg * taps)
        wg = w.reshape(g, o // g, cg * taps)
    dn3 = (((2,), (2,)), ((0,), (0,)))
    if p.slicing is not None:
        r = exact.contract(p, xg, wg, dn3, None)  # (groups, N' * P, O')
    else:
        r = contract_decoded(p, xg, wg, dn3, kw["precision"])
    groups = r.shape[0]
    r = r.reshape((groups, -1) + tuple(out_spatial) + (r.shape[-1],))
    nsp = len(out_spatial)
    # (groups, N', S..., O') -> (N', groups * O', S...), then the output's own layout
    r = jnp.transpose(r, (1, 0, nsp + 2) + tuple(range(2, nsp + 2)))
    r = r.reshape((r.shape[0], groups * r.shape[2]) + tuple(out_spatial))
    return jnp.transpose(r, tuple(int(i) for i in np.argsort(dn.out_spec)))


def _patches(x: jax.Array, window, kw) -> jax.Array:
    """(N, C, T, P...) windows of (N, C, S...) values, T the taps in row-major order."""
    uint = formats.unsigned_dtype(8 * x.dtype.itemsize).type
    bits = lax.bitcast_convert_type(x, uint)
    config = [(0, 0, 0), (0, 0, 0)] + [
        (lo, hi, d - 1) for (lo, hi), d in zip(kw["padding"], kw["lhs_dilation"], strict=True)
    ]
    bits = lax.pad(bits, uint(0), config)
    strides, rd = kw["window_strides"], kw["rhs_dilation"]
    out = [
        max(0, (size - (k - 1) * r - 1) // s + 1)
        for size, k, r, s in zip(bits.shape[2:], window, rd, strides, strict=True)
    ]
    if math.prod(window) > _GATHER_TAPS:  # a long window: one gather per spatial dimension
        for i, (o_, k_, r, st) in enumerate(zip(out, window, rd, strides, strict=True)):
            idx = np.arange(o_)[:, None] * st + np.arange(k_)[None, :] * r  # (o, k)
            bits = jnp.take(bits, jnp.asarray(idx, jnp.int32), axis=2 + 2 * i, mode="clip")
        nsp = len(window)  # (N, C, o1, k1, o2, k2, ...) -> (N, C, k1, k2, ..., o1, o2, ...)
        order = (0, 1) + tuple(3 + 2 * i for i in range(nsp)) + tuple(2 + 2 * i for i in range(nsp))
        bits = jnp.transpose(bits, order).reshape(bits.shape[:2] + (math.prod(window), *out))
        return lax.bitcast_convert_type(bits, x.dtype)
    taps = []
    for tap in np.ndindex(*window):
        start = [t * r for t, r in zip(tap, rd, strict=True)]
        if any(o_ == 0 for o_ in out):
            taps.append(jnp.zeros(bits.shape[:2] + tuple(out), uint))
            continue
        stop = [st + (o_ - 1) * s + 1 for st, o_, s in zip(start, out, strides, strict=True)]
        taps.append(lax.slice(bits, (0, 0, *start), (*bits.shape[:2], *stop), (1, 1, *strides)))
    if not taps:  # a window with no taps
        return jnp.zeros(bits.shape[:2] + (0, *out), x.dtype)
    return lax.bitcast_convert_type(jnp.stack(taps, axis=2), x.dtype)
