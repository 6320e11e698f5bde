"""Codebook weights (:attr:`emulate.QArray.codebook`) and act-order permutations in
:func:`emulate.pallas.matmul`.

Codebooks. A QArray whose unsigned codes (``uint4``: 16 entries, or ``uint8``: 256) index
a table (:mod:`emulate.codebooks`: NF4, IQ4_NL or a user table) is read as stored: the
kernel cuts the codes out of their bytes as for any weight and decodes each tile in VMEM
with a *select tree* over the table's entries (Mosaic has no general gather): level ``b``
picks, by bit ``b`` of the code, between pairs of the previous level's values, the first
level's values being the table's entries as f32 constants (``2**bits - 1`` selects per
element, exact). What the matrix unit then takes (:class:`KernelCodebook`), as
:func:`emulate.dot_general` contracts a codebook QArray:

* an integer table whose values fit int8 (IQ4_NL): the values as int8, the route of
  ``x`` x int8 (exact for integer ``x`` where that pair is exact: bit for bit equal to
  ``emulate.dot_general``);
* any other finite table whose f32 values (an integer table's values rounded to f32, as
  ``dequantize`` reads them) split into at most three normal bfloat16 *pieces* by
  truncation (``p1 = v`` with its low 16 bits cleared, then the same on ``v - p1``, ...;
  every f32, f16 and bf16 table of normal values, NF4 included), with ``x`` entering the
  matrix unit as bfloat16: one bf16 dot per piece, each product exact in f32, added in
  the f32 accumulator. The pieces have ``v``'s sign and ``sum |p_i| = |v|``, so the f32
  sum stays within ``gamma_(K + 2) * sum |x v|`` (plus underflow), inside the bound
  ``emulate.dot_general`` states for a codebook QArray (``gamma_(K + S + 4)``);
  bit-identical where every partial sum is exact;
* otherwise (``x`` in float32, v2 / v3, values that would need a subnormal piece): the
  values in f32, contracted at ``Precision.HIGHEST``, as ``emulate.dot_general`` does.

A table with a NaN or Inf entry is refused (NotImplementedError): padding rows hold code 0
and meet zero activations, and ``0 * Inf`` would be NaN.

Act-order (:attr:`emulate.QArray.perm`): ``x @ W == x[:, perm] @ W_stored`` for a
permutation of K (GPTQ ``g_idx``), so the kernel reads the codes as stored and ``x`` (M x
K, small) is gathered outside it (:func:`permute_x`); a permutation of N gathers the
result's columns by the inverse (:func:`restore_columns`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from emulate import formats, targets
from emulate.codebooks import Codebook
from emulate.formats import Format
from emulate.pallas import compute, words
from emulate.quantized.values import inverse_permutation

__all__ = [
    "KernelCodebook",
    "decode",
    "kernel_codebook",
    "permute_x",
    "restore_columns",
    "select_tree",
    "split_pieces",
    "table_tiles",
]

#: Bits of an f32 kept by a bfloat16 piece (sign, exponent, 7 mantissa bits).
_BF16_MASK = -65536  # 0xFFFF0000 as an int32
_MAX_PIECES = 3
_TINY = 2.0**-126  # the smallest normal f32 / bf16


@dataclasses.dataclass(frozen=True)
class KernelCodebook:
    """The static side of a codebook weight in the kernel (part of its jit key).

    Attributes:
      values: the table's entries as f32 values (Python floats), in code order.
      code_format: the codes' format ("uint4" or "uint8").
      value_format: the format the kernel's route sees for the weight: "int8" (an integer
        table that fits), "bfloat16" (values as bf16 pieces) or "float32".
      pieces: bfloat16 pieces per value (1 unless ``value_format`` is "bfloat16" and the
        values need more).
      name: the table's name (for messages).
    """

    values: tuple[float, ...] = dataclasses.field(repr=False)
    code_format: str
    value_format: str
    pieces: int = 1
    name: str = "table"


def _pieces(t32: np.ndarray) -> int | None:
    """How many truncated bfloat16 pieces hold every value of ``t32`` exactly, each piece
    zero or normal; None if three do not."""
    rest = t32.astype(np.float32)
    count = 0
    while np.any(rest != 0):
        if count == _MAX_PIECES:
            return None
        hi = (rest.view(np.int32) & np.int32(_BF16_MASK)).view(np.float32)
        if np.any((hi != 0) & (np.abs(hi) < _TINY)):
            return None
        assert np.all(hi.astype(ml_dtypes.bfloat16).astype(np.float32) == hi)
        rest = (rest - hi).astype(np.float32)  # exact: the low 16 bits of rest
        count += 1
    return max(count, 1)


def kernel_codebook(
    cb: Codebook | None, code_format: str, xf: Format, target: targets.Target, arg: str = "w"
) -> KernelCodebook | None:
    """How the kernel decodes the table ``cb`` (None: no codebook) for activations of
    format ``xf`` on ``target`` (module docstring).

    Raises:
      NotImplementedError: a table with a NaN or Inf entry.
    """
    if cb is None:
        return None
    t32 = cb.array().astype(np.float32)  # the values as dequantize reads them
    if not np.all(np.isfinite(t32)):
        compute.refuse(arg, "this codebook", f"{cb!r} has NaN or Inf entries")
    values = tuple(float(v) for v in t32)
    if cb.is_integer and cb.max_abs <= 127:
        return KernelCodebook(values, code_format, "int8", 1, cb.name)
    pieces = _pieces(t32)
    r = compute.in_kernel(xf, "bfloat16", target=target, preferred_element_type="float32")
    if pieces is not None and r.lhs_compute == r.rhs_compute == "bfloat16":
        return KernelCodebook(values, code_format, "bfloat16", pieces, cb.name)
    return KernelCodebook(values, code_format, "float32", 1, cb.name)


def select_tree(c: jax.Array, values: tuple[float, ...], first_bit: int = 0) -> jax.Array:
    """``values[c]`` in f32 for int32 codes ``c`` in ``[0, len(values))`` (a power of two):
    one select per pair of entries per level, by the code's bits from the lowest (exact;
    also the 256-entry maps of two-level scales, :mod:`emulate.pallas.qgroups`). With
    ``first_bit``, the code is bits ``first_bit ..`` of ``c`` (a nibble of a word, tested
    in place: no shift, no mask)."""
    level: list[Any] = list(values)  # Python floats, then f32 tiles
    bit = first_bit
    while len(level) > 1:
        on = c < 0 if bit == 31 else (c & (1 << bit)) != 0  # bit 31: the int32's sign
        nxt: list[Any] = []
        for lo, hi in zip(level[0::2], level[1::2]):
            if isinstance(lo, float) and isinstance(hi, float) and _same(lo, hi):
                nxt.append(lo)  # equal constants: no select
            else:
                nxt.append(jnp.where(on, _f32(hi), _f32(lo)))
        level, bit = nxt, bit + 1
    return jnp.broadcast_to(_f32(level[0]), c.shape)


def _f32(v: Any) -> Any:
    return jnp.float32(v) if isinstance(v, float) else v


def _same(a: float, b: float) -> bool:
    return np.float32(a).tobytes() == np.float32(b).tobytes()


def decode(codes: jax.Array, kc: KernelCodebook, to: str) -> list[jax.Array]:
    """A loaded tile of codes (int32 byte values, the code in the low bits) as the tiles
    the matrix unit takes, in ``to`` ("int8", "bfloat16" or "float32"): one tile, or
    ``kc.pieces`` bfloat16 tiles whose sum is the values (module docstring)."""
    c = codes.astype(jnp.int32) & formats.get(kc.code_format).code_mask
    v = select_tree(c, kc.values)
    if to == "int8":
        return [v.astype(jnp.int32).astype(jnp.int8)]
    if kc.pieces == 1:
        return [v.astype(to)]
    return [p.astype(jnp.bfloat16) for p in split_pieces(v, kc.pieces)]


def split_pieces(v: jax.Array, pieces: int) -> list[jax.Array]:
    """f32 values ``v`` as ``pieces`` f32 arrays whose values are bfloat16 numbers (each
    the rest with its low 16 bits cleared, the last the rest itself) summing to ``v``
    exactly (module docstring; :attr:`KernelCodebook.pieces` says how many hold a table's
    values)."""
    out = []
    for _ in range(pieces - 1):
        hi = lax.bitcast_convert_type(
            lax.bitcast_convert_type(v, jnp.int32) & jnp.int32(_BF16_MASK), jnp.float32
        )
        out.append(hi)
        v = v - hi
    out.append(v)
    return out


def table_tiles(
    w: jax.Array, kc: KernelCodebook, *, to: str, interpret: bool, piece_order: bool
) -> list[jax.Array]:
    """One word-order tile (:mod:`emulate.pallas.words`), (32, C) int32 words of uint4
    codes into a 16-entry table, as its (256, C) values in ``to``: per nibble a select
    tree whose bit tests read the word in place (:func:`select_tree`), the f32 values split
    into the table's bfloat16 pieces (:func:`split_pieces`) and each two rows one bfloat16
    pair (:func:`emulate.pallas.words.pack_rows`): a list of one tile, or one per piece.
    With ``piece_order`` (f32, one piece) the rows in piece order, unpacked."""
    n = kc.pieces if to == "bfloat16" else 1
    runs: list[list[jax.Array]] = [[] for _ in range(n)]
    for q in range(4):  # rows 64q + 2i + e: nibble q + 4e
        pair = [select_tree(w, kc.values, 4 * (q + 4 * e)) for e in range(2)]
        if piece_order:
            runs[0] += pair
            continue
        split = [split_pieces(v, n) for v in pair]
        for i in range(n):
            v = words.pack_rows(split[0][i], split[1][i], interpret)
            runs[i].append(v.astype(jnp.float32) if to == "float32" else v)
    return [jnp.concatenate(r, axis=0) for r in runs]


def permute_x(x: jax.Array, perm: Any) -> jax.Array:
    """``x[:, perm]``: the (M, K) activations in the order the weight's rows are stored."""
    return jnp.take(x, jnp.asarray(perm), axis=1)


def restore_columns(y: jax.Array, perm: Any) -> jax.Array:
    """The (M, N) result of a weight whose columns are stored permuted, in logical order:
    ``y[:, inverse(perm)]``."""
    return jnp.take(y, inverse_permutation(jnp.asarray(perm)), axis=1)
