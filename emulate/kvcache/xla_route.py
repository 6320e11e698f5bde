"""Attention over a stored KV cache layer in XLA: the route on the CPU (and wherever the
kernels do not run), with the kernels' numerics contract.

The same online softmax as the kernels, block by block over the tokens some query sees
(a loop whose trip count is the longest sequence's: nothing past it is read): each block's
codes decoded exactly to f32, each scale block's scores contracted in f32 (``HIGHEST``
precision: exact products) and multiplied by its scales, the softmax weights times the V
scales contracted with the decoded V codes. Queries ``T > 1`` (a prefill) see the tokens
up to their own position.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from emulate.kvcache import blocks, layout
from emulate.kvcache.formats import CacheFormat
from emulate.numerics import codecs

__all__ = ["attend"]

_HIGHEST = lax.Precision.HIGHEST


def _values(rows: jax.Array, fmt: CacheFormat, kv: int, nb: int) -> jax.Array:
    """A block of code rows (B, code rows, KV * hd) as f32 (B, tokens, KV, nb, hd / nb)."""
    c = layout.token_codes(rows, fmt)
    b, n, w = c.shape
    if fmt.granularity is None:
        v = c.astype(jnp.float32)
    else:
        v = codecs.decode(c, fmt.element, to=jnp.float32)
    return v.reshape(b, n, kv, nb, w // kv // nb)


def _scales(rows: jax.Array | None, fmt: CacheFormat, kv: int, nb: int) -> jax.Array | None:
    """A block of stored scales (B, KV * nb, tokens) as f32 (B, KV, nb, tokens)."""
    if rows is None:
        return None
    s = blocks.scale_rows(rows, fmt)
    return s.reshape(s.shape[0], kv, nb, s.shape[-1])


def attend(
    x: jax.Array,
    k: jax.Array,
    k_scales: Any,
    v: jax.Array,
    v_scales: Any,
    visible: jax.Array,
    fmt: CacheFormat,
    block: int,
) -> jax.Array:
    """Scaled queries ``x`` (B, T, KV, G, hd) f32 (:func:`emulate.kvcache.queries.
    scaled_queries`) over one layer's codes ``k``, ``v`` (B, code rows, KV * hd) and their
    per-token or block scales (B, KV * nb, S) or None; query ``t`` of sequence ``b`` sees
    the first ``visible[b] + t`` tokens. Returns (B, T, KV, G, hd) f32 (zero where a
    query sees nothing), before any per-head V scale."""
    bsz, t, kv, g, hd = x.shape
    nb = fmt.blocks(hd)
    xq = x.reshape(bsz, t, kv, g, nb, hd // nb)
    rows_per_block = layout.code_rows(fmt, block)
    last = visible + t - 1  # tokens the last query sees
    stored = 2 * k.shape[1] if fmt.packed else k.shape[1]
    trips = jnp.minimum((jnp.max(last) + block - 1) // block, stored // block)
    sees = visible[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]  # (B, T)

    def body(s: Any, state: tuple) -> tuple:
        m, lsum, acc = state
        token = s * block + jnp.arange(block, dtype=jnp.int32)
        ck = _values(
            lax.dynamic_slice_in_dim(k, s * rows_per_block, rows_per_block, 1), fmt, kv, nb
        )
        cv = _values(
            lax.dynamic_slice_in_dim(v, s * rows_per_block, rows_per_block, 1), fmt, kv, nb
        )
        sk, sv = (
            _scales(
                None if sc is None else lax.dynamic_slice_in_dim(sc, s * block, block, 2),
                fmt,
                kv,
                nb,
            )
            for sc in (k_scales, v_scales)
        )
        raw = jnp.einsum("btkgjd,bnkjd->bkgtjn", xq, ck, precision=_HIGHEST)
        if sk is not None:
            raw = raw * sk[:, :, None, None]
        logits = jnp.sum(raw, axis=4)  # (B, KV, G, T, n)
        seen = token[None, None, :] < sees[:, :, None]  # (B, T, n)
        logits = jnp.where(seen[:, None, None], logits, -jnp.inf)
        p, alpha, m, lsum = blocks.softmax_step(
            logits.reshape(-1, block), m.reshape(-1, 1), lsum.reshape(-1, 1)
        )
        p = p.reshape(bsz, kv, g, t, 1, block)
        if sv is not None:
            p = jnp.where(seen[:, None, None, :, None], p * sv[:, :, None, None], 0.0)
        # tokens no query sees may hold anything (NaN codes, an old sequence's tokens)
        cv = jnp.where((token[None, :] < last[:, None])[:, :, None, None, None], cv, 0.0)
        pv = jnp.einsum("bkgtjn,bnkjd->bkgtjd", p, cv, precision=_HIGHEST)
        acc = alpha.reshape(bsz, kv, g, t, 1) * acc + pv.reshape(bsz, kv, g, t, hd)
        return m.reshape(bsz, kv, g, t), lsum.reshape(bsz, kv, g, t), acc

    state = (
        jnp.full((bsz, kv, g, t), -jnp.inf, jnp.float32),
        jnp.zeros((bsz, kv, g, t), jnp.float32),
        jnp.zeros((bsz, kv, g, t, hd), jnp.float32),
    )
    _, lsum, acc = lax.fori_loop(0, trips, body, state)
    total = lsum[..., None]
    out = blocks.normalized(acc, total)
    return jnp.moveaxis(out, 3, 1)  # (B, T, KV, G, hd)
