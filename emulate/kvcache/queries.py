"""Queries as the attention kernels read them, and their outputs back.

The kernels multiply stored codes, never scaled values: a block's scale multiplies the
scores (K) or the softmax weights (V) of its lanes. A query is scaled once per call,
outside the kernels (it is small next to the cache): by the softmax scale and, for
per-head formats, the head's K scale (one f32 product, :func:`scaled_queries`), and
placed at its head's offset in the head's window of lanes (:func:`windowed`,
:class:`emulate.kvcache.blocks.Geometry`). The kernels cut it into exact bf16 pieces
themselves (:func:`emulate.kvcache.blocks.split3`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from emulate.kvcache.blocks import Geometry

__all__ = ["scaled_queries", "windowed"]


def scaled_queries(q: jax.Array, kv_heads: int, factor: jax.Array) -> jax.Array:
    """``q`` (B, T, H, head_dim) as f32 (B, T, KV, groups, head_dim), times ``factor``
    (KV,) f32 (the softmax scale, times each head's fixed K scale where the format has
    one): one f32 rounding per element."""
    b, t, h, hd = q.shape
    x = q.astype(jnp.float32).reshape(b, t, kv_heads, h // kv_heads, hd)
    return x * factor[:, None, None]


def windowed(x: jax.Array, g: Geometry) -> jax.Array:
    """Scaled queries ``(..., KV, G, hd)`` placed at each head's offset in its window of
    lanes: ``(..., KV, G, window)``, zero elsewhere (``x`` itself where a window is one
    head)."""
    if g.window == g.head_dim:
        return x
    placed = []
    for h in range(g.kv_heads):
        off = g.offset(h)
        pad = [(0, 0)] * (x.ndim - 2) + [(off, g.window - off - g.head_dim)]
        placed.append(jnp.pad(x[..., h, :, :], pad))
    return jnp.stack(placed, axis=-3)
