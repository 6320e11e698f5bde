"""In the kernel, once per K step: the group sums of the activations, two-level parts
decoded for all of the step's groups at once, and the offset term as one dot.

A weight with an offset per group (``W = q s + o``) adds ``sum_g X[m, g] o[g, n]`` to the
product, ``X[m, g]`` the sum of ``x[m, k]`` over the rows of group ``g``. Per K step of
``count`` groups this is matrix-unit work, not per-group vector work:

* ``X = x_tile @ E`` (:func:`group_sums`), ``E`` the constant 0/1 ``(columns, count)``
  group indicator built from iotas in the kernel: bf16 (or integer) tiles with an f32
  (int32) accumulator, f32 tiles at ``Precision.HIGHEST``; each entry of ``X`` is a sum of
  the group's (exactly decoded) activations with one f32 rounding per addition at most,
  as the vector sum it replaces (an exact route's integer sums are exact).
* the step's two-level values ``(code - zero) * super`` (or bitsandbytes'
  ``table[code] * super + offset`` by a select tree) as a ``(count, C)`` f32 matrix
  (:func:`step_levels`): each group's code cut out of the 16-bit word of the two bytes it
  spans, those words picked from the codes' bytes by one one-hot f32 dot at
  ``Precision.HIGHEST`` (bytes and the weights 1 and 256: the f32 sum of one or two
  products is exact), then shifted and masked per row; the super-block scales held as
  their int32 bits and picked with exact one-hot selects (NaN and Inf stay in their
  group; a dot would spread them), each selected one split into ``m * 2**e`` from its bits
  (a float16 one decoded first), so that no float operation flushes an f32 or bf16
  subnormal scale, which :func:`emulate.dequantize` keeps; super-block scales
  of several columns (one row of them) spread to the block's columns by a one-hot f32
  dot of their four bytes (exact, NaN kept in its columns), once per output block (its
  first K step; kept in VMEM scratch for the block's other steps), from the window of
  scales the block needs (:func:`supers_window`: a ``(W, C)`` f32 selector, ``W`` = 128
  or ``C / cols`` scales) or, where no window fits, the whole row.
* the offset term ``X @ O`` (:func:`offset_term`): one f32 dot at ``Precision.HIGHEST``,
  ``count`` products a sum.

Error: the offset term is an f32 sum of ``count`` products ``X o`` added to the step's
sum, inside the ``gamma_(K + S + 5)`` bound :mod:`emulate.pallas.qoffsets` states (the
same products the per-group form adds one at a time). Non-finite values: a NaN or Inf
offset reaches only its column, as before; on a TPU, whose f32 dot at HIGHEST splits each
operand into bf16 parts, an Inf offset may come out as NaN rather than Inf (not checked on
a chip; CPU interpret mode keeps IEEE products).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats
from emulate.numerics import bits, codecs
from emulate.pallas import qcodebook

__all__ = [
    "block_spread",
    "group_sums",
    "offset_term",
    "scaled",
    "select_row",
    "spread_supers",
    "step_levels",
    "super_factors",
    "super_rows",
    "supers_window",
]

_HIGHEST = lax.Precision.HIGHEST


def _indicator(cols: int, count: int, rows: int, dtype: Any) -> jax.Array:
    """``E[c, q] = 1`` where column ``c`` of an x plane lies in group ``q`` (``rows``
    columns a group), else 0, as ``dtype``."""
    c = lax.broadcasted_iota(jnp.int32, (cols, count), 0)
    q = lax.broadcasted_iota(jnp.int32, (cols, count), 1)
    if jnp.issubdtype(jnp.dtype(dtype), jnp.integer):
        return (c // rows == q).astype(jnp.int32).astype(dtype)
    # from f32, not int32: XLA folds int32 -> f32 -> bf16 into one convert, which Mosaic
    # refuses on v4 to 7x without compatibility mode (integer-to-float on 32-bit only)
    return jnp.where(c // rows == q, jnp.float32(1), jnp.float32(0)).astype(dtype)


def group_sums(xs: list[jax.Array], count: int, rows: int, quantum: float = 1.0) -> jax.Array:
    """``X`` (bm, count) f32: per group of ``rows`` consecutive columns of each decoded x
    plane in ``xs`` (bf16, f32 or int8 tiles, one per column plane), the sum over the
    planes and the group's columns, times ``quantum`` (an exact route's ``2**-scale``)."""
    total = None
    for x in xs:
        e = _indicator(x.shape[1], count, rows, x.dtype)
        if jnp.issubdtype(x.dtype, jnp.integer):
            t = lax.dot(x, e, preferred_element_type=jnp.int32).astype(jnp.float32)
        elif x.dtype == jnp.float32:
            t = lax.dot(x, e, precision=_HIGHEST, preferred_element_type=jnp.float32)
        else:
            t = lax.dot(x, e, preferred_element_type=jnp.float32)
        total = t if total is None else total + t
    assert total is not None
    return total if quantum == 1.0 else total * jnp.float32(quantum)


def select_row(rows: jax.Array, index: Any) -> jax.Array:
    """Row ``index`` (dynamic) of ``rows`` (R, C) as (1, C), in the kernel: a one-hot sum,
    exact (every other row contributes +0), NaN and Inf kept; a row past the end is 0.
    Mosaic cannot prove a dynamic single-row load of an 8- or 16-bit block aligned."""
    at = lax.broadcasted_iota(jnp.int32, rows.shape, 0) == index
    return jnp.sum(jnp.where(at, rows, jnp.zeros((), rows.dtype)), axis=0, keepdims=True)


def super_rows(block: jax.Array, fmt: str) -> jax.Array:
    """A loaded block of super-block scales as :func:`step_levels` takes it: int32 bits,
    never values (a float operation flushes a subnormal f32 or bf16 scale on the CPU and
    the TPU): float32 as its bits, bfloat16 as the bits of its f32 widening (``<< 16``),
    float16 (held as uint16 bits) as its 16 bits, decoded only in the rows a step
    selects (the bit formulas cost about 15 vector ops an element)."""
    if fmt in ("float32", "bfloat16"):
        return lax.bitcast_convert_type(bits.f32_bits(block), jnp.int32)
    return block.astype(jnp.int32) & 0xFFFF


def super_factors(rows: jax.Array, fmt: str) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Selected rows of :func:`super_rows` (int32 bits) as three f32 factors ``(m, 2**h,
    2**(e - h))``, ``scale == m * 2**e`` with ``1 <= |m| < 2`` and ``h = floor(e / 2)``,
    from the bits by integer operations (:func:`emulate.numerics.bits.frexp_bits`, as
    :func:`emulate.dequantize` takes them): f32 and bf16 subnormal scales (down to
    ``2**-149``) keep their value. Zero gives ``(+-0, 1, 1)``, NaN and Inf ``(themselves,
    1, 1)``."""
    if fmt == "float16":  # every float16 value is a normal f32 one (or 0, Inf, NaN)
        b = codecs.decode_float_bits(rows, formats.get("float16"))
    else:
        b = lax.bitcast_convert_type(rows, jnp.uint32)
    m, e = bits.frexp_bits(b)
    half = e >> 1  # floor(e / 2): both factors normal, -75 <= h <= 64
    return m, bits.pow2_normal(half), bits.pow2_normal(e - half)


