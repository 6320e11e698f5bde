"""Mode "exact" for float formats outside the exact class: exponent slicing.

Every finite value of a float format is ``m * 2**E`` with an integer mantissa
``|m| < 2**p`` (``p = mantissa_bits + 1``) and ``E`` at least the format's quantum
exponent ``q_min``. Each operand is cut into ``S`` *slices*: arrays of integers below
``2**(p + w - 1)`` (static slicing) or ``2**w`` (per-row slicing) that, each scaled by its
slice's power of two, add up to the operand exactly. The slices are exact in int8 (when
they stay within 127), in bf16 (when they have at most 8 significant bits) and in f32.
Each pair of slices is one matmul whose chunk sums are exact (chunks short enough for the
int32 or f32 accumulator), and every chunk sum is an integer in units of the pair's
quantum.

Two ways to cut an operand:

* **static** (the low-precision formats: float8, float6, float4, integers): the exponent
  range ``[q_min, q_max]`` is cut into ``S`` slices of ``w`` exponents each.
* **per row** (the wide formats bfloat16, float16, float32, whose exponent ranges are far
  too wide to cut statically): each row of the lhs (column of the rhs) is scaled by the
  power of two of its largest element, and the ``S * w`` bits below it are cut into
  ``S`` slices of ``w`` bits. Bits of smaller elements that fall below those ``S * w``
  bits are left in a *residual*; while any residual is non-zero, further blocks of ``S``
  slices are taken below each row's residual maximum (a data-dependent number of passes:
  none for rows that span less than ``S * w`` bits, the usual case).

The chunk sums, at up to ``S_lhs * S_rhs`` different scales, are added exactly in a wide
fixed-point number held in 16-bit limbs of uint32 arrays (positive and negative parts
apart, so no limb ever overflows), at the power of two of the row and column scales, and
the total is rounded once into float32, with its subnormals and overflow to Inf: to
nearest even for a float32 result, or *to odd* for a narrower one, which makes the second
rounding equal to a single one. NaN and Inf follow IEEE: they come from a dot of the
operands with every finite non-zero value replaced by its sign (no overflow, no flushed
subnormals), run only when an operand holds NaN or Inf.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats, targets
from emulate.engine.layout import result_shape, to_bkn, to_bmk
from emulate.numerics import accumulate
from emulate.numerics.bits import f32_bits, split_f32
from emulate.planning.exactness import F32_EXACT, I32_EXACT, MAX_CHUNKS
from emulate.planning.slicing import Slicing

__all__ = ["contract", "static_slices"]

_NONE = -(1 << 20)  # "no bits": the top exponent of a zero residual


# ------------------------------------------------------------------------------ slices


def static_slices(v: jax.Array, s: Slicing, compute: str) -> list[jax.Array]:
    """Split decoded f32 values (NaN and Inf already zeroed) into integer-valued slices
    (static slicing: exponent windows, or balanced digits)."""
    bits = lax.bitcast_convert_type(v, jnp.uint32)
    if s.digits:
        return _digit_slices(bits, s, compute)
    biased = ((bits >> 23) & 0xFF).astype(jnp.int32)
    e = jnp.maximum(biased - 127 - (s.p - 1), s.q_min)
    index = (e - s.q_min) // s.width
    out = []
    for i in range(s.count):
        base = s.q_min + i * s.width
        part = jnp.where(index == i, v * jnp.float32(2.0**-base), 0.0)
        out.append(part.astype(compute))
    return out


def _digit_slices(bits: jax.Array, s: Slicing, compute: str) -> list[jax.Array]:
    """The balanced base-``2**width`` digits of ``|v| / 2**q_min`` (an integer below 2**32:
    every value of the format is a multiple of ``2**q_min``), lowest first, each with the
    value's sign, from the f32 bits: uint32 shifts and masks, no float operation."""
    neg, u = _digit_word(bits, s)
    half = 1 << (s.width - 1)
    mask = jnp.uint32((1 << s.width) - 1)
    out = []
    for i in range(s.count):
        d = u >> jnp.uint32(s.width * i)  # the top digit: at most 2**(width - 1)
        if i < s.count - 1:
            d = (d & mask).astype(jnp.int32) - half
        else:
            d = d.astype(jnp.int32)
        d = jnp.where(neg, -d, d)
        out.append(d.astype(compute))
    return out


