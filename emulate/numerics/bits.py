"""Float32 bit constructions that no backend flushes or rounds.

XLA on the CPU and the TPU read subnormal f32 / bf16 operands as zero and flush subnormal
results, in any float operation (a convert included). The helpers here reach the bits of a
value, and build powers of two, with integer operations only, so that exact arithmetic on
scales and mantissas survives those backends.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from emulate.formats import F32_MIN_NORMAL

__all__ = [
    "f32_bits",
    "frexp",
    "frexp_bits",
    "frexp_normal",
    "pow2",
    "pow2_normal",
    "split_f32",
    "times_pow2",
]


def f32_bits(x: jax.Array) -> jax.Array:
    """The float32 bits of ``x`` (float32, bfloat16 or float16), by integer operations only:
    XLA CPU may flush subnormals in any float operation, a convert included."""
    if x.dtype == jnp.float32:
        return lax.bitcast_convert_type(x, jnp.uint32)
    h = lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
    if x.dtype == jnp.bfloat16:
        return h << 16
    if x.dtype != jnp.float16:
        raise TypeError(f"x: expected float32, bfloat16 or float16 values, got {x.dtype}")
    sign, e, frac = (h >> 15) << 31, (h >> 10) & 0x1F, h & 0x3FF
    normal = sign | ((e + 112) << 23) | (frac << 13)
    special = sign | 0x7F800000 | (frac << 13)
    # float16 subnormals (frac * 2**-24) are normal float32 values: nothing to flush.
    sub = lax.bitcast_convert_type(frac.astype(jnp.float32) * jnp.float32(2.0**-24), jnp.uint32)
    return jnp.where(e == 0x1F, special, jnp.where(e == 0, sub | sign, normal))


def split_f32(bits: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The f32 values of ``bits`` (uint32; subnormals included, NaN and Inf read as 0) as
    ``(negative, m, E)`` with ``v = (-1)**negative * m * 2**E``, ``0 <= m < 2**24``."""
    e = ((bits >> 23) & 0xFF).astype(jnp.int32)
    frac = (bits & 0x7FFFFF).astype(jnp.int32)
    m = jnp.where(e == 0, frac, frac | 0x800000)
    m = jnp.where(e == 0xFF, 0, m)
    return (bits >> 31) == 1, m, jnp.maximum(e, 1) - 150


def frexp_normal(a: jax.Array) -> tuple[jax.Array, jax.Array]:
    """For finite normal ``a > 0``: ``(m, e)`` with ``a == m * 2**e``, ``1 <= m < 2`` (exact)."""
    u = lax.bitcast_convert_type(a, jnp.uint32)
    e = (u >> 23).astype(jnp.int32) - 127
    m = lax.bitcast_convert_type((u & jnp.uint32(0x7FFFFF)) | jnp.uint32(127 << 23), jnp.float32)
    return m, e


def frexp_bits(bits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The f32 values whose bits are ``bits`` (uint32) as ``(m, e)``: an f32 ``m`` and an
    int32 ``e`` with ``value == m * 2**e``, ``1 <= |m| < 2``, f32 subnormals included (down
    to ``2**-149``: integer operations only, nothing flushed). Zero gives ``(+-0, 0)``, Inf
    and NaN give ``(themselves, 0)``."""
    negative, mant, e_low = split_f32(bits)
    top = 31 - lax.clz(jnp.maximum(mant, 1))  # the leading bit's position, 0 to 23
    frac = (mant.astype(jnp.uint32) << (23 - top).astype(jnp.uint32)) & jnp.uint32(0x7FFFFF)
    m = lax.bitcast_convert_type(frac | jnp.uint32(127 << 23), jnp.float32)
    m = jnp.where(negative, -m, m)
    special = (bits & jnp.uint32(0x7F800000)) == jnp.uint32(0x7F800000)
    zero = (mant == 0) & ~special
    value = lax.bitcast_convert_type(bits, jnp.float32)
    m = jnp.where(special, value, jnp.where(zero, jnp.where(negative, -0.0, 0.0), m))
    return m, jnp.where(special | zero, 0, e_low + top)


def frexp(s: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(m, e)`` with ``s == m * 2**e`` for normal f32 ``s``; zero, subnormal, Inf and
    NaN give ``(s flushed, 0)``."""
    m, e = frexp_normal(jnp.abs(s))
    normal = jnp.isfinite(s) & (jnp.abs(s) >= F32_MIN_NORMAL)
    m = jnp.where(normal, jnp.where(s < 0, -m, m), jnp.where(jnp.isfinite(s), 0 * s, s))
    return m, jnp.where(normal, e, 0)


def pow2(e: jax.Array) -> jax.Array:
    """``2**e`` as f32 for ``-127 <= e <= 127`` (2**-127 is an f32 subnormal: built from
    its bits, which encode reads without arithmetic)."""
    normal = lax.bitcast_convert_type(
        (jnp.clip(e, -126, 127) + 127).astype(jnp.uint32) << 23, jnp.float32
    )
    sub = lax.bitcast_convert_type(jnp.uint32(1 << 22), jnp.float32)
    return jnp.where(e < -126, sub, normal)


def times_pow2(x: jax.Array, n: jax.Array) -> jax.Array:
    """``x * 2**n`` for integer ``|n| <= 500``, by four power-of-two factors that are all
    normal f32 numbers: exact unless the result overflows or is below 2**-126 (which
    XLA flushes to zero on CPU and TPU)."""
    n = n.astype(jnp.int32)
    for parts in (4, 3, 2):
        k = n // parts
        x = x * pow2_normal(k)
        n = n - k
    return x * pow2_normal(n)


def pow2_normal(n: jax.Array) -> jax.Array:
    """``2**n`` as f32 from its bits, for integer ``-126 <= n <= 127`` (normal numbers
    only: outside that range the bits are garbage)."""
    return lax.bitcast_convert_type((n + 127).astype(jnp.uint32) << 23, jnp.float32)