def _words(byte_rows: jax.Array, first: Any, count: int, bits: int) -> jax.Array:
    """(count, C) int32: for group ``first + q``, ``lo | hi << 8`` of the two bytes its
    ``bits``-bit code starts in (:func:`emulate.pack`'s bit stream; past the end: 0), by one
    one-hot f32 dot of the bytes (exact: integers below 2**16)."""
    r = byte_rows.shape[0]
    q = lax.broadcasted_iota(jnp.int32, (count, r), 0)
    c = lax.broadcasted_iota(jnp.int32, (count, r), 1)
    lo = (first + q) * bits // 8
    pick = jnp.where(c == lo, 1.0, 0.0)
    if bits < 8:
        pick = pick + jnp.where(c == lo + 1, 256.0, 0.0)
    # f32 at HIGHEST (exact for integers below 2**16): a bf16 copy of the bytes would be
    # an int32 -> bf16 convert after XLA folds the f32 step, refused on v4 without compat
    b = byte_rows.astype(jnp.float32)
    w = lax.dot(pick, b, precision=_HIGHEST, preferred_element_type=jnp.float32)
    return w.astype(jnp.int32)


def spread_supers(supers: jax.Array, level: Any, col0: Any, width: int) -> jax.Array:
    """Super-block scales of ``level.cols`` columns each (one (1, S) row of int32 bits, as
    :func:`super_rows` gives it) as the (1, width) int32 bits of each column's scale, for
    the output block whose first weight column is ``col0``: column ``c`` takes entry
    ``(col0 + c) // level.cols`` (past the end: 0). One one-hot f32 dot of the bits' four
    bytes (exact: each output sums one byte and zeros; a NaN's bits stay in their columns,
    as a dot of the values would not); :func:`step_levels`' ``spread``, made once per
    output block (:func:`block_spread`)."""
    s = supers.shape[1]
    plane = lax.broadcasted_iota(jnp.int32, (8, s), 0)
    shifted = lax.shift_right_logical(jnp.broadcast_to(supers, (8, s)), (plane & 3) * 8)
    byte = (shifted & 0xFF).astype(jnp.float32)
    t = (
        col0
        + lax.broadcasted_iota(jnp.int32, (s, width), 1)
        - lax.broadcasted_iota(jnp.int32, (s, width), 0) * level.cols
    )
    pick = jnp.where((t >= 0) & (t < level.cols), 1.0, 0.0)
    got = lax.dot(byte, pick, precision=_HIGHEST, preferred_element_type=jnp.float32)
    b = got.astype(jnp.int32)
    return b[0:1] | (b[1:2] << 8) | (b[2:3] << 16) | (b[3:4] << 24)