def _digit_word(bits: jax.Array, s: Slicing) -> tuple[jax.Array, jax.Array]:
    """``(negative, V + offset)`` (uint32) of the values given by their f32 bits: the
    plain base-``2**width`` digits of the second are the balanced digits of ``V`` plus
    ``2**(width - 1)`` each (but the top one)."""
    neg, m, e = split_f32(bits)
    sh = e - s.q_min  # V = m * 2**sh; m's trailing zeros cover a negative sh
    mu = m.astype(jnp.uint32)
    v = jnp.where(
        sh >= 0,
        mu << jnp.clip(sh, 0, 31).astype(jnp.uint32),
        mu >> jnp.clip(-sh, 0, 31).astype(jnp.uint32),
    )
    return neg, v + jnp.uint32(s.offset)  # below 2**32 (slicing checks it)


def _top(m: jax.Array, e: jax.Array) -> jax.Array:
    """Exponent of the highest set bit of ``m * 2**e``; ``_NONE`` where ``m == 0``."""
    return jnp.where(m != 0, e + 31 - lax.clz(m), _NONE)


def _row_slices(neg, m, e, s: Slicing, compute: str, axis: int):
    """One block of per-row slices of ``(-1)**neg * m * 2**e`` (K along ``axis``): the
    slices (lowest first), each row's base exponent (K reduced to 1) and the residual
    mantissas (the bits below the base)."""
    t = jnp.max(_top(m, e), axis=axis, keepdims=True, initial=_NONE)
    base = jnp.maximum(t - s.count * s.width + 1, s.q_min)
    rel = e - base  # the element's lowest bit relative to the base
    mask = (1 << s.width) - 1
    out = []
    for i in range(s.count):
        sh = rel - i * s.width
        left = m << jnp.clip(sh, 0, 31)  # bits past the slice are masked off below
        right = m >> jnp.clip(-sh, 0, 31)
        part = jnp.where(sh >= 0, left, right) & mask
        part = jnp.where(neg, -part, part)
        out.append(part.astype(compute))
    below = jnp.clip(-rel, 0, 31)
    residual = jnp.where(rel >= 0, 0, m & ((1 << below) - 1))
    return out, base, residual


# ------------------------------------------------------------------ chunk sums and limbs


