"""A QArray weight contracted tile by tile on the CPU: never dequantized in full.

Mode "fast" on the CPU contracts a block-scaled QArray as its dequantized values in one
f32 dot (:mod:`emulate.scaled`). Done whole, that writes a full f32 copy of the weight
(64 MiB at 4096 x 4096) and reads it back on every call, and computes every block's
scale from the stored parts per element. Here the QArray is cut along its longest free
dimension ("N") into tiles of whole blocks (:func:`slice_blocks`: codes, scales, zero
points, offsets and two-level scales sliced as stored, in their own units); a
``lax.fori_loop`` dequantizes one tile at a time (:func:`emulate.quantized.values.dequantize`, so
the values are those of the whole weight bit for bit, each block's scale decoded once) and
contracts it with the other operand in f32, writing its columns of the result. Every
result element is an f32 dot over the whole of K of the values ``dequantize`` gives, so
the bound of docs/numerics.md is unchanged (XLA's dot may add a column's products in
another order for another tile width: the bits may depend on the tile where the sum is
not exact, as they may on the batch size).

The tile (:func:`qtiling_for`) is a power of two of whole blocks (and whole packing groups
where the codes are packed along N) whose f32 values fit ``Settings.max_tile_bytes``, and
at most half the dimension, however small the weight: the loop is what keeps the blocks'
factors apart from the elements (a two-step loop costs little; a one-step one XLA
removes). None (run untiled) where the weight has no free dimension, no two tiles of
whole blocks, or is tiny (:data:`MIN_ELEMENTS`). Used only where the program is lowered for the CPU
(``lax.platform_dependent`` in :mod:`emulate.scaled`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from emulate import moved
from emulate.engine.layout import DimensionNumbers, dot_general
from emulate.engine.operands import Precision
from emulate.engine.tiled import Settings, dyn_slice
from emulate.numerics.storage import Packed, code_planes, group_shape
from emulate.quantized.array import QArray
from emulate.quantized.checks import is_int
from emulate.quantized.values import apply_block_factors, block_factors, element_values

__all__ = ["MIN_ELEMENTS", "QTiling", "qtiling_for", "contract", "slice_blocks", "tile_values"]

#: Weights of fewer elements, and within ``Settings.min_bytes`` as f32, stay untiled: one
#: dequantize and one dot cost little there (the tiny llama example's 256 x 256 matrices
#: are tiled: two steps halve their decoding time a token).
MIN_ELEMENTS = 1 << 16


@dataclasses.dataclass(frozen=True)
class QTiling:
    """Tiles of ``tile`` elements along free dimension ``dim`` (of size ``size``) of the
    QArray on ``side`` (0 lhs, 1 rhs); ``out_dim`` is the result's matching dimension."""

    side: int
    dim: int
    size: int
    tile: int
    out_dim: int

    @property
    def n_full(self) -> int:
        return self.size // self.tile


def _unit(q: QArray, dim: int) -> int:
    """The least tile length along ``dim`` that cuts ``q`` into whole blocks and whole
    packing groups, nested QArrays (two-level scales, offsets) included."""
    unit = q.block_shape[dim]
    if isinstance(q.codes, Packed) and dim == q.codes.ndim + q.codes.axis:
        unit = math.lcm(unit, group_shape(q.format.bits)[0])
    for part in (q.scales, q.offsets):
        if isinstance(part, QArray):
            unit = math.lcm(unit, q.block_shape[dim] * _unit(part, dim))
    zp = q.zero_points
    if isinstance(zp, Packed) and dim == zp.ndim + zp.axis:
        unit = math.lcm(unit, q.block_shape[dim] * group_shape(zp.format.bits)[0])
    return unit


def _stacked(q: QArray) -> bool:
    """Whether the leaves have more dimensions than the record (stacked QArrays)."""
    codes = q.codes.data if isinstance(q.codes, Packed) else q.codes
    return codes.ndim != len(q.shape)


