"""The pieces of attention over a block of stored tokens, shared by the Pallas kernels
(:mod:`emulate.kvcache.decode_kernel`, :mod:`emulate.kvcache.prefill_kernel`) and the
preparation of their operands: the geometry of heads in a code row (:class:`Geometry`),
exact bf16 pieces of f32 values (:func:`split3`), stored codes and scales decoded into
values (:func:`code_parts`, :func:`scale_rows`), the 4-bit tiles' token order
(:func:`tokens_in_order`, :func:`tiles_apart`) and the online softmax step
(:func:`softmax_step`).

Everything here is plain ``jnp`` on loaded values that Mosaic compiles on every TPU
generation with compatibility mode off: 32-bit integer ops and bitcasts for the decoding
(:func:`emulate.pallas.compute.decode_codes`), no integer-to-float conversion of narrow
types, no gather.

Why pieces: the matrix unit multiplies a bf16 (or, on v2 and v3, f32 in one bf16 pass)
operand exactly only if its values are bf16 values. Decoded codes are (every 8-bit and
4-bit element format is exact in bf16); a query or a softmax weight is not, so it is cut
into three bf16 pieces whose sum is the f32 value exactly (:func:`split3`), stacked as rows
of one matmul against the stored block: every product exact, the sum accumulated in f32.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import tpu as pltpu

from emulate import formats
from emulate.kvcache import layout
from emulate.kvcache.formats import CacheFormat
from emulate.numerics import codecs
from emulate.numerics.storage import split_group_bytes
from emulate.pallas.compute import decode_codes, decode_values

__all__ = [
    "PIECES",
    "Geometry",
    "cache_operands",
    "code_parts",
    "compute_dtype",
    "normalized",
    "row_tokens",
    "scale_rows",
    "softmax_step",
    "split3",
    "tiles_apart",
    "tokens_in_order",
]

#: bf16 pieces of an f32 value (:func:`split3`).
PIECES = 3
_LANES = 128


@dataclasses.dataclass(frozen=True)
class Geometry:
    """Where each KV head's lanes lie in a code row of ``kv_heads * head_dim`` lanes, and
    the row groups of a stacked operand.

    A kernel reads one *window* of ``window`` lanes per head: the head's own lanes when
    ``head_dim`` is a multiple of 128; a 128-lane window shared by ``128 / head_dim``
    heads when ``head_dim`` divides 128 and the row is a multiple of 128; else the whole
    row (odd head counts of narrow heads). Queries are placed at the head's offset in its
    window, zero elsewhere.

    Attributes:
      kv_heads, groups, head_dim: KV heads, query heads per KV head, head width.
      blocks: scales per (token, head) (``head_dim / block`` for block scales, else 1).
    """

    kv_heads: int
    groups: int
    head_dim: int
    blocks: int

    @property
    def window(self) -> int:
        row, hd = self.kv_heads * self.head_dim, self.head_dim
        if hd % _LANES == 0:
            return hd
        if _LANES % hd == 0 and row % _LANES == 0:
            return _LANES
        return row

    def start(self, h: Any) -> Any:
        """The first lane of head ``h``'s window in a code row."""
        return (h * self.head_dim) // self.window * self.window

    def offset(self, h: Any) -> Any:
        """Head ``h``'s first lane inside its window."""
        return h * self.head_dim - self.start(h)

    @property
    def row_groups(self) -> int:
        """Row groups of a stacked operand: (piece, scale block) pairs."""
        return PIECES * self.blocks

    def lane_mask(self, h: Any, j: int, shape: tuple[int, ...]) -> jax.Array:
        """Which lanes of a window hold head ``h``'s scale block ``j``."""
        lane = lax.broadcasted_iota(jnp.int32, shape, 1) - self.offset(h)
        width = self.head_dim // self.blocks
        return (lane >= j * width) & (lane < (j + 1) * width)

    @property
    def whole_head(self) -> bool:
        """Whether a window is exactly one head, one scale block (no lane mask needed)."""
        return self.window == self.head_dim and self.blocks == 1


