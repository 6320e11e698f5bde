"""Matmuls on block-scaled operands: :class:`emulate.QArray` in ``dot_general`` /
``matmul`` / ``einsum``, and ``scaled_matmul`` / ``scaled_dot_general`` with
``jax.nn.scaled_matmul``'s signature.

The contraction runs segment by segment along K, a segment being the longest run over
which neither operand's scale changes (the block length, or the gcd of both operands'
block lengths): the codes of each segment are contracted by the operand pair's own
:class:`emulate.Plan` (so only operand pairs the target runs natively reach the matrix
unit, and a float4_e2m1fn or float6_e2m3fn or integer segment sum is exact), each
segment sum is multiplied by its two scales in f32, and the scaled sums are added in
f32 and rounded once into the result type. Scales that do not change along K
(per-tensor, per-row, per-output-channel) make one segment: the plan contracts all of K
and the scales are applied once to its accumulator.

Mode "fast": where scales change along K and the dequantized values are exact in bf16
(e8m0 scales), or segments are shorter than 64 on a target other than a TPU, or the
target is the CPU (whose f32 dot runs at full rate), the QArrays are dequantized (bf16
where exact, f32 otherwise, both operands in one type, f32 at ``Precision.HIGHEST``) and
contracted in one dot instead.
An f32 operand passed by the caller may be multiplied at the caller's ``precision`` (on
a TPU the default rounds it to bf16; pass ``Precision.HIGHEST`` for the bound). Either
way, with ``S`` segments and ``a``, ``b`` the dequantized values, the f32 accumulator is
within ``gamma_(K + S + 4) * sum|a*b|`` of the exact sum, plus the underflow term of
:mod:`emulate.bounds`.

Mode "exact": the QArrays' values, as :func:`emulate.dequantize` gives them in f32 (for
e8m0 scales exactly ``code * 2**e``; each product rounded once otherwise), contracted by
mode "exact" of :func:`emulate.dot_general`: the exact sum of their products, rounded
once into the result type.

Gradients, both modes: those of the dequantized math, with respect to float operands,
float codes, scales and tensor scales (:mod:`emulate.engine.grad`).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats, moved
from emulate.engine import grad, layout, qtiled, sites, tiled
from emulate.engine.args import DotArgs, dot_args
from emulate.engine.layout import to_bfk
from emulate.engine.operands import Operand, OperandLike, Precision, operand
from emulate.engine.qoperands import (
    bf16_exact,
    code_operand,
    offset_coefficients,
    wide_values,
    with_flat_scales,
    without_perm,
)
from emulate.engine.run import plan_for, run_plan
from emulate.formats import FormatLike
from emulate.numerics import accumulate, codecs
from emulate.numerics.bits import times_pow2
from emulate.numerics.storage import Packed
from emulate.planning.plan import plan
from emulate.quantized.array import QArray
from emulate.quantized.checks import SCALE_FORMATS
from emulate.quantized.values import dequantize
from emulate.targets import TargetLike

__all__ = ["qarray_dot_general", "scaled_matmul"]


def _codes_operand(x: OperandLike | QArray, arg: str) -> tuple[Operand, QArray | None]:
    if isinstance(x, QArray):
        return code_operand(x), x
    op = operand(x, arg=arg)
    if isinstance(op.value, Packed):
        op = Operand(op.unpacked(), op.format_name)
    return op, None


def qarray_dot_general(call: DotArgs) -> jax.Array:
    """:func:`emulate.dot_general` where one or both operands are :class:`emulate.QArray`
    (``emulate.dot_general``, ``matmul``, ``einsum`` and :func:`scaled_matmul` validate
    the call with :func:`emulate.engine.args.dot_args` and hand it here).

    The result type is ``call.result``: ``lax.dot_general``'s for operands of the QArrays'
    ``dtype`` (and the other operand's type), or ``preferred_element_type``.
    """
    if any(isinstance(x, QArray) and x.perm is not None for x in (call.lhs, call.rhs)):
        # Act-order: the permutation moves to the other operand (or the result), and the
        # QArray is contracted in its stored order.
        lhs, rhs, restore = without_perm(call.lhs, call.rhs, call.dimension_numbers)
        return restore(qarray_dot_general(dataclasses.replace(call, lhs=lhs, rhs=rhs)))
    static = (call.dimension_numbers, call.precision, call.result, call.target, call.mode)
    with sites.scope(call.tag()):
        return _differentiable_qdot(static, call.lhs, call.rhs)


def _qdot(static: tuple, lhs: Operand | QArray, rhs: Operand | QArray) -> jax.Array:
    """The forward contraction of :func:`qarray_dot_general` (validated arguments)."""
    dn, precision, out_name, target, mode = static
    if mode == "exact":
        # The QArrays' values (dequantize's f32 numbers) through mode "exact": the exact
        # sum of their products, rounded once.
        va = _values_operand(lhs, "lhs")
        vb = _values_operand(rhs, "rhs")
        p = plan_for(va, vb, target, out_name, "exact")
        return run_plan(p, va, vb, dn, precision, tiled.current_settings())
    a, qa = _codes_operand(with_flat_scales(lhs) if isinstance(lhs, QArray) else lhs, "lhs")
    b, qb = _codes_operand(with_flat_scales(rhs) if isinstance(rhs, QArray) else rhs, "rhs")
    p = plan(a.format, b.format, target=target, preferred_element_type="float32", mode=mode)
    segs = _segments(a.shape, b.shape, dn, qa, qb)
    both_affine = qa is not None and qa.is_affine and qb is not None and qb.is_affine
    short = segs.g < 64 and p.platform != "tpu"
    if both_affine or (segs.count > 1 and (short or _bf16_exact(qa, qb) or p.platform == "cpu")):
        # Scales change along K: one dot of the dequantized values beats many short ones
        # (docs/performance.md, "Matmul on block-scaled weights"), unless they would have
        # to be f32 on a TPU (an f32 dot costs six bf16 passes, and XLA:TPU writes the
        # dequantized weight out in f32: "Quantized weights from checkpoints"), however
        # short the segments.
        return _dequantized(
            qa if qa is not None else a,
            qb if qb is not None else b,
            dn,
            precision,
            out_name,
            tiled.current_settings(),
        )
    if any(q is not None and c.format_name == "float32" for q, c in ((qa, a), (qb, b))):
        # a float32 codebook's values: a TPU's default precision would round them to bf16
        precision = lax.Precision.HIGHEST
    sa = _segment_scales(qa, dn[1][0], dn[0][0], segs, 0) if qa is not None else None
    sb = _segment_scales(qb, dn[1][1], dn[0][1], segs, 1) if qb is not None else None
    # zero points and offsets: per segment, c = offset - zero_point * scale, times the
    # other operand's segment sums (module docstring)
    ca = _segment_layout(qa, offset_coefficients(qa), dn[1][0], dn[0][0], segs, 0)
    cb = _segment_layout(qb, offset_coefficients(qb), dn[1][1], dn[0][1], segs, 1)
    return _scaled_run(
        p,
        a,
        b,
        sa,
        sb,
        (ca, cb),
        dn,
        precision,
        segs.g,
        out_name,
        tiled.current_settings(),
    )


def _values_operand(x: Operand | QArray, arg: str) -> Operand:
    """A QArray's values (dequantize's f32 numbers) as an Operand; an Operand as it is."""
    return operand(dequantize(x, to=jnp.float32), arg=arg) if isinstance(x, QArray) else x


def _contract_f32(static: tuple, a: jax.Array, b: jax.Array) -> jax.Array:
    dn, precision = static[:2]
    return layout.dot_general(a, b, dn, precision, preferred_element_type=jnp.float32)


# Differentiable as the dequantized math (emulate.engine.grad): gradients reach float
# operands, float codes, scales and tensor scales.
_differentiable_qdot = grad.bilinear(_qdot, _contract_f32)


class _Segments:
    """Segment length ``g`` along merged K, count, and each segment's block index per side."""

    def __init__(self, k: int, g: int, index: tuple[np.ndarray | None, np.ndarray | None]):
        self.k, self.g, self.index = k, g, index
        self.count = -(-k // g) if k else 1


def _block_index(
    q: QArray | None, shape: tuple[int, ...], contract: tuple[int, ...]
) -> np.ndarray | None:
    """For each position of merged K (row-major over ``contract``), the flat index of the
    scale block it falls in; None when ``q`` has no scales."""
    if q is None:
        return None
    sizes = [shape[d] for d in contract]
    nblk = [-(-shape[d] // q.block_shape[d]) for d in contract]
    pos = np.indices(sizes).reshape(len(sizes), -1) if sizes else np.zeros((0, 1), int)
    blk = [pos[i] // q.block_shape[d] for i, d in enumerate(contract)]
    return np.ravel_multi_index(blk, nblk) if blk else np.zeros(1, int)


def _segments(ashape, bshape, dn, qa: QArray | None, qb: QArray | None) -> _Segments:
    (lc, rc), _ = dn
    k = math.prod(ashape[d] for d in lc)
    ia, ib = _block_index(qa, ashape, lc), _block_index(qb, bshape, rc)
    if len(lc) == 1:
        # one contracting dim: blocks of the gcd of the two block lengths, K padded
        bl = [q.block_shape[d] for q, d in ((qa, lc[0]), (qb, rc[0])) if q is not None]
        g = functools.reduce(math.gcd, [min(v, k) for v in bl], 0) or k
        g = max(g, 1)
    else:
        changes = [
            i for ids in (ia, ib) if ids is not None for i in np.flatnonzero(np.diff(ids)) + 1
        ]
        g = functools.reduce(math.gcd, [int(c) for c in changes], k) or 1
    count = -(-k // g) if k else 1

    def first(ids):
        if ids is None:
            return None
        starts = np.minimum(np.arange(count) * g, max(k - 1, 0))
        return ids[starts] if k else np.zeros(1, int)

    return _Segments(k, g, (first(ia), first(ib)))


def _segment_scales(q: QArray, batch, contract, segs: _Segments, side: int):
    """The scales of ``q`` as ``(m, e)`` (:meth:`QArray.scale_parts`), laid out
    (batch..., free..., segment): per element along batch and free dims, per segment
    along K."""
    return tuple(_segment_layout(q, s, batch, contract, segs, side) for s in q.scale_parts())


def _segment_layout(q: QArray | None, s, batch, contract, segs: _Segments, side: int):
    """A per-block array of ``q`` (None: None) laid out (batch..., free..., segment)."""
    if q is None or s is None:
        return None
    first = segs.index[side]
    assert first is not None  # a QArray has scales, so a block index
    blocks = math.prod(s.shape[d] for d in contract)
    # one segment per block (the usual case): no gather, which XLA:TPU runs as a separate
    # program with transposes around it
    gather = blocks > 0 and not np.array_equal(first, np.arange(blocks))
    return _laid_out(
        s,
        jnp.asarray(first),
        shape=tuple(q.shape),
        block_shape=tuple(q.block_shape),
        batch=tuple(batch),
        contract=tuple(contract),
        gather=gather,
    )


@functools.partial(jax.jit, static_argnames=("shape", "block_shape", "batch", "contract", "gather"))
def _laid_out(s, idx, *, shape, block_shape, batch, contract, gather):
    """:func:`_segment_layout`'s array: ``s`` (one entry a block of a QArray of ``shape``
    and ``block_shape``) repeated over the batch and free dimensions' elements, those
    first, the blocks along K last, then taken at ``idx`` (each segment's block) where
    ``gather``. Jitted: one program per layout, not one eager op a step, when the
    contraction is not traced."""
    nd = len(shape)
    free = [d for d in range(nd) if d not in batch and d not in contract]
    for d in tuple(batch) + tuple(free):
        b = block_shape[d]
        s = jnp.repeat(s, b, axis=d, total_repeat_length=s.shape[d] * b)
        s = lax.slice_in_dim(s, 0, shape[d], axis=d)
    s = jnp.transpose(s, tuple(batch) + tuple(free) + tuple(contract))
    kept = len(batch) + len(free)
    s = s.reshape(s.shape[:kept] + (math.prod(s.shape[kept:]),))  # no -1: N may be 0
    if s.shape[-1] == 0:  # K = 0: one empty segment, nothing to scale
        return jnp.zeros(s.shape[:-1] + idx.shape, s.dtype)
    return jnp.take(s, idx, axis=-1) if gather else s


@functools.partial(
    jax.jit, static_argnames=("p", "dimension_numbers", "precision", "g", "out", "tiling")
)
def _scaled_run(
    p, a: Operand, b: Operand, sa, sb, coeffs, dimension_numbers, precision, g, out, tiling
):
    (lc, rc), (lb, rb) = dimension_numbers
    nb = len(lb)
    a3 = to_bfk(a.value, lb, lc)
    b3 = to_bfk(b.value, rb, rc)
    k = a3.shape[-1]
    n_seg = -(-k // g) if k else 1
    pad = n_seg * g - k
    if pad:
        a3 = jnp.pad(a3, [(0, 0)] * (a3.ndim - 1) + [(0, pad)])
        b3 = jnp.pad(b3, [(0, 0)] * (b3.ndim - 1) + [(0, pad)])
    a4 = a3.reshape(a3.shape[:-1] + (n_seg, g))
    b4 = b3.reshape(b3.shape[:-1] + (n_seg, g))
    dn = (
        ((a4.ndim - 1,), (b4.ndim - 1,)),
        (tuple(range(nb)) + (a4.ndim - 2,), tuple(range(nb)) + (b4.ndim - 2,)),
    )
    partial = run_plan(
        p, Operand(a4, a.format_name), Operand(b4, b.format_name), dn, precision, tiling
    )
    partial = partial.astype(jnp.float32)  # (batch..., seg, lfree..., rfree...)
    fl, fr = a4.ndim - 2 - nb, b4.ndim - 2 - nb
    # Scale and sum the segments as (batch, seg, free): XLA:CPU (jax 0.10.2) runs a
    # multiply feeding a reduce as one YNNPACK fusion, which crashes the process for some
    # rank-7 operands (docs/numerics.md, platform notes); collapsed, the operands stay at
    # rank 3 plus one per enclosing vmap.
    full = partial.shape
    rows = (math.prod(full[:nb]), full[nb], math.prod(full[nb + 1 :]))
    partial = partial.reshape(rows)
    exp = None
    for parts, lhs_side in ((sa, True), (sb, False)):
        if parts is None:
            continue
        m, e = (
            jnp.broadcast_to(_to_partial(v, nb, fl, fr, lhs_side), full).reshape(rows)
            for v in parts
        )
        partial = partial * m
        exp = e if exp is None else exp + e
    if exp is not None:
        partial = times_pow2(partial, exp)
    acc = jnp.sum(partial, axis=1).reshape(full[:nb] + full[nb + 1 :])
    for c, lhs_side, other in ((coeffs[0], True, (b4, b, sb)), (coeffs[1], False, (a4, a, sa))):
        if c is not None:  # the offset term: the other operand's segment sums times c
            x = _segment_sums(other[0], other[1].format, other[2])
            lhs, rhs = (c, x) if lhs_side else (x, c)  # (batch..., free..., segment) each
            dn_seg = (((lhs.ndim - 1,), (rhs.ndim - 1,)), (tuple(range(nb)),) * 2)
            acc = acc + layout.dot_general(
                lhs, rhs, dn_seg, lax.Precision.HIGHEST, preferred_element_type=jnp.float32
            )
    return accumulate.round_accumulator(acc, out)


def _segment_sums(x4: jax.Array, f: formats.Format, parts) -> jax.Array:
    """Per segment, the f32 sum of an operand's values: its codes ``(batch..., free...,
    segment, g)`` decoded exactly, summed over ``g``, times its scales ``(m, e)`` if any."""
    low = f.is_low_precision
    v = codecs.decode(x4, f.name, to=jnp.float32) if low else x4.astype(jnp.float32)
    v = jnp.sum(v, axis=-1)
    if parts is not None:
        v = times_pow2(v * parts[0], parts[1])
    return v


def _to_partial(v, nb: int, fl: int, fr: int, lhs_side: bool):
    """(batch..., free..., seg) -> the partial sums' layout (batch..., seg, lfree..., rfree...),
    with ones for the other operand's free dims."""
    v = jnp.moveaxis(v, -1, nb)
    if lhs_side:
        return v.reshape(v.shape + (1,) * fr)
    return v.reshape(v.shape[: nb + 1] + (1,) * fl + v.shape[nb + 1 :])


def _bf16_exact(*qs) -> bool:
    return all(bf16_exact(q) for q in qs)


def _dequantized(a, b, dimension_numbers, precision, out, tiling: tiled.Settings) -> jax.Array:
    """The dequantized values of ``a`` and ``b`` in one dot (:func:`_dequantized_run`);
    on the CPU a single large QArray is dequantized tile by tile next to the dot
    (:mod:`emulate.engine.qtiled`)."""
    t = None
    if isinstance(a, QArray) != isinstance(b, QArray):
        side = 0 if isinstance(a, QArray) else 1
        q, other = (a, b) if side == 0 else (b, a)
        t = qtiled.qtiling_for(q, side, len(other.shape), dimension_numbers, tiling)
    if t is None:
        return _dequantized_run(a, b, dimension_numbers, precision, out)
    return _qtiled_run(a, b, dimension_numbers, precision, out, t)


def _common_values(a, b, precision) -> tuple[jax.Array, jax.Array, Precision]:
    """Both operands' values in one type (XLA's CPU backend runs a mixed-type dot slower
    than a converted one), and the precision that keeps f32 values whole."""
    va, vb = wide_values(a), wide_values(b)
    if va.dtype != vb.dtype:
        common = jnp.promote_types(va.dtype, vb.dtype)
        va, vb = va.astype(common), vb.astype(common)
    if va.dtype == jnp.float32:
        # f32 values not exact in bf16: a TPU's default precision would round them to
        # bf16 (one pass), outside the contract.
        precision = lax.Precision.HIGHEST
    return va, vb, precision


@functools.partial(jax.jit, static_argnames=("dimension_numbers", "precision", "out"))
def _dequantized_run(a, b, dimension_numbers, precision, out):
    va, vb, precision = _common_values(a, b, precision)
    acc = layout.dot_general(
        va, vb, dimension_numbers, precision, preferred_element_type=jnp.float32
    )
    return accumulate.round_accumulator(acc, out)


@functools.partial(jax.jit, static_argnames=("dimension_numbers", "precision", "out", "t"))
def _qtiled_run(a, b, dimension_numbers, precision, out, t: qtiled.QTiling):
    q, other = (a, b) if t.side == 0 else (b, a)
    to = jnp.bfloat16 if _bf16_exact(q) else jnp.float32
    vo = wide_values(other)
    common = jnp.promote_types(vo.dtype, to)
    hi = lax.Precision.HIGHEST if common == jnp.float32 else precision

    (lc, rc), (lb, rb) = dimension_numbers
    skip = (rc + rb) if t.side == 0 else (lc + lb)
    rows = math.prod(n for d, n in enumerate(other.shape) if d not in skip)
    # XLA:CPU's matrix-vector dot widens a bf16 operand to f32 (and runs slower than an f32
    # one): few rows take f32 values even where bf16 would be exact
    on_cpu = jnp.float32 if rows < 16 else common
    hi_cpu = lax.Precision.HIGHEST if on_cpu == jnp.float32 else precision

    def cpu(q, vo):
        return qtiled.contract(t, q, vo.astype(on_cpu), dimension_numbers, hi_cpu, on_cpu)

    def untiled(q, vo):
        w = dequantize(q, to=common)
        va, vb = (w, vo.astype(common)) if t.side == 0 else (vo.astype(common), w)
        return layout.dot_general(va, vb, dimension_numbers, hi, preferred_element_type=jnp.float32)

    acc = lax.platform_dependent(q, vo, cpu=cpu, default=untiled)
    return accumulate.round_accumulator(acc, out)


# --- jax.nn.scaled_matmul's interface ------------------------------------------------------


def _as_qarray(x: jax.Array | np.ndarray, scales: jax.Array | np.ndarray, arg: str) -> QArray:
    if not hasattr(x, "shape") or not hasattr(scales, "shape"):
        raise TypeError(f"{arg}, {arg}_scales: expected arrays")
    if x.ndim != 3 or scales.ndim != 3:
        raise ValueError(
            f"{arg}, {arg}_scales: expected 3-D arrays (B, rows, K) and (B, rows, K // block),"
            f" got shapes {tuple(x.shape)} and {tuple(scales.shape)}"
        )
    k, kb = x.shape[-1], scales.shape[-1]
    if tuple(scales.shape[:2]) != tuple(x.shape[:2]) or kb == 0 or k % kb:
        raise ValueError(
            f"{arg}_scales: expected shape ({x.shape[0]}, {x.shape[1]}, K_s) with K_s "
            f"dividing K = {k}, got {tuple(scales.shape)}"
        )
    dt = np.dtype(x.dtype).name
    if dt not in formats.MATMUL_OPERANDS:
        raise TypeError(f"{arg}: dtype {dt} is not an operand format")
    if np.dtype(scales.dtype).name not in SCALE_FORMATS:
        raise TypeError(f"{arg}_scales: dtype {np.dtype(scales.dtype).name} is not a scale format")
    return QArray(
        jnp.asarray(x),
        jnp.asarray(scales),
        None,
        dt,
        np.dtype(scales.dtype).name,
        (1, 1, k // kb),
        tuple(x.shape),
        np.dtype(jnp.float32),
    )


def scaled_matmul(
    lhs: jax.Array | np.ndarray,
    rhs: jax.Array | np.ndarray,
    lhs_scales: jax.Array | np.ndarray,
    rhs_scales: jax.Array | np.ndarray,
    preferred_element_type: FormatLike | None = jnp.float32,
    *,
    target: TargetLike = None,
    mode: str | None = None,
) -> jax.Array:
    """``jax.nn.scaled_matmul`` on any target: ``lhs`` (B, M, K), ``rhs`` (B, N, K), scales
    (B, M, K // block) and (B, N, K // block); returns (B, M, N) in
    ``preferred_element_type`` (float32 by default), the contraction of
    ``lhs * repeat(lhs_scales)`` with ``rhs * repeat(rhs_scales)`` over K.

    Operands may be of any format (float8, float4_e2m1fn, int8, ... or wide types),
    scales float8_e8m0fnu, float8_e4m3fn, bfloat16, float16 or float32. The numerics are
    those of :func:`emulate.dot_general` on QArrays (module docstring).

    Differentiable with respect to ``lhs``, ``rhs`` (float dtypes) and both scales, as the
    dequantized math is (``jax.nn.scaled_matmul`` has no differentiation rule); the
    backward is float32 dots (docs/numerics.md, "Gradients").
    """
    qa = _as_qarray(lhs, lhs_scales, "lhs")
    qb = _as_qarray(rhs, rhs_scales, "rhs")
    if qa.shape[0] != qb.shape[0] or qa.shape[2] != qb.shape[2]:
        raise ValueError(
            f"lhs, rhs: expected (B, M, K) and (B, N, K) with the same B and K, got "
            f"{qa.shape} and {qb.shape}"
        )
    dn = (((2,), (2,)), ((0,), (0,)))
    call = dot_args(qa, qb, dn, None, preferred_element_type, target=target, mode=mode)
    return qarray_dot_general(call)


#: Names the docs gave this module before they moved (emulate.moved).
__getattr__ = moved.module_getattr(__name__)
