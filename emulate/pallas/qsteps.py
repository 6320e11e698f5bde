"""The in-kernel arithmetic of a QArray weight's scales in :func:`emulate.pallas.matmul`:
scale blocks decoded to f32 factors (float8 and e8m0 from their bits), a K step of group
scales (each group's partial sum times its scale, with the zero-point and offset terms of
:class:`GroupTerms`; NVFP4's row-scaled tile and one dot), and the store's scaling of the
result. What is built and the bounds: :mod:`emulate.pallas.qweight`; the host side of
zero points, offsets and two-level parts: :mod:`emulate.pallas.qoffsets`.

Scale blocks of several columns: FP8 e4m3 weights with one scale per 128 x 128 block
(DeepSeek-V3's ``weight_scale_inv``, compressed-tensors' "block" strategy, the ``fp8``
quantization config's ``weight_block_size``) and any QArray of ``(G, C)`` blocks, ``C`` a
multiple of 128 columns short of N. The scales enter the kernel as stored,
``(ceil(K / G), ceil(N / C))``: one block holding all of them
(:func:`column_blocks_spec`: Mosaic takes a block whose last dim is the array's own, and
the index never changes, so Pallas fetches it once per call). No copy is made outside the
kernel: a prepared weight costs the QArray's bytes. In the kernel (:func:`widen`), a
group's row of scales (``(1, ceil(N / C))``, as :func:`scale_rows` holds them: f32
factors, or the int32 bits of float32 and bfloat16 scales) becomes the output block's
``(1, bn)`` row: each slice of ``w = gcd(bn, C)`` lanes (a multiple of 128, inside one
block column) takes its block's factor, picked with a one-hot lane sum (exact: the other
lanes add +0, and bits are summed as integers; NaN and Inf stay in their block, where a
one-hot dot would spread them with ``NaN * 0``) and broadcast along the slice. Lanes past
the last block column get 0 (their output columns lie past N, dropped). The group path
then applies the row as it does a per-column scale row: the numerics are those of
``(G, 1)`` groups (each group's partial sum in f32 times its scale, added in f32). Not
built (refused by :func:`emulate.pallas.qweight.split`): blocks of a width that is not a
multiple of 128 columns, and zero points or offsets with column blocks.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from emulate import formats
from emulate.numerics import codecs
from emulate.numerics.bits import frexp, frexp_bits, pow2_normal, times_pow2
from emulate.numerics.scales import scale_frexp
from emulate.pallas import compute, qgroups
from emulate.pallas.qoffsets import Affine
from emulate.pallas.qweight import Scaling

__all__ = [
    "GroupTerms",
    "column_blocks_spec",
    "float_rows",
    "group_scale",
    "group_scaled_step",
    "rows_scaled",
    "scale_rows",
    "scaled_result",
    "store_factors",
    "tensor_parts",
    "widen",
    "zero_in_codes",
]

#: (element format, scale format) whose products are exact in bfloat16 (NVFP4: e2m1 values
#: have 2 significant bits and exponents -1 to 2, e4m3 scales 4 bits and -9 to 8), so a
#: K step of several groups may scale the weight tile's rows and run one dot.
_ROW_SCALED = {("float4_e2m1fn", "float8_e4m3fn")}
#: ... from this many rows of x a block on (measured on a v5e, 4096 x 4096 NVFP4: at
#: M = 512, bm = 256, one dot a step took 732 us against 1068 us for one a group; at
#: M = 1 and 64 it took 343 and 365 us against 303 and 323: the row scaling costs the
#: vector unit more than the short dots cost the matrix unit).
_ROW_SCALED_MIN_BM = 256


#: Scale formats held as int32 bits in the kernel and split into two factors only in the
#: rows a step selects (a float operation would flush a subnormal scale on the CPU and the
#: TPU, which :func:`emulate.dequantize` and :func:`emulate.dot_general` keep).
_WIDE = ("float32", "bfloat16")


def _wide_frexp(bits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(m, e)`` of float32 scales given as int32 bits (integer operations only)."""
    return frexp_bits(lax.bitcast_convert_type(bits, jnp.uint32))


