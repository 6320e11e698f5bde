"""numba: a QArray weight's per-block factors (zero point, scale, offset), decoded once a
block, each compiled for one :class:`~emulate.cpu.form.Form` (constants, stored arrays,
two-level parts: no branch on the kind at run time).

Each factor is read from its :class:`~emulate.cpu.operands.Factor` record: a constant
factor is its ``constant``; a stored one is read from ``stored``; a two-level part's value
is ``(v - zero_point) * scale + constant`` of its code ``v`` (``stored``) and its scale
(``scales``), each step rounded to float32 as ``dequantize`` rounds it (the product is
fenced, :func:`emulate.cpu.parts.rounded`: in a kernel compiled with fast-math flags,
``* scale + offset`` became one fused multiply-add, one rounding).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numba
import numpy as np

from emulate.cpu.form import ConstantFactor, FactorForm, Form, Kind, LevelSlots, Slot
from emulate.cpu.lanes import LANES, code_values, half_values
from emulate.cpu.parts import flushed, frexp32, pow2, reader, rounded, subnormal

__all__ = ["LIMIT", "combined_scale", "factors", "ordinary", "row_factors", "scale_parts"]

#: Factors (scales, offsets, zero points) of at least this magnitude, Inf and NaN leave the
#: kernel's arithmetic, which multiplies a block's sum by its scale: there each element's
#: dequantized value is multiplied and summed instead (:mod:`emulate.cpu.dequantized`),
#: so that NaN and Inf come out as the dequantized product gives them (``0 * Inf`` is NaN
#: in the product where a block sum would hide it).
LIMIT = np.float32(2.0**100)


def _dummy_reader() -> Callable:
    @numba.njit(inline="always")
    def value(data, table, i, j):
        return np.float32(0)

    return value


def _affine(level: LevelSlots) -> Callable:
    """An njit ``(v, zp, scale, offset) -> float32``: a two-level part's value of code value
    ``v``, ``(v - zp) * scale + offset``, each step rounded to float32 as ``dequantize``
    rounds it (the product fenced: :func:`emulate.cpu.parts.rounded`)."""
    has_zp, has_off, has_scale = level.zero_point, level.offset, level.scales is not None

    @numba.njit(inline="always")
    def value(v, zp, scale, off):
        if has_zp:
            v = np.float32(v - zp)
        if has_scale:
            v = rounded(np.float32(v * scale))
        if has_off:
            v = np.float32(v + off)
        return v

    return value


def _factor(form: FactorForm) -> Callable:
    """An njit ``(f, i, j) -> float32``: factor ``f`` (a :class:`~emulate.cpu.operands.Factor`
    of form ``form``) at block ``(i, j)`` (0 where absent)."""
    if isinstance(form, LevelSlots):
        codes = reader(form.codes)
        scales = reader(form.scales) if form.scales is not None else _dummy_reader()
        bi, bj = form.block
        affine = _affine(form)

        @numba.njit
        def nested(f, i, j):
            v = codes(f.stored.data, f.stored.table, i, j)
            s = scales(f.level_scales.data, f.level_scales.table, i // bi, j // bj)
            return affine(v, f.zero_point, s, f.constant)

        return nested
    if isinstance(form, Slot):
        slot = reader(form)

        @numba.njit(inline="always")
        def stored(f, i, j):
            return slot(f.stored.data, f.stored.table, i, j)

        return stored
    is_constant = isinstance(form, ConstantFactor)

    @numba.njit(inline="always")
    def constant(f, i, j):
        return f.constant if is_constant else np.float32(0)

    return constant


@functools.cache
def factors(form: Form) -> Callable:
    """An njit ``(weight, i, j) -> (z, s, o)``: block ``(i, j)``'s zero point, scale and
    offset of ``weight`` (a :class:`~emulate.cpu.operands.Weight`), float32 (0, 1, 0 where
    absent)."""
    zero_point, scale, offset = _factor(form.zero_point), _factor(form.scale), _factor(form.offset)
    has_scale = form.scale is not None
    combine = combined_scale(form)

    @numba.njit
    def block(weight, i, j):
        z = zero_point(weight.zero_point, i, j)
        s = np.float32(1)
        if has_scale:
            s = combine(scale(weight.scale, i, j), weight.tensor)
        o = offset(weight.offset, i, j)
        return z, s, o

    return block


def _scaled(form: Form) -> bool:
    return form.tensor or form.exponent != 0


def combined_scale(form: Form) -> Callable:
    """An njit ``(s, t) -> float32``: block scale ``s`` times tensor scale ``t`` times
    ``2**element_exponent`` as ``dequantize`` forms it (``s``'s and ``t``'s mantissas
    multiplied and rounded once, exponents added), where that is a normal float32 below
    :data:`LIMIT` (exact); else Inf or NaN, which send the block to the dequantized path.
    ``s`` itself where the form has neither a tensor scale nor an element exponent."""
    scaled, ee = _scaled(form), form.exponent

    @numba.njit(inline="always")
    def combine(s, t):
        if not scaled:
            return s
        ms, es = frexp32(s)
        mt, et = frexp32(t)
        m = rounded(np.float32(ms * mt))
        e = es + et + ee
        if m == 0 or not np.isfinite(m):
            return m
        if e < -126 or e > 99:
            return np.float32(np.inf)
        return np.float32(m * pow2(e))

    return combine


def scale_parts(form: Form) -> Callable:
    """An njit ``(weight, i, j) -> (m, p1, p2)``: block ``(i, j)``'s scale as ``dequantize``
    applies it, ``m * p1 * p2`` (:func:`emulate.quantized.values.block_factors`: the
    mantissa of the scale times the tensor scale's, and two normal powers of two)."""
    scale = _factor(form.scale)
    has_scale, scaled, ee = form.scale is not None, _scaled(form), form.exponent
    flush = isinstance(form.scale, LevelSlots)  # dequantize flushes a two-level scale first

    @numba.njit
    def parts(weight, i, j):
        s = scale(weight.scale, i, j) if has_scale else np.float32(1)
        if flush:
            s = flushed(s)
        m, e = frexp32(s)
        if scaled:
            mt, et = frexp32(weight.tensor)
            m = rounded(np.float32(m * mt))
            e = 0 if not np.isfinite(m) else e + et + ee
        e = max(e, -252)
        return m, pow2(e // 2), pow2(e - e // 2)

    return parts


@numba.njit(inline="always")
def ordinary(v: np.float32) -> bool:
    """Whether a factor stays in the kernel's arithmetic: finite, below :data:`LIMIT`, and
    not subnormal (the kernel runs with denormal inputs read as zero: a block's sum times a
    scale of 2**-127, e8m0's least, would be 0 where the dequantized values are normal)."""
    return bool(abs(v) < LIMIT) & (not subnormal(v))


def _halves_row(form: Slot | ConstantFactor | None) -> Callable:
    """An njit ``(f, i, out)``: :func:`_factor`'s value at ``(i, j)`` for every ``j <
    len(out)``, float16 / bfloat16 factors stored along the row :data:`LANES` a step."""
    one = _factor(form)
    halves = isinstance(form, Slot) and form.kind in (Kind.FLOAT16, Kind.BFLOAT16)
    brain = int(isinstance(form, Slot) and form.kind == Kind.BFLOAT16)

    @numba.njit
    def each(f, i, out):
        n, done = out.shape[0], 0
        if halves:
            row = f.stored.data[i]
            for c in range(n // LANES):
                # numba binds the intrinsic's typing context: mypy counts it
                half_values(out, row, np.uint64(c * LANES), brain)  # type: ignore[call-arg]
            done = (n // LANES) * LANES
        for j in range(done, n):
            out[j] = one(f, i, j)

    return each


def _level_row(form: LevelSlots) -> Callable:
    """An njit ``(f, i, out)``: a two-level part's value at ``(i, j)`` for every ``j <
    len(out)``, its scale decoded once a run of blocks that share it (not once a block),
    integer codes along the row (a bit stream, or whole bytes) :data:`LANES` groups a
    step."""
    codes = reader(form.codes)
    scales = reader(form.scales) if form.scales is not None else _dummy_reader()
    bi, bj = form.block
    has_scale = form.scales is not None
    affine = _affine(form)
    slot = form.codes
    bits, packed, signed, _ = slot.step
    vector = slot.kind in (Kind.UNSIGNED, Kind.SIGNED) and (
        slot.axis == 1 or (slot.axis == -1 and slot.width == 1)
    )
    step = LANES * slot.group  # codes a step

    @numba.njit
    def level(f, i, out):
        n = out.shape[0]
        done = 0
        if vector:
            row, table = f.stored.data[i], f.stored.table
            for c in range(n // step):
                at, g0 = np.uint64(c * step), np.uint64(c * LANES)
                # numba binds the intrinsic's typing context: mypy counts it as an argument
                code_values(out, at, row, table, g0, bits, packed, signed, 0)  # type: ignore[call-arg]
            done = (n // step) * step
        for j in range(done, n):
            out[j] = codes(f.stored.data, f.stored.table, i, j)
        for u in range((n + bj - 1) // bj):
            sup = (
                scales(f.level_scales.data, f.level_scales.table, i // bi, u)
                if has_scale
                else np.float32(1)
            )
            for j in range(np.uint64(u * bj), np.uint64(min(n, (u + 1) * bj))):
                out[j] = affine(out[j], f.zero_point, sup, f.constant)

    return level


def _factor_row(form: FactorForm) -> Callable:
    """An njit ``(f, i, out)``: :func:`_factor`'s value at ``(i, j)`` for every ``j <
    len(out)`` (one row of the weight's grid)."""
    return _level_row(form) if isinstance(form, LevelSlots) else _halves_row(form)


def row_factors(form: Form) -> Callable:
    """An njit ``(weight, i, zb, sb, ob) -> bool``: the factors of every block of row ``i``
    of the weight's grid (layout ROWS) into ``zb``, ``sb``, ``ob``: as :func:`factors`
    gives them, a row at a time; whether they are all :func:`ordinary`."""
    zero_point = _factor_row(form.zero_point)
    scale = _factor_row(form.scale)
    offset = _factor_row(form.offset)
    has_scale, scaled = form.scale is not None, _scaled(form)
    combine = combined_scale(form)

    @numba.njit
    def row(weight, i, zb, sb, ob):
        zero_point(weight.zero_point, i, zb)
        if has_scale:
            scale(weight.scale, i, sb)
            if scaled:
                for j in range(sb.shape[0]):
                    sb[j] = combine(sb[j], weight.tensor)
        else:
            sb[:] = 1
        offset(weight.offset, i, ob)
        fine = True
        for j in range(sb.shape[0]):
            fine &= ordinary(zb[j]) & ordinary(sb[j]) & ordinary(ob[j])
        return bool(fine)

    return row
