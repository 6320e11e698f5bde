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
(e8m0 scales), or segments are shorter than 64, the QArrays are dequantized (bf16 where
exact, f32 otherwise) and contracted in one dot instead. Either way, with ``S`` segments
and ``a``, ``b`` the dequantized values, the f32 accumulator is within
``gamma_(K + S + 4) * sum|a*b|`` of the exact sum, plus the underflow term of
:mod:`emulate.bounds`.

Mode "exact" (float8_e8m0fnu scales without a tensor scale, elements whose segment sums
are exact: integers, float4_e2m1fn, float6_e2m3fn, that is MXFP4, MXFP6_E2M3 and MXINT8):
each segment sum is an integer number of product quanta at a power-of-two position; the
terms are added exactly in 16-bit limbs spanning every position the scales allow, and the
total is rounded once (to odd first for results narrower than f32). The result equals the
exact sum of the dequantized products rounded once; a NaN scale makes its outputs NaN;
results below 2**-126 flush to zero, as XLA does. Other QArrays raise NotImplementedError
in mode "exact".
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import accumulate, codecs, formats
from emulate.codes import to_codes
from emulate.dot import Operand, _canonical, _hashable, _normalize_dn, _run, operand
from emulate.formats import Format
from emulate.packing import Packed, unpack_codes
from emulate.plan import exact_class, plan
from emulate.quant import QArray, dequantize, times_pow2

__all__ = ["dot_general", "scaled_matmul", "scaled_dot_general"]


def _codes_operand(x: Any, arg: str) -> tuple[Operand, QArray | None]:
    if isinstance(x, QArray):
        c = x.codes
        if isinstance(c, Packed):
            return Operand(unpack_codes(c), x.format_name), x
        f = x.format
        if f.is_low_precision:
            return Operand(to_codes(c, f)[0], f.name), x
        return Operand(jnp.asarray(c), f.name), x
    op = operand(x, arg=arg)
    if isinstance(op.value, Packed):
        op = Operand(op.codes(), op.format_name)
    return op, None


def _logical(op: Operand, q: QArray | None) -> str:
    if q is not None:
        return q.dtype.name
    return op.format_name


def dot_general(
    lhs: Any,
    rhs: Any,
    dimension_numbers: Any,
    precision: Any = None,
    preferred_element_type: Any = None,
    *,
    target: Any = None,
    mode: str = "fast",
) -> jax.Array:
    """``emulate.dot_general`` where one or both operands are :class:`emulate.QArray`.

    The result type is ``lax.dot_general``'s for operands of the QArrays' ``dtype``
    (and the other operand's type), or ``preferred_element_type``.
    """
    a, qa = _codes_operand(lhs, "lhs")
    b, qb = _codes_operand(rhs, "rhs")
    if mode not in ("fast", "exact"):
        raise ValueError(f"mode: expected 'fast' or 'exact', got {mode!r}")
    dn = _normalize_dn(dimension_numbers, a, b, target)
    out = formats.dot_result(_logical(a, qa), _logical(b, qb), preferred_element_type)
    if not out.xla_storable or out.is_low_precision:
        raise ValueError(
            f"preferred_element_type: the result of a QArray matmul must be float32, "
            f"bfloat16, float16 or int32, got {out.name}"
        )
    if mode == "exact":
        _check_exact(a, qa, b, qb, out)
        p = plan(a.format, b.format, target=target, preferred_element_type="float32")
        limit = _exact_segment_limit(a.format, b.format)
    else:
        p = plan(a.format, b.format, target=target, preferred_element_type="float32", mode=mode)
        limit = None
    segs = _segments(a.shape, b.shape, dn, qa, qb, limit)
    if mode == "fast" and segs.count > 1 and (segs.g < 64 or _bf16_exact(qa, qb)):
        # Scales change along K: one dot of the dequantized values beats many short ones
        # (measured by benchmarks/scaled.py), unless they would have to be f32 and the
        # segments are long.
        return _dequantized_run(
            qa if qa is not None else a,
            qb if qb is not None else b,
            dn,
            _hashable(precision),
            out.name,
        )
    sa = _segment_scales(qa, dn[1][0], dn[0][0], segs, 0) if qa is not None else None
    sb = _segment_scales(qb, dn[1][1], dn[0][1], segs, 1) if qb is not None else None
    return _scaled_run(p, a, b, sa, sb, dn, _hashable(precision), segs.g, out.name, mode)


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