def compute_dtype(generation_is_f32: bool) -> jnp.dtype:
    """The type the matrix unit takes: f32 on v2 and v3 (Mosaic multiplies f32 x f32
    only; one bf16 pass, exact for bf16 values), bf16 elsewhere."""
    return jnp.dtype(jnp.float32 if generation_is_f32 else jnp.bfloat16)


def split3(x: jax.Array) -> list[jax.Array]:
    """Three f32 arrays of bf16 values whose sum is ``x`` exactly (finite ``x``, not
    below ``2**-110`` in magnitude, where the last piece could underflow): each piece keeps
    the top 8 significand bits of what is left (a truncation by bit mask, which no
    compiler folds), so every piece has ``x``'s sign and their magnitudes add up to
    ``|x|``. NaN and Inf stay in the first piece (the others are then NaN)."""
    pieces = []
    rest = x
    for _ in range(PIECES - 1):
        top = lax.bitcast_convert_type(
            lax.bitcast_convert_type(rest, jnp.uint32) & jnp.uint32(0xFFFF0000), jnp.float32
        )
        pieces.append(top)
        rest = rest - top
    pieces.append(rest)
    return pieces


def code_parts(
    loaded: jax.Array, fmt: CacheFormat, to: jnp.dtype, first: Any = None, limit: Any = None
) -> list[jax.Array]:
    """A loaded block of stored codes decoded into ``to``: one array of the block's
    shape, or for 4-bit codes two (the low nibbles, then the high ones: the first and
    the second :data:`emulate.kvcache.layout.HALF` tokens of each tile). Exact: every
    element value is a bf16 value.

    With ``first`` (the block's first token) and ``limit``, the rows of tokens at or past
    ``limit`` are zero where a code could decode to NaN or Inf (float8 codes, bfloat16
    values; done on the integer codes: v4 has no bf16 select); integer and float4 codes
    are always finite, and a zero weight times them is zero, so they are left as they
    are (a select an element is a fifth of the decoding's vector work)."""
    element = fmt.element_format
    if not (element.has_nan or element.has_inf):
        limit = None
    if fmt.granularity is None:  # bfloat16 values
        values = [loaded.astype(jnp.float32)]
    elif fmt.element == "int8":  # sign-extended as loaded, then built from its bits
        values = [decode_values(loaded, "float32")]
    elif fmt.element == "int4":  # two's complement nibbles: (n ^ 8) - 8, from bits
        c = loaded.astype(jnp.int32)
        values = [_int4_values(n) for n in split_group_bytes([c], 4)]
    else:
        if jnp.issubdtype(loaded.dtype, jnp.floating):  # float8: Mosaic bitcasts to int8
            loaded = lax.bitcast_convert_type(loaded, jnp.int8)
        c = loaded.astype(jnp.int32)
        codes = split_group_bytes([c], 4) if fmt.packed else [c & 0xFF]
        if limit is not None:  # code 0 is zero in every element format
            codes = [
                jnp.where(row_tokens(fmt, p.shape, first, i) < limit, p, 0)
                for i, p in enumerate(codes)
            ]
            limit = None
        values = [decode_codes(p, fmt.element, "float32") for p in codes]
    if limit is not None:
        values = [jnp.where(row_tokens(fmt, v.shape, first, 0) < limit, v, 0.0) for v in values]
    return [v.astype(to) for v in values]


def _int4_values(n: jax.Array) -> jax.Array:
    """int4 codes ``n`` (int32, 0..15) as f32 values: ``n ^ 8`` is the value plus 8, so
    the float ``2**23 + 2**22 + (n ^ 8)`` is built by an OR into its bits and the
    offset subtracted once (exact: integers below 2**22): three vector ops a code."""
    biased = lax.bitcast_convert_type((n ^ 8) | 0x4B400000, jnp.float32)
    return biased - jnp.float32(12582912.0 + 8.0)


def scale_rows(loaded: jax.Array, fmt: CacheFormat) -> jax.Array:
    """Loaded per-token or block scales (stored dtype) as f32 values."""
    if fmt.scale_format in ("float32", None):
        return loaded.astype(jnp.float32)
    mask = 0xFFFF if fmt.scale_format == "float16" else 0xFF
    bits = codecs.decode_float_bits(loaded.astype(jnp.int32) & mask, formats.get(fmt.scale_format))
    return lax.bitcast_convert_type(bits, jnp.float32)