def scale_rows(block: jax.Array, scale_format: str) -> tuple[jax.Array, jax.Array | None]:
    """A loaded scale block, one row per group: f32 ``(value, None)``; float32 and bfloat16
    as ``(bits, None)``, their int32 f32 bits (:func:`emulate.pallas.qgroups.super_rows`),
    which :func:`group_scale` splits into factors in the row it selects; float8_e8m0fnu
    ``(2**(e//2), 2**(e - e//2))`` (both normal f32; NaN for the NaN code)."""
    f = formats.get(scale_format)
    if scale_format in _WIDE:
        return qgroups.super_rows(block, scale_format), None
    if block.dtype.itemsize == 1 and jnp.issubdtype(block.dtype, jnp.floating):
        block = lax.bitcast_convert_type(block, jnp.int8)  # Mosaic bitcasts to int8
    c = block.astype(jnp.int32) & f.code_mask
    if scale_format == "float8_e8m0fnu":
        e = c - 127
        half = e // 2
        nan = c == 255
        lo = jnp.where(nan, jnp.float32(jnp.nan), pow2_normal(jnp.where(nan, 0, half)))
        return lo, pow2_normal(jnp.where(nan, 0, e - half))
    return lax.bitcast_convert_type(codecs.decode_float_bits(c, f), jnp.float32), None


def store_factors(block: jax.Array | None, s: Scaling) -> tuple[Any, Any]:
    """In the kernel, at the store: ``(m, e)`` of the scales constant along K for a loaded
    (1, C) scale block, as :meth:`emulate.QArray.scale_parts` gives them (before the tensor
    scale and element exponent); ``(1, 0)`` for scales along K (applied per group)."""
    if s.along_k or block is None:
        return jnp.float32(1), jnp.int32(0)
    if s.scale_format == "float8_e8m0fnu":
        if block.dtype.itemsize == 1 and jnp.issubdtype(block.dtype, jnp.floating):
            block = lax.bitcast_convert_type(block, jnp.int8)  # Mosaic bitcasts to int8
        c = block.astype(jnp.int32) & 0xFF
        m = jnp.where(c == 255, jnp.float32(jnp.nan), jnp.float32(1))
        return m, jnp.where(c == 255, 0, c - 127)
    if s.scale_format in _WIDE:
        return _wide_frexp(qgroups.super_rows(block, s.scale_format))
    v, _ = scale_rows(block, s.scale_format)
    return frexp(v)


def tensor_parts(tensor_scale: Any) -> tuple[jax.Array, jax.Array]:
    """A tensor scale's ``(m, e)`` as (1, 1) f32 and int32 arrays (kernel operands)."""
    m, e = scale_frexp(jnp.asarray(tensor_scale, jnp.float32), "float32")
    return m.reshape(1, 1), e.reshape(1, 1)


def group_scale(
    parts: tuple[jax.Array, jax.Array | None], index: Any, cfg: Any
) -> tuple[jax.Array, jax.Array | None]:
    """Group ``index``'s scale factors (``parts`` as :func:`scale_rows` gives them) as
    (1, C) rows; for scale blocks of several columns (``cfg.scaling.columns``), the output
    block's (1, bn) rows (:func:`widen`). float32 and bfloat16
    scales (``cfg.scaling.scale_format``; held as bits) become two normal f32 factors
    ``(m * 2**(e - e//2), 2**(e//2))``: subnormal scales keep their value, a partial sum
    times the first rounds once as times ``m``, the second is exact unless the result is
    below 2**-126 (flushed there as in :func:`emulate.dot_general`)."""
    lo = qgroups.select_row(parts[0], index)
    hi = None if parts[1] is None else qgroups.select_row(parts[1], index)
    if cfg.scaling.columns:
        from jax.experimental import pallas as pl  # noqa: PLC0415 - kernel-side only

        j, cols = pl.program_id(1), cfg.scaling.columns
        lo = widen(lo, cols, cfg.bn, j)
        hi = None if hi is None else widen(hi, cols, cfg.bn, j)
    if cfg.scaling.scale_format in _WIDE:
        m, e = _wide_frexp(lo)
        half = e >> 1
        lo, hi = m * pow2_normal(e - half), pow2_normal(half)
    return lo, hi