def _segments(ashape, bshape, dn, qa: QArray | None, qb: QArray | None, limit=None) -> _Segments:
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
    if limit is not None:  # exact segment sums: the largest divisor of g within the limit
        g = max(d for d in range(1, min(g, limit) + 1) if g % d == 0)
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
    nd = len(q.shape)
    free = [d for d in range(nd) if d not in batch and d not in contract]
    idx = jnp.asarray(segs.index[side])
    out = []
    for s in q.scale_parts():
        for d in tuple(batch) + tuple(free):
            b = q.block_shape[d]
            s = jnp.repeat(s, b, axis=d, total_repeat_length=s.shape[d] * b)
            s = lax.slice_in_dim(s, 0, q.shape[d], axis=d)
        s = jnp.transpose(s, tuple(batch) + tuple(free) + tuple(contract))
        s = s.reshape(s.shape[: len(batch) + len(free)] + (-1,))
        out.append(jnp.take(s, idx, axis=-1))
    return tuple(out)


@functools.partial(
    jax.jit, static_argnames=("p", "dimension_numbers", "precision", "g", "out", "mode")
)
def _scaled_run(p, a: Operand, b: Operand, sa, sb, dimension_numbers, precision, g, out, mode):
    (lc, rc), (lb, rb) = dimension_numbers
    nb = len(lb)
    a3 = _canonical(a.value, lb, lc)
    b3 = _canonical(b.value, rb, rc)
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
    partial = _run(p, Operand(a4, a.format_name), Operand(b4, b.format_name), dn, precision)
    partial = partial.astype(jnp.float32)  # (batch..., seg, lfree..., rfree...)
    fl, fr = a4.ndim - 2 - nb, b4.ndim - 2 - nb
    if mode == "exact":
        return _exact_sum(partial, a.format, b.format, sa, sb, nb, fl, fr, out)
    exp = None
    for parts, lhs_side in ((sa, True), (sb, False)):
        if parts is None:
            continue
        m, e = (_to_partial(v, nb, fl, fr, lhs_side) for v in parts)
        partial = partial * m
        exp = e if exp is None else exp + e
    if exp is not None:
        partial = times_pow2(partial, exp)
    acc = jnp.sum(partial, axis=nb)
    return accumulate.round_accumulator(acc, out)


def _to_partial(v, nb: int, fl: int, fr: int, lhs_side: bool):
    """(batch..., free..., seg) -> the partial sums' layout (batch..., seg, lfree..., rfree...),
    with ones for the other operand's free dims."""
    v = jnp.moveaxis(v, -1, nb)
    if lhs_side:
        return v.reshape(v.shape + (1,) * fr)
    return v.reshape(v.shape[: nb + 1] + (1,) * fl + v.shape[nb + 1 :])


def _bf16_exact(*qs) -> bool:
    return all(
        q is None
        or q.scale_format == "float8_e8m0fnu"
        and q.tensor_scale is None
        and (q.format.is_integer or "bfloat16" in q.format.exact_in)
        for q in qs
    )


def _wide(x) -> jax.Array:
    """A QArray's values (bf16 where that is exact: e8m0 scales without a tensor scale and
    elements exact in bf16; f32 otherwise), or an operand decoded to bf16 / f32."""
    if isinstance(x, QArray):
        return dequantize(x, to=jnp.bfloat16 if _bf16_exact(x) else jnp.float32)
    f = x.format
    if not f.is_low_precision:
        return x.value
    to = jnp.bfloat16 if "bfloat16" in f.exact_in else jnp.float32
    return codecs.decode(x.codes(), f.name, to=to)


@functools.partial(jax.jit, static_argnames=("dimension_numbers", "precision", "out"))
def _dequantized_run(a, b, dimension_numbers, precision, out):
    va, vb = _wide(a), _wide(b)
    acc = lax.dot_general(va, vb, dimension_numbers, precision, preferred_element_type=jnp.float32)
    return accumulate.round_accumulator(acc, out)


# --- mode "exact": the scaled segment sums added in a wide fixed-point number ---------------

_LIMB = 16


def _check_exact(a: Operand, qa, b: Operand, qb, out: Format) -> None:
    for name, q in (("lhs", qa), ("rhs", qb)):
        if q is not None and (q.scale_format != "float8_e8m0fnu" or q.tensor_scale is not None):
            raise NotImplementedError(
                f"mode: 'exact' on QArrays is built for float8_e8m0fnu scales without a tensor "
                f"scale (the MX schemes); {name} has {q.scale_format} scales"
                + (" and a tensor scale" if q.tensor_scale is not None else "")
                + "; use mode='fast'"
            )
    if not exact_class(a.format, b.format):
        raise NotImplementedError(
            f"mode: 'exact' on QArrays is built where each segment sum is exact (integer, "
            f"float4_e2m1fn and float6_e2m3fn elements: MXFP4, MXFP6_E2M3, MXINT8), not for "
            f"{a.format_name} x {b.format_name}; use mode='fast'"
        )
    if out.is_integer:
        raise ValueError(
            f"preferred_element_type: mode 'exact' on QArrays gives a float result, got {out.name}"
        )


