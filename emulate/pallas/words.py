"""In the kernel: packed 4-bit codes cut out of whole 32-bit words, in K order.

A 4-bit :class:`emulate.pallas.weights.KernelWeight` keeps each tile of 256 rows in *word
order* (:func:`emulate.pallas.weights.word_order_rows`): its 128 byte rows, read as 32
little-endian words per column, hold in nibble ``q + 4e`` of word ``i`` the tile row
``64q + 2i + e``. So the word block (``pltpu.bitcast`` of the loaded bytes: no copy)
gives rows in order a pair at a time:

* :func:`tile_values` decodes a tile into the values the matrix unit takes. With
  bfloat16 arithmetic in the vector unit (TPU v6e and later, :func:`bf16_vector_unit`)
  ``((w >> 4q) & 0x000F000F) | 0x43004300`` is the pair of bfloat16 values ``128 + c``
  for rows ``64q + 2i`` and ``64q + 2i + 1`` (low, high half), and one bfloat16
  subtraction of ``128 + z`` gives ``c - z`` exactly (|c - z| < 256): four operations
  per word for two rows, no conversion. Elsewhere each nibble becomes an int32 (a shift
  and a mask), ``c - z`` an f32 by one conversion, and two rows of f32 values one
  bfloat16 pair (:func:`pack_rows`: one pack operation, exact since every value is a
  small integer); on TPU v2 and v3, whose matrix unit takes f32 only, the pair is widened
  back to f32 (the rows in order).
* :func:`natural_codes` gives the codes themselves (int32, K order), for the kernel's
  other routes.

Everything is exact: the decoded value of every code is ``c - z`` (signed codes as
two's complement nibbles, ``z`` the zero point or 0) in the compute type.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = [
    "TILE_ROWS",
    "TILE_WORDS",
    "bf16_vector_unit",
    "natural_codes",
    "pack_rows",
    "piece_rows",
    "tile_values",
    "to_piece_order",
    "words",
]

#: Rows of K per word-order tile (4-bit codes) and its 32-bit word rows.
TILE_ROWS = 256
TILE_WORDS = 32
#: Rows of one pair run: nibbles q and q + 4 of a tile's words.
_RUN = 64
#: Targets whose vector unit has bfloat16 arithmetic (from TPU v6e on).
_BF16_VPU_GENERATIONS = 6
_SIGN_FLIP = -0x77777778  # 0x88888888 as an int32: flips the top bit of every nibble


def bf16_vector_unit(target: Any) -> bool:
    """Whether ``target`` (a :class:`emulate.targets.Target`) adds bfloat16 vectors in
    its vector unit (TPU v6e, 7x and later); v2 to v5p emulate it in f32."""
    return target.kind == "tpu" and (target.generation or 0) >= _BF16_VPU_GENERATIONS


def words(block: jax.Array) -> jax.Array:
    """A loaded (R, C) uint8 / int8 block as its (R / 4, C) int32 words (free)."""
    from jax.experimental.pallas import tpu as pltpu  # noqa: PLC0415 - kernel-side only

    return pltpu.bitcast(block, jnp.int32)


def pack_rows(a: jax.Array, b: jax.Array, interpret: bool) -> jax.Array:
    """f32 ``a`` and ``b`` (R, C), every value exact in bfloat16, as one (2R, C) bfloat16
    array whose rows ``2i`` and ``2i + 1`` are ``a[i]`` and ``b[i]``: one pack operation
    per pair of vectors on a TPU (``pltpu.pack_elementwise``); in interpret mode the same
    bits from the f32 bits (exact values: truncation is the rounding)."""
    from jax.experimental.pallas import tpu as pltpu  # noqa: PLC0415 - kernel-side only

    if interpret:
        lo = lax.shift_right_logical(lax.bitcast_convert_type(a, jnp.uint32), jnp.uint32(16))
        hi = lax.bitcast_convert_type(b, jnp.uint32) & jnp.uint32(0xFFFF0000)
        word = lo | hi
    else:
        word = pltpu.pack_elementwise([a, b], packed_dtype=jnp.bfloat16)
    return pltpu.bitcast(word, jnp.bfloat16)


def _nibble(w: jax.Array, p: int) -> jax.Array:
    """Nibble ``p`` of each int32 word as an unsigned int32 (0..15)."""
    if p == 0:
        return w & 0xF
    s = lax.shift_right_logical(w, 4 * p)
    return s if p == 7 else s & 0xF


def _rows_of(zero: Any, rows: int, start: int, group: int, dtype: Any) -> Any:
    """The zero points of an array's ``rows`` rows, row ``r`` in group ``(start + r) //
    group``, as something that broadcasts against a (rows, C) array: a scalar, or the
    groups' (1, C) rows of ``zero`` (Z, C), each repeated over its rows."""
    if zero is None or isinstance(zero, (int, float)):
        return zero
    first, last = start // group, (start + rows - 1) // group
    if first == last:
        return zero[first : first + 1].astype(dtype)
    parts = [
        jnp.broadcast_to(
            zero[g : g + 1].astype(dtype),
            (min(start + rows, (g + 1) * group) - max(start, g * group), zero.shape[1]),
        )
        for g in range(first, last + 1)
    ]
    return jnp.concatenate(parts, axis=0)


