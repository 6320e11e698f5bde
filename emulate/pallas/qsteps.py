"""The in-kernel arithmetic of a QArray weight's scales in :func:`emulate.pallas.matmul`:
scale blocks decoded to f32 factors (float8 and e8m0 from their bits), a K step of group
scales (each group's partial sum times its scale, with the zero-point and offset terms of
:mod:`emulate.pallas.qoffsets`; NVFP4's row-scaled tile and one dot), and the store's
scaling of the result. What is built and the bounds: :mod:`emulate.pallas.qweight`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from emulate import formats
from emulate.numerics import codecs
from emulate.numerics.bits import frexp, frexp_bits, pow2_normal, times_pow2
from emulate.numerics.scales import scale_frexp
from emulate.pallas import qblocks, qgroups, qoffsets, route
from emulate.pallas.qweight import Scaling

__all__ = [
    "group_scale",
    "group_scaled_step",
    "rows_scaled",
    "scale_rows",
    "scaled_result",
    "store_factors",
    "tensor_parts",
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
    block's (1, bn) rows (:func:`emulate.pallas.qblocks.widen`). float32 and bfloat16
    scales (``cfg.scaling.scale_format``; held as bits) become two normal f32 factors
    ``(m * 2**(e - e//2), 2**(e//2))``: subnormal scales keep their value, a partial sum
    times the first rounds once as times ``m``, the second is exact unless the result is
    below 2**-126 (flushed there as in :func:`emulate.dot_general`)."""
    lo = qgroups.select_row(parts[0], index)
    hi = None if parts[1] is None else qgroups.select_row(parts[1], index)
    if cfg.scaling.columns:
        from jax.experimental import pallas as pl  # noqa: PLC0415 - kernel-side only

        j, cols = pl.program_id(1), cfg.scaling.columns
        lo = qblocks.widen(lo, cols, cfg.bn, j)
        hi = None if hi is None else qblocks.widen(hi, cols, cfg.bn, j)
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
        if cfg.route.scale:
            acc = acc * jnp.float32(2.0**-cfg.route.scale)
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
    sc, r = cfg.scaling, cfg.route
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
        d = route.float_dot(xt, ws, cfg.route.precision)
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
    with zero points and offsets (``aff_refs``), their terms (:mod:`.qoffsets`); where
    :func:`rows_scaled`, the tile's rows times their scales and one dot (``spread_refs``:
    :class:`emulate.pallas.qoffsets.GroupTerms`')."""
    r = cfg.route
    sc = cfg.scaling
    assert sc is not None
    if rows_scaled(cfg):
        return _row_scaled_step(tiles, scale_rows(s_ref[...], sc.scale_format), cfg, k)
    terms = None
    if sc.affine is not None:
        zero = zero_in_codes(sc.affine, r)
        terms = qoffsets.GroupTerms(
            aff_refs, s_ref, sc.affine, r.exact, r.lhs_scale, spread_refs, zero
        )
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
            d = route.exact_dot(xs, ws, r) if r.exact else route.float_dot(xs, ws, r.precision)
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