def _quantum_exp(f: Format) -> int:
    return 0 if f.is_integer else round(math.log2(float(f.min_subnormal)))


def _exact_segment_limit(fa: Format, fb: Format) -> int:
    """The longest segment whose sum, in units of the product quantum, stays below 2**24
    (exact in the f32 the plan returns)."""
    qa, qb = 2.0 ** _quantum_exp(fa), 2.0 ** _quantum_exp(fb)
    top = max(abs(float(fa.max)), abs(float(fa.min))) / qa
    top *= max(abs(float(fb.max)), abs(float(fb.min))) / qb
    return max(1, int((2**24 - 1) // top))


def _exact_sum(partial, fa: Format, fb: Format, sa, sb, nb: int, fl: int, fr: int, out: str):
    """Round ``sum_seg partial * scale_a * scale_b`` once into ``out``. Every partial is an
    exact integer number of product quanta and every scale a power of two (or NaN), so
    each term is an integer at a power-of-two position: the terms are added exactly in
    16-bit limbs spanning every position they can take, and the total is rounded once."""
    qexp = _quantum_exp(fa) + _quantum_exp(fb)
    units = jnp.round(times_pow2(partial, jnp.int32(-qexp))).astype(jnp.int32)
    exp = jnp.zeros(partial.shape, jnp.int32) + qexp
    nan = jnp.zeros(partial.shape, bool)
    for parts, lhs_side in ((sa, True), (sb, False)):
        if parts is not None:
            m, e = (_to_partial(v, nb, fl, fr, lhs_side) for v in parts)
            exp = exp + e
            nan = nan | jnp.isnan(m)
    lo_exp = qexp - 2 * 127
    span = 2 * 2 * 127 + 31  # every position: scale exponents, then the 31 bits of a unit
    n_limbs = (span + _LIMB - 1) // _LIMB + 4
    pos = exp - lo_exp  # >= 0
    j, r = pos // _LIMB, (pos % _LIMB).astype(jnp.uint32)
    mag = jnp.abs(units).astype(jnp.uint32)
    neg = units < 0
    lo = (mag & 0xFFFF) << r
    hi = (mag >> 16) << r
    pieces = (lo & 0xFFFF, (lo >> 16) + (hi & 0xFFFF), hi >> 16)
    pieces = [jnp.where(neg, -p.astype(jnp.int32), p.astype(jnp.int32)) for p in pieces]
    limbs = []
    for i in range(n_limbs):
        v = sum(jnp.where(j + d == i, pieces[d], 0) for d in range(3))
        limbs.append(jnp.sum(v, axis=nb))  # the segment axis; < 2**17 * segments
    limbs = _carry(limbs)
    negative = limbs[-1] < 0
    limbs = _carry([jnp.where(negative, -v, v) for v in limbs])
    value = _round_limbs(jnp.stack(limbs, axis=-1), lo_exp, out)
    value = jnp.where(negative, -value, value)
    value = jnp.where(jnp.any(nan, axis=nb), jnp.float32(jnp.nan), value)
    return accumulate.round_accumulator(value, out)


def _carry(limbs: list) -> list:
    """Propagate carries so every limb but the top one is in [0, 2**16)."""
    out, carry = [], 0
    for i, v in enumerate(limbs):
        v = v + carry
        if i == len(limbs) - 1:
            out.append(v)
        else:
            carry = lax.shift_right_arithmetic(v, jnp.int32(_LIMB))
            out.append(v & 0xFFFF)
    return out


def _round_limbs(limbs: jax.Array, lo_exp: int, out: str) -> jax.Array:
    """A non-negative number ``sum_i limbs[..., i] * 2**(16 i + lo_exp)`` as f32: rounded to
    nearest even for a float32 result, to odd (for one more rounding) otherwise."""
    n = limbs.shape[-1]
    nonzero = limbs != 0
    h = (n - 1) - jnp.argmax(jnp.flip(nonzero, axis=-1), axis=-1)  # top non-zero limb

    def limb(i):
        got = jnp.take_along_axis(limbs, jnp.clip(i, 0, n - 1)[..., None], axis=-1)[..., 0]
        return jnp.where(i >= 0, got, 0).astype(jnp.uint32)

    w2, w1, w0 = limb(h), limb(h - 1), limb(h - 2)
    below = jnp.arange(n) < (h - 2)[..., None]
    sticky = jnp.any(nonzero & below, axis=-1)
    bits = 32 - lax.clz(w2).astype(jnp.int32)  # 1..16 where the number is not zero
    s = bits + 8  # bits below the 24 kept ones, within the 48-bit window w2:w1:w0
    hi = (w2 << 16) | w1
    sh = jnp.clip(s - 16, 0, 31).astype(jnp.uint32)
    sl = jnp.clip(s, 0, 31).astype(jnp.uint32)
    one = jnp.uint32(1)
    # s >= 16: the kept bits are all in hi
    m_a = hi >> sh
    g_a = jnp.where(sh >= 1, (hi >> (sh - one)) & one, (w0 >> 15) & one)
    r_a = jnp.where(sh >= 2, hi & ((one << (sh - one)) - one), 0) != 0
    r_a = r_a | jnp.where(sh >= 1, w0 != 0, (w0 & 0x7FFF) != 0)
    # s < 16: hi shifted up, the rest from w0
    m_b = (hi << (jnp.uint32(16) - sl)) | (w0 >> sl)
    g_b = (w0 >> (sl - one)) & one
    r_b = (w0 & ((one << (sl - one)) - one)) != 0
    big = s >= 16
    mant, guard = jnp.where(big, m_a, m_b), jnp.where(big, g_a, g_b)
    rest = jnp.where(big, r_a, r_b) | sticky
    if out == "float32":
        up = (guard == 1) & (rest | ((mant & one) == 1))
        mant = mant + up.astype(jnp.uint32)
    else:
        mant = mant | ((guard == 1) | rest).astype(jnp.uint32)
    exp = _LIMB * (h - 2) + s + lo_exp
    value = times_pow2(mant.astype(jnp.float32), exp)
    return jnp.where(jnp.any(nonzero, axis=-1), value, jnp.float32(0))


# --- jax.nn.scaled_matmul's interface ------------------------------------------------------


def _as_qarray(x: Any, scales: Any, arg: str) -> QArray:
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
    if dt not in formats.names() or dt == "float8_e8m0fnu":
        raise TypeError(f"{arg}: dtype {dt} is not an operand format")
    if np.dtype(scales.dtype).name not in (
        "float8_e8m0fnu",
        "float8_e4m3fn",
        "bfloat16",
        "float16",
        "float32",
    ):
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
    lhs: Any,
    rhs: Any,
    lhs_scales: Any,
    rhs_scales: Any,
    preferred_element_type: Any = jnp.float32,
    *,
    target: Any = None,
    mode: str = "fast",
) -> jax.Array:
    """``jax.nn.scaled_matmul`` on any target: ``lhs`` (B, M, K), ``rhs`` (B, N, K), scales
    (B, M, K // block) and (B, N, K // block); returns (B, M, N) in
    ``preferred_element_type`` (float32 by default), the contraction of
    ``lhs * repeat(lhs_scales)`` with ``rhs * repeat(rhs_scales)`` over K.

    Operands may be of any format (float8, float4_e2m1fn, int8, ... or wide types),
    scales float8_e8m0fnu, float8_e4m3fn, bfloat16, float16 or float32. The numerics are
    those of :func:`emulate.dot_general` on QArrays (module docstring).
    """
    qa = _as_qarray(lhs, lhs_scales, "lhs")
    qb = _as_qarray(rhs, rhs_scales, "rhs")
    if qa.shape[0] != qb.shape[0] or qa.shape[2] != qb.shape[2]:
        raise ValueError(
            f"lhs, rhs: expected (B, M, K) and (B, N, K) with the same B and K, got "
            f"{qa.shape} and {qb.shape}"
        )
    dn = (((2,), (2,)), ((0,), (0,)))
    return dot_general(qa, qb, dn, None, preferred_element_type, target=target, mode=mode)


def scaled_dot_general(
    lhs: Any,
    rhs: Any,
    dimension_numbers: Any,
    preferred_element_type: Any = jnp.float32,
    configs: Any = None,
    *,
    target: Any = None,
    mode: str = "fast",
) -> jax.Array:
    """``jax.nn.scaled_dot_general`` on any target: JAX's own function (its quantizer for
    ``configs`` from ``jax.nn.get_scaled_dot_general_config``, "mxfp8" or "nvfp4"), run
    through :func:`emulate.polyfill` so that its ``scaled_matmul`` runs as
    :func:`scaled_matmul` here. ``configs=None`` contracts the operands as they are."""
    from emulate.polyfill import polyfill

    def run(x, y):
        return jax.nn.scaled_dot_general(
            x,
            y,
            dimension_numbers,
            preferred_element_type=preferred_element_type,
            configs=configs,
        )

    return polyfill(run, target=target, mode=mode)(lhs, rhs)