def _pair_chunk_sums(a: jax.Array, b: jax.Array, sa: int, sb: int, chunk: int, acc) -> jax.Array:
    """Chunk sums of every pair of ``sa`` lhs slices, concatenated as (B, Sa*M, K), and
    ``sb`` rhs slices, concatenated as (B, K, Sb*N), in one dot: int32 of shape
    (B, C, Sa, M, Sb, N) (pair (i, j) is ``[:, :, i, :, j]``, no transpose)."""
    k = a.shape[-1]
    n = -(-max(k, 1) // min(chunk, max(k, 1)))
    chunk = -(-max(k, 1) // n)  # as even as the chunks go: no padding where n divides K
    pad = n * chunk - k
    if pad:
        a = jnp.pad(a, ((0, 0), (0, 0), (0, pad)))
        b = jnp.pad(b, ((0, 0), (0, pad), (0, 0)))
    a = a.reshape(a.shape[:2] + (n, chunk))
    b = b.reshape((b.shape[0], n, chunk, b.shape[2]))
    dn = (((3,), (2,)), ((0, 2), (0, 1)))
    part = lax.dot_general(a, b, dn, preferred_element_type=acc).astype(jnp.int32)
    nb, _, sam, sbn = part.shape  # (B, C, Sa*M, Sb*N)
    return part.reshape(nb, n, sa, sam // sa, sb, sbn // sb)


def _signed_limbs(part: jax.Array, shifts: np.ndarray, n_limbs: int, bound: int) -> list[jax.Array]:
    """``sum_ij part_ij * 2**shifts_ij`` (part from :func:`_pair_chunk_sums`, summed over
    its chunks) as signed int32 limbs, each of magnitude below 2**26, not normalised.

    Pairs with equal shifts are added first in int32 (the sums of a group of ``g`` pairs
    stay below ``g * bound``, ``bound`` the largest chunk sum; groups are cut so that this
    stays below 2**31), so the 16-bit splitting runs once per shift, not once per pair;
    where ``g * chunks * bound`` stays below 2**31 too, the chunks are added in int32 as well.
    """
    per = max(1, I32_EXACT // max(bound, 1))  # pairs whose chunk sums add up in int32
    groups: dict[int, list[tuple[int, int]]] = {}
    for i, j in np.ndindex(shifts.shape):
        groups.setdefault(int(shifts[i, j]), []).append((i, j))
    n_chunks = part.shape[1]
    limbs: list[jax.Array | int] = [0] * n_limbs
    for sh, pairs in sorted(groups.items()):
        for start in range(0, len(pairs), per):
            # (B, C, M, N); sum() of a non-empty group is an array, never its start 0
            f = cast(jax.Array, sum(part[:, :, i, :, j] for i, j in pairs[start : start + per]))
            hi = lax.shift_right_arithmetic(f, jnp.int32(16))  # |hi| < 2**15
            lo = f & 0xFFFF
            if n_chunks == 1:
                big, small = hi[:, 0], lo[:, 0]
            elif n_chunks * len(pairs[start : start + per]) <= per:
                # all of the group's chunk sums add up in int32 (short f32-route chunks)
                total = jnp.sum(f, axis=1, dtype=jnp.int32)
                big = lax.shift_right_arithmetic(total, jnp.int32(16))
                small = total & 0xFFFF
            else:  # <= 2**15 chunks: |sum hi| < 2**30, sum lo < 2**31
                big = jnp.sum(hi, axis=1, dtype=jnp.int32)
                lo_sum = jnp.sum(lo, axis=1, dtype=jnp.int32)
                big = big + (lo_sum >> 16)
                small = lo_sum & 0xFFFF
            # value = big * 2**16 + small, placed at 2**sh
            q, r = divmod(sh, 16)
            x = small << r  # < 2**31
            ah = lax.shift_right_arithmetic(big, jnp.int32(16))  # |ah| < 2**15
            al = (big & 0xFFFF) << r
            y = ah << r  # |y| < 2**30
            for idx, piece in (
                (q, x & 0xFFFF),
                (q + 1, (x >> 16) + (al & 0xFFFF)),
                (q + 2, (al >> 16) + (y & 0xFFFF)),
                (q + 3, lax.shift_right_arithmetic(y, jnp.int32(16))),
            ):
                limbs[idx] = limbs[idx] + piece
    shape = (part.shape[0], part.shape[3], part.shape[5])
    return [jnp.broadcast_to(jnp.asarray(x, jnp.int32), shape) for x in limbs]


def _sign_magnitude(limbs: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
    """``(negative, |value|)`` of signed, unnormalised int32 limbs (magnitudes below
    2**30), the magnitude in normalised uint32 limbs; the top limb must have headroom."""

    def normalise(xs):
        out, carry = [], jnp.zeros_like(xs[0])
        for x in xs:
            x = x + carry
            out.append(x & 0xFFFF)
            carry = lax.shift_right_arithmetic(x, jnp.int32(16))
        return out, carry

    pos, carry = normalise(limbs)
    neg, _ = normalise([-x for x in limbs])
    negative = carry < 0
    return negative, [jnp.where(negative, n, p).astype(jnp.uint32) for p, n in zip(pos, neg)]


def _place(acc: jax.Array, rel: list[jax.Array], offset: jax.Array) -> jax.Array:
    """``acc + rel * 2**offset`` for limbs ``acc`` stacked on a leading axis (each below
    2**17), normalised limbs ``rel`` and a run-time ``offset >= 0`` (an int32 array of the
    limbs' shape). Each limb of the result is below 2**17 again (one carry step)."""
    q = offset >> 4
    r = (offset & 15).astype(jnp.uint32)
    zero = jnp.zeros_like(rel[0])
    padded = [zero, *rel, zero]
    pieces = [  # rel << r in 16-bit pieces, each < 2**16
        ((padded[j + 1] << r) & 0xFFFF) | ((padded[j] << r) >> 16) for j in range(len(rel) + 1)
    ]
    idx = jnp.arange(acc.shape[0], dtype=jnp.int32).reshape((-1,) + (1,) * q.ndim) - q[None]
    for j, x in enumerate(pieces):  # each limb receives at most one piece
        acc = acc + jnp.where(idx == j, x[None], 0)
    carry = jnp.concatenate([jnp.zeros_like(acc[:1]), acc[:-1] >> 16])
    return (acc & 0xFFFF) + carry


def _subtract_stacked(pos: jax.Array, neg: jax.Array) -> tuple[jax.Array, list[jax.Array]]:
    """``(negative, |pos - neg|)`` for limbs stacked on a leading axis (each below 2**30),
    the carries rippled by a scan over the limbs (a long unrolled chain compiles slowly)."""

    def step(carry, limbs):
        x = limbs + carry  # (2, ...) int32: pos - neg and neg - pos
        return x >> 16, x & 0xFFFF

    d = pos.astype(jnp.int32) - neg.astype(jnp.int32)
    both = jnp.stack([d, -d], axis=1)  # (A, 2, ...)
    carry, out = lax.scan(step, jnp.zeros_like(both[0]), both)
    negative = carry[0] < 0  # the sign of pos - neg: its final carry (headroom above)
    mag = jnp.where(negative[None], out[:, 1], out[:, 0]).astype(jnp.uint32)
    return negative, list(mag)


def _select(stack: jax.Array, index: jax.Array) -> jax.Array:
    """``stack[index]`` per element along the leading axis (0 outside it)."""
    iota = jnp.arange(stack.shape[0], dtype=jnp.int32).reshape((-1,) + (1,) * index.ndim)
    return jnp.sum(jnp.where(iota == index[None], stack, 0), axis=0, dtype=jnp.uint32)


def _round_wide(negative, limbs: list[jax.Array], q0, to_odd: bool) -> jax.Array:
    """Round ``(-1)**negative * sum(limbs[i] * 2**(16 i)) * 2**q0`` (normalised limbs;
    ``q0`` an int or an int32 array) once into float32, subnormals and overflow included:
    to nearest even, or to odd (for a later rounding into a narrower type). The result is
    built from its bits, so no arithmetic flushes it."""
    zero = jnp.zeros_like(limbs[0])
    stack = jnp.stack([zero, zero, *limbs])  # 32 bits below: windows never run off
    shape = limbs[0].shape
    q0 = jnp.broadcast_to(jnp.asarray(q0, jnp.int32), shape) - 32
    iota = jnp.arange(stack.shape[0], dtype=jnp.int32).reshape((-1,) + (1,) * len(shape))
    h = jnp.max(jnp.where(stack != 0, iota, 0), axis=0)
    top = _select(stack, h)
    msb = 16 * h + 31 - lax.clz(top).astype(jnp.int32)  # bit index of the leading one
    # The result's quantum (its lowest kept bit): 24 bits below the leading one, or 2**-149.
    d = jnp.maximum(msb - 23, -149 - q0)  # >= 9: msb >= 32 unless the total is 0
    p = d - 1  # the rounding bit
    li, r = p >> 4, (p & 15).astype(jnp.uint32)
    lo, mid, hi = _select(stack, li), _select(stack, li + 1), _select(stack, li + 2)
    window = (lo >> r) | (mid << (16 - r)) | jnp.where(r == 0, 0, hi << ((32 - r) & 31))
    sticky = ((lo & ((jnp.uint32(1) << r) - 1)) != 0) | jnp.any(
        (iota < li[None]) & (stack != 0), axis=0
    )
    f = (window >> 1) & 0xFFFFFF
    half = (window & 1) == 1
    if to_odd:
        f = f | (half | sticky).astype(jnp.uint32)
    else:
        f = f + (half & (sticky | ((f & 1) == 1))).astype(jnp.uint32)
    qt = jnp.minimum(d + q0, 200)  # the exponent of f's unit; >= -149
    bits = ((qt + 149).astype(jnp.uint32) << 23) + f  # f < 2**23 only for subnormals
    bits = jnp.where(bits >= 0x7F800000, jnp.uint32(0x7F800000), bits)
    bits = jnp.where(top == 0, 0, bits | (negative.astype(jnp.uint32) << 31))
    return lax.bitcast_convert_type(bits, jnp.float32)


# ---------------------------------------------------------------------------- contract


@dataclasses.dataclass(frozen=True)
class _Side:
    """One operand in canonical (B, R, K) layout, ready to slice."""

    s: Slicing
    bits: jax.Array  # the f32 bits of the values, NaN/Inf zeroed
    compute: str
    axis: int  # the contracting axis: 2 for the lhs (B, M, K), 1 for the rhs (B, K, N)

    def first(self):
        """The first block: (slices concatenated along the free axis, as the dot takes
        them, base exponent, residual or None)."""
        cat = 1 if self.axis == 2 else 2
        if not self.s.dynamic:  # low-precision values: normal in f32, float ops are safe
            v = lax.bitcast_convert_type(self.bits, jnp.float32)
            sl = static_slices(v, self.s, self.compute)
            return jnp.concatenate(sl, axis=cat), self.s.q_min, None
        neg, m, e = split_f32(self.bits)
        sl, base, res = _row_slices(neg, m, e, self.s, self.compute, self.axis)
        return jnp.concatenate(sl, axis=cat), base, res

    def split(self):
        return split_f32(self.bits)


def _n_limbs(max_shift: int) -> int:
    # value bits: shift + 16 (hi half) + 32 (sum of 2**16 chunk pieces) + pair count, and
    # two limbs of headroom for the carries
    return (max_shift + 16 + 32 + 8) // 16 + 2


def contract(plan, lhs_values, rhs_values, dimension_numbers, precision) -> jax.Array:
    """The exact-mode contraction of decoded f32 operands for a "sliced" plan.

    ``precision`` is accepted for symmetry with the other routes; every dot here multiplies
    values that are exact in the compute type.
    """
    del precision
    sa, sb = plan.slicings()
    compute = plan.lhs_compute
    (lc, rc), (lb, rb) = dimension_numbers
    a3 = to_bmk(lhs_values, lb, lc)  # (B, M, K)
    b3 = to_bkn(rhs_values, rb, rc)  # (B, K, N)
    out_shape = result_shape(lhs_values.shape, rhs_values.shape, dimension_numbers)
    k = a3.shape[-1]
    n_chunks = -(-max(k, 1) // min(plan.k_chunk, max(k, 1)))
    if n_chunks > MAX_CHUNKS:
        raise ValueError(
            f"lhs, rhs: exact mode covers contractions of up to {MAX_CHUNKS * plan.k_chunk} "
            f"for {plan.lhs} x {plan.rhs}; got K = {k}"
        )
    a3, b3 = f32_bits(a3), f32_bits(b3)
    fin_a, fin_b = ((x & 0x7F800000) != 0x7F800000 for x in (a3, b3))
    run = functools.partial(_sliced_sum, plan=plan, sa=sa, sb=sb, k=k)
    if not (sa.dynamic or sb.dynamic):
        r = run((a3, b3), residual=False)
    else:
        # Whether any per-row operand has bits below its first block. The whole sum runs
        # inside the cond (a cond or loop that captures the big slice arrays computed
        # outside it costs XLA CPU more than the passes it saves).
        more = jnp.zeros((), bool)
        for side, bits, fin, axis in ((sa, a3, fin_a, 2), (sb, b3, fin_b, 1)):
            if side.dynamic:
                neg, m, e = split_f32(jnp.where(fin, bits, 0))
                more = more | jnp.any(_row_slices(neg, m, e, side, compute, axis)[2] != 0)
        r = lax.cond(
            more,
            functools.partial(run, residual=True),
            functools.partial(run, residual=False),
            (a3, b3),
        )
    r = _specials(r, a3, b3, fin_a, fin_b, plan)
    return accumulate.round_accumulator(r.reshape(out_shape), plan.out)


def _sliced_sum(bits, *, plan, sa: Slicing, sb: Slicing, k: int, residual: bool) -> jax.Array:
    """The exact sum of the (B, M, K) x (B, K, N) operands given by their f32 bits, rounded
    into f32 (to odd for a narrower result); with ``residual``, the further blocks of a
    per-row operand too."""
    a3, b3 = bits
    compute = plan.lhs_compute
    acc = jnp.int32 if compute == "int8" else jnp.float32
    fin_a, fin_b = ((x & 0x7F800000) != 0x7F800000 for x in (a3, b3))
    side_a = _Side(sa, jnp.where(fin_a, a3, 0), compute, 2)
    side_b = _Side(sb, jnp.where(fin_b, b3, 0), compute, 1)
    shifts = np.add.outer(np.arange(sa.count) * sa.width, np.arange(sb.count) * sb.width)
    n_rel = _n_limbs(int(shifts.max()))
    to_odd = formats.get(plan.out).name != "float32"

    chunk = min(plan.k_chunk, max(k, 1))
    if compute == "int8":
        bound = chunk * sa.max_int * sb.max_int  # the largest |chunk sum|
    else:
        bound = min(chunk * sa.max_int * sb.max_int, F32_EXACT)

    def block(cat_a, cat_b):
        """The block of concatenated lhs slices times the block of rhs slices, as
        (negative, magnitude limbs)."""
        part = _pair_chunk_sums(cat_a, cat_b, sa.count, sb.count, plan.k_chunk, acc)
        return _sign_magnitude(_signed_limbs(part, shifts, n_rel, bound))

    sl_a, base_a, res_a = side_a.first()
    sl_b, base_b, res_b = side_b.first()
    # Concatenated once: the dot's operands, reused by the further blocks.
    negative, mag = block(sl_a, sl_b)
    q0 = _q0(base_a, base_b)
    if not residual:
        return _round_wide(negative, mag, q0, to_odd)
    return _residual_blocks(
        side_a,
        side_b,
        (sl_a, base_a, res_a),
        (sl_b, base_b, res_b),
        (negative, mag),
        block,
        to_odd,
    )


def _q0(base_a, base_b):
    """The exponent of the relative limbs' unit, per (B, M, N) element (or an int)."""
    if isinstance(base_a, int) and isinstance(base_b, int):
        return base_a + base_b
    ea = base_a if not isinstance(base_a, int) else jnp.full((1, 1, 1), base_a, jnp.int32)
    eb = base_b if not isinstance(base_b, int) else jnp.full((1, 1, 1), base_b, jnp.int32)
    return ea + eb  # (B, M, 1) + (B, 1, N)


def _residual_blocks(side_a, side_b, first_a, first_b, first_limbs, block, to_odd):
    """The exact sum when a per-row operand has bits below its first block: every block
    of the lhs against every block of the rhs, added at run-time shifts into one
    fixed-point number covering the whole range of the two formats."""
    sa, sb = side_a.s, side_b.s
    lo = sa.q_min + sb.q_min  # no base is below its format's q_min
    hi_a = sa.q_max + sa.p if sa.dynamic else sa.q_min
    hi_b = sb.q_max + sb.p if sb.dynamic else sb.q_min
    n_rel = len(first_limbs[1])
    n_abs = (hi_a + hi_b - lo) // 16 + n_rel + 4  # room for the carries of many blocks
    sl_a1, base_a1, res_a1 = first_a
    sl_b1, base_b1, res_b1 = first_b
    shape = first_limbs[1][0].shape
    zeros = jnp.zeros((n_abs, *shape), jnp.uint32)

    def add(accs, rel, base_a, base_b):
        negative, mag = rel
        off = jnp.broadcast_to(_q0(base_a, base_b) - lo, shape)
        pos = [jnp.where(negative, 0, x) for x in mag]
        neg = [jnp.where(negative, x, 0) for x in mag]
        return _place(accs[0], pos, off), _place(accs[1], neg, off)

    accs = add((zeros, zeros), first_limbs, base_a1, base_b1)

    def against_b(sl_a, base_a, res_b, accs):
        """Add the lhs block ``sl_a`` times every rhs block still in ``res_b``."""
        if res_b is None:
            return accs
        neg_b, _, e_b = side_b.split()

        def cond(state):
            return jnp.any(state[0] != 0)

        def body(state):
            res, accs = state
            sl_b, base_b, res = _row_slices(neg_b, res, e_b, sb, side_b.compute, 1)
            return res, add(accs, block(sl_a, jnp.concatenate(sl_b, axis=2)), base_a, base_b)

        return lax.while_loop(cond, body, (res_b, accs))[1]

    accs = against_b(sl_a1, base_a1, res_b1, accs)
    if res_a1 is not None:
        neg_a, _, e_a = side_a.split()
        _, m_b, _ = side_b.split() if sb.dynamic else (None, None, None)

        def cond(state):
            return jnp.any(state[0] != 0)

        def body(state):
            res, accs = state
            sl_a, base_a, res = _row_slices(neg_a, res, e_a, sa, side_a.compute, 2)
            sl_a = jnp.concatenate(sl_a, axis=1)
            if sb.dynamic:
                accs = against_b(sl_a, base_a, m_b, accs)
            else:
                accs = add(accs, block(sl_a, sl_b1), base_a, sb.q_min)
            return res, accs

        accs = lax.while_loop(cond, body, (res_a1, accs))[1]
    return _round_wide(*_subtract_stacked(*accs), lo, to_odd)


def _specials(r, a3, b3, fin_a, fin_b, plan) -> jax.Array:
    """NaN and Inf by IEEE rules, from a dot of the operands with every finite value
    replaced by its sign (0, +-1): exact, no overflow, nothing flushed. Run only when an
    operand holds NaN or Inf."""
    try:
        bf16 = targets.get(plan.target).supports("bfloat16", "bfloat16")
    except ValueError:  # a Target built by the caller, not registered by name
        bf16 = plan.lhs_compute == "bfloat16"
    dtype = jnp.bfloat16 if bf16 else jnp.float32

    def signs(bits, finite):  # from the bits: no float operation sees a subnormal
        one = jnp.where((bits >> 31) == 1, -1.0, 1.0)
        nan = jnp.where((bits << 9) != 0, jnp.nan, jnp.inf)  # NaN, or Inf with the sign
        value = jnp.where(finite, jnp.where((bits << 1) == 0, 0.0, 1.0), nan)
        return (value * one).astype(dtype)

    def with_specials(r):
        sa, sb = signs(a3, fin_a), signs(b3, fin_b)
        dn = (((2,), (1,)), ((0,), (0,)))
        s = lax.dot_general(sa, sb, dn, preferred_element_type=jnp.float32)
        return jnp.where(jnp.isfinite(s), r, s)

    special = ~(jnp.all(fin_a) & jnp.all(fin_b))
    return lax.cond(special, with_specials, lambda r: r, r)