def supers_window(cols: int, bn: int) -> tuple[int, int] | None:
    """How a kernel reads super-block scales of ``cols`` columns each (one row) for output
    blocks of ``bn`` columns: ``(width, per)``, a block of ``width`` scales (``bn / cols``
    when a multiple of 128, else 128) shared by ``per`` consecutive output blocks; None
    (the whole row) where ``cols`` does not divide ``bn`` or neither of those fits."""
    if cols <= 1 or bn % cols:
        return None
    w = bn // cols
    if w % 128 == 0:
        return w, 1
    if 128 % w == 0:
        return 128, 128 // w
    return None


def block_spread(ref: Any, supers: jax.Array, level: Any, width: int) -> jax.Array:
    """In the kernel: :func:`spread_supers` of the output block (``width`` columns) made at
    its first K step into the (1, width) int32 VMEM scratch ``ref``, then read from it;
    ``supers``: the loaded row (the whole one, or the window :func:`supers_window` gives,
    whose first scale covers weight column ``b0 * level.cols``)."""
    from jax.experimental import pallas as pl  # noqa: PLC0415 - kernel-side only

    j = pl.program_id(1)
    window = supers_window(level.cols, width)
    b0: Any = 0
    if window is not None and supers.shape[1] == window[0]:
        b0 = (j // window[1]) * window[0]
    col0 = j * width - b0 * level.cols

    @pl.when(pl.program_id(2) == 0)
    def _fill():
        ref[...] = spread_supers(supers, level, col0, width)

    return ref[...]


def _supers(
    supers: jax.Array, level: Any, first: Any, count: int, col0: Any, width: int, spread: Any
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """:func:`super_factors` of each of the step's groups' super-block scale, each
    (count, C) or (1, C) f32."""
    fmt = level.super_format
    if level.cols > 1:  # one block spans every group: one row of S scales
        wide = spread_supers(supers, level, col0, width) if spread is None else spread
        return super_factors(wide, fmt)
    q = lax.broadcasted_iota(jnp.int32, (count, 1), 0)
    base = first // level.block
    rel = (first + q) // level.block - base  # (count, 1): 0 .. spans - 1
    spans = (count - 1) // level.block + 2 if count > 1 else 1
    got: tuple[jax.Array, ...] = ()
    for j in range(spans):
        f = super_factors(select_row(supers, base + j), fmt)
        got = f if not got else tuple(jnp.where(rel == j, a, b) for a, b in zip(f, got))
    m, p1, p2 = got
    return m, p1, p2


def scaled(
    values: jax.Array, factors: tuple[jax.Array, jax.Array, jax.Array], offset: float
) -> jax.Array:
    """``values * scale + offset`` as :func:`emulate.dequantize` computes it, whatever the
    compiler contracts: ``values * m`` rounded once (``factors`` from
    :func:`super_factors`), then the two exact power-of-two factors (unless the result is
    below 2**-126, which flushes as there), then the offset added (an FMA of an exact
    product rounds as the plain add)."""
    m, p1, p2 = factors
    v = values * m
    v = v * p1
    v = v * p2
    return v + jnp.float32(offset) if offset else v


def step_levels(
    byte_rows: jax.Array,
    supers: jax.Array,
    level: Any,
    first: Any,
    count: int,
    col0: Any = None,
    spread: Any = None,
) -> jax.Array:
    """Groups ``first .. first + count - 1``'s two-level values as a (count, C) f32 matrix:
    ``(code - level.zero) * super`` rounded once to f32, or with a codebook
    ``codebook[code] * super + offset`` (:func:`scaled`; the table by a select
    tree, :func:`emulate.pallas.qcodebook.select_tree`): :func:`emulate.dequantize`'s
    value. ``byte_rows``: the codes' bytes as int32 (0..255), packed along the groups
    (8-bit codes one a row); ``supers``: the super-block scales as :func:`super_rows`
    gives them, one row per ``level.block`` groups (``level.cols`` > 1: one row, a scale
    per ``cols`` columns of the weight); ``level``:
    :class:`emulate.pallas.qoffsets.KernelLevel`; ``col0``: the weight column of the block's
    first column (``level.cols`` > 1: this or ``spread`` is required; unused otherwise);
    ``spread``: :func:`spread_supers` of the block, if made already.

    Raises:
      ValueError: ``level.cols`` > 1 with neither ``col0`` nor ``spread`` (at trace time:
        every block but the first would get the first block's scales).
    """
    if level.cols > 1 and col0 is None and spread is None:
        raise ValueError(
            "col0: expected the weight column of the block's first column (or spread=) "
            f"for super-block scales of {level.cols} columns each, got None"
        )
    f = formats.get(level.code_format)
    width = f.bits
    q = lax.broadcasted_iota(jnp.int32, (count, 1), 0)
    code = _words(byte_rows, first, count, width)
    if width < 8:
        code = (code >> ((first + q) * width % 8)) & ((1 << width) - 1)
    sup = _supers(supers, level, first, count, col0, byte_rows.shape[1], spread)
    if level.codebook is not None:
        table = tuple(float(v) for v in level.codebook.array().astype(np.float32))
        return scaled(qcodebook.select_tree(code, table), sup, level.offset)
    if f.signed:
        half = 1 << (width - 1)
        code = (code ^ half) - half
    if level.zero:
        code = code - level.zero
    return scaled(code.astype(jnp.float32), sup, 0.0)


def offset_term(sums: jax.Array, offsets: jax.Array) -> jax.Array:
    """``X @ O``: the group sums (bm, count) times the step's offsets (count, C), f32."""
    return lax.dot(sums, offsets, precision=_HIGHEST, preferred_element_type=jnp.float32)
