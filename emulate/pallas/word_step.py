"""``emulate.pallas.matmul`` at decode: a few rows of activations times a 4- or 6-bit
weight at the speed of the weight's bytes.

At one to a few dozen rows of ``x`` the matrix unit is idle most of the time and the
vector unit's per-element work sets the pace: unpacking each code, its group's scale,
zero point and offset. This module's kernel body (:func:`body`, chosen by
:func:`applies`) does per element only what cannot be shared:

* The weight block is read as 32-bit words and decoded a tile of 256 rows at a time into
  the matrix unit's type, in K order, zero points subtracted
  (:func:`emulate.pallas.words.tile_values`: about two vector operations per pair of codes
  with bfloat16 arithmetic, three and a conversion per code without; float4_e2m1fn
  codes, MXFP4 and NVFP4, built as floats from their bits: four and a half operations
  per code with bfloat16 arithmetic, seven and a half without; 6-bit integer codes, GGUF
  Q6_K, their high two bits from 16 more words a tile put in under the nibbles: three
  and a half operations per code with bfloat16 arithmetic, five and a half without).
* Scales and offsets are applied to partial sums, never to elements. The ``R`` groups
  of ``G`` rows a dot spans (``R = D / G`` for groups of 16 rows up to the dot's ``D``
  rows; one for longer groups) get their own partial sums from that one dot: ``x``'s rows
  are repeated ``R`` times, copy ``g`` of row ``m`` keeping only group ``g``'s columns (a
  block diagonal ``(R * bm, D)`` left operand, rows in ``(m, g)`` order), so row ``(m,
  g)`` of the product is group ``g``'s partial sum for row ``m``. It is scaled by the group's
  scales (one multiply per partial sum), offsets add ``X o`` with ``X`` the row sums of
  the same operand, and the ``(R * bm, bn)`` sums accumulate in f32 over K; the ``R``
  rows of each ``m`` are added once, at the last K step.
* Each group's scale, zero point and offset is decoded once per output column block, at
  its first K step, into VMEM scratch (:mod:`emulate.pallas.word_groups`); each K step
  reads its own rows.
* Each dot takes the matrix unit's depth of rows (:func:`dot_rows`: 128 to v5p, 256 from
  v6e on), so its sums leave the unit once.

Numerics: as the other group-scaled routes (:mod:`emulate.pallas.qsteps`): the decoded
``c - z`` (or e2m1 value) is exact, each product exact in f32 (bf16 operands) or at
``Precision.HIGHEST`` (f32 ones), each group's partial sum (over at most 256 rows a dot,
plus, for groups longer than 256 rows, one scaled partial sum per 256 rows) times its
scale rounded once (MXFP4's e8m0 scales are powers of two: exact unless the product leaves
f32's normal range; NVFP4's e4m3 scales are not, and the group path applies them so too),
the offset term ``X o`` added per group, all added in f32, then a tensor scale (NVFP4)
times the f32 sum, rounded once: within ``gamma_(K + S + 5)`` of the exact sum, the bound
:func:`emulate.bounds.qarray_bound` states for the kernel.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import tpu as pltpu

from emulate import formats, targets
from emulate.pallas import compute, qcodebook, qsteps, word_groups, words

__all__ = [
    "MAX_ROWS",
    "applies",
    "body",
    "dot_rows",
    "partial_rows",
    "piece_order",
    "scratch_shapes",
    "vmem_bytes",
]

_LANES = 128
_TILE = words.TILE_ROWS
#: At most this many rows of partial sums per K step, ``R * bm`` (rows of x times the
#: groups of a dot): decode-sized row blocks.
MAX_ROWS = 256
#: The 4-bit code formats the step decodes (:mod:`emulate.pallas.words`).
_E2M1 = "float4_e2m1fn"
_CODES = ("int4", "uint4", _E2M1)
#: The 6-bit integer code formats it decodes (stored as codes of
#: ``emulate.formats.CODE_FORMATS``: GGUF Q6_K's uint6 with zero point 32).
_SIX_BIT_CODES = ("int6", "uint6")
#: The types a uint4 codebook's values take in the kernel (:mod:`emulate.pallas.qcodebook`).
_TABLE_VALUES = ("bfloat16", "float32", "int8")
#: Live (units, bn) 32-bit arrays per per-group part with a row a scale unit at the first
#: K step of an output block (:func:`vmem_bytes`): the part's scratch and its decoding's
#: temporaries (the loaded bytes as int32, the codes, their values, the rows spread over the
#: block's lanes, and a spare). Super-block factors count as allocated.
_FILL_ARRAYS = 6
#: Zero-point formats whose codes take the bfloat16 decode (``128 + z`` exact in bf16).
_SMALL_ZEROS = ("int4", "uint4", "int2", "uint2", "int3", "uint3", "int5", "uint5", "int6", "uint6")


def dot_rows(target: str) -> int:
    """Rows of K per dot: the matrix unit's depth (128 to v5p, 256 from v6e on), so that
    each dot is one pass of the unit and its sums leave it once."""
    return min(_TILE, targets.get(target).mxu_column_size or _LANES)


def _dot_groups(scaling: Any, target: str) -> int:
    """Groups per dot: the rows of partial sums per row of x."""
    return max(1, dot_rows(target) // word_groups.unit(scaling))


def partial_rows(r: compute.Compute, scaling: Any, bm: int) -> int:
    """Rows of partial sums a K step keeps for ``bm`` rows of x: the groups a dot spans
    times ``bm`` (at most :data:`MAX_ROWS` for :func:`applies`)."""
    return _dot_groups(scaling, r.target) * bm


def applies(r: compute.Compute, stored: Any, scaling: Any, codebook: Any, bm: int) -> bool:
    """Whether :func:`body` runs a call: a 4-bit weight in word order (``int4`` /
    ``uint4`` / ``float4_e2m1fn`` codes of a :class:`emulate.pallas.KernelWeight` or
    prepared QArray: MXFP4, NVFP4; ``uint4`` codes into a 16-entry codebook: NF4,
    IQ4_NL) or a 6-bit one (``int6`` / ``uint6`` integer codes: GGUF Q6_K), float
    activations on a float route, groups along K of 16 to 256 rows or a
    multiple of 256 (or scales constant along K), zero points (integer codes only) and
    offsets the kernel decodes per group (none with a codebook: bitsandbytes' double
    quantization keeps the per-element kernel), no column blocks, and at most
    :data:`MAX_ROWS` rows of partial sums per step."""
    if r.exact:
        return False
    six = stored.code in _SIX_BIT_CODES and codebook is None
    if codebook is not None:  # a 16-entry table: the values' type is the route's
        if codebook.code_format != "uint4" or r.rhs not in _TABLE_VALUES:
            return False
    elif r.rhs not in _CODES and not six:
        return False
    grouping = (4, 3) if six else (2, 1)  # codes per byte group, its bytes
    if stored.layout != "planar" or (stored.group, stored.nbytes) != grouping:
        return False
    if stored.code and not six:
        return False
    if r.lhs_compute not in ("bfloat16", "float32") or r.rhs_compute != r.lhs_compute:
        return False
    if scaling is not None:
        if scaling.columns or scaling.element_exponent and scaling.along_k:
            return False
        if scaling.along_k:
            g = scaling.group
            if not (g % 16 == 0 and (_TILE % g == 0 or g % _TILE == 0)):
                return False
            a = scaling.affine
            if a is not None and (codebook is not None or a.zero != "none" and r.rhs == _E2M1):
                return False  # a codebook's nested (double-quantized) scales: not built
            if a is not None and (
                a.zero not in ("none", "static", "array", "packed")
                or a.offset not in ("none", "static", "array", "two_level")
            ):
                return False
    return partial_rows(r, scaling, bm) <= MAX_ROWS


def scratch_shapes(cfg: Any) -> list[Any]:
    """The VMEM scratch of :func:`body`: the ``(bn / 128, R * bm, 128)`` f32 partial sums,
    then the per-group parts' (:func:`emulate.pallas.word_groups.scratch_shapes`)."""
    rows = _dot_groups(cfg.scaling, cfg.compute.target) * cfg.bm
    acc = pltpu.VMEM((cfg.bn // _LANES, rows, _LANES), jnp.float32)
    return [acc, *word_groups.scratch_shapes(cfg)]


def vmem_bytes(
    bm: int,
    bn: int,
    bk: int,
    k: int,
    x_bytes: int,
    scaling: Any,
    highest: bool = False,
    pieces: int = 1,
    bits: int = 4,
    dot: int = _TILE,
) -> int:
    """VMEM of one grid step of :func:`body` (an upper estimate): the double-buffered
    weight and x blocks (x spanning K), the step's decoded tiles and their temporaries
    (Mosaic keeps a step's worth live: 8 bytes an element, 40 with f32 dots at
    ``Precision.HIGHEST`` (``highest``), whose operands it cuts in bfloat16 pieces:
    measured on v2 with f32 x, 39.5 MiB for (2048, 512) blocks; 6 more for each further
    bfloat16 piece of a codebook's values, ``pieces``), the partial sums, the per-group
    scratch and the first step's decoding (:data:`_FILL_ARRAYS`); ``bits``: the codes'
    width (4 or 6); ``dot``: rows of K per dot (:func:`dot_rows`), which set the rows of
    partial sums."""
    kp = -(-k // bk) * bk
    r = max(1, dot // word_groups.unit(scaling))
    w = 2 * (bk * bits // 8) * bn
    x = 2 * bm * kp * x_bytes + 6 * bm * bk  # and the step's slice as f32 and bf16
    tile = (40 if highest else 8 + 6 * (pieces - 1)) * bk * bn
    sums = 3 * r * bm * bn * 4
    shape = types.SimpleNamespace(scaling=scaling, k=k, bk=bk, bn=bn)
    groups = sum(  # the per-group scratch, and what decoding it keeps live at the first step
        n if name.endswith("_supers") else _FILL_ARRAYS * n
        for name, n in word_groups.part_rows(shape)
    )
    return w + x + tile + sums + groups * bn * 4


def _tiled(rows: jax.Array, bm: int) -> jax.Array:
    """(R, bn) rows as the (R * bm, bn) rows of the partial sums, ``(m, g)`` order."""
    return rows if bm == 1 else jnp.tile(rows, (bm, 1))


def _block_diagonal(xc: jax.Array, r: int, u: int, pieces: bool) -> jax.Array:
    """``(R * bm, D)``: row ``m * R + g`` is ``xc[m]`` on group ``g``'s columns, 0 off
    them (``R = D / u`` groups of ``u`` rows of K; with ``pieces`` the columns are in
    piece order, :func:`emulate.pallas.words.piece_rows`); ``xc`` itself when R is 1."""
    if r == 1:
        return xc
    bm, d = xc.shape
    rep = jnp.broadcast_to(xc, (r, d)) if bm == 1 else jnp.repeat(xc, r, axis=0)
    col = lax.broadcasted_iota(jnp.int32, rep.shape, 1)
    if pieces:  # the column's K row, 64q + 2i (the pair's second row shares its group)
        col = col // 64 * 64 + 2 * (col % 32)
    row = lax.broadcasted_iota(jnp.int32, rep.shape, 0)
    return jnp.where(col // u == row % r, rep, jnp.zeros((), rep.dtype))


def piece_order(cfg: Any) -> bool:
    """Whether the call decodes f32 tiles in piece order and takes ``x`` permuted so
    (:func:`emulate.pallas.words.to_piece_order`, outside the kernel): f32 routes, where
    a tile in K order would cost a pack and an unpack per pair of rows."""
    return cfg.word_step and cfg.compute.rhs_compute == "float32"


def _decode_options(cfg: Any) -> dict[str, Any]:
    """:func:`emulate.pallas.words.tile_values`' static options for the call."""
    r, sc = cfg.compute, cfg.scaling
    a = sc.affine if sc is not None and sc.along_k else None
    bf16_vpu = words.bf16_vector_unit(targets.get(r.target)) and (
        a is None or a.zero in ("none", "static") or a.zero_format in _SMALL_ZEROS
    )
    return {
        "signed": formats.get(cfg.stored.code or r.rhs).signed,
        "to": r.rhs_compute,
        "bf16_vpu": bf16_vpu,
        "interpret": cfg.interpret,
        "group": word_groups.unit(sc),
        "piece_order": piece_order(cfg),
        "e2m1": r.rhs == _E2M1,
    }


def _step_sums(cfg: Any, x: jax.Array, wv: jax.Array, parts: Any) -> jax.Array:
    """The K step's ``(R * bm, bn)`` scaled partial sums (module docstring): ``x`` the
    step's (bm, bk) activations as stored, ``wv`` its (bk / 8, bn) words (3 bk / 16 for
    6-bit codes), ``parts`` its rows of the per-group parts
    (:class:`emulate.pallas.word_groups.StepParts`, or None)."""
    r, sc = cfg.compute, cfg.scaling
    a = sc.affine if sc is not None and sc.along_k else None
    u = word_groups.unit(sc)
    dr, rd = dot_rows(r.target), _dot_groups(sc, r.target)
    opts = _decode_options(cfg)
    six = cfg.stored.code in _SIX_BIT_CODES  # 16 words of high crumbs after each tile's 32
    per_tile = words.TILE_WORDS + (words.HIGH_WORDS if six else 0)
    static_zero = a.zero_value if a is not None and a.zero == "static" else None
    static_offset = a.offset_value if a is not None and a.offset == "static" else None

    def rows(name: str, first: int, n: int) -> jax.Array | None:
        return None if parts is None else parts.rows(name, first, n)

    total = None
    for c in range(cfg.bk // _TILE):
        z = rows("zero", c * _TILE // u, _TILE // u)
        tile = wv[c * per_tile : c * per_tile + words.TILE_WORDS]
        high = wv[c * per_tile + words.TILE_WORDS : (c + 1) * per_tile] if six else None
        if cfg.codebook is not None:  # a select tree per nibble, a tile per piece
            wts = qcodebook.table_tiles(
                tile, cfg.codebook, to=r.rhs_compute, interpret=cfg.interpret,
                piece_order=opts["piece_order"],
            )  # fmt: skip
        else:
            zero = static_zero if z is None else z
            wts = [words.tile_values(tile, zero=zero, high=high, **opts)]
        for h in range(_TILE // dr):
            d0 = c * _TILE + h * dr  # the dot's first row of the step
            first = d0 // u  # its first scale unit
            xc = x[:, d0 : d0 + dr]
            if rd > 1:  # selects in f32: v4 has none on bf16 vectors
                xc = xc.astype(jnp.float32)
            xbd = _block_diagonal(xc, rd, min(u, dr), opts["piece_order"])
            t = None
            for wt in wts:  # one tile, or a codebook's bfloat16 pieces
                d = lax.dot_general(
                    xbd.astype(jnp.dtype(r.rhs_compute)),
                    wt[h * dr : (h + 1) * dr],
                    (((1,), (0,)), ((), ())),
                    precision=r.precision,
                    preferred_element_type=jnp.float32,
                )
                t = d if t is None else t + d
            assert t is not None
            for name in ("scale", "scale_hi"):
                s = rows(name, first, rd)
                if s is not None:
                    t = t * _tiled(s, cfg.bm)
            off = rows("offset", first, rd)
            if off is not None or static_offset is not None:
                xs = jnp.sum(xbd.astype(jnp.float32), axis=1, keepdims=True)
                o: Any = _tiled(off, cfg.bm) if off is not None else jnp.float32(static_offset)
                t = t + xs * o
            total = t if total is None else total + t
    assert total is not None
    return total


def _result(acc: Any, rd: int, bm: int, bn: int) -> jax.Array:
    """The (bm, bn) sum over the ``rd`` group rows of each row of x (strided loads)."""
    from jax.experimental import pallas as pl  # noqa: PLC0415 - kernel-side only

    tiles = []
    for i in range(bn // _LANES):
        s = acc[i, pl.ds(0, bm, stride=rd), :] if rd > 1 else acc[i]
        for g in range(1, rd):
            s = s + acc[i, pl.ds(g, bm, stride=rd), :]
        tiles.append(s)
    return tiles[0] if len(tiles) == 1 else jnp.concatenate(tiles, axis=1)


def body(
    cfg: Any,
    x_ref: Any,
    w_ref: Any,
    s_ref: Any,
    aff_refs: Sequence[Any],
    ts_refs: Any,
    out_ref: Any,
    scratch: Sequence[Any],
    store: Any,
) -> None:
    """The kernel's body on grid step ``(i, j, k)`` (module docstring): ``x_ref`` the
    resident (bm, Kp) activations, ``w_ref`` the (bk / 2, bn) word-order bytes, ``s_ref``
    and ``aff_refs`` the QArray's scale operands (or None and ()), ``ts_refs`` the tensor
    scale's two parts (or None), ``scratch`` :func:`scratch_shapes`' arrays; ``store``
    writes the finished output block."""
    from jax.experimental import pallas as pl  # noqa: PLC0415 - kernel-side only

    sc = cfg.scaling
    grouped = sc is not None and sc.along_k
    acc, refs = scratch[0], word_groups.bind(cfg, scratch[1:])
    bk = cfg.bk
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _first():
        acc[...] = jnp.zeros(acc.shape, acc.dtype)
        if grouped:
            word_groups.fill(cfg, s_ref, aff_refs, refs)

    x = x_ref[:, pl.ds(pl.multiple_of(k * bk, bk), bk)]
    if cfg.k % bk and not piece_order(cfg):  # columns past K: garbage of a partial block
        cols = lax.broadcasted_iota(jnp.int32, x.shape, 1)
        # v4 has no select on bf16 vectors: select in f32, then round (exactly)
        wide = jnp.where(cols < cfg.k - k * bk, x.astype(jnp.float32), jnp.float32(0))
        x = wide.astype(x.dtype)
    parts = word_groups.StepParts(cfg, refs, k) if grouped else None
    total = _step_sums(cfg, x, words.words(w_ref[...]), parts)
    rd = _dot_groups(sc, cfg.compute.target)
    for i, tl in enumerate(word_groups.lane_tiles(total)):
        acc[i] += tl

    @pl.when(k == pl.num_programs(2) - 1)
    def _store():
        res = _result(acc, rd, cfg.bm, cfg.bn)
        if cfg.scaled_in_kernel:
            store(out_ref, qsteps.scaled_result(res, s_ref, ts_refs, cfg))
        else:
            store(out_ref, res)
