"""When a sum of low-precision products is exact: the exact class and the accumulator limits.

A sum of products is exact when every partial sum is a multiple of the products' common
quantum and stays within :data:`F32_EXACT` quanta (an f32 accumulator) or
:data:`I32_EXACT` (int32), whatever the order of the additions. The exact class is the set
of formats whose values become integers after an exact power-of-two scaling (their products
then have a common quantum ``2**-(ka + kb)``); every other float pair needs exponent
slicing (:mod:`emulate.planning.slicing`) for an exact sum.
"""

from __future__ import annotations

from emulate import formats
from emulate.formats import Format, FormatLike

__all__ = [
    "F32_EXACT",
    "I32_EXACT",
    "MAX_CHUNKS",
    "MAX_TOTAL_QUANTA",
    "exact_class",
    "exact_scale",
    "max_quanta",
]

F32_EXACT = 1 << 24
"""An f32 accumulator holds every integer up to ``2**24``."""

I32_EXACT = (1 << 31) - 1
"""The largest int32."""

MAX_CHUNKS = 1 << 15
"""Chunk sums, split into 16-bit halves, add up exactly in int32 for this many chunks
(:func:`emulate.numerics.accumulate.combine_chunks`; also the K steps of the Pallas matmul's
two-limb accumulator)."""

MAX_TOTAL_QUANTA = 1 << 40
"""Two int32 limbs ``hi * 2**16 + lo`` round exactly into a float while the total stays
below ``2**40`` quanta."""


def exact_scale(fmt: FormatLike) -> int | None:
    """``k`` such that every value of ``fmt`` times ``2**k`` is an integer that int8 or int32
    holds; None outside the exact class.

    0 for integers of at most 8 bits, the format's ``int8_scale`` for float4_e2m1fn (1) and
    float6_e2m3fn (3); None for int32, the float8 family, float6_e3m2fn and the wide floats.
    """
    f = formats.get(fmt)
    if f.is_integer:
        return 0 if f.bits <= 8 else None
    return f.int8_scale


def exact_class(lhs: FormatLike, rhs: FormatLike) -> bool:
    """Whether ``lhs x rhs`` is in the exact class: every plan for it (``Plan.exact``) gives
    the exact sum rounded once, in mode "fast" too.

    True when both operands are integers of at most 8 bits or values that become integers
    after an exact power-of-two scaling (int4, uint4, int8, uint8, float4_e2m1fn,
    float6_e2m3fn); False for every other pair (the float8 family, float6_e3m2fn, and
    pairs with a wide type such as bfloat16).
    """
    return exact_scale(lhs) is not None and exact_scale(rhs) is not None


def max_quanta(fmt: Format | str, scale: int) -> int:
    """The largest ``|value| * 2**scale`` of ``fmt``: its largest magnitude in quanta."""
    f = formats.get(fmt)
    return int(max(abs(f.max), abs(f.min)) * 2**scale)