def scaled_result(acc: jax.Array, s_ref: Any, ts_refs: Any, cfg: Any) -> jax.Array:
    """The f32 sum (or an exact int32 sum, rounded once into f32 and scaled by its
    quantum) times what the K steps did not apply (scales constant along K, the tensor
    scale, ``2**element_exponent``) as :func:`apply_outside` does, rounded once into the
    result type."""
    sc = cfg.scaling
    assert sc is not None
    if acc.dtype == jnp.int32:  # an exact sum that fits int32: rounded once into f32
        acc = acc.astype(jnp.float32)
        if cfg.compute.scale:
            acc = acc * jnp.float32(2.0**-cfg.compute.scale)
    m, e = store_factors(None if sc.along_k else s_ref[...], sc)
    if ts_refs is not None:
        m, e = m * ts_refs[0][...], e + ts_refs[1][...]
    if sc.element_exponent:
        e = e + sc.element_exponent
    if not sc.along_k or ts_refs is not None or sc.element_exponent:
        acc = times_pow2(acc * m, e)
    return acc.astype(formats.get(cfg.out).dtype)


def rows_scaled(cfg: Any) -> bool:
    """Whether a K step scales the decoded weight tile's rows by their groups' scales and
    runs one dot (:func:`group_scaled_step`): several groups a step, a bf16 float route,
    element x scale products exact in bf16 (:data:`_ROW_SCALED`) and blocks of at least
    :data:`_ROW_SCALED_MIN_BM` rows of x."""
    sc, r = cfg.scaling, cfg.compute
    return (
        sc is not None
        and sc.along_k
        and sc.group < cfg.bk
        and not r.exact
        and r.rhs_compute == "bfloat16"
        and cfg.x_planes == 1
        and cfg.codebook is None
        and sc.affine is None
        and (r.rhs, sc.scale_format) in _ROW_SCALED
        and cfg.bm >= _ROW_SCALED_MIN_BM
    )


def _row_scaled_step(tiles: list, factors: tuple, cfg: Any, k: Any) -> jax.Array:
    """One K step of :func:`rows_scaled`: the (bk, C) tile of each row's group scale (one
    row selected per group, repeated over the group's rows), times the decoded tile in f32
    (exact, then exactly bf16), one dot with the f32 accumulator."""
    sc = cfg.scaling
    per = cfg.bk // sc.group
    rows = []
    for q in range(per):
        lo, _ = group_scale(factors, k * per + q, cfg)
        rows.append(jnp.broadcast_to(lo, (sc.group, lo.shape[1])))
    tile_scale = jnp.concatenate(rows, axis=0)
    total = None
    for xt, wt in tiles:
        ws = (wt.astype(jnp.float32) * tile_scale).astype(jnp.bfloat16)
        d = compute.float_dot(xt, ws, cfg.compute.precision)
        total = d if total is None else total + d
    assert total is not None
    return total


def zero_in_codes(spec: Any, r: Any) -> bool:
    """Whether a float route subtracts a weight's zero points from its decoded codes: every
    ``v - z`` then is an exact integer of the compute type (|v - z| <= 256 in bfloat16), and
    the dot's error is relative to ``|W|``, not to ``|v s| + |z s|`` (issue 40). Exact
    routes subtract ``z X`` from their int32 sums instead, exactly."""
    if r.exact or spec.zero == "none" or r.rhs_compute not in ("bfloat16", "float32"):
        return False
    f = formats.get(r.rhs)
    if not f.is_integer:
        return False
    if spec.zero == "static":
        zlo = zhi = spec.zero_value
    else:
        z = formats.get(spec.zero_format)
        zlo, zhi = int(z.min), int(z.max)
    reach = max(abs(int(f.min) - zhi), abs(int(f.max) - zlo))
    return reach <= (256 if r.rhs_compute == "bfloat16" else 2**24)


