"""Where a KV cache's codes and scales lie: array shapes, the token rows of 4-bit codes,
and their unpacking.

One layer of a cache of capacity ``S`` tokens, batch ``B``, ``KV`` heads of ``head_dim``:

- codes ``(B, rows, KV * head_dim)``, token-major: a token's row holds every KV head (so
  a row is at least 128 lanes wide for every model with ``KV * head_dim >= 128``, and
  writing a token touches one row). ``rows = S`` for 8- and 16-bit elements. 4-bit codes
  are packed two a byte along the tokens, in tiles of :data:`TILE` tokens: byte row
  ``tile * 128 + r`` holds token ``tile * 256 + r`` in its low nibble and token
  ``tile * 256 + 128 + r`` in its high one (the K-planar layout of
  :mod:`emulate.pallas.weights`: a kernel splits a loaded block into two runs of whole
  rows, no interleaving), so ``rows = S / 2``;
- per-token and block scales ``(B, KV * nb, S)``, ``nb`` scales per (token, head): tokens
  along the lanes, so a block of tokens reads whole rows and nothing is padded (row
  ``h * nb + j`` is head ``h``'s block ``j``);
- per-head scales ``(KV,)`` float32.

The stacked cache (:class:`emulate.kvcache.KVCache`) adds a leading layer axis to each.
The capacity is rounded up to a multiple of :data:`TILE` tokens (:func:`capacity`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from emulate.kvcache.formats import CacheFormat
from emulate.numerics.storage import split_group_bytes

__all__ = [
    "HALF",
    "TILE",
    "capacity",
    "code_rows",
    "code_shape",
    "scale_shape",
    "token_codes",
    "token_place",
]

#: Tokens of one packing tile (4-bit codes: two runs of :data:`HALF` rows' nibbles); every
#: capacity and kernel block is a multiple of it.
TILE = 256
HALF = TILE // 2


def capacity(length: int) -> int:
    """The stored capacity for at least ``length`` tokens: a multiple of :data:`TILE`.

    Raises:
      ValueError: ``length`` is not a positive int.
    """
    if not isinstance(length, int) or isinstance(length, bool) or length <= 0:
        raise ValueError(f"length: expected a positive int, got {length!r}")
    return -(-length // TILE) * TILE


def code_rows(fmt: CacheFormat, tokens: int) -> int:
    """Rows of codes that hold ``tokens`` tokens (a multiple of :data:`TILE`)."""
    return tokens // 2 if fmt.packed else tokens


def code_shape(fmt: CacheFormat, batch: int, tokens: int, kv_heads: int, head_dim: int) -> tuple:
    """One layer's code array shape."""
    return (batch, code_rows(fmt, tokens), kv_heads * head_dim)


def scale_shape(
    fmt: CacheFormat, batch: int, tokens: int, kv_heads: int, head_dim: int
) -> tuple | None:
    """One layer's scale array shape; None for an unscaled format."""
    if fmt.granularity is None:
        return None
    if fmt.granularity == "head":
        return (kv_heads,)
    return (batch, kv_heads * fmt.blocks(head_dim), tokens)


def token_place(positions: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The byte row and nibble (0: low, 1: high) of 4-bit tokens at ``positions``."""
    tile, r = positions // TILE, positions % TILE
    return tile * HALF + r % HALF, r // HALF


def token_codes(rows: jax.Array, fmt: CacheFormat) -> jax.Array:
    """Codes of whole tiles, one token a row: ``rows`` is ``(..., code rows, lanes)`` of a
    multiple of :data:`TILE` tokens (``HALF`` rows a tile for 4-bit codes); the result is
    ``(..., tokens, lanes)`` in token order, uint8 codes for 4-bit elements (the code in
    the low bits), the stored array itself otherwise."""
    if not fmt.packed:
        return rows
    *lead, n, lanes = rows.shape
    b = rows.reshape(*lead, n // HALF, 1, HALF, lanes)
    pair = jnp.concatenate(split_group_bytes([b], 4), axis=-3)  # (..., tiles, 2, HALF, lanes)
    return pair.reshape(*lead, 2 * n, lanes)
