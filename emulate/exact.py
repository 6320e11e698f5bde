"""Mode "exact" for float formats outside the exact class: exponent slicing.

Every finite value of a low-precision float format is ``m * 2**E`` with an integer
mantissa ``|m| < 2**p`` (``p = mantissa_bits + 1``) and ``E`` between the format's quantum
exponent ``q_min`` and ``q_max``. Cutting the exponent range into slices of width ``w``
splits an operand into ``S`` arrays whose values, each scaled by its slice's power of
two, are integers below ``2**(p + w - 1)``: exact in int8 (when ``p + w - 1 <= 7``), in
bf16 (any width: they have at most ``p`` significant bits) and in f32. Each pair of
slices is one matmul whose chunk sums are exact (chunks short enough for the int32 or
f32 accumulator), and every chunk sum is an integer in units of the pair's quantum.

Those integers, at up to ``S_lhs * S_rhs`` different scales, are added exactly in a wide
fixed-point number held in 16-bit limbs of uint32 arrays (positive and negative parts
apart, so no limb ever overflows), and the total is rounded once into the result type:
correctly for float32, and through a round-to-odd float32 for narrower types, which
makes the second rounding equal to a single one. Products that are NaN or infinite, and
sums of infinities, follow IEEE: they are taken from an f32 dot of the decoded values.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import accumulate, formats
from emulate.formats import Format

__all__ = ["Slicing", "slicing", "choose", "contract"]

_F32_EXACT = 1 << 24
_I32_EXACT = (1 << 31) - 1
_MIN_CHUNK = 256  # shorter chunks cost more in partial sums than they save in passes
_MAX_CHUNKS = 1 << 16  # 16-bit pieces of chunk sums add up in uint32 for this many chunks


@dataclasses.dataclass(frozen=True)
class Slicing:
    """How one operand is cut: ``count`` slices of ``width`` exponents from ``q_min``."""

    format: str
    p: int
    q_min: int
    q_max: int
    width: int

    @property
    def count(self) -> int:
        return -(-(self.q_max - self.q_min + 1) // self.width)

    @property
    def max_int(self) -> int:
        """Largest integer a slice holds: ``(2**p - 1) * 2**(width - 1)``."""
        return ((1 << self.p) - 1) << (self.width - 1)


def slicing(fmt: object, width: int) -> Slicing:
    """The slicing of a low-precision format (integers are one slice: ``m * 2**0``)."""
    f = formats.get(fmt)
    if not f.is_low_precision or (f.is_float and not f.has_subnormals):
        raise ValueError(f"fmt: exponent slicing is for the low-precision formats, got {f.name}")
    if f.is_integer:
        return Slicing(f.name, f.bits, 0, 0, width)
    q_min = round(math.log2(f.min_subnormal))
    q_max = math.floor(math.log2(f.max)) - f.mantissa_bits
    return Slicing(f.name, f.mantissa_bits + 1, q_min, q_max, width)


def choose(lhs: Format, rhs: Format, compute: str) -> tuple[Slicing, Slicing, int] | None:
    """The slicings with the fewest passes for ``compute`` ("int8", "bfloat16", "float32"),
    and the K-chunk that keeps every partial sum exact; None if ``compute`` cannot hold
    the slices (int8 and a format with more than 7 significant bits)."""
    best = None
    for wa in range(1, 17):
        for wb in range(1, 17):
            a, b = slicing(lhs, wa), slicing(rhs, wb)
            if compute == "int8":
                if a.max_int > 127 or b.max_int > 127:
                    continue
                chunk = _I32_EXACT // (a.max_int * b.max_int)
            else:
                chunk = _F32_EXACT // (a.max_int * b.max_int)
                if chunk < _MIN_CHUNK:
                    continue
            key = (a.count * b.count, -chunk)
            if best is None or key < best[0]:
                best = (key, a, b, chunk)
    return None if best is None else (best[1], best[2], best[3])


def _slices(v: jax.Array, s: Slicing, compute: str) -> list[jax.Array]:
    """Split decoded f32 values (NaN and Inf already zeroed) into integer-valued slices."""
    bits = lax.bitcast_convert_type(v, jnp.uint32)
    biased = ((bits >> 23) & 0xFF).astype(jnp.int32)
    e = jnp.maximum(biased - 127 - (s.p - 1), s.q_min)
    index = (e - s.q_min) // s.width
    out = []
    for i in range(s.count):
        base = s.q_min + i * s.width
        part = jnp.where(index == i, v * jnp.float32(2.0**-base), 0.0)
        out.append(part.astype(compute))
    return out


def _canonical3(x: jax.Array, batch, contract) -> jax.Array:
    """(batch, free, K) with each group of dimensions merged into one."""
    free = [d for d in range(x.ndim) if d not in batch and d not in contract]
    x = jnp.transpose(x, tuple(batch) + tuple(free) + tuple(contract))
    nb = math.prod(x.shape[: len(batch)])
    nf = math.prod(x.shape[len(batch) : len(batch) + len(free)])
    return x.reshape(nb, nf, -1)


def _pair_chunk_sums(slices_a, slices_b, dimension_numbers, chunk: int, acc) -> jax.Array:
    """Chunk sums of every slice pair in one dot: int32 of shape (Sa, Sb, B, M, N, C)."""
    (lc, rc), (lb, rb) = dimension_numbers
    a = jnp.concatenate([_canonical3(x, lb, lc) for x in slices_a], axis=1)  # (B, Sa*M, K)
    b = jnp.concatenate([_canonical3(y, rb, rc) for y in slices_b], axis=1)  # (B, Sb*N, K)
    k = a.shape[-1]
    chunk = min(chunk, max(k, 1))
    pad = (-k) % chunk
    if pad:
        a = jnp.pad(a, ((0, 0), (0, 0), (0, pad)))
        b = jnp.pad(b, ((0, 0), (0, 0), (0, pad)))
    n = (k + pad) // chunk
    a = a.reshape(a.shape[:2] + (n, chunk))
    b = b.reshape(b.shape[:2] + (n, chunk))
    dn = (((3,), (3,)), ((0, 2), (0, 2)))
    part = lax.dot_general(a, b, dn, preferred_element_type=acc).astype(jnp.int32)
    nb, _, sam, sbn = part.shape  # (B, C, Sa*M, Sb*N)
    sa, sb = len(slices_a), len(slices_b)
    part = part.reshape(nb, n, sa, sam // sa, sb, sbn // sb)
    return jnp.transpose(part, (2, 4, 0, 3, 5, 1))


def _limbs(part: jax.Array, shifts: np.ndarray, n_limbs: int, sign: int) -> list[jax.Array]:
    """The non-negative integer ``sum_ij max(sign * part_ij, 0) * 2**shifts_ij`` (summed
    over chunks, the last axis) in normalised 16-bit limbs."""
    m = jnp.maximum(sign * part, 0).astype(jnp.uint32)  # |part| < 2**31
    values = (
        (jnp.sum(m & 0xFFFF, axis=-1, dtype=jnp.uint32), shifts),  # < 2**32: <= 2**16 chunks
        (jnp.sum(m >> 16, axis=-1, dtype=jnp.uint32), shifts + 16),
    )
    limbs = [jnp.zeros(m.shape[2:-1], jnp.uint32) for _ in range(n_limbs)]
    for v, sh in values:
        for i, j in np.ndindex(sh.shape):  # the shifts are static: place each pair directly
            q, r = divmod(int(sh[i, j]), 16)
            v0, v1 = (v[i, j] & 0xFFFF) << r, (v[i, j] >> 16) << r  # each < 2**31
            # pieces < 2**17 each: a limb sums at most 6 per pair, far below 2**32
            limbs[q] = limbs[q] + (v0 & 0xFFFF)
            limbs[q + 1] = limbs[q + 1] + (v0 >> 16) + (v1 & 0xFFFF)
            limbs[q + 2] = limbs[q + 2] + (v1 >> 16)
    for i in range(n_limbs - 1):
        limbs[i + 1] = limbs[i + 1] + (limbs[i] >> 16)
        limbs[i] = limbs[i] & 0xFFFF
    return limbs


def _subtract(pos: list[jax.Array], neg: list[jax.Array]) -> tuple[jax.Array, list[jax.Array]]:
    """``(negative, |pos - neg|)`` as limbs."""

    def sub(x, y):
        out, borrow = [], jnp.zeros_like(x[0], dtype=jnp.int32)
        for xi, yi in zip(x, y, strict=True):
            d = xi.astype(jnp.int32) - yi.astype(jnp.int32) - borrow
            borrow = (d < 0).astype(jnp.int32)
            out.append((d + (borrow << 16)).astype(jnp.uint32))
        return out, borrow

    d1, b1 = sub(pos, neg)
    d2, _ = sub(neg, pos)
    negative = b1 == 1
    return negative, [jnp.where(negative, y, x) for x, y in zip(d1, d2, strict=True)]


def _pow2(e: jax.Array) -> jax.Array:
    """``2.0**e`` in f32 for ``-126 <= e <= 127`` (int32 array)."""
    return lax.bitcast_convert_type(((e + 127) << 23).astype(jnp.uint32), jnp.float32)


def _round_wide(negative, limbs: list[jax.Array], q0: int, to_odd: bool) -> jax.Array:
    """Round ``(-1)**negative * sum(limbs[i] * 2**(16 i)) * 2**q0`` to f32: to nearest even,
    or to odd (for a later rounding into a narrower type)."""
    limbs = [jnp.zeros_like(limbs[0])] * 2 + limbs  # so the window below never runs off
    n = len(limbs)
    h = jnp.zeros(limbs[0].shape, jnp.int32)
    for i in range(n):
        h = jnp.where(limbs[i] != 0, i, h)
    h = jnp.maximum(h, 2)

    def pick(offset):
        return sum(jnp.where(h - offset == i, limbs[i], 0) for i in range(n)).astype(jnp.uint32)

    top, mid, low = pick(0), pick(1), pick(2)
    below = jnp.zeros(limbs[0].shape, bool)
    for i in range(n):
        below = below | ((i < h - 2) & (limbs[i] != 0))
    msb = 32 + 31 - lax.clz(top).astype(jnp.int32)  # top != 0 unless the total is zero
    s = (msb - 25).astype(jnp.uint32)  # in [7, 22]
    hiw = (top << 16) | mid
    small = s <= 16
    s_lo = jnp.minimum(s, 16)
    s_hi = jnp.maximum(s, 16) - 16
    w_small = (hiw << (16 - s_lo)) | (low >> s_lo)
    w_large = hiw >> s_hi
    w = jnp.where(small, w_small, w_large)
    out_small = (low & ((jnp.uint32(1) << s_lo) - 1)) != 0
    out_large = ((hiw & ((jnp.uint32(1) << s_hi) - 1)) != 0) | (low != 0)
    sticky = below | jnp.where(small, out_small, out_large)
    f = w >> 2
    rem = w & 3
    if to_odd:
        f = f | ((rem != 0) | sticky).astype(jnp.uint32)
    else:
        up = (rem == 3) | ((rem == 2) & (sticky | ((f & 1) == 1)))
        f = f + up.astype(jnp.uint32)
    e = s.astype(jnp.int32) + 2 + 16 * (h - 2 - 2) + q0  # the two padding limbs
    e1 = e // 2
    value = f.astype(jnp.float32) * _pow2(e1) * _pow2(e - e1)
    value = jnp.where(top == 0, 0.0, value)
    return jnp.where(negative, -value, value)


def contract(plan, lhs_values, rhs_values, dimension_numbers, precision) -> jax.Array:
    """The exact-mode contraction of decoded f32 operands for a "sliced" plan."""
    sa = slicing(plan.lhs, plan.slicing[0])
    sb = slicing(plan.rhs, plan.slicing[1])
    compute = plan.lhs_compute
    acc = jnp.int32 if compute == "int8" else jnp.float32
    # IEEE specials from an f32 dot of the decoded values: NaN and Inf are exact there.
    fast = lax.dot_general(
        lhs_values, rhs_values, dimension_numbers, precision, preferred_element_type=jnp.float32
    )
    a = jnp.where(jnp.isfinite(lhs_values), lhs_values, 0.0)
    b = jnp.where(jnp.isfinite(rhs_values), rhs_values, 0.0)
    slices_a, slices_b = _slices(a, sa, compute), _slices(b, sb, compute)
    k = math.prod(a.shape[d] for d in dimension_numbers[0][0])
    n_chunks = -(-max(k, 1) // min(plan.k_chunk, max(k, 1)))
    if n_chunks > _MAX_CHUNKS:
        raise ValueError(
            f"lhs, rhs: exact mode covers contractions of up to {_MAX_CHUNKS * plan.k_chunk} "
            f"for {plan.lhs} x {plan.rhs}; got K = {k}"
        )
    part = _pair_chunk_sums(slices_a, slices_b, dimension_numbers, plan.k_chunk, acc)
    shifts = np.add.outer(np.arange(sa.count) * sa.width, np.arange(sb.count) * sb.width)
    # value bits: shift + 16 (hi half) + 32 (sum of 2**16 chunk pieces) + pair count, and
    # two limbs of headroom for the carries
    n_limbs = (int(shifts.max()) + 16 + 32 + 8) // 16 + 2
    pos = _limbs(part, shifts, n_limbs, 1)
    neg = _limbs(part, shifts, n_limbs, -1)
    negative, mag = _subtract(pos, neg)
    out = formats.get(plan.out)
    r = _round_wide(negative, mag, sa.q_min + sb.q_min, to_odd=out.name != "float32")
    r = jnp.where(jnp.isfinite(fast), r.reshape(fast.shape), fast)
    return accumulate.round_accumulator(r, plan.out)
