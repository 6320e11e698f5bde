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
from emulate.cpu.parts import reader, rounded

__all__ = ["factors", "row_factors"]


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

        @numba.njit(inline="always")
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

    @numba.njit(inline="always")
    def block(weight, i, j):
        z = zero_point(weight.zero_point, i, j)
        s = np.float32(1)
        if has_scale:
            s = scale(weight.scale, i, j)
        o = offset(weight.offset, i, j)
        return z, s, o

    return block


def _halves_row(form: Slot | ConstantFactor | None) -> Callable:
    """An njit ``(f, i, out)``: :func:`_factor`'s value at ``(i, j)`` for every ``j <
    len(out)``, float16 / bfloat16 factors stored along the row :data:`LANES` a step."""
    one = _factor(form)
    halves = isinstance(form, Slot) and form.kind in (Kind.FLOAT16, Kind.BFLOAT16)
    brain = int(isinstance(form, Slot) and form.kind == Kind.BFLOAT16)

    @numba.njit(inline="always")
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

    @numba.njit(inline="always")
    def level(f, i, out):
        n = out.shape[0]
        done = 0
        if vector:
            row = f.stored.data[i]
            for c in range(n // step):
                # numba binds the intrinsic's typing context: mypy counts it as an argument
                code_values(out, row, np.uint64(c * LANES), bits, packed, signed)  # type: ignore[call-arg]
            done = (n // step) * step
        for j in range(done, n):
            out[j] = codes(f.stored.data, f.stored.table, i, j)
        for u in range((n + bj - 1) // bj):
            sup = np.float32(1)
            if has_scale:
                sup = scales(f.level_scales.data, f.level_scales.table, i // bi, u)
            for j in range(np.uint64(u * bj), np.uint64(min(n, (u + 1) * bj))):
                out[j] = affine(out[j], f.zero_point, sup, f.constant)

    return level


def _factor_row(form: FactorForm) -> Callable:
    """An njit ``(f, i, out)``: :func:`_factor`'s value at ``(i, j)`` for every ``j <
    len(out)`` (one row of the weight's grid)."""
    return _level_row(form) if isinstance(form, LevelSlots) else _halves_row(form)


def row_factors(form: Form) -> Callable:
    """An njit ``(weight, i, zb, sb, ob)``: the factors of every block of row ``i`` of the
    weight's grid (layout ROWS) into ``zb``, ``sb``, ``ob``: as :func:`factors` gives them,
    a row at a time."""
    zero_point = _factor_row(form.zero_point)
    scale = _factor_row(form.scale)
    offset = _factor_row(form.offset)
    has_scale = form.scale is not None

    @numba.njit(inline="always")
    def row(weight, i, zb, sb, ob):
        zero_point(weight.zero_point, i, zb)
        if has_scale:
            scale(weight.scale, i, sb)
        else:
            sb[:] = 1
        offset(weight.offset, i, ob)

    return row
