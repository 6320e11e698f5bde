"""The exact combination of mode "exact": chunk sums of slice pairs, each an integer at
its own power of two, added exactly in a wide fixed-point number of 16-bit limbs (int32 or
uint32 arrays, positive and negative parts apart where they accumulate) and rounded once
into float32 (to nearest even, or to odd for a later rounding into a narrower type).
:mod:`emulate.engine.slices` makes the slices, :mod:`emulate.engine.exact` their chunk sums."""

from __future__ import annotations

from typing import cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate.planning.exactness import I32_EXACT

__all__ = [
    "n_limbs",
    "place",
    "round_wide",
    "sign_magnitude",
    "signed_limbs",
    "subtract_stacked",
]


def signed_limbs(pair, shifts: np.ndarray, count: int, bound: int) -> list[jax.Array]:
    """``sum_ij pair(i, j) * 2**shifts_ij`` (``pair(i, j)``: the int32 chunk sums
    (B, C, M, N) of slice pair (i, j), summed over its chunks) as signed int32 limbs,
    each of magnitude below 2**26, not normalised.

    Pairs with equal shifts are added first in int32 (the sums of a group of ``g`` pairs
    stay below ``g * bound``, ``bound`` the largest chunk sum; groups are cut so that this
    stays below 2**31), so the 16-bit splitting runs once per shift, not once per pair;
    where ``g * chunks * bound`` stays below 2**31 too, the chunks are added in int32 as well.
    """
    per = max(1, I32_EXACT // max(bound, 1))  # pairs whose chunk sums add up in int32
    groups: dict[int, list[tuple[int, int]]] = {}
    for i, j in np.ndindex(shifts.shape):
        groups.setdefault(int(shifts[i, j]), []).append((i, j))
    nb, n_chunks, m, nn = pair(0, 0).shape
    limbs: list[jax.Array | int] = [0] * count
    for sh, pairs in sorted(groups.items()):
        for start in range(0, len(pairs), per):
            # (B, C, M, N); sum() of a non-empty group is an array, never its start 0
            f = cast(jax.Array, sum(pair(i, j) for i, j in pairs[start : start + per]))
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
    return [jnp.broadcast_to(jnp.asarray(x, jnp.int32), (nb, m, nn)) for x in limbs]


def sign_magnitude(limbs: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
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


def place(acc: jax.Array, rel: list[jax.Array], offset: jax.Array) -> jax.Array:
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


def subtract_stacked(pos: jax.Array, neg: jax.Array) -> tuple[jax.Array, list[jax.Array]]:
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


def round_wide(negative, limbs: list[jax.Array], q0, to_odd: bool) -> jax.Array:
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


def n_limbs(max_shift: int) -> int:
    # value bits: shift + 16 (hi half) + 32 (sum of 2**16 chunk pieces) + pair count, and
    # two limbs of headroom for the carries
    return (max_shift + 16 + 32 + 8) // 16 + 2