def tile_values(
    w: jax.Array,
    *,
    signed: bool,
    to: str,
    bf16_vpu: bool,
    interpret: bool,
    zero: Any = None,
    group: int = TILE_ROWS,
    piece_order: bool = False,
) -> jax.Array:
    """One word-order tile, (32, C) int32 words, as its (256, C) values ``c - z`` in K
    order, of type ``to`` ("bfloat16" or "float32"); with ``piece_order`` (f32 only) in
    *piece order* instead, row ``64q + 32e + i`` holding K row ``64q + 2i + e``
    (:func:`piece_rows`; no pair is packed: contract it with ``x`` permuted so).

    Args:
      w: the tile's words.
      signed: the codes are two's complement nibbles (int4), else unsigned (uint4).
      to: the compute type.
      bf16_vpu: build bfloat16 pairs with bfloat16 arithmetic (:func:`bf16_vector_unit`).
      interpret: Pallas interpret mode (:func:`pack_rows`).
      zero: None, an int (one zero point for every code), or an int32 (Z, C) array of the
        tile's zero points per group of ``group`` rows (Z = 256 / group, group a
        multiple of 16).
      group: rows per zero point (when ``zero`` is an array).
    """
    if bf16_vpu and to == "bfloat16":
        from jax.experimental.pallas import tpu as pltpu  # noqa: PLC0415 - kernel-side only

        if signed:
            w = w ^ _SIGN_FLIP  # nibble n ^ 8: its value n - 8 (two's complement) plus 8
        bias = 8 if signed else 0
        runs = []
        for q in range(4):
            s = lax.shift_right_logical(w, 4 * q) if q else w
            v = pltpu.bitcast((s & 0x000F000F) | 0x43004300, jnp.bfloat16)  # 128 + c
            z = _rows_of(zero, _RUN, _RUN * q, group, jnp.float32)
            off = 128 + bias + (0 if z is None else z)
            runs.append(v - jnp.asarray(off).astype(jnp.bfloat16))
        return jnp.concatenate(runs, axis=0)
    if not signed and isinstance(zero, int) and zero == 8:  # uint4 - 8: int4 of n ^ 8
        w, signed, zero = w ^ _SIGN_FLIP, True, None
    runs = []
    for q in range(4):
        pair = []
        for e in range(2):  # rows 64q + 2i + e: nibble q + 4e
            p = q + 4 * e
            if signed:  # the nibble's top bit to bit 31, then an arithmetic shift back
                c = lax.shift_left(w, 28 - 4 * p) if p < 7 else w
                c = lax.shift_right_arithmetic(c, 28)
            else:
                c = _nibble(w, p)
            # word row i holds tile row 64q + 2i + e: group (32q + i) // (group / 2)
            z = _rows_of(zero, TILE_WORDS, TILE_WORDS * q, group // 2, jnp.int32)
            if z is not None and not (isinstance(z, int) and z == 0):
                c = c - z
            pair.append(c.astype(jnp.float32))
        if piece_order:
            runs += pair
            continue
        v = pack_rows(pair[0], pair[1], interpret)
        runs.append(v.astype(jnp.float32) if to == "float32" else v)
    return jnp.concatenate(runs, axis=0)


def piece_rows(n: int) -> np.ndarray:
    """For piece order (:func:`tile_values`), the K row of each of ``n`` rows (a multiple
    of 64): row ``64q + 32e + i`` holds K row ``64q + 2i + e``."""
    r = np.arange(n)
    return r // _RUN * _RUN + 2 * (r % TILE_WORDS) + (r % _RUN) // TILE_WORDS


def to_piece_order(x: jax.Array) -> jax.Array:
    """``x`` (M, K), K a multiple of 64, with its columns in piece order: column
    ``64q + 32e + i`` takes column ``64q + 2i + e`` (an XLA transpose, outside kernels)."""
    m, k = x.shape
    return x.reshape(m, k // _RUN, TILE_WORDS, 2).swapaxes(2, 3).reshape(m, k)


def natural_codes(w: jax.Array, interpret: bool) -> jax.Array:
    """Word-order tiles, (32 T, C) int32 words, as their (256 T, C) unsigned int32 codes
    in K order (exact: each pair of rows goes through a bfloat16 pair and back)."""
    tiles = []
    for t in range(w.shape[0] // TILE_WORDS):
        v = tile_values(
            w[t * TILE_WORDS : (t + 1) * TILE_WORDS],
            signed=False,
            to="float32",
            bf16_vpu=False,
            interpret=interpret,
        )
        tiles.append(v.astype(jnp.int32))
    return tiles[0] if len(tiles) == 1 else jnp.concatenate(tiles, axis=0)
