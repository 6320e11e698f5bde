"""Exponent slicing, the plan side of mode "exact" outside the exact class.

Every finite value of a float format is ``m * 2**E`` with an integer mantissa
``|m| < 2**p`` (``p = mantissa_bits + 1``) and ``E`` at least the format's quantum
exponent ``q_min``. An operand is cut into ``S`` *slices*: arrays of integers that, each
scaled by its slice's power of two, add up to the operand exactly, and every pair of
slices is one matmul whose chunk sums are exact. This module chooses the cut (pure Python):
the slice widths and counts for a compute type ("int8", "bfloat16", "float32") and the
K-chunk that keeps each chunk sum exact. :mod:`emulate.engine.exact` executes it.

* **static** (the low-precision formats: float8, float6, float4, integers): the exponent
  range ``[q_min, q_max]`` is cut into ``S`` slices of ``w`` exponents each; slice values
  are integers below ``2**(p + w - 1)``.
* **digits** (the low-precision float formats too): every value is the integer
  ``V = |v| / 2**q_min`` (below ``2**32``), written in ``S`` balanced base-``2**w`` digits
  (each in ``[-2**(w-1), 2**(w-1)]``, the sign applied to every digit). A value's 2 to 5
  significant bits then fill the digits densely, where an exponent window leaves most of
  its ``p + w - 1`` bits unused: e5m2 needs 5 int8 digits of 7 bits against 6 windows of
  5 exponents, e4m3fn 3 against 4.
* **per row** (bfloat16, float16, float32, whose exponent ranges are far too wide to cut
  statically): each row of the lhs (column of the rhs) is scaled by the power of two of
  its largest element, and the ``S * w`` bits below it are cut into ``S`` slices of ``w``
  bits (integers below ``2**w``); further blocks of ``S`` slices cover smaller elements.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from emulate import formats
from emulate.formats import Format, FormatLike
from emulate.planning.exactness import F32_EXACT, I32_EXACT

__all__ = [
    "CHUNK_COST",
    "MIN_CHUNK",
    "WIDE_EXTRA_BITS",
    "Slicing",
    "fewest_passes",
    "cost",
    "digit_offset",
    "slicing",
]

MIN_CHUNK = 256
"""Shorter chunks cost more in partial sums than they save in passes."""

WIDE_EXTRA_BITS = 24
"""Bits below a row's largest element that the first block of per-row slices covers,
beyond the format's own mantissa: elements down to ``2**-WIDE_EXTRA_BITS`` of the row
maximum are sliced in one block; smaller ones (rare in activations) cost further blocks."""


@dataclasses.dataclass(frozen=True)
class Slicing:
    """How one operand is cut: ``count`` slices of ``width`` exponents (bits) each.

    Static slicing (``levels`` None) starts at ``q_min``: slice ``i`` holds the values
    whose quantum exponent lies in ``[q_min + i*width, q_min + (i+1)*width)`` (exponent
    windows), or with ``digits`` the balanced base-``2**width`` digit ``i`` of every value
    over ``2**q_min`` (see the module docstring). Per-row slicing (``levels`` set, the wide
    formats) takes ``levels`` slices of ``width`` bits below each row's (column's) largest
    exponent, and further blocks of them while bits remain below. In every kind slice ``i``
    is scaled by ``2**(base + i*width)``.
    """

    format: str
    p: int
    q_min: int
    q_max: int
    width: int
    levels: int | None = None
    digits: bool = False

    @property
    def dynamic(self) -> bool:
        return self.levels is not None

    @property
    def count(self) -> int:
        if self.levels is not None:
            return self.levels
        if self.digits:
            n = _digit_count(self.largest, self.width)
            assert n is not None  # slicing() builds digit slicings only where they fit
            return n
        return -(-(self.q_max - self.q_min + 1) // self.width)

    @property
    def largest(self) -> int:
        """The largest ``|v| / 2**q_min`` (static slicing): ``(2**p - 1) * 2**(q_max - q_min)``."""
        return ((1 << self.p) - 1) << (self.q_max - self.q_min)

    @property
    def offset(self) -> int:
        """What balanced digits add to ``V`` before its plain base-``2**width`` digits are
        read (each digit but the top is then less ``2**(width - 1)``)."""
        return digit_offset(self.width, self.count)

    @property
    def max_int(self) -> int:
        """Largest integer a slice holds: ``(2**p - 1) * 2**(width - 1)`` (static),
        ``2**(width - 1)`` (digits) or ``2**width - 1`` (per row)."""
        if self.levels is not None:
            return (1 << self.width) - 1
        if self.digits:
            return 1 << (self.width - 1)
        return ((1 << self.p) - 1) << (self.width - 1)

    @property
    def significant_bits(self) -> int:
        """Most significant bits in one slice value (what a bf16 slice must hold)."""
        if self.levels is not None:
            return min(self.width, self.p)
        if self.digits:
            return self.width - 1  # |digit| <= 2**(width-1): one bit more only for a power of 2
        return self.p


@functools.cache
def digit_offset(width: int, count: int) -> int:
    """``sum_{i < count - 1} 2**(width - 1) * 2**(width * i)``: added to ``V``, it turns the
    plain digits of the sum (less ``2**(width - 1)`` each, but the top one) into balanced
    digits of ``V``."""
    return sum((1 << (width - 1)) << (width * i) for i in range(count - 1))


@functools.cache
def _digit_count(largest: int, width: int) -> int | None:
    """The fewest balanced base-``2**width`` digits of every integer in ``[0, largest]``,
    the top digit at most ``2**(width - 1)`` and ``largest`` plus the offset below 2**32
    (uint32 arithmetic); None if no count fits."""
    for n in range(1, 33):
        total = largest + digit_offset(width, n)
        if total >= 1 << 32:
            return None
        if total >> (width * (n - 1)) <= 1 << (width - 1):
            return n
    return None


def slicing(fmt: FormatLike, width: int, digits: bool = False) -> Slicing:
    """The slicing of a format: static for the low-precision formats of at most 8 bits
    (integers are one slice, ``m * 2**0``), per row for bfloat16, float16, float32 and the
    float formats of 9 to 16 bits. ``digits``: balanced
    digits instead of exponent windows (low-precision float formats only; ValueError
    where ``width`` makes ``V`` plus the digits' offset reach 2**32)."""
    f = formats.get(fmt)
    wide = _per_row(f)
    if not (wide or f.is_low_precision) or not f.has_zero:
        raise ValueError(
            "fmt: exponent slicing is for the low-precision formats and "
            f"{', '.join(formats.WIDE_FLOATS)}, got {f.name}"
        )
    if f.is_integer:
        return Slicing(f.name, f.bits, 0, 0, width)
    q_min = round(math.log2(f.quantum))  # below the smallest value without subnormals
    q_max = math.floor(math.log2(f.max)) - f.mantissa_bits
    p = f.mantissa_bits + 1
    levels = -(-(p + WIDE_EXTRA_BITS) // width) if wide else None
    if digits:
        if wide:
            raise ValueError(f"digits: {f.name} is sliced per row, not in digits")
        if _digit_count(((1 << p) - 1) << (q_max - q_min), width) is None:
            raise ValueError(f"width: {width}-bit digits of {f.name} do not fit in 32 bits")
    return Slicing(f.name, p, q_min, q_max, width, levels, digits)


def _kinds(f: Format) -> list[Slicing]:
    """Every slicing of ``f`` that :func:`fewest_passes` weighs: per width, exponent windows and,
    for low-precision float formats, balanced digits where they fit."""
    out = []
    for w in _widths(f):
        out.append(slicing(f, w))
        if f.is_float and not _per_row(f):
            largest = out[-1].largest
            if _digit_count(largest, w) is not None:
                out.append(slicing(f, w, digits=True))
    return out


CHUNK_COST = 1024
"""What one element of a slice pair's chunk sums costs in the exact combination (limb
splitting and adding, elementwise work), in multiply-adds of that pair's dot: it weighs the
compute types against each other on targets without stated rates. Within one compute type
the fewest passes win. The figures behind it are in docs/performance.md ("Mode exact")."""


def cost(a: Slicing, b: Slicing, chunk: int) -> float:
    """The relative cost of a slicing: its passes, each with its chunk sums' combination
    (``CHUNK_COST / chunk`` of the pass's dot)."""
    return a.count * b.count * (1 + CHUNK_COST / chunk)


def _per_row(f: Format) -> bool:
    """Whether ``f`` is sliced per row: bfloat16, float16, float32 and the float formats of
    9 to 16 bits (the wide P3109 ones, whose exponent ranges reach 2**-149 and 2**127:
    cut statically, p3109_k12p6se would take 13 slices where it takes 4 per row)."""
    return f.name in formats.WIDE_FLOATS or (f.is_float and f.is_low_precision and f.bits > 8)


def _widths(f: Format) -> range:
    return range(1, 25) if _per_row(f) else range(1, 17)


@functools.cache
def fewest_passes(lhs: Format, rhs: Format, compute: str) -> tuple[Slicing, Slicing, int] | None:
    """The slicings with the fewest passes for ``compute`` ("int8", "bfloat16", "float32"),
    and the K-chunk that keeps every partial sum exact; None if ``compute`` cannot hold
    the slices (int8 and a format with more than 7 significant bits)."""
    best = None
    rhs_kinds = _kinds(rhs)
    for a in _kinds(lhs):
        for b in rhs_kinds:
            if compute == "int8":
                if a.max_int > 127 or b.max_int > 127:
                    continue
                chunk = I32_EXACT // (a.max_int * b.max_int)
            else:
                if compute == "bfloat16" and max(a.significant_bits, b.significant_bits) > 8:
                    continue
                chunk = F32_EXACT // (a.max_int * b.max_int)
                if chunk < MIN_CHUNK:
                    continue
            # fewest passes, then the longest chunk, then exponent windows (the older kind)
            key = (a.count * b.count, -chunk, a.digits + b.digits)
            if best is None or key < best[0]:
                best = (key, a, b, chunk)
    return None if best is None else (best[1], best[2], best[3])