def group_scaled_step(
    tiles: list, s_ref: Any, cfg: Any, k: Any, aff_refs: Any = (), spread_refs: Any = ()
) -> jax.Array:
    """One K step of a weight with scales along K: per group of rows, the partial sum of
    every plane (exact for exact-class pairs, then f32) times the group's scale, in f32;
    with zero points and offsets (``aff_refs``), their terms (:class:`GroupTerms`); where
    :func:`rows_scaled`, the tile's rows times their scales and one dot (``spread_refs``:
    :class:`GroupTerms`')."""
    r = cfg.compute
    sc = cfg.scaling
    assert sc is not None
    if rows_scaled(cfg):
        return _row_scaled_step(tiles, scale_rows(s_ref[...], sc.scale_format), cfg, k)
    terms = None
    if sc.affine is not None:
        zero = zero_in_codes(sc.affine, r)
        terms = GroupTerms(aff_refs, s_ref, sc.affine, r.exact, r.lhs_scale, spread_refs, zero)
    two_level = terms is not None and terms.two_level_scales
    factors = None if two_level else scale_rows(s_ref[...], sc.scale_format)
    sub = min(sc.group, cfg.bk)  # K rows per partial sum
    rows = sub // cfg.x_planes  # their rows in each plane
    quantum = jnp.float32(2.0**-r.scale) if r.exact and r.scale else None
    if terms is not None:  # the step's two-level parts and group sums, once
        terms.begin([xt for xt, _ in tiles], k * cfg.bk // sc.group, cfg.bk // sub, rows)
    total = None
    for q in range(cfg.bk // sub):
        part, cut = None, []
        index = (k * cfg.bk + q * sub) // sc.group
        for xt, wt in tiles:
            xs = xt[:, q * rows : (q + 1) * rows]
            ws = wt[q * rows : (q + 1) * rows]
            if terms is not None and terms.zero_in_codes:  # v - z: exact (zero_in_codes)
                z = jnp.asarray(terms.zero_row(index), jnp.float32)
                ws = (ws.astype(jnp.float32) - z).astype(ws.dtype)
            d = compute.exact_dot(xs, ws, r) if r.exact else compute.float_dot(xs, ws, r.precision)
            part = d if part is None else part + d
            cut.append(xs)
        assert part is not None
        if terms is not None:
            part = terms.subtract_zero(part, cut, index)
        part = part.astype(jnp.float32)
        if quantum is not None:
            part = part * quantum
        if factors is None:
            assert terms is not None
            lo, hi = terms.scale(q)
        else:
            lo, hi = group_scale(factors, index, cfg)
        part = part * lo
        if hi is not None:
            part = part * hi
        if terms is not None:
            part = terms.add_offset(part, index)
        total = part if total is None else total + part
    assert total is not None
    return total if terms is None else terms.finish(total)


# --- scale blocks of several columns -----------------------------------------------------


def column_blocks_spec(shape: tuple[int, int]) -> Any:
    """The BlockSpec of a whole ``(rows, columns)`` scale array of column blocks: one
    block, index (0, 0)."""
    from jax.experimental import pallas as pl  # noqa: PLC0415 - kernel-side only

    return pl.BlockSpec(tuple(shape), lambda i, j, k: (0, 0))


def widen(row: jax.Array, columns: int, bn: int, j: Any) -> jax.Array:
    """In the kernel: ``row`` (R, B) of one scale per block column (f32 or int32 bits), as
    the (R, bn) rows of output block ``j`` (dynamic) of ``bn`` columns: lane ``c`` takes
    block column ``(j * bn + c) // columns`` (0 past the last one). ``columns`` and
    ``bn``: multiples of 128."""
    r, b = row.shape
    width = math.gcd(bn, columns)
    lane = lax.broadcasted_iota(jnp.int32, (r, b), 1)
    zero = jnp.zeros((), row.dtype)
    pieces = []
    for s in range(bn // width):
        at = (j * bn + s * width) // columns
        col = jnp.sum(jnp.where(lane == at, row, zero), axis=1, keepdims=True)
        pieces.append(jnp.broadcast_to(col, (r, width)))
    return pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=1)


# --- zero points, offsets and two-level parts, one K step ---------------------------------


def _packed_code(rows: jax.Array, index: Any, bits: int) -> jax.Array:
    """Code ``index`` (dynamic) of codes packed along the rows (:func:`emulate.pack`'s bit
    stream, ``rows`` int32 byte values) as a (1, C) int32 row of unsigned codes."""
    if bits == 8:
        return qgroups.select_row(rows, index)
    bit = index * bits
    lo, hi = (
        qgroups.select_row(rows, bit // 8),
        qgroups.select_row(rows, bit // 8 + 1),
    )  # past the end: 0
    return ((lo | (hi << 8)) >> (bit % 8)) & ((1 << bits) - 1)


def _bytes(block: jax.Array) -> jax.Array:
    """A loaded 8-bit block as int32 byte values (0..255)."""
    return block.astype(jnp.int32) & 0xFF


def float_rows(block: jax.Array, fmt: str) -> jax.Array:
    """A loaded block of float32, bfloat16 or float16 values (float16 held as its uint16
    bits) as f32 values (exact)."""
    if fmt == "float32":
        return block
    if fmt == "bfloat16":
        return block.astype(jnp.float32)
    c = block.astype(jnp.int32) & 0xFFFF  # float16 as its uint16 bits
    bits = codecs.decode_float_bits(c, formats.get("float16"))
    return lax.bitcast_convert_type(bits, jnp.float32)


class GroupTerms:
    """In the kernel, one K step: the zero-point and offset terms of each group, and
    two-level scales.

    ``refs``: the kernel operands of :class:`emulate.pallas.qoffsets.AffineParts`
    (:attr:`~emulate.pallas.qoffsets.Affine.operands`' order); ``s_ref``: the scales'
    (two-level: their codes); ``exact``: whether partial sums are exact int32 sums (in
    quanta of ``2**-lhs_scale``); ``spread_refs``: a (1, C) int32 VMEM scratch per
    :attr:`~emulate.pallas.qoffsets.Affine.spreads`, filled at the output block's first K
    step (:func:`emulate.pallas.qgroups.spread_supers`)."""

    def __init__(
        self,
        refs: Any,
        s_ref: Any,
        spec: Affine,
        exact: bool,
        lhs_scale: int,
        spread_refs: Any = (),
        zero_in_codes: bool = False,
    ):
        self.spec = spec
        self.exact = exact
        self.lhs_scale = lhs_scale
        self.zero_in_codes = zero_in_codes  # the caller subtracts z from the codes
        refs = list(refs)
        self.zeros = _bytes(refs.pop(0)[...]) if spec.zero in ("array", "packed") else None
        self.offsets: Any = None
        if spec.offset == "array":
            self.offsets = float_rows(refs.pop(0)[...], spec.offset_format)
        elif spec.offset == "two_level":
            assert spec.offset_level is not None
            codes = _bytes(refs.pop(0)[...])
            supers = qgroups.super_rows(refs.pop(0)[...], spec.offset_level.super_format)
            self.offsets = (codes, supers)
        self.scales: Any = None
        if spec.scale_level is not None:
            supers = qgroups.super_rows(refs.pop(0)[...], spec.scale_level.super_format)
            self.scales = (_bytes(s_ref[...]), supers)
        self.spread: dict[str, Any] = {}  # super-blocks of columns: spread once a block
        refs_left = list(spread_refs)
        for name, lv, part in (
            ("offsets", spec.offset_level, self.offsets),
            ("scales", spec.scale_level, self.scales),
        ):
            if lv is not None and lv.cols > 1:
                ref = refs_left.pop(0)
                self.spread[name] = qgroups.block_spread(ref, part[1], lv, s_ref.shape[1])
        self.xsum: Any = None

    @property
    def two_level_scales(self) -> bool:
        return self.scales is not None

    def begin(self, xs: list[jax.Array], first: Any, count: int, rows: int) -> None:
        """Decode the K step's two-level parts for groups ``first .. first + count - 1``
        (:func:`emulate.pallas.qgroups.step_levels`) and, for two-level offsets, the group
        sums of the step's decoded x planes ``xs`` (``rows`` columns a group in each)."""
        s = self.spec
        if self.scales is not None:
            assert s.scale_level is not None
            codes, supers = self.scales
            self.step_scales = qgroups.step_levels(
                codes, supers, s.scale_level, first, count, spread=self.spread.get("scales")
            )
        if s.offset == "two_level":
            assert s.offset_level is not None
            codes, supers = self.offsets
            self.step_offsets = qgroups.step_levels(
                codes, supers, s.offset_level, first, count, spread=self.spread.get("offsets")
            )
            quantum = 2.0**-self.lhs_scale if self.exact else 1.0
            self.step_sums = qgroups.group_sums(xs, count, rows, quantum)

    def scale(self, q: int) -> tuple[jax.Array, None]:
        """The step's group ``q``'s two-level scale as
        :func:`emulate.pallas.qsteps.group_scale` gives a scale: a (1, C) f32 row (and
        None)."""
        return self.step_scales[q : q + 1], None

    def finish(self, total: jax.Array) -> jax.Array:
        """The step's sum plus its two-level offset term, ``X @ O`` (one dot)."""
        if self.spec.offset != "two_level":
            return total
        return total + qgroups.offset_term(self.step_sums, self.step_offsets)

    def zero_row(self, index: Any) -> Any:
        """Group ``index``'s zero points as a (1, C) int32 row, or an int."""
        s = self.spec
        if s.zero == "static":
            return s.zero_value
        assert self.zeros is not None
        if s.zero == "packed":
            v = _packed_code(self.zeros, index, formats.get(s.zero_format).bits)
        else:
            v = qgroups.select_row(self.zeros, index)
        if formats.get(s.zero_format).signed:
            half = 1 << (formats.get(s.zero_format).bits - 1)
            v = (v ^ half) - half
        return v

    def subtract_zero(self, part: jax.Array, xs: list[jax.Array], index: Any) -> jax.Array:
        """``part - z X`` for the group ``index``: ``xs``, its decoded x slices (one per
        column plane); ``part`` int32 (exact) or f32. Keeps ``X`` for :meth:`add_offset`."""
        if self.spec.zero == "none" and self.spec.offset in ("none", "two_level"):
            return part  # two-level offsets: group sums by the matrix unit (begin)
        total = None
        for x in xs:
            if jnp.issubdtype(x.dtype, jnp.integer):  # int8: summed in int32 (Mosaic
                # converts only 32-bit integers to float, and folds int8 -> int32 -> f32)
                t = jnp.sum(x.astype(jnp.int32), axis=1, keepdims=True)
            else:  # exact for the integers of an exact route
                t = jnp.sum(x.astype(jnp.float32), axis=1, keepdims=True)
            total = t if total is None else total + t
        assert total is not None
        self.xsum = total if total.dtype == jnp.float32 else total.astype(jnp.float32)
        if self.spec.zero == "none" or self.zero_in_codes:
            return part
        z = self.zero_row(index)
        if self.exact:
            return part - total.astype(jnp.int32) * z
        zf = jnp.float32(z) if isinstance(z, int) else z.astype(jnp.float32)
        return part - total * zf

    def add_offset(self, scaled: jax.Array, index: Any) -> jax.Array:
        """``scaled + X o`` for the group ``index`` (after its scale)."""
        s = self.spec
        if s.offset in ("none", "two_level"):  # two-level: once per step (finish)
            return scaled
        x = self.xsum
        if self.exact and self.lhs_scale:
            x = x * jnp.float32(2.0**-self.lhs_scale)
        if s.offset == "static":
            return scaled + x * jnp.float32(s.offset_value)
        assert self.offsets is not None
        return scaled + x * qgroups.select_row(self.offsets, index)