def qtiling_for(
    q: QArray, side: int, other_ndim: int, dimension_numbers: DimensionNumbers, s: Settings
) -> QTiling | None:
    """The tiling of ``q`` (on ``side``) for this contraction, or None to run untiled."""
    if not s.enabled or q.perm is not None or _stacked(q):
        return None
    (lc, rc), (lb, rb) = dimension_numbers
    contracting, batch = (lc, lb) if side == 0 else (rc, rb)
    free = [d for d in range(len(q.shape)) if d not in contracting and d not in batch]
    if not free or (4 * math.prod(q.shape) <= s.min_bytes and math.prod(q.shape) < MIN_ELEMENTS):
        return None
    dim = max(free, key=lambda d: q.shape[d])
    size = q.shape[dim]
    unit = _unit(q, dim)
    slice_bytes = 4 * math.prod(q.shape) // size  # one f32 slice along dim
    limit = s.tile if s.tile is not None else max(s.max_tile_bytes // slice_bytes, unit)
    tile = unit * (1 << int(math.floor(math.log2(max(limit // unit, 1)))))
    if s.tile is not None and (s.tile % unit or s.tile != tile):
        return None
    if tile >= size and s.tile is None and size >= 2 * unit:
        # two steps at least: the loop is what keeps each block's factors out of the
        # loop over elements (:func:`contract`)
        tile = unit * (1 << int(math.floor(math.log2((size - 1) // unit))))
    if tile >= size:
        return None
    other_free = other_ndim - len(lc if side == 1 else rc) - len(batch)
    out_dim = len(batch) + free.index(dim) + (other_free if side == 1 else 0)
    return QTiling(side, dim, size, tile, out_dim)


def _slice_leaf(x: Any, dim: int, start: int | jax.Array, length: int) -> Any:
    """An array or Packed array restricted to ``[start, start + length)`` along ``dim``
    (elements; along a packed dimension whole packing groups, or a static tail)."""
    if isinstance(x, Packed):
        if dim == x.ndim + x.axis:
            bits = x.format.bits
            data = dyn_slice(x.data, dim, start * bits // 8, -(-bits * length // 8))
            return Packed(data, x.format_name, x.axis, length)
        return Packed(dyn_slice(x.data, dim, start, length), x.format_name, x.axis, x.length)
    return dyn_slice(jnp.asarray(x), dim, start, length)


def _slice_part(x: Any, dim: int, start: int | jax.Array, length: int) -> Any:
    """A per-block part (scales, zero points, offsets) restricted along ``dim``: an int
    or float for the whole tensor (or None) as it is."""
    if x is None or is_int(x) or isinstance(x, float):
        return x
    if isinstance(x, QArray):
        return slice_blocks(x, dim, start, length)
    return _slice_leaf(x, dim, start, length)


def slice_blocks(q: QArray, dim: int, start: int | jax.Array, length: int) -> QArray:
    """``q`` restricted to ``[start, start + length)`` along ``dim`` as a QArray of the
    same parts. ``start`` may be traced; it and ``length`` are whole multiples of the
    block (and packing group) along ``dim``, except a static ``length`` that reaches the
    end. ``q`` has no permutation along ``dim``."""
    b = q.block_shape[dim]
    g_start = start // b
    g_len = -(-length // b)
    shape = tuple(length if d == dim else n for d, n in enumerate(q.shape))
    sliced = object.__new__(QArray)  # leaves may be traced: no validation (as tree_unflatten)
    values = {f.name: getattr(q, f.name) for f in dataclasses.fields(QArray)}
    values.update(
        codes=_slice_leaf(q.codes, dim, start, length),
        scales=_slice_part(q.scales, dim, g_start, g_len),
        zero_points=_slice_part(q.zero_points, dim, g_start, g_len),
        offsets=_slice_part(q.offsets, dim, g_start, g_len),
        shape=shape,
    )
    for name, v in values.items():
        object.__setattr__(sliced, name, v)
    return sliced


def tile_values(
    q: QArray, to: Any, factors: tuple[jax.Array | None, ...] | None = None
) -> jax.Array:
    """:func:`emulate.dequantize` of ``q`` (no permutation) in type ``to``, bit for bit,
    given each block's factors (:func:`emulate.quantized.values.block_factors` of ``q``; computed
    here when None)."""
    if factors is None:
        factors = block_factors(q)
    v = element_values(q.unpacked_codes(), q.format, q.codebook)
    return apply_block_factors(v, factors, q.block_shape).astype(to)


def _planar_dims(
    q: QArray, side: int, dimension_numbers: DimensionNumbers
) -> tuple[int, int, int] | None:
    """``(dim, other_dim, g)`` where ``q``'s codes are packed along a contracting ``dim``
    in groups of ``g`` codes that split its blocks evenly (``other_dim``: the other
    operand's matching dimension); None otherwise."""
    c = q.codes
    if not isinstance(c, Packed):
        return None
    (lc, rc), _ = dimension_numbers
    mine, theirs = (lc, rc) if side == 0 else (rc, lc)
    dim = c.ndim + c.axis
    g = group_shape(q.format.bits)[0]
    if dim not in mine or q.shape[dim] % g or q.block_shape[dim] % g:
        return None
    return dim, theirs[mine.index(dim)], g


def _plane_values(
    q: QArray, dim: int, g: int, to: Any, factors: tuple[jax.Array | None, ...]
) -> list[jax.Array]:
    """The dequantized values of ``q`` (codes packed along ``dim``) plane by plane
    (:func:`emulate.numerics.storage.code_planes`: elements ``j, j + g, ...`` along
    ``dim``), each block's factors spread over its ``block / g`` elements of a plane."""
    block = tuple(b // g if d == dim else b for d, b in enumerate(q.block_shape))
    return [
        apply_block_factors(element_values(c, q.format, q.codebook), factors, block).astype(to)
        for c in code_planes(q.codes)
    ]


def contract(
    t: QTiling,
    q: QArray,
    other: jax.Array,
    dimension_numbers: DimensionNumbers,
    precision: Precision,
    to: Any = jnp.float32,
) -> jax.Array:
    """The f32 contraction of ``q``'s dequantized values (cast to ``to``: float32, or
    bfloat16 where they are exact in it) with ``other`` (of type ``to``), tiled as ``t``:
    the f32 result.

    Codes packed along K are decoded plane by plane, each plane contracted with the
    matching elements of ``other`` (cut once, up front) and the products added, as
    :mod:`emulate.engine.tiled` does: interleaving the planes is a concatenation, which
    XLA's CPU backend runs slowly. Each step computes the next tile's block factors and
    carries them to the next step: XLA fuses what it can into the loop over a tile's
    elements (an optimization barrier does not stop it on the CPU), which would decode a
    block's scale (frexp, two-level scales) once per element; a value the loop carries is
    computed once."""
    planar = _planar_dims(q, t.side, dimension_numbers)
    if planar is not None:
        pdim, odim, g = planar
        k = other.shape[odim]
        other_planes = [lax.slice_in_dim(other, j, k, stride=g, axis=odim) for j in range(g)]

    def piece(start: int | jax.Array, length: int) -> QArray:
        return slice_blocks(q, t.dim, start, length)

    def dot(w: jax.Array, o: jax.Array) -> jax.Array:
        a, b = (w, o) if t.side == 0 else (o, w)
        return dot_general(a, b, dimension_numbers, precision, preferred_element_type=jnp.float32)

    def columns(start: int | jax.Array, length: int, factors=None) -> jax.Array:
        tile = piece(start, length)
        if factors is None:
            factors = block_factors(tile)
        if planar is None:
            return dot(tile_values(tile, to, factors), other)
        planes = _plane_values(tile, pdim, g, to, factors)
        total = dot(planes[0], other_planes[0])
        for w, o in zip(planes[1:], other_planes[1:], strict=True):
            total = total + dot(w, o)
        return total

    def step(i, carry):
        out, factors = carry
        nxt = block_factors(piece(jnp.minimum(i + 1, t.n_full - 1) * t.tile, t.tile))
        cols = columns(i * t.tile, t.tile, factors)
        return lax.dynamic_update_slice_in_dim(out, cols, i * t.tile, axis=t.out_dim), nxt

    shape = jax.eval_shape(lambda: columns(0, t.tile)).shape
    out_shape = tuple(t.size if d == t.out_dim else n for d, n in enumerate(shape))
    first = block_factors(piece(0, t.tile))
    out, _ = lax.fori_loop(0, t.n_full, step, (jnp.zeros(out_shape, jnp.float32), first))
    rest = t.size - t.n_full * t.tile
    if rest:
        start = t.n_full * t.tile
        out = lax.dynamic_update_slice_in_dim(out, columns(start, rest), start, axis=t.out_dim)
    return out


#: Names the docs gave this module before they moved (emulate.moved).
__getattr__ = moved.module_getattr(__name__)
