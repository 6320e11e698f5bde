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

import jax
import jax.numpy as jnp
from jax import lax

from emulate.kvcache import layout
from emulate.kvcache.formats import CacheFormat
from emulate.numerics.storage import to_codes
from emulate.quantized.quantizing import quantize, round_scaled

__all__ = ["put", "token_codes"]


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
    positions: jax.Array,
    new_codes: jax.Array,
    new_scales: jax.Array | None,
    fmt: CacheFormat,
) -> tuple[jax.Array, jax.Array | None]:
    """``codes`` (L, B, rows, lanes) and per-token or block ``scales`` (L, B, KV * nb, S)
    with the tokens of :func:`token_codes` written into ``layer`` at ``positions`` (B, T)
    (int32; a position at or past the capacity is dropped). 4-bit codes share bytes: each
    nibble is merged into its byte, low nibbles first, then high ones (two tokens of one
    call may share a byte)."""
    bsz, t = positions.shape
    seq = jnp.arange(bsz, dtype=jnp.int32)[:, None]
    if fmt.packed:
        rows = codes.shape[2]
        row, nibble = layout.token_place(positions)
        new = new_codes.astype(jnp.uint8)
        for n in (0, 1):
            target = jnp.where((nibble == n) & (positions < 2 * rows), row, rows)  # rows: dropped
            old = codes[layer, seq, jnp.minimum(target, rows - 1)]
            keep = jnp.uint8(0xF0 if n == 0 else 0x0F)
            merged = (old & keep) | (new << (4 * n))
            codes = codes.at[layer, seq, target].set(merged, mode="drop")
    else:
        codes = codes.at[layer, seq, positions].set(new_codes.astype(codes.dtype), mode="drop")
    if new_scales is not None:
        assert scales is not None
        rows_of = jnp.arange(new_scales.shape[-1], dtype=jnp.int32)[None, None, :]
        scales = scales.at[layer, seq[:, :, None], rows_of, positions[:, :, None]].set(
            new_scales, mode="drop"
        )
    return codes, scales
