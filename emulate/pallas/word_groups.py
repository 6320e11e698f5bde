"""The per-group parts of a word step (:mod:`emulate.pallas.word_step`): each group's
scale, zero point and offset, decoded once per output column block into VMEM scratch.

At the first K step of an output block (:func:`fill`), every group of the block's
columns is decoded from the operands :mod:`emulate.pallas.qweight` and
:mod:`emulate.pallas.qoffsets` define into a ``(bn / 128, units, 128)`` scratch per part,
a row per scale *unit* of ``U = min(G, 256)`` rows of K (:func:`unit`): f32 scales (two
factors for float32, bfloat16 and e8m0 scales, as :func:`emulate.pallas.qsteps.group_scale`
splits them), int32 zero points, f32 offsets. Codes packed along the groups (4-bit zero
points, two-level parts' 4- or 6-bit codes) are cut out per block of 64 groups by a
one-hot dot of their bytes (exact) and shifts. A two-level part keeps its codes' values
(``code - zero`` or a codebook's entry) per unit and its super-block scales' factors per
:func:`super_rows` rows of K; each K step (:class:`StepParts`) reads its own rows and
multiplies the two as :func:`emulate.dequantize` rounds them (one product for float16
super-block scales, :func:`emulate.pallas.qgroups.scaled`'s three factors otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental.pallas import tpu as pltpu

from emulate import formats
from emulate.numerics import codecs
from emulate.numerics.bits import frexp_bits, pow2_normal
from emulate.pallas import qcodebook, qgroups, qsteps
from emulate.pallas.qoffsets import Affine, KernelLevel

__all__ = [
    "PARTS",
    "StepParts",
    "bind",
    "fill",
    "lane_tiles",
    "packed_codes",
    "parts",
    "scratch_shapes",
    "part_rows",
    "unit",
    "units",
]

_LANES = 128
_TILE = 256


def unit(scaling: Any) -> int:
    """Rows of K per scale unit: the group, or a tile (256 rows) for longer groups and
    weights without scales along K."""
    if scaling is None or not scaling.along_k:
        return _TILE
    return min(scaling.group, _TILE)


def _levels(cfg: Any) -> dict[str, KernelLevel | None]:
    """The two-level parts of a call: "scale" and "offset" (or None)."""
    sc = cfg.scaling
    a = sc.affine if sc is not None and sc.along_k else None
    return {
        "scale": a.scale_level if a is not None else None,
        "offset": a.offset_level if a is not None and a.offset == "two_level" else None,
    }


def super_rows(cfg: Any, lv: KernelLevel) -> int:
    """Rows of K per row of a two-level part's super-block factors in scratch: a whole
    tile (256 rows) where a super-block spans tiles, else one group (factors spread)."""
    g = cfg.scaling.group
    return _TILE if lv.cols > 1 or lv.block * g >= _TILE else g


def parts(cfg: Any) -> dict[str, bool]:
    """Which per-group scratch the call needs: scale factors (one or two), zero points,
    offsets, and each two-level part's super-block factors."""
    sc = cfg.scaling
    grouped = sc is not None and sc.along_k
    a = sc.affine if grouped else None
    lv = _levels(cfg)
    plain = grouped and lv["scale"] is None
    return {
        "scale": grouped,
        "scale_hi": bool(plain and sc.scale_format in ("float32", "bfloat16", "float8_e8m0fnu")),
        "scale_supers": lv["scale"] is not None,
        "zero": a is not None and a.zero in ("array", "packed"),
        "offset": a is not None and a.offset in ("array", "two_level"),
        "offset_supers": lv["offset"] is not None,
    }


PARTS = ("scale", "scale_hi", "scale_supers", "zero", "offset", "offset_supers")


