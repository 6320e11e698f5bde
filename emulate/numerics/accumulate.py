"""Exact combination of chunk sums and the single final rounding into the result type.

A plan in the exact class runs its contraction in chunks whose sums are exact integers
(in units of the products' quantum). Those chunk sums are combined here in two int32
limbs, without 64-bit types (JAX runs with 32-bit types unless x64 is on, and TPUs have
no 64-bit arithmetic): ``total = hi * 2**16 + lo`` with ``0 <= lo < 2**16``. The total is
exact while ``|total| < 2**40`` (``|hi| < 2**24``): K up to 2**26 for int8 x int8.

The total is then rounded once into the result type. For f32 the sum of the two exact
f32 pieces is correctly rounded by IEEE addition. For narrower types (bf16, f16, the
float8 family) it is first rounded to f32 *to odd* (truncate and set the last bit when
inexact), which makes the following round-to-nearest-even into a type with at most 22
significant bits equal to a single rounding of the exact value.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from emulate import formats
from emulate.numerics import codecs

__all__ = ["combine_chunks", "round_limbs", "round_accumulator"]


def combine_chunks(partials: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
    """Sum int32 chunk sums along ``axis`` exactly, as limbs ``(hi, lo)``, ``0 <= lo < 2**16``.

    Exact for up to 2**15 chunks.
    """
    # dtype=int32: under jax_enable_x64 jnp.sum would widen int32 sums to int64
    hi = jnp.sum(lax.shift_right_arithmetic(partials, jnp.int32(16)), axis=axis, dtype=jnp.int32)
    lo = jnp.sum(partials & 0xFFFF, axis=axis, dtype=jnp.int32)
    return normalize(hi, lo)


def normalize(hi: jax.Array, lo: jax.Array) -> tuple[jax.Array, jax.Array]:
    return hi + lax.shift_right_arithmetic(lo, jnp.int32(16)), lo & 0xFFFF


def split(total: jax.Array) -> tuple[jax.Array, jax.Array]:
    """An int32 total as limbs."""
    return lax.shift_right_arithmetic(total, jnp.int32(16)), total & 0xFFFF


def round_limbs(hi: jax.Array, lo: jax.Array, scale: int, out: str) -> jax.Array:
    """Round ``(hi * 2**16 + lo) * 2**-scale`` once into the format ``out``.

    Integer results wrap modulo 2**32 and then into ``out``'s width, as XLA's integer
    dots do.
    """
    f = formats.get(out)
    if f.is_integer:
        total = lax.shift_left(hi, jnp.int32(16)) + lo
        return to_integer(total, out)
    a = hi.astype(jnp.float32) * jnp.float32(65536.0)  # exact for |hi| < 2**24
    b = lo.astype(jnp.float32)
    s = a + b
    if f.name != "float32":
        s = _round_to_odd(s, a, b)
    if scale:
        s = s * jnp.float32(2.0**-scale)  # exact: a power of two, results stay normal
    return round_accumulator(s, out)


def _round_to_odd(s: jax.Array, a: jax.Array, b: jax.Array) -> jax.Array:
    # TwoSum: s + err == a + b exactly.
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    bits = lax.bitcast_convert_type(s, jnp.int32)
    # |exact| > |s| when err has the sign of s: truncation keeps s; else step toward zero.
    away = (err > 0) == (s > 0)
    trunc = jnp.where(away, bits, bits - 1)
    odd = jnp.where(err != 0, trunc | 1, bits)
    return lax.bitcast_convert_type(odd, jnp.float32)


def to_integer(total: jax.Array, out: str) -> jax.Array:
    """Wrap an int32 total into the integer format ``out`` (two's complement)."""
    if out == "int32":
        return total
    return codecs.encode(total, out)


def round_accumulator(acc: jax.Array, out: str) -> jax.Array:
    """Round an f32 or int32 accumulator once into ``out``."""
    f = formats.get(out)
    if f.is_integer:
        return to_integer(acc.astype(jnp.int32), out)
    if acc.dtype != jnp.float32:
        acc = acc.astype(jnp.float32)
    if not f.is_low_precision:
        return acc.astype(f.dtype)
    return codecs.encode(acc, out)
