"""Tiled execution of a decoding plan on the CPU: the decoded operand never exists in full.

XLA on the CPU fuses a decode into a loop fusion but never into the dot (the dot is a
YNNPACK custom fusion whose operands are buffers), so a plan that decodes a large operand
first writes a full decoded copy of it, then reads it back; at 4096 x 4096 that copy is
32 MiB, which glibc maps fresh (and the kernel zeroes) on every call. Here the decoded
operand, the "weight" ``D``, is instead sliced into tiles inside a ``lax.fori_loop``; each
step decodes one tile of codes (a few MiB, which stays in cache) and contracts it:

* **K-tiling** (few output rows): tiles along a contracting dimension; each step adds the
  tile's partial product into an accumulator of the plan's type (f32 or int32), which is
  rounded into the result type once at the end. Used only where the plan's partial sums
  are exact in any order (integer pairs, exact-class pairs within ``Plan.k_chunk``) or
  bounded in any order (mode "fast" float pairs: ``gamma_K * sum|a*b|`` holds for every
  summation order), so the result keeps the contract; the bits of the exact classes are
  the same as untiled.
* **N-tiling** (many output rows): tiles along a free dimension of ``D``; each step is the
  whole untiled contraction (K-chunks and exact combination included) for a slice of the
  output columns, so every output element is computed as it would be untiled (except
  with planes, below, which are used only where K-tiling would be allowed).

Packed 4- and 6-bit operands packed along the contracting dimension are decoded plane by
plane (:func:`emulate.numerics.storage.code_planes`): the low nibbles of a tile's bytes,
then the high ones (for 6-bit codes, the four codes of each 3-byte group); each plane is
contracted with the matching elements of the other operand (``x[..., j::g]``, cut once, up
front) and the plane products are added. No interleaving is done on the weight (for XLA
that is a transpose, which it fuses badly), and no concatenation either (XLA's CPU backend
runs a concatenating fusion far slower than plain decodes); a contraction does not depend
on the order of K. The measurements behind each threshold are in docs/performance.md
("The tiled CPU path").

Tiles are chosen from static shapes (:func:`tiling_for`) so that the temporaries stay within
a fraction of one decoded copy. The tiled program is used only when the computation is
lowered for the CPU (``lax.platform_dependent``); other platforms keep the untiled program.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats, moved
from emulate.engine.contract import contract_decoded, finish
from emulate.engine.layout import DimensionNumbers, dot_general
from emulate.engine.operands import Operand, Precision, decode_to
from emulate.numerics.storage import Packed, code_planes, to_codes
from emulate.planning.plan import Plan

__all__ = [
    "DEFAULT",
    "Settings",
    "Tiling",
    "tiling_for",
    "contract",
    "current_settings",
    "dyn_slice",
    "settings",
]


@dataclasses.dataclass(frozen=True)
class Settings:
    """How the CPU path tiles (hashable: part of the jit cache key).

    Attributes:
      enabled: tile at all.
      min_bytes: decoded operands of at most this many bytes are decoded whole (they fit
        in cache, where a loop over thin tiles is slower than one decode).
      budget: the temporaries a tiled program may hold, as a fraction of one decoded copy
        of the tiled operand.
      max_tile_bytes: the largest decoded tile (bytes), to keep a tile in cache.
      min_tile_bytes: the smallest decoded K-tile (bytes), even where that exceeds the
        budget (small weights): thin K-tiles of a small weight cost more in loop steps
        than they save.
      max_acc_bytes: K-tiling (one running accumulator) while the accumulator is at most
        this large; N-tiling beyond.
      min_tile: the fewest elements along the tiled dimension; thinner tiles are not used.
      tile: force this tile length (tests); None chooses one from the budget.
      kind: force "k" or "n" tiling (tests); None chooses.
    """

    enabled: bool = True
    min_bytes: int = 2 << 20
    budget: float = 0.24
    max_tile_bytes: int = 4 << 20
    min_tile_bytes: int = 1 << 20
    max_acc_bytes: int = 2 << 20
    min_tile: int = 8
    tile: int | None = None
    kind: str | None = None


DEFAULT = Settings()
_SETTINGS: contextvars.ContextVar[Settings | None] = contextvars.ContextVar(
    "emulate_tiling", default=None
)


def current_settings() -> Settings:
    """The :class:`Settings` in effect (:data:`DEFAULT` outside :func:`settings`)."""
    return _SETTINGS.get() or DEFAULT


@contextlib.contextmanager
def settings(**kw: Any) -> Iterator[Settings]:
    """Within the block, dots tile with these :class:`Settings` fields changed."""
    s = dataclasses.replace(current_settings(), **kw)
    token = _SETTINGS.set(s)
    try:
        yield s
    finally:
        _SETTINGS.reset(token)


@dataclasses.dataclass(frozen=True)
class Tiling:
    """A tiling of one dot: operand ``side`` (0 lhs, 1 rhs) is cut along its ``dim``.

    ``kind`` "k": ``dim`` is contracting and ``other_dim`` the other operand's matching one;
    "n": ``dim`` is free and ``out_dim`` the matching dimension of the result. ``planar``:
    the operand is Packed along a contracting dimension (``packed_dim``, matched by the other
    operand's ``other_packed_dim``) and decoded in planar order.
    """

    side: int
    kind: str
    dim: int
    size: int
    tile: int
    other_dim: int | None = None
    out_dim: int | None = None
    planar: bool = False
    packed_dim: int | None = None
    other_packed_dim: int | None = None

    @property
    def n_full(self) -> int:
        return self.size // self.tile


def _itemsize(name: str) -> int:
    return np.dtype(formats.get(name).dtype).itemsize


def _packed_dim(op: Operand) -> int | None:
    v = op.value
    return v.ndim + v.axis if isinstance(v, Packed) else None


def _group(op: Operand) -> int:
    return 2 if op.format.bits == 4 else 4


def tiling_for(
    p: Plan, lhs: Operand, rhs: Operand, dimension_numbers: DimensionNumbers, s: Settings
) -> Tiling | None:
    """The tiling for ``p`` on these operands (static shapes), or None to run untiled.

    The operand to tile is the larger one the plan decodes (:func:`_geometry`); it is
    tiled along K (:func:`_k_tiling`) while the sum may be reordered and the accumulator
    is small, along a free dimension (:func:`_n_tiling`) otherwise.
    """
    if not s.enabled or p.slicing is not None:
        return None
    g = _geometry(p, lhs, rhs, dimension_numbers)
    if g is None or g.decoded_bytes <= s.min_bytes:
        return None
    # K-tiling keeps a running accumulator and one partial product (2 x acc_bytes); it is
    # the choice while those stay small enough to sit in cache and the sum may be
    # reordered; a larger accumulator leaves the cache, and N-tiling wins.
    k_ok = (p.k_chunk is None or g.k <= p.k_chunk) and len(g.contracting) > 0
    kind = s.kind or ("k" if k_ok and g.acc_bytes <= s.max_acc_bytes else "n")
    if kind == "k":
        return _k_tiling(g, s) if k_ok else None
    return _n_tiling(g, s, k_ok)


@dataclasses.dataclass(frozen=True)
class _Geometry:
    """The static facts a tiling is chosen from: the decoded operand ``tiled`` (on
    ``side``), its dimensions, and those of the other operand (``other_*``). Sizes are
    element counts, ``*_bytes`` bytes."""

    side: int
    tiled: Operand
    compute: str  # the type ``tiled`` is decoded to
    contracting: tuple[int, ...]  # of ``tiled``
    other_contracting: tuple[int, ...]
    batch_dims: tuple[int, ...]  # of ``tiled``
    free: tuple[int, ...]  # of ``tiled``
    other_free: tuple[int, ...]
    decoded_bytes: int  # one decoded copy of ``tiled``
    other_bytes: int  # per element of ``other`` as the dot sees it
    out_bytes: int  # per result element
    batch: int
    m: int  # result rows: the other operand's free size
    k: int
    n: int  # result columns: the tiled operand's free size
    packed_dim: int | None  # where ``tiled`` is Packed
    planar_dim: int | None  # ``packed_dim`` if it is contracting (decoded plane by plane)
    other_planar_dim: int | None  # the other operand's dimension matching ``planar_dim``

    @property
    def acc_bytes(self) -> int:
        return self.batch * self.m * self.n * 4

    @property
    def planar_copy_bytes(self) -> int:
        """The permuted copy of the other operand that planar decoding needs."""
        return self.batch * self.m * self.k * self.other_bytes

    @property
    def group(self) -> int:
        return _group(self.tiled)


def _geometry(
    p: Plan, lhs: Operand, rhs: Operand, dimension_numbers: DimensionNumbers
) -> _Geometry | None:
    """The geometry of the larger operand the plan decodes, or None if it decodes none."""
    (lc, rc), (lb, rb) = dimension_numbers
    sides = []
    for side, op, compute in ((0, lhs, p.lhs_compute), (1, rhs, p.rhs_compute)):
        f = op.format
        if f.is_low_precision and compute != f.name:
            sides.append((math.prod(op.shape) * _itemsize(compute), side))
    if not sides:
        return None
    decoded, side = max(sides)
    tiled_op, other = (lhs, rhs) if side == 0 else (rhs, lhs)
    contracting, other_contracting = (lc, rc) if side == 0 else (rc, lc)
    batch_dims, other_batch = (lb, rb) if side == 0 else (rb, lb)
    compute = p.lhs_compute if side == 0 else p.rhs_compute
    other_compute = p.rhs_compute if side == 0 else p.lhs_compute
    other_type = other_compute if other.format.is_low_precision else other.format_name
    free = tuple(
        i for i in range(len(tiled_op.shape)) if i not in contracting and i not in batch_dims
    )
    other_free = tuple(
        i for i in range(len(other.shape)) if i not in other_contracting and i not in other_batch
    )
    pdim = _packed_dim(tiled_op)
    planar_dim = pdim if pdim is not None and pdim in contracting else None
    return _Geometry(
        side=side,
        tiled=tiled_op,
        compute=compute,
        contracting=tuple(contracting),
        other_contracting=tuple(other_contracting),
        batch_dims=tuple(batch_dims),
        free=free,
        other_free=other_free,
        decoded_bytes=decoded,
        other_bytes=_itemsize(other_type),
        out_bytes=_itemsize(p.out),
        batch=math.prod(tiled_op.shape[i] for i in batch_dims),
        m=math.prod(other.shape[i] for i in other_free),
        k=math.prod(tiled_op.shape[i] for i in contracting),
        n=math.prod(tiled_op.shape[i] for i in free),
        packed_dim=pdim,
        planar_dim=planar_dim,
        other_planar_dim=(
            None if planar_dim is None else other_contracting[contracting.index(planar_dim)]
        ),
    )


def _k_tiling(g: _Geometry, s: Settings) -> Tiling | None:
    """Tiles along the longest contracting dimension (the packed one, decoded in planes,
    where ``tiled`` is Packed along K), each step adding into one running accumulator."""
    planar = g.planar_dim is not None
    dim = (
        g.planar_dim
        if g.planar_dim is not None
        else max(g.contracting, key=lambda i: g.tiled.shape[i])
    )
    size = g.tiled.shape[dim]
    slice_bytes = g.decoded_bytes // size
    if g.m < 16 and g.compute == "bfloat16":
        slice_bytes *= 2  # XLA CPU's matrix-vector dot converts a bf16 tile to f32
    fixed = 2 * g.acc_bytes + (g.planar_copy_bytes if planar else 0)
    tile = _tile_len(
        s,
        size,
        max(s.budget * g.decoded_bytes - fixed, s.min_tile_bytes) / slice_bytes,
        s.max_tile_bytes / slice_bytes,
        g.group if planar else 1,
    )
    if tile is None:
        return None
    return Tiling(
        g.side,
        "k",
        dim,
        size,
        tile,
        other_dim=g.other_contracting[g.contracting.index(dim)],
        planar=planar,
        packed_dim=g.planar_dim,
        other_packed_dim=g.other_planar_dim,
    )


def _n_tiling(g: _Geometry, s: Settings, k_ok: bool) -> Tiling | None:
    """Tiles along the longest free dimension of ``tiled``; each step is the whole
    contraction for a slice of the result's columns. Decodes in planes only where K-tiling
    would be allowed (``k_ok``) and the other operand's planar copy is small."""
    if not g.free:
        return None
    dim = max(g.free, key=lambda i: g.tiled.shape[i])
    size = g.tiled.shape[dim]
    slice_bytes = g.decoded_bytes // size
    out_slice = g.batch * g.m * (g.n // size) * g.out_bytes
    budget = s.budget * g.decoded_bytes
    # A forced tile (tests) always decodes in planes where it may.
    planar = (
        k_ok
        and g.planar_dim is not None
        and (s.tile is not None or g.planar_copy_bytes <= budget * 0.6)
    )
    fixed = g.planar_copy_bytes if planar else 0
    tile = _tile_len(
        s,
        size,
        (budget - fixed) / (slice_bytes + out_slice),
        s.max_tile_bytes / slice_bytes,
        g.group if dim == g.packed_dim else 1,
    )
    if tile is None:
        return None
    free_before = len([i for i in g.free if i < dim])
    # The result's dimensions: batch, lhs free, rhs free.
    out_dim = len(g.batch_dims) + free_before + (len(g.other_free) if g.side == 1 else 0)
    return Tiling(
        g.side,
        "n",
        dim,
        size,
        tile,
        out_dim=out_dim,
        planar=planar,
        packed_dim=g.planar_dim if planar else None,
        other_packed_dim=g.other_planar_dim if planar else None,
    )


def _tile_len(
    s: Settings, size: int, by_budget: float, by_cache: float, group: int = 1
) -> int | None:
    if s.tile is not None:
        return s.tile if 0 < s.tile < size and s.tile % group == 0 else None
    limit = min(by_budget, by_cache)
    if limit < s.min_tile:
        return None
    tile = 1 << int(math.floor(math.log2(limit)))  # a power of two: whole bytes, whole groups
    return tile if tile < size else None


# ----------------------------------------------------------------------------- slicing


def _slice(op: Operand, dim: int, start: int | jax.Array, length: int) -> Operand:
    """``op`` (an Operand) restricted to ``[start, start + length)`` along ``dim``; ``start``
    may be traced. Along a packed dimension ``start`` and ``length`` are whole byte groups,
    except for the final (static) tail."""
    v = op.value
    if isinstance(v, Packed) and dim == v.ndim + v.axis:
        bits = v.format.bits
        nbytes = -(-bits * length // 8)
        data = dyn_slice(v.data, dim, start * bits // 8, nbytes)
        return Operand(Packed(data, v.format_name, v.axis, length), op.format_name)
    if isinstance(v, Packed):
        return Operand(
            Packed(dyn_slice(v.data, dim, start, length), v.format_name, v.axis, v.length),
            op.format_name,
        )
    if op.format.is_low_precision and v.dtype == op.format.dtype:
        if not isinstance(start, int):
            _, v = lax.optimization_barrier((start, v))  # see dyn_slice
        v = to_codes(v, op.format_name)[0]
    return Operand(dyn_slice(v, dim, start, length), op.format_name)


def dyn_slice(x: jax.Array, dim: int, start: int | jax.Array, length: int) -> jax.Array:
    """``x[start:start + length]`` along ``dim``; ``start`` may be traced (see below)."""
    if isinstance(start, int):
        return lax.slice_in_dim(x, start, start + length, axis=dim)
    # The barrier (tied to the loop index) keeps XLA from hoisting what comes next out of
    # the loop: the bitcast of an fp8 array to codes, or the conversion that XLA CPU puts
    # around a dynamic slice of a bf16 or float8 array, would otherwise be done on the whole
    # operand before the loop, writing the full copy that tiling avoids.
    _, x = lax.optimization_barrier((start, x))
    dt = x.dtype
    # bf16, f16 and float8: sliced as their unsigned codes of the same width; float4 (4
    # bits in a byte of numpy's, no unsigned type of its width to bitcast to here)
    # is sliced as it is
    if jnp.issubdtype(dt, jnp.floating) and 8 <= jnp.finfo(dt).bits < 32:
        u = lax.bitcast_convert_type(x, formats.unsigned_dtype(8 * dt.itemsize))
        return lax.bitcast_convert_type(lax.dynamic_slice_in_dim(u, start, length, axis=dim), dt)
    return lax.dynamic_slice_in_dim(x, start, length, axis=dim)


# ----------------------------------------------------------------------------- running


def contract(
    p: Plan,
    t: Tiling,
    lhs: Operand,
    rhs: Operand,
    dimension_numbers: DimensionNumbers,
    precision: Precision,
) -> jax.Array:
    """Run plan ``p`` tiled as ``t`` (the result of the untiled program, bit for bit for
    the exact classes and within the same bound otherwise)."""
    d, o = (lhs, rhs) if t.side == 0 else (rhs, lhs)
    d_compute, d_scale = (
        (p.lhs_compute, p.lhs_scale) if t.side == 0 else (p.rhs_compute, p.rhs_scale)
    )
    o_compute, o_scale = (
        (p.rhs_compute, p.rhs_scale) if t.side == 0 else (p.lhs_compute, p.lhs_scale)
    )
    o_dec = decode_to(o, o_compute, o_scale)
    acc_dtype = jnp.dtype(p.accumulator)
    g = _group(d) if t.planar else 1
    if t.planar:  # the other operand's matching dimension, split the same way as the planes
        assert t.packed_dim is not None and t.other_packed_dim is not None
        length = d.shape[t.packed_dim]
        o_planes = [
            lax.slice_in_dim(o_dec, j, length, stride=g, axis=t.other_packed_dim)
            for j in range(min(g, length))
        ]

    def pair(dd: jax.Array, oo: jax.Array) -> tuple[jax.Array, jax.Array]:
        return (dd, oo) if t.side == 0 else (oo, dd)

    def dot(dd: jax.Array, oo: jax.Array) -> jax.Array:
        return dot_general(
            *pair(dd, oo), dimension_numbers, precision, preferred_element_type=acc_dtype
        )

    def planar_sum(piece: Operand, start: int | jax.Array) -> jax.Array:
        """Sum over the planes of ``piece`` (a tile whose packed axis starts at element
        ``start`` of the whole operand, a multiple of ``g``) of plane x matching slice."""
        axis = piece.value.ndim + piece.value.axis
        total = None
        for j, codes in enumerate(code_planes(piece.value)):
            dd = decode_to(Operand(codes, piece.format_name), d_compute, d_scale)
            oo = o_planes[j]
            if t.kind == "k":
                assert t.other_dim is not None
                oo = dyn_slice(oo, t.other_dim, start // g, codes.shape[axis])
            r = dot(dd, oo)
            total = r if total is None else total + r
        assert total is not None  # a tile has at least one plane
        return total

    if t.kind == "k":

        def partial(start: int | jax.Array, length: int) -> jax.Array:
            piece = _slice(d, t.dim, start, length)
            if t.planar:
                return planar_sum(piece, start)
            assert t.other_dim is not None
            oo = dyn_slice(o_dec, t.other_dim, start, length)
            return dot(decode_to(piece, d_compute, d_scale), oo)

        acc = lax.fori_loop(
            1,
            t.n_full,
            lambda i, acc: acc + partial(i * t.tile, t.tile),
            partial(0, t.tile),
        )
        rest = t.size - t.n_full * t.tile
        if rest:
            acc = acc + partial(t.n_full * t.tile, rest)
        return finish(p, acc)

    def columns(start: int | jax.Array, length: int) -> jax.Array:
        piece = _slice(d, t.dim, start, length)
        if t.planar:
            return finish(p, planar_sum(piece, 0))
        dd = decode_to(piece, d_compute, d_scale)
        return contract_decoded(p, *pair(dd, o_dec), dimension_numbers, precision)

    assert t.out_dim is not None
    shape = jax.eval_shape(lambda: columns(0, t.tile))
    out_shape = list(shape.shape)
    out_shape[t.out_dim] = t.size
    out = lax.fori_loop(
        0,
        t.n_full,
        lambda i, out: lax.dynamic_update_slice_in_dim(
            out, columns(i * t.tile, t.tile), i * t.tile, axis=t.out_dim
        ),
        jnp.zeros(out_shape, shape.dtype),
    )
    rest = t.size - t.n_full * t.tile
    if rest:
        out = lax.dynamic_update_slice_in_dim(
            out, columns(t.n_full * t.tile, rest), t.n_full * t.tile, axis=t.out_dim
        )
    return out


#: Names the docs gave this module before they moved (emulate.moved).
__getattr__ = moved.module_getattr(__name__)
