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
  other routes (a 16-entry table's values: :func:`emulate.pallas.qcodebook.table_tiles`).

Everything is exact: the decoded value of every code is ``c - z`` (signed codes as
two's complement nibbles, ``z`` the zero point or 0) in the compute type.

float4_e2m1fn codes (``e2m1=True``: MXFP4, NVFP4) are built as floats from their bits,
exactly (every value, 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, is a bfloat16). The
magnitude's three bits ``em = 2E + m`` go under the exponent and mantissa fields of
``y = 2**(E - 1) * (1 + m / 2)`` (bfloat16 bits ``(em << 6) + 0x3F00``), the value of
every normal code (``E > 0``); for the subnormal binade (codes 0 and 1: values 0 and 0.5,
where ``y`` is 0.5 and 0.75) the value is ``2y - 1``, so it is ``min(y, 2y - 1)``
(exact: small dyadic numbers), with no select and no float subnormal (XLA and the TPU
flush those); the sign bit is put in last. Both halves of a word, two rows, are built at
once with integer operations (:func:`e2m1_pairs`); with bfloat16 arithmetic the ``min``
runs on the pair (nine operations a pair of rows), elsewhere on each half widened to f32,
then one pack (fifteen).

6-bit codes (``high``: a 6-bit word tile's 16 words of high crumbs,
:func:`emulate.pallas.weights.word_fields`) are cut as 4-bit ones with their high two bits
put in under each half's nibble: ``((w >> 4q) & 0x000F000F) | ((h >> (2r - 4)) &
0x00300030) | 0x43004300`` is the bfloat16 pair ``128 + c`` (:func:`six_bit_pairs`; ``h``
shifted once for words 0-15 of the run, once for 16-31). With bfloat16 arithmetic one
subtraction of ``128 + z`` follows (seven operations a pair of rows); elsewhere each half
is widened to f32 (a shift or a mask), ``128 + z`` subtracted, and the pair packed again
(eleven), or kept as two f32 pieces (piece order). Signed (int6) codes flip the top bit
of every crumb first, ``c ^ 32``, and subtract 32 more.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.pallas import tpu as pltpu

__all__ = [
    "HIGH_WORDS",
    "TILE_ROWS",
    "TILE_WORDS",
    "bf16_vector_unit",
    "e2m1_pairs",
    "e2m1_values",
    "natural_codes",
    "pack_rows",
    "piece_rows",
    "six_bit_pairs",
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
_CRUMB_SIGN_FLIP = -0x55555556  # 0xAAAAAAAA: flips the top bit of every crumb
#: Word rows of a 6-bit word tile's high crumbs (:func:`emulate.pallas.weights.word_fields`).
HIGH_WORDS = 16


def bf16_vector_unit(target: Any) -> bool:
    """Whether ``target`` (a :class:`emulate.targets.Target`) adds bfloat16 vectors in
    its vector unit (TPU v6e, 7x and later); v2 to v5p emulate it in f32."""
    return target.kind == "tpu" and (target.generation or 0) >= _BF16_VPU_GENERATIONS


def words(block: jax.Array) -> jax.Array:
    """A loaded (R, C) uint8 / int8 block as its (R / 4, C) int32 words (free)."""
    return pltpu.bitcast(block, jnp.int32)


def pack_rows(a: jax.Array, b: jax.Array, interpret: bool) -> jax.Array:
    """f32 ``a`` and ``b`` (R, C), every value exact in bfloat16, as one (2R, C) bfloat16
    array whose rows ``2i`` and ``2i + 1`` are ``a[i]`` and ``b[i]``: one pack operation
    per pair of vectors on a TPU (``pltpu.pack_elementwise``); in interpret mode the same
    bits from the f32 bits (exact values: truncation is the rounding)."""
    return pltpu.bitcast(_packed_words(a, b, interpret), jnp.bfloat16)


def _packed_words(a: jax.Array, b: jax.Array, interpret: bool) -> jax.Array:
    """:func:`pack_rows`' pairs as their 32-bit words (``a`` the low halves)."""
    if interpret:
        lo = lax.shift_right_logical(lax.bitcast_convert_type(a, jnp.uint32), jnp.uint32(16))
        hi = lax.bitcast_convert_type(b, jnp.uint32) & jnp.uint32(0xFFFF0000)
        return lo | hi
    return pltpu.pack_elementwise([a, b], packed_dtype=jnp.bfloat16)


def _nibble(w: jax.Array, p: int) -> jax.Array:
    """Nibble ``p`` of each int32 word as an unsigned int32 (0..15)."""
    if p == 0:
        return w & 0xF
    s = lax.shift_right_logical(w, 4 * p)
    return s if p == 7 else s & 0xF


def _shifted(w: jax.Array, left: int) -> jax.Array:
    """``w`` shifted left by ``left`` bits (right, logically, by ``-left``)."""
    if left > 0:
        return lax.shift_left(w, left)
    return lax.shift_right_logical(w, -left) if left < 0 else w


_NIBBLE_PAIR = 0x000F000F
_HIGH_PAIR = 0x00300030  # bits 4-5 of each half
_BF16_128_PAIR = 0x43004300  # bfloat16 128 in both halves


def six_bit_pairs(w: jax.Array, h: jax.Array, q: int) -> jax.Array:
    """Run ``q`` (rows ``64q + 2i + e``, q in 0..3) of a 6-bit word tile: its (32, C) nibble
    words ``w`` and (16, C) crumb words ``h`` as (32, C) int32 words, each the bfloat16
    pair ``128 + c`` of rows ``64q + 2i`` (low half) and ``64q + 2i + 1`` (high half)."""
    n = _shifted(w, -4 * q) & _NIBBLE_PAIR
    hi = jnp.concatenate(
        [_shifted(h, 4 - 2 * q) & _HIGH_PAIR, _shifted(h, -4 - 2 * q) & _HIGH_PAIR], axis=0
    )
    return n | hi | _BF16_128_PAIR


def _six_bit_tile(
    w: jax.Array,
    high: jax.Array,
    *,
    signed: bool,
    to: str,
    bf16_vpu: bool,
    interpret: bool,
    zero: Any,
    group: int,
    piece_order: bool,
) -> jax.Array:
    """:func:`tile_values` of 6-bit codes (module docstring)."""
    if signed:
        high = high ^ _CRUMB_SIGN_FLIP  # c ^ 32: its value plus 32
    bias = 128 + (32 if signed else 0)
    runs: list[jax.Array] = []
    for q in range(4):
        p = six_bit_pairs(w, high, q)
        if bf16_vpu and to == "bfloat16":
            z = _rows_of(zero, _RUN, _RUN * q, group, jnp.float32)
            off = bias + (0 if z is None else z)
            runs.append(pltpu.bitcast(p, jnp.bfloat16) - jnp.asarray(off).astype(jnp.bfloat16))
            continue
        z = _rows_of(zero, TILE_WORDS, TILE_WORDS * q, group // 2, jnp.float32)
        off = jnp.float32(bias) + (0 if z is None else z)
        lo, hi = _pair_halves(p)
        runs += _run_rows(lo - off, hi - off, to=to, interpret=interpret, piece_order=piece_order)
    return jnp.concatenate(runs, axis=0)


def _run_rows(
    lo: jax.Array, hi: jax.Array, *, to: str, interpret: bool, piece_order: bool
) -> list[jax.Array]:
    """One run of a tile (64 K rows) from its f32 halves ``lo`` (rows ``2i``) and ``hi``
    (rows ``2i + 1``), each (32, C) and exact in bfloat16: in piece order the two as they
    are; else packed into bfloat16 pairs (:func:`pack_rows`), widened back for
    ``to="float32"``."""
    if piece_order:
        return [lo, hi]
    v = pack_rows(lo, hi, interpret)
    return [v.astype(jnp.float32) if to == "float32" else v]


#: bfloat16 bits of 0.5 (exponent field 126) in both halves: the e2m1 magnitude ``em`` at
#: bits 6-8 of a half above it is ``2**(E - 1) * (1 + m / 2)``.
_HALF_PAIR = 0x3F003F00
_SIGN = -0x80000000  # bit 31 as an int32
_SIGN_PAIR = -0x7FFF8000  # 0x80008000: bits 15 and 31
_EM_PAIR = 0x01C001C0  # the magnitude's three bits at 6-8 of each half
_HIGH_HALF = -0x10000  # 0xFFFF0000


def _subnormal_fixed(y: jax.Array) -> jax.Array:
    """``min(y, 2y - 1)`` (module docstring): the e2m1 magnitude from ``y``, exact in
    f32 and in bfloat16 (``y`` in {0.5, 0.75, 1, 1.5, 2, 3, 4, 6})."""
    return jnp.minimum(y, y + y - jnp.asarray(1, y.dtype))


def _e2m1_halves(w: jax.Array, q: int) -> tuple[jax.Array, jax.Array]:
    """For nibbles ``q`` (low half) and ``q + 4`` (high half) of each int32 word, q in
    0..3: the bfloat16 pair of ``y`` (module docstring: magnitudes under 0.5's exponent)
    and the pair's sign bits, as int32 words."""
    y = (_shifted(w, 6 - 4 * q) & _EM_PAIR) + _HALF_PAIR
    return y, _shifted(w, 12 - 4 * q) & _SIGN_PAIR


def e2m1_pairs(w: jax.Array, q: int, *, bf16_vpu: bool, interpret: bool) -> jax.Array:
    """Nibbles ``q`` and ``q + 4`` (q in 0..3) of each of the (R, C) int32 words,
    float4_e2m1fn codes, as the (2R, C) bfloat16 values of rows ``2i`` (nibble ``q`` of
    word ``i``) and ``2i + 1`` (nibble ``q + 4``), exactly: both halves built at once
    (:func:`_e2m1_halves`), then ``min(y, 2y - 1)`` with bfloat16 arithmetic
    (``bf16_vpu``: TPU v6e and later) or on each half widened to f32 and one pack
    (:func:`pack_rows`), and the sign bits put in last."""
    y, sign = _e2m1_halves(w, q)
    if bf16_vpu:
        v = pltpu.bitcast(_subnormal_fixed(pltpu.bitcast(y, jnp.bfloat16)), jnp.int32)
        return pltpu.bitcast(v | sign, jnp.bfloat16)
    lo, hi = _e2m1_halves_f32(y)
    word = _packed_words(lo, hi, interpret)
    word = word | lax.bitcast_convert_type(sign, word.dtype)
    return pltpu.bitcast(word, jnp.bfloat16)


def _e2m1_halves_f32(y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The magnitudes of a pair of ``y`` (:func:`_e2m1_halves`) as two f32 arrays (low
    half, high half): each half widened (a shift, a mask), then ``min(y, 2y - 1)``."""
    lo, hi = _pair_halves(y)
    return _subnormal_fixed(lo), _subnormal_fixed(hi)


def _pair_halves(p: jax.Array) -> tuple[jax.Array, jax.Array]:
    """int32 words ``p``, each a pair of bfloat16 values, as two f32 arrays (low half, high
    half), each exact: the half shifted (or masked) into f32's top 16 bits."""
    return (
        lax.bitcast_convert_type(lax.shift_left(p, 16), jnp.float32),
        lax.bitcast_convert_type(p & _HIGH_HALF, jnp.float32),
    )


def e2m1_values(w: jax.Array, q: int) -> tuple[jax.Array, jax.Array]:
    """Nibbles ``q`` and ``q + 4`` (q in 0..3) of each int32 word, float4_e2m1fn codes,
    as their f32 values (two arrays, rows in piece order): :func:`_e2m1_halves_f32` and
    each half's sign bit. Exact for all 16 codes (-0 for code 8)."""
    y, sign = _e2m1_halves(w, q)
    lo, hi = _e2m1_halves_f32(y)
    lo_sign, hi_sign = lax.shift_left(sign, 16), sign & _SIGN
    return (
        lax.bitcast_convert_type(lax.bitcast_convert_type(lo, jnp.int32) | lo_sign, jnp.float32),
        lax.bitcast_convert_type(lax.bitcast_convert_type(hi, jnp.int32) | hi_sign, jnp.float32),
    )


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
    e2m1: bool = False,
    high: jax.Array | None = None,
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
      e2m1: the codes are float4_e2m1fn (``signed`` and ``zero`` unused): their values
        (:func:`e2m1_values`, :func:`e2m1_pairs`).
      high: 6-bit codes: the word tile's (16, C) int32 words of high crumbs (``w`` its
        nibbles; ``signed``: int6). Zero points as for 4-bit codes.
    """
    if high is not None:
        return _six_bit_tile(
            w, high, signed=signed, to=to, bf16_vpu=bf16_vpu, interpret=interpret,
            zero=zero, group=group, piece_order=piece_order,
        )  # fmt: skip
    if e2m1:
        return _e2m1_tile(w, to=to, bf16_vpu=bf16_vpu, interpret=interpret, piece_order=piece_order)
    if bf16_vpu and to == "bfloat16":
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
        runs += _run_rows(*pair, to=to, interpret=interpret, piece_order=piece_order)
    return jnp.concatenate(runs, axis=0)


def _e2m1_tile(
    w: jax.Array, *, to: str, bf16_vpu: bool, interpret: bool, piece_order: bool
) -> jax.Array:
    """:func:`tile_values` of float4_e2m1fn codes."""
    runs: list[jax.Array] = []
    for q in range(4):  # rows 64q + 2i + e: nibble q + 4e
        if piece_order:
            runs += e2m1_values(w, q)
            continue
        v = e2m1_pairs(w, q, bf16_vpu=bf16_vpu and to == "bfloat16", interpret=interpret)
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


def natural_codes(w: jax.Array, interpret: bool, bits: int = 4) -> jax.Array:
    """Word-order tiles of ``bits``-bit codes (4 or 6), (32 T or 48 T, C) int32 words, as
    their (256 T, C) unsigned int32 codes in K order (exact: each pair of rows goes through
    a bfloat16 pair and back)."""
    per = TILE_WORDS + (HIGH_WORDS if bits == 6 else 0)
    tiles = []
    for t in range(w.shape[0] // per):
        v = tile_values(
            w[t * per : t * per + TILE_WORDS],
            signed=False,
            to="float32",
            bf16_vpu=False,
            interpret=interpret,
            high=w[t * per + TILE_WORDS : (t + 1) * per] if bits == 6 else None,
        )
        tiles.append(v.astype(jnp.int32))
    return tiles[0] if len(tiles) == 1 else jnp.concatenate(tiles, axis=0)