def tokens_in_order(lo: jax.Array, hi: jax.Array) -> jax.Array:
    """Columns of the low and the high nibbles' tokens (``(rows, n)`` each, ``n`` a
    multiple of :data:`emulate.kvcache.layout.HALF`) in token order: 128-lane runs taken
    alternately (lane-aligned slices, no shuffle)."""
    runs = []
    for t in range(lo.shape[1] // layout.HALF):
        cut = slice(t * layout.HALF, (t + 1) * layout.HALF)
        runs += [lo[:, cut], hi[:, cut]]
    return jnp.concatenate(runs, axis=1)


def tiles_apart(x: jax.Array) -> list[jax.Array]:
    """The inverse of :func:`tokens_in_order`: columns ``(rows, tokens)`` in token order
    split into the low and the high nibbles' tokens."""
    h = layout.HALF
    tiles = range(x.shape[1] // layout.TILE)
    lo = jnp.concatenate([x[:, t * 2 * h : t * 2 * h + h] for t in tiles], axis=1)
    hi = jnp.concatenate([x[:, t * 2 * h + h : (t + 1) * 2 * h] for t in tiles], axis=1)
    return [lo, hi]


def softmax_step(
    logits: jax.Array, m_prev: jax.Array, l_prev: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """One block of the online softmax: ``logits`` (rows, n) f32 with masked entries at
    -inf, the running maximum and sum (rows, 1). Returns ``(p, alpha, m, l)``: the block's
    weights ``exp(logits - m)``, the factor ``exp(m_prev - m)`` of the earlier sums, and
    the new maximum and sum. A row with nothing visible yet keeps ``m = -inf`` and zero
    weights (its maximum is taken as 0 in the exponent, never ``-inf - -inf``)."""
    m = jnp.maximum(m_prev, jnp.max(logits, axis=1, keepdims=True))
    m_safe = jnp.where(m == -jnp.inf, 0.0, m)
    p = jnp.exp(logits - m_safe)
    alpha = jnp.exp(m_prev - m_safe)
    return p, alpha, m, alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)


def cache_operands(
    stored: tuple[Any, Any, Any, Any], code_spec: Any, scale_spec: Any, interpret: bool
) -> tuple[list[Any], list[Any]]:
    """A kernel's cache operands ``(k, k_scales, v, v_scales)`` (scales None for per-head
    and unscaled formats: left out) and their block specs, in that order; outside
    interpret mode each constrained to stay in HBM and be streamed (7x would otherwise
    copy a whole cache into VMEM first)."""
    k, ks, v, vs = stored
    if ks is None:
        specs, operands = [code_spec, code_spec], [k, v]
    else:
        specs, operands = [code_spec, scale_spec, code_spec, scale_spec], [k, ks, v, vs]
    if not interpret:
        operands = [pltpu.with_memory_space_constraint(a, pltpu.HBM) for a in operands]
    return specs, operands


def normalized(acc: jax.Array, total: jax.Array) -> jax.Array:
    """The online softmax's result ``acc / total``; 0 where a row saw no token (``total``
    is 0), NaN where the sum is NaN (a NaN score or value)."""
    empty = total == 0
    return jnp.where(empty, 0.0, acc / jnp.where(empty, 1.0, total))


def row_tokens(
    fmt: CacheFormat, shape: tuple[int, ...], first: jax.Array, nibble: int
) -> jax.Array:
    """The token of each row of a decoded part (:func:`code_parts`) of a block whose first
    token is ``first``: row ``r`` for one code a row; for 4-bit codes, row ``r`` of the
    low (``nibble`` 0) or high (1) nibbles is token ``(r // HALF) * TILE + nibble * HALF +
    r % HALF``."""
    r = lax.broadcasted_iota(jnp.int32, shape, 0)
    if not fmt.packed:
        return first + r
    half = layout.HALF  # a power of two: shifts and masks (no vector integer division)
    shift = half.bit_length() - 1
    return first + ((r >> shift) << (shift + 1)) + nibble * half + (r & (half - 1))
