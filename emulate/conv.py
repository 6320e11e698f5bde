"""Drop-in ``conv_general_dilated`` for operands of any format, on any target.

The same plans as :func:`emulate.dot_general`: a convolution is a contraction over the input
features and the window, ``K = in_features_per_group * prod(window)``. When the plan's
K-chunk is shorter than that, the input features are cut into slices whose sums stay
exact, and the slice results are combined exactly.

Gradients (both modes): ``lax.conv_general_dilated``'s, computed as float32 convolutions
of the exactly decoded operands and their tangents with the same parameters
(:mod:`emulate.engine.grad`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats, moved
from emulate.engine import args, conv_args, exact, front, grad, sites
from emulate.engine.contract import check_k, combine_chunk_sums, contract_decoded, finish
from emulate.engine.operands import (
    Operand,
    OperandLike,
    Precision,
    decode_to,
    describe,
    exact_inputs,
    operand,
)
from emulate.engine.out_sharding import resharded
from emulate.engine.run import per_platform, plan_for
from emulate.formats import FormatLike
from emulate.numerics import accumulate
from emulate.numerics.bits import times_pow2
from emulate.planning.plan import Plan
from emulate.quantized.array import QArray
from emulate.quantized.layout import layout_of
from emulate.quantized.values import broadcast_blocks, dequantize
from emulate.targets import TargetLike

__all__ = ["GATHER_TAPS", "conv_general_dilated"]

#: Windows with more taps than this are cut into patches by gathers rather than slices (read
#: at each call, and part of the compiled program's key: a change takes effect at once).
GATHER_TAPS = 64


def conv_general_dilated(
    lhs: OperandLike,
    rhs: OperandLike | QArray,
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
    out_sharding: Any = None,
) -> jax.Array:
    """``jax.lax.conv_general_dilated`` for operands of any format, on any target.

    Arguments as in ``lax.conv_general_dilated``; ``target``, ``mode`` and the formats as in
    :func:`emulate.dot_general`. A call that needs no emulation (the rule of
    :func:`emulate.dot_general`) goes to ``lax.conv_general_dilated`` unchanged; otherwise
    the result dtype and the numerics contract are those of :func:`emulate.dot_general`
    with ``K = in_features_per_group * prod(window)``, and an emulated result is resharded
    to ``out_sharding``. Rank-2 operands (no spatial dimensions) are a dot over the input
    features, as in JAX. Gradients are those of ``lax.conv_general_dilated`` (float32
    convolutions of the decoded operands, both modes; a QArray kernel's codes and scales
    get zero gradients, not built yet).

    ``rhs`` may be an :class:`emulate.QArray` (quantized kernel weights). Scales that do not
    change along the input features and the window (per output channel, per tensor):
    the codes are convolved by their own plan with an f32 accumulator, multiplied by
    their output channel's scale in f32 and rounded once into the result type. Scales
    that change along them (blocks along the input features): mode "fast" convolves the
    dequantized values (bf16 where exact, f32 at ``Precision.HIGHEST`` otherwise) with
    an f32 accumulator; mode "exact" gives the dequantized values to mode "exact". The
    result type is the type both operands promote to (``lax.conv_general_dilated`` takes one
    dtype; :func:`emulate.formats.promoted`, as flax's Conv promotes them), for a kernel of
    the QArray's ``dtype``.
    Either way the f32 sum is within ``gamma_(K + 4) * sum|a*b|`` of the exact sum over
    the dequantized values (plus the underflow term of :mod:`emulate.bounds`).

    Raises:
      TypeError: ``window_strides`` or a dilation that is not a sequence of ints (as lax).
      ValueError: strides or dilations below 1, a padding that is no padding string or
        (low, high) pairs (an unknown string raises
        :class:`emulate.engine.conv_args.PaddingError`, also a RuntimeError as in lax), rank or
        feature-count mismatches (naming both operands and the target);
        an exact plan on a native sub-byte pair (int4) whose window alone exceeds the exact
        K-chunk, or that needs chunking with ``feature_group_count`` or
        ``batch_group_count`` above 1 (not built); a contraction beyond the plan's K limit.
    """
    return front.call(_DOOR, locals())


def _plain_conv(a: Mapping[str, Any]) -> jax.Array:
    """A call that goes to ``lax.conv_general_dilated`` (plain arrays: passes_through
    checked them), after emulate's messages for a type that is none and for the
    parameters (with lax's exception types)."""
    args.preferred(a["preferred_element_type"])
    lhs, rhs = a["lhs"], a["rhs"]
    params = {name: a[name] for name in _LAX_PARAMS}
    nd = min(np.ndim(lhs), np.ndim(rhs))
    if nd >= 2:
        conv_args.check_conv_params(
            nd - 2,
            *(params[name] for name in _LAX_PARAMS if name != "dimension_numbers"),
            where=f"lhs {np.shape(lhs)}, rhs {np.shape(rhs)}",
        )
    return lax.conv_general_dilated(
        lhs, rhs, **params, precision=a["precision"],
        preferred_element_type=a["preferred_element_type"], out_sharding=a["out_sharding"],
    )  # fmt: skip


#: ``lax.conv_general_dilated``'s parameters between the operands and ``precision``;
#: without ``dimension_numbers``, :func:`emulate.engine.conv_args.check_conv_params`' order.
_LAX_PARAMS = (
    "window_strides",
    "padding",
    "lhs_dilation",
    "rhs_dilation",
    "dimension_numbers",
    "feature_group_count",
    "batch_group_count",
)


def _validated_conv(call: conv_args.ConvArgs) -> jax.Array:
    """Run a validated call: a QArray kernel by its scales' rule, others by their plan."""
    with sites.scope(call.tag()):
        if isinstance(call.rhs, QArray):
            out = _qarray_conv(call, call.lhs, call.rhs)
        else:
            out = _emulated_conv(call, call.lhs, call.rhs)
    return resharded(out, call.out_sharding)


_DOOR = front.FrontDoor(_plain_conv, conv_args.conv_args, _validated_conv)


def _emulated_conv(call: conv_args.ConvArgs, a: Operand, b: Operand) -> jax.Array:
    """The convolution of two validated operands by their plan."""
    where = describe(a, b, call.target)
    p = plan_for(a, b, call.target, call.result, call.mode)
    window, k = call.window, call.k
    g, bg = call.feature_group_count, call.batch_group_count
    chunked = p.k_chunk is not None and k > p.k_chunk
    # Patches, then a dot: mode "exact" by exponent slicing, and exact-class plans whose
    # chunks cannot be cut along the input features (groups, or a window longer than the
    # chunk) where the compute types can be moved as plain words.
    patched = p.slicing is not None or (
        chunked
        and (g != 1 or bg != 1 or (p.k_chunk is not None and p.k_chunk < window))
        and {p.lhs_compute, p.rhs_compute} <= {"int8", "bfloat16", "float32"}
    )
    check_k(p, k)
    params = dict(call.lax_params(), precision=call.precision)
    if patched:  # explicit pads and dilations: the patches are cut by hand
        ones = (1,) * (len(a.shape) - 2)
        params.update(
            padding=_pads(a.shape, b.shape, call),
            lhs_dilation=call.lhs_dilation or ones,
            rhs_dilation=call.rhs_dilation or ones,
        )
        out = _differentiable_conv((p, True, None, tuple(sorted(params.items()))), a, b)
        return out if call.wrap_to is None else out.astype(call.wrap_to)
    slice_features = None
    if chunked:
        if g != 1 or bg != 1:
            raise ValueError(
                f"feature_group_count: an exact {p.lhs} x {p.rhs} convolution with K = {k} "
                f"needs chunking, which is not built for grouped convolutions; {where}"
            )
        assert p.k_chunk is not None  # chunked
        slice_features = p.k_chunk // window
        if slice_features == 0:
            raise ValueError(
                f"rhs: the window ({window} taps) alone exceeds the exact K-chunk "
                f"{p.k_chunk} of {p.lhs} x {p.rhs}; {where}"
            )
    out = _differentiable_conv((p, False, slice_features, tuple(sorted(params.items()))), a, b)
    return out if call.wrap_to is None else out.astype(call.wrap_to)


def _route(static: tuple, lhs: Operand, rhs: Operand) -> jax.Array:
    p, patched, slice_features, params = static
    if patched:
        return _run_sliced_conv(p, lhs, rhs, params, GATHER_TAPS)
    return _run_conv(p, lhs, rhs, slice_features, params)


def _contract_f32(static: tuple, x: jax.Array, w: jax.Array) -> jax.Array:
    return lax.conv_general_dilated(x, w, preferred_element_type=jnp.float32, **dict(static[3]))


# Differentiable as lax.conv_general_dilated is (emulate.engine.grad).
_differentiable_conv = grad.bilinear(_route, _contract_f32)


def _qarray_conv(call: conv_args.ConvArgs, a: Operand, q: QArray) -> jax.Array:
    """:func:`conv_general_dilated` with a QArray kernel (see its docstring)."""
    mode, precision, out = call.mode, call.precision, call.result
    dn = call.dimension_numbers
    kw = dict(call.lax_params(), target=call.target)
    o = dn.rhs_spec[0]
    per_channel = all(q.block_shape[d] >= q.shape[d] for d in range(len(q.shape)) if d != o)
    if mode == "exact" or not per_channel or not q.is_plain:
        exact_bf16 = (
            mode == "fast"
            and a.format_name == "bfloat16"
            and q.scale_format == "float8_e8m0fnu"
            and layout_of(q).tensor is None
            and (q.format.is_integer or "bfloat16" in q.format.exact_in)
        )
        values = dequantize(q, to=jnp.bfloat16 if exact_bf16 else jnp.float32)
        if values.dtype == jnp.float32:
            precision = lax.Precision.HIGHEST  # a TPU's default would round f32 to bf16
        return conv_general_dilated(
            a, values, precision=precision, preferred_element_type=out, mode=mode, **kw
        )
    packed = layout_of(q).codes.packed_axis is not None
    codes = q.codes if packed else operand(q.codes, q.format_name, arg="rhs")
    acc = conv_general_dilated(
        a, codes, precision=precision, preferred_element_type="float32", mode="fast", **kw
    )
    return _scale_output_channels(acc, q, o, dn.out_spec[1], out)


@functools.partial(jax.jit, static_argnames=("o", "out_axis", "out"))
def _scale_output_channels(acc: jax.Array, q: QArray, o: int, out_axis: int, out: str):
    """Multiply each output channel of an f32 convolution by its scale (``m * 2**e``) and
    round once into ``out``."""
    n = q.shape[o]
    shape = [1] * acc.ndim
    shape[out_axis] = n
    m, e = (
        broadcast_blocks(jnp.moveaxis(v, o, 0).reshape(-1), (q.block_shape[o],), (n,)).reshape(
            shape
        )
        for v in q.scale_parts()
    )
    acc = times_pow2(acc * m, e)
    return accumulate.round_accumulator(acc, out)


@functools.partial(jax.jit, static_argnames=("p", "slice_features", "params"))
def _run_conv(p: Plan, lhs: Operand, rhs: Operand, slice_features, params) -> jax.Array:
    return per_platform(
        p, functools.partial(_conv, slice_features=slice_features, params=params), lhs, rhs
    )


def _conv(p: Plan, lhs: Operand, rhs: Operand, *, slice_features, params) -> jax.Array:
    kw = dict(params)
    dn = kw["dimension_numbers"]
    x = decode_to(lhs, p.lhs_compute, p.lhs_scale, target=p.target)
    w = decode_to(rhs, p.rhs_compute, p.rhs_scale, target=p.target)
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


def _pads(
    lshape: tuple[int, ...], rshape: tuple[int, ...], call: conv_args.ConvArgs
) -> tuple[tuple[int, int], ...]:
    """Explicit (low, high) pads, as ``lax.conv_general_dilated`` resolves a padding string."""
    if not isinstance(call.padding, str):
        return call.padding
    dn = call.dimension_numbers
    rd = call.rhs_dilation or (1,) * (len(lshape) - 2)
    window = [(rshape[d] - 1) * r + 1 for d, r in zip(dn.rhs_spec[2:], rd, strict=True)]
    sizes = [lshape[d] for d in dn.lhs_spec[2:]]
    pads = lax.padtype_to_pads(sizes, window, call.window_strides, call.padding)
    return tuple((int(lo), int(hi)) for lo, hi in pads)


@functools.partial(jax.jit, static_argnames=("p", "params", "gather_taps"))
def _run_sliced_conv(p: Plan, lhs: Operand, rhs: Operand, params, gather_taps: int) -> jax.Array:
    run = functools.partial(_sliced_conv, params=params, gather_taps=gather_taps)
    return per_platform(p, run, lhs, rhs)


def _sliced_conv(p: Plan, lhs: Operand, rhs: Operand, *, params, gather_taps: int) -> jax.Array:
    """The windows of the decoded input, moved as bits (no arithmetic, so nothing is
    flushed or rounded), contracted with the weights by :func:`emulate.engine.exact.contract`
    (mode "exact" by slicing) or as the plan's dot (chunked exact-class plans)."""
    kw = dict(params)
    dn = kw["dimension_numbers"]
    if p.slicing is not None:
        x, w = exact_inputs(lhs, rhs)
    else:
        x, w = (
            decode_to(lhs, p.lhs_compute, p.lhs_scale, target=p.target),
            decode_to(rhs, p.rhs_compute, p.rhs_scale, target=p.target),
        )
    x = jnp.transpose(x, dn.lhs_spec)  # (N, C, S...)
    w = jnp.transpose(w, dn.rhs_spec)  # (O, Cg, K...)
    patches = _patches(x, w.shape[2:], kw, gather_taps)  # (N, C, T, P...)
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


def _patches(x: jax.Array, window, kw, gather_taps: int) -> jax.Array:
    """(N, C, T, P...) windows of (N, C, S...) values, T the taps in row-major order; by
    gathers for a window of more than ``gather_taps`` taps, else by slices."""
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
    if math.prod(window) > gather_taps:  # a long window: one gather per spatial dimension
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


#: Names the docs gave this module before they moved (emulate.moved).
__getattr__ = moved.module_getattr(__name__)
