"""Writing tokens into a KV cache: quantize their K or V rows (:func:`token_codes`) and put
the codes and scales at their positions (:func:`put`).

Quantization is :func:`emulate.quantize`'s, element for element: per-token and block
scales by the format's rule (``absmax``: the block's largest magnitude times ``fl(1 /
max)`` rounded into the scale format; ``ocp_floor``: ``2**(floor(log2 amax) - emax)``),
the values divided by their scale, saturated at ``+-max`` and rounded to nearest even; a
block holding NaN or Inf gets a NaN scale and zero codes. Per-head scales are fixed: the
values are multiplied by ``fl(1 / scale)`` and rounded by the same rule
(:func:`emulate.quantized.quantizing.round_scaled`), so NaN becomes the format's NaN code
(int8 has none: 0) and Inf saturates. bfloat16 caches round to nearest even.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from emulate.kvcache import layout
from emulate.kvcache.formats import CacheFormat
from emulate.numerics.storage import to_codes
from emulate.quantized.quantizing import quantize, round_scaled

__all__ = ["put", "token_codes"]

#: Lanes of a vector: a write of scales covers whole runs of them.
_LANES = 128
#: Rows of a TPU memory tile of 8-bit values (32 x 128): an unpacked write's window
#: starts and ends on them (16-bit and 32-bit tiles divide them).
_ROWS = 32


def token_codes(
    x: jax.Array, fmt: CacheFormat, head_scales: jax.Array | None = None
) -> tuple[jax.Array, jax.Array | None]:
    """The stored form of rows ``x`` (B, T, KV, head_dim) of K or V: codes (B, T, KV *
    head_dim) in the format's code dtype (uint8 codes, one a byte, for 4-bit elements) and
    scales (B, T, KV * nb) in its scale dtype, or None (per-head and unscaled formats).
    ``head_scales``: (KV,) float32, for per-head formats."""
    b, t, kv, hd = x.shape
    x = x.astype(jnp.float32)
    if fmt.granularity is None:
        return x.astype(fmt.code_dtype).reshape(b, t, kv * hd), None
    if fmt.granularity == "head":
        assert head_scales is not None
        inverse = jnp.float32(1) / head_scales.astype(jnp.float32)
        codes = round_scaled(x * inverse[:, None], fmt.element)
        return _stored_codes(codes, fmt).reshape(b, t, kv * hd), None
    q = quantize(
        x,
        fmt.element,
        axis=-1,
        block_shape=fmt.block,
        scale_fmt=fmt.scale_format,
        scale_rule=fmt.scale_rule,
        packed=False,
    )
    scales = q.scales
    assert fmt.scale_dtype is not None
    if scales.dtype != fmt.scale_dtype:  # float16 bits, e8m0 codes
        scales = lax.bitcast_convert_type(scales, fmt.scale_dtype)
    return _stored_codes(q.codes, fmt).reshape(b, t, kv * hd), scales.reshape(b, t, -1)


def _stored_codes(codes: jax.Array, fmt: CacheFormat) -> jax.Array:
    return to_codes(codes, fmt.element)[0] if fmt.packed else codes


def put(
    codes: jax.Array,
    scales: jax.Array | None,
    layer: jax.Array | int,
    start: jax.Array,
    new_codes: jax.Array,
    new_scales: jax.Array | None,
    fmt: CacheFormat,
) -> tuple[jax.Array, jax.Array | None]:
    """``codes`` (L, B, rows, lanes) and per-token or block ``scales`` (L, B, KV * nb, S)
    with the T tokens of :func:`token_codes` written into ``layer`` at positions
    ``start[b] .. start[b] + T - 1`` of each sequence (a position at or past the capacity
    is dropped).

    One sequence at a time, each as a read of the window of whole row groups (columns of
    scales) its tokens fall in, the new codes merged in (4-bit codes: each token's
    nibble), and one ``dynamic_update_slice`` back: in place when the cache is donated,
    and XLA:TPU reads and writes the window only. (Its scatter into an 8-bit array copies
    the whole array through VMEM: 571 MB accessed to write 16 tokens of a 64 MiB int8
    layer, v5e; so does a window sliced at a traced row rather than a group.)"""
    seqs, t = new_codes.shape[:2]
    n_layers, batch, rows, lanes = codes.shape
    tokens = 2 * rows if fmt.packed else rows
    # A window is whole groups of 32 rows (an 8-bit memory tile) taken along a major axis
    # of its own: sliced at a traced row instead, XLA:TPU relays the whole layer out into
    # other tiles first (a 64 MiB int8 layer copied into VMEM on every write: a decode
    # step moved 2.0x its ideal bytes on v5e). 4-bit codes: a token's row is
    # (p // TILE) * HALF + p % HALF, so up to HALF tokens fall in two runs of rows (the
    # second from the start of the tile where they cross into its high nibbles): one
    # window at the first token's row, one ending at the last's; longer writes take
    # whole tiles.
    tiles = fmt.packed and t > layout.HALF
    group = layout.HALF if tiles else _ROWS
    per_group = layout.TILE if tiles else _ROWS  # tokens a group holds, where contiguous
    groups = rows // group
    span = min(groups, -(-(t - 1) // per_group) + 1)  # groups a run of t tokens can touch
    grouped = codes.reshape(n_layers, batch, groups, group, lanes)
    new = new_codes.astype(codes.dtype if not fmt.packed else jnp.uint8)

    def firsts(p: Any) -> list:
        """The first group of each window the tokens ``p .. p + t - 1`` need."""
        if not fmt.packed or tiles:
            return [p // per_group]
        last = p + t - 1
        end = (last // layout.TILE) * layout.HALF + last % layout.HALF
        row = (p // layout.TILE) * layout.HALF + p % layout.HALF
        if t == 1:  # one run
            return [row // group]
        return [row // group, jnp.maximum(end - (t - 1), 0) // group]

    def one(b: Any, grouped: jax.Array) -> jax.Array:
        p = start[b]
        for first in firsts(p):
            first = jnp.clip(first, 0, groups - span)
            at = (layer, b, first, 0, 0)
            old = lax.dynamic_slice(grouped, at, (1, 1, span, group, lanes))
            row = first * group + jnp.arange(span * group, dtype=jnp.int32)
            merged = _merged(old.reshape(span * group, lanes), row, new[b], p, t, tokens, fmt)
            grouped = lax.dynamic_update_slice(grouped, merged.reshape(old.shape), at)
        return grouped

    def one_scales(b: Any, scales: jax.Array) -> jax.Array:
        assert new_scales is not None
        p = start[b]
        # whole 128-lane columns: a narrower update makes XLA:TPU lay the array out
        # transposed and copy all of it to and from the kernel's layout
        w = min((-(-(t - 1) // _LANES) + 1) * _LANES, scales.shape[-1])
        c0 = jnp.clip((p // _LANES) * _LANES, 0, scales.shape[-1] - w)
        at_s = (layer, b, 0, c0)
        old_s = lax.dynamic_slice(scales, at_s, (1, 1, scales.shape[2], w))[0, 0]
        col = c0 + jnp.arange(w, dtype=jnp.int32)
        take = jnp.take(new_scales[b].T, jnp.clip(col - p, 0, t - 1), axis=1)
        keep = (col >= p) & (col < p + t)
        return lax.dynamic_update_slice(
            scales, jnp.where(keep[None, :], take, old_s)[None, None], at_s
        )

    grouped = lax.fori_loop(0, seqs, one, grouped)
    if scales is not None and new_scales is not None:
        # 16-bit scales (float16: q4_0, q8_0) carried through a loop: XLA:TPU on 7x keeps
        # the whole array in VMEM in (16, 128) tiles for the loop and copies it in and
        # out around it (4 copies of a layer's scales: 16.8 MB for the 8B at 16 x 4096
        # tokens); written in straight-line code, each window is updated in HBM
        unroll = scales.dtype.itemsize == 2
        scales = lax.fori_loop(0, seqs, one_scales, scales, unroll=unroll)
    return grouped.reshape(codes.shape), scales


def _merged(
    old: jax.Array, row: jax.Array, new: jax.Array, p: Any, t: int, tokens: int, fmt: CacheFormat
) -> jax.Array:
    """A window of stored rows ``old`` (rows ``row``) with the tokens ``p .. p + t - 1``
    of ``new`` (t, lanes) written in: whole rows, or for 4-bit codes each token's nibble
    (token ``(r // HALF) * TILE + nibble * HALF + r % HALF`` of row ``r``)."""
    if not fmt.packed:
        keep = (row >= p) & (row < p + t)
        return jnp.where(keep[:, None], jnp.take(new, jnp.clip(row - p, 0, t - 1), axis=0), old)
    out = old
    for nibble in (0, 1):
        token = (row // layout.HALF) * layout.TILE + nibble * layout.HALF + row % layout.HALF
        keep = (token >= p) & (token < p + t) & (token < tokens)
        code = jnp.take(new, jnp.clip(token - p, 0, t - 1), axis=0) & 15
        shift = 4 * nibble
        placed = (out & jnp.uint8(0xF0 >> shift)) | (code << shift).astype(jnp.uint8)
        out = jnp.where(keep[:, None], placed, out)
    return out