def units(cfg: Any) -> int:
    """Scale units of the padded K (the per-group scratch's rows)."""
    kp = -(-cfg.k // cfg.bk) * cfg.bk
    return kp // unit(cfg.scaling)


def part_rows(cfg: Any) -> list[tuple[str, int]]:
    """The scratch rows of each part the call needs (:func:`parts`, in :data:`PARTS`
    order): a row per scale unit, or for a two-level part's super-block factors
    :func:`_factor_count` blocks of a row per :func:`super_rows` rows of K (at least 8)."""
    have = parts(cfg)
    kp = -(-cfg.k // cfg.bk) * cfg.bk
    out = []
    for name in PARTS:
        if not have[name]:
            continue
        if name.endswith("_supers"):
            lv = _levels(cfg)[name.split("_")[0]]
            assert lv is not None
            out.append((name, _factor_count(lv) * max(8, kp // super_rows(cfg, lv))))
        else:
            out.append((name, units(cfg)))
    return out


def scratch_shapes(cfg: Any) -> list[Any]:
    """Per part (:func:`parts`, in :data:`PARTS` order) a ``(bn / 128, rows, 128)`` VMEM
    array (:func:`part_rows`): f32 scales, offsets and super-block factors, int32 zero
    points."""
    lanes = cfg.bn // _LANES
    return [
        pltpu.VMEM((lanes, rows, _LANES), jnp.int32 if name == "zero" else jnp.float32)
        for name, rows in part_rows(cfg)
    ]


def lane_tiles(v: jax.Array) -> list[jax.Array]:
    return [v[:, i * _LANES : (i + 1) * _LANES] for i in range(v.shape[1] // _LANES)]


def _lanes(v: jax.Array, bn: int) -> jax.Array:
    """A (rows, C) array as (rows, bn): as it is, or one column broadcast."""
    return v if v.shape[1] == bn else jnp.broadcast_to(v[:, :1], (v.shape[0], bn))


#: Groups per one-hot dot of :func:`packed_codes` (a whole number of bytes for every
#: code width; the dot's cost grows with the square of this, its count linearly with K).
_CODE_BLOCK = 64


def packed_codes(byte_rows: jax.Array, bits: int, count: int) -> jax.Array:
    """The (count, C) unsigned int32 codes of ``count`` groups packed along the rows
    (:func:`emulate.pack`'s bit stream; ``byte_rows`` (B, C) int32 bytes): per block of
    :data:`_CODE_BLOCK` groups, the 16 bits of the two bytes each code starts in, ``lo +
    256 * hi``, picked from the block's bytes by one one-hot dot (0, 1 and 256 times
    bytes: every product and sum exact in f32, whatever passes the unit makes), then
    shifted and masked per row."""
    if bits == 8:
        return byte_rows[:count]
    b = byte_rows.shape[0]
    blocks = []
    for g0 in range(0, count, _CODE_BLOCK):
        n = min(_CODE_BLOCK, count - g0)
        lo = g0 * bits // 8
        hi = min(b, (g0 + n) * bits // 8 + 1)
        g = lax.broadcasted_iota(jnp.int32, (n, hi - lo), 0)
        c = lax.broadcasted_iota(jnp.int32, (n, hi - lo), 1)
        first = g * bits // 8
        pick = jnp.where(c == first, jnp.float32(1), jnp.float32(0))
        pick = pick + jnp.where(c == first + 1, jnp.float32(256), jnp.float32(0))
        win = byte_rows[lo:hi].astype(jnp.float32)
        blocks.append(lax.dot(pick, win, preferred_element_type=jnp.float32))
    word = blocks[0] if len(blocks) == 1 else jnp.concatenate(blocks, axis=0)
    # an integer below 2**16 from its f32 bits: 2**23 + v has v in its low mantissa bits,
    # and the shift (at most 7) and mask leave the exponent's bits out
    word = lax.bitcast_convert_type(word + jnp.float32(2**23), jnp.int32)
    shift = lax.broadcasted_iota(jnp.int32, (count, 1), 0) * bits % 8
    return lax.shift_right_logical(word, shift) & ((1 << bits) - 1)


def _level_codes(byte_rows: jax.Array, lv: KernelLevel, count: int) -> jax.Array:
    """A two-level part's (count, C) f32 values before the super-block scale: ``code -
    zero`` (exact) or ``table[code]`` (a codebook's f32 entry)."""
    code = packed_codes(byte_rows, formats.get(lv.code_format).bits, count)
    if lv.codebook is not None:
        table = tuple(float(v) for v in lv.codebook.array().astype(np.float32))
        return qcodebook.select_tree(code, table)
    f = formats.get(lv.code_format)
    if f.signed:
        half = 1 << (f.bits - 1)
        code = (code ^ half) - half
    if lv.zero:
        code = code - lv.zero
    return code.astype(jnp.float32)


def _factor_count(lv: KernelLevel) -> int:
    """Factors a two-level part's super-block scale is applied as: one for float16 scales
    (every one a normal f32 number, so ``fl(v * m) * 2**e == fl(v * s)``), else three
    (:func:`emulate.pallas.qgroups.super_factors`: f32 and bf16 subnormals kept)."""
    return 1 if lv.super_format == "float16" else 3


def _level_factors(supers: jax.Array, lv: KernelLevel, bn: int) -> tuple[jax.Array, ...]:
    """The super-block scales as the factors :func:`_factor_count` says (one row per
    super-block, or for scales of several columns one (1, bn) row spread to the block's
    columns): the f32 scale, or ``(m, 2**h, 2**(e - h))``."""
    if lv.cols > 1:
        supers = qgroups.spread_supers(supers, lv, _column0(lv, supers, bn), bn)
    if _factor_count(lv) == 1:  # float16 bits: their f32 value
        bits = codecs.decode_float_bits(supers, formats.get("float16"))
        return (lax.bitcast_convert_type(bits, jnp.float32),)
    return qgroups.super_factors(supers, lv.super_format)


def _column0(lv: KernelLevel, supers: jax.Array, bn: int) -> Any:
    """The weight column of the output block's first column, counted from the first scale
    of the loaded window of super-block scales (:func:`emulate.pallas.qgroups.block_spread`)."""
    from jax.experimental import pallas as pl  # noqa: PLC0415 - kernel-side only

    j = pl.program_id(1)
    window = qgroups.supers_window(lv.cols, bn)
    b0: Any = 0
    if window is not None and supers.shape[1] == window[0]:
        b0 = (j // window[1]) * window[0]
    return j * bn - b0 * lv.cols


def _plain_scales(block: jax.Array, fmt: str) -> tuple[jax.Array, jax.Array | None]:
    """Every group's scale factors from the loaded (groups, C) scale block: one f32 value,
    or two normal f32 factors for float32 / bfloat16 scales held as bits (subnormal
    scales keep their value) and e8m0 (as :func:`emulate.pallas.qsteps.group_scale`)."""
    lo, hi = qsteps.scale_rows(block, fmt)
    if fmt in ("float32", "bfloat16"):
        m, e = frexp_bits(lax.bitcast_convert_type(lo, jnp.uint32))
        half = e >> 1
        return m * pow2_normal(e - half), pow2_normal(half)
    return lo, hi


def _store_units(ref: Any, v: jax.Array, group: int, units: int) -> None:
    """Per-group rows ``v`` (groups, bn) into the (L, units, 128) scratch ``ref`` as one row
    per unit of ``min(group, 256)`` rows (a group longer than a tile fills ``group /
    256`` consecutive rows), zeros past the last group."""
    reps = max(1, group // _TILE)
    if reps > 1:
        v = jnp.repeat(v, reps, axis=0)
    g = min(v.shape[0], units)
    for i, t in enumerate(lane_tiles(v[:g])):
        if g < units:
            ref[i] = jnp.zeros(ref.shape[1:], ref.dtype)
        ref[i, :g, :] = t


def _store_factors(ref: Any, factors: tuple[jax.Array, ...], lv: KernelLevel, cfg: Any) -> None:
    """Super-block factors into their (L, 3 n, 128) scratch: rows ``[0, n)``, ``[n, 2n)``,
    ``[2n, 3n)`` hold ``m``, ``2**h``, ``2**(e - h)``, one row per :func:`_super_rows`
    rows of K (a super-block's row repeated over the tiles or groups it spans)."""
    n = ref.shape[1] // len(factors)
    rows = super_rows(cfg, lv)
    g = cfg.scaling.group
    for f_i, f in enumerate(factors):
        if lv.cols > 1:
            v = jnp.broadcast_to(f, (n, f.shape[1]))
        else:
            v = jnp.repeat(f, lv.block * g // rows, axis=0) if lv.block * g > rows else f
        v = v[:n]
        for i, t in enumerate(lane_tiles(v)):
            if v.shape[0] < n:
                ref[i, f_i * n : (f_i + 1) * n, :] = jnp.zeros((n, _LANES), jnp.float32)
            ref[i, f_i * n : f_i * n + v.shape[0], :] = t


def bind(cfg: Any, scratch: Sequence[Any]) -> dict[str, Any]:
    """:func:`scratch_shapes`' refs by part name."""
    have = parts(cfg)
    rest = list(scratch)
    return {name: rest.pop(0) for name in PARTS if have[name]}


def fill(cfg: Any, s_ref: Any, aff_refs: Sequence[Any], refs: dict[str, Any]) -> None:
    """At an output block's first K step: its groups' scales (or two-level values and
    super-block factors), zero points and offsets into the scratch ``refs`` (:func:`bind`)
    from the scale operands (``s_ref``, ``aff_refs``: :func:`emulate.pallas.matmul_kernel.
    scale_operands`' order)."""
    sc = cfg.scaling
    a: Affine | None = sc.affine
    bn, count = cfg.bn, sc.rows
    n_units = units(cfg)
    have = parts(cfg)
    aff = list(aff_refs)
    zeros = aff.pop(0)[...] if a is not None and a.zero in ("array", "packed") else None
    if a is not None and a.offset == "array":
        offsets = qsteps.float_rows(aff.pop(0)[...], a.offset_format)
        _store_units(refs["offset"], _lanes(offsets, bn), sc.group, n_units)
    elif a is not None and a.offset == "two_level":
        lv = a.offset_level
        assert lv is not None
        obytes = aff.pop(0)[...].astype(jnp.int32) & 0xFF
        osup = qgroups.super_rows(aff.pop(0)[...], lv.super_format)
        _store_units(refs["offset"], _lanes(_level_codes(obytes, lv, count), bn), sc.group, n_units)
        _store_factors(refs["offset_supers"], _level_factors(osup, lv, bn), lv, cfg)
    if a is not None and a.scale_level is not None:
        lv = a.scale_level
        ssup = qgroups.super_rows(aff.pop(0)[...], lv.super_format)
        sbytes = s_ref[...].astype(jnp.int32) & 0xFF
        _store_units(refs["scale"], _lanes(_level_codes(sbytes, lv, count), bn), sc.group, n_units)
        _store_factors(refs["scale_supers"], _level_factors(ssup, lv, bn), lv, cfg)
    else:
        lo, hi = _plain_scales(s_ref[...], sc.scale_format)
        _store_units(refs["scale"], _lanes(lo, bn), sc.group, n_units)
        if have["scale_hi"]:
            assert hi is not None
            _store_units(refs["scale_hi"], _lanes(hi, bn), sc.group, n_units)
    if have["zero"]:
        assert a is not None and zeros is not None
        zf = formats.get(a.zero_format)
        if a.zero == "packed":
            z = packed_codes(zeros.astype(jnp.int32) & 0xFF, zf.bits, count)
        else:
            z = zeros.astype(jnp.int32) & 0xFF
        if zf.signed:
            half = 1 << (zf.bits - 1)
            z = (z ^ half) - half
        _store_units(refs["zero"], _lanes(z, bn), sc.group, n_units)


# --- one K step ------------------------------------------------------------------------


def _step_rows(ref: Any, k: Any, per_step: int, bn: int) -> jax.Array:
    """The K step's (per_step, bn) rows of a per-group scratch (an aligned dynamic slice)."""
    from jax.experimental import pallas as pl  # noqa: PLC0415 - kernel-side only

    start = pl.multiple_of(k * per_step, per_step)
    tiles = [ref[i, pl.ds(start, per_step), :] for i in range(bn // _LANES)]
    return tiles[0] if len(tiles) == 1 else jnp.concatenate(tiles, axis=1)


def _step_rows_at(ref: Any, base: int, k: Any, per_step: int, bn: int) -> jax.Array:
    """:func:`_step_rows` of the rows from ``base`` on (a static offset)."""
    from jax.experimental import pallas as pl  # noqa: PLC0415 - kernel-side only

    start = base + k * per_step
    if base % per_step == 0:
        start = pl.multiple_of(start, per_step)
    tiles = [ref[i, pl.ds(start, per_step), :] for i in range(bn // _LANES)]
    return tiles[0] if len(tiles) == 1 else jnp.concatenate(tiles, axis=1)


def _times_super(v: jax.Array, factors: Sequence[jax.Array], offset: float) -> jax.Array:
    """``v`` times its super-block scale as :func:`emulate.dequantize` rounds it: one
    product (float16 scales), or :func:`emulate.pallas.qgroups.scaled`'s three factors;
    then a codebook level's static offset."""
    if len(factors) == 1:
        v = v * factors[0]
        return v + jnp.float32(offset) if offset else v
    m, p1, p2 = factors
    return qgroups.scaled(v, (m, p1, p2), offset)


class StepParts:
    """In a K step: the step's rows of every per-group part (:func:`bind`'s ``refs``)."""

    def __init__(self, cfg: Any, refs: dict[str, Any], k: Any):
        bn, bk = cfg.bn, cfg.bk
        self.unit = unit(cfg.scaling)
        per_step = bk // self.unit
        self.step = {
            name: _step_rows(refs[name], k, per_step, bn)
            for name in ("scale", "scale_hi", "zero", "offset")
            if name in refs
        }
        self.supers: dict[str, tuple[list[jax.Array], int, KernelLevel]] = {}
        for name, lv in _levels(cfg).items():
            if lv is not None:
                ref = refs[name + "_supers"]
                nf = _factor_count(lv)
                n, rows = ref.shape[1] // nf, super_rows(cfg, lv)
                fs = [_step_rows_at(ref, f * n, k, bk // rows, bn) for f in range(nf)]
                self.supers[name] = (fs, rows, lv)

    def rows(self, name: str, first: int, n: int) -> jax.Array | None:
        """Rows ``first .. first + n - 1`` (scale units of the step) of a part, (n, bn)
        (a two-level part's value times its super-block's factors, as dequantize rounds
        it), or None where the call has no such part."""
        if name not in self.step:
            return None
        v = self.step[name][first : first + n]
        if name in self.supers:
            fs, rows, lv = self.supers[name]
            if rows == _TILE:  # one super-block row per tile, repeated over its units
                c0, c1 = first * self.unit // _TILE, (first + n - 1) * self.unit // _TILE + 1
                per = _TILE // self.unit
                fs = [f[c0:c1] if c1 - c0 == 1 else jnp.repeat(f[c0:c1], per, axis=0) for f in fs]
            else:
                fs = [f[first : first + n] for f in fs]
            v = _times_super(v, fs, lv.offset)
        return v
