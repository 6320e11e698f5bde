"""numba: a QArray weight's per-block factors (zero point, scale, offset), decoded once a
block, each compiled for one :class:`~emulate.cpu.form.Form` (constants, stored arrays,
two-level parts: no branch on the kind at run time).

The kernel's float32 ``consts`` (:data:`emulate.cpu.form.CONSTS`) hold the weight's
constant zero point (0) and offset (1), and each two-level part's zero point and offset
(2 to 5). Slots: 1 the zero points, 2 the scales (or a two-level
scale's codes), 3 a two-level scale's scales, 4 the offsets (or a two-level offset's
codes), 5 a two-level offset's scales. A two-level part's value is ``(v - zp) * scale +
offset``, each step rounded to float32 as ``dequantize`` rounds it (the product is fenced,
:func:`emulate.cpu.parts.rounded`: in a kernel compiled with fast-math flags, ``* scale +
offset`` became one fused multiply-add, one rounding).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numba
import numpy as np

from emulate.cpu.form import BFLOAT16, FLOAT16, SIGNED, UNSIGNED, Form, LevelSlots, Slot
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


def _level_value(level: LevelSlots) -> Callable:
    codes = reader(level.codes)
    scales = reader(level.scales) if level.scales is not None else _dummy_reader()
    bi, bj = level.block
    affine = _affine(level)

    @numba.njit(inline="always")
    def value(c, t, sc, st, zp, off, i, j):
        return affine(codes(c, t, i, j), zp, scales(sc, st, i // bi, j // bj), off)

    return value


def _factor(part: Slot | LevelSlots | str | None, zp_at: int, off_at: int) -> Callable:
    """An njit ``(consts, b0, t0, b1, t1, i, j) -> float32`` for one factor: a constant
    (``consts[off_at - 1]``: the weight's zero point or offset), a slot (``b0``), or a
    two-level part (codes ``b0``, scales ``b1``, constants at ``zp_at``, ``off_at``)."""
    if isinstance(part, LevelSlots):
        level = _level_value(part)

        @numba.njit(inline="always")
        def nested(consts, b0, t0, b1, t1, i, j):
            return level(b0, t0, b1, t1, consts[zp_at], consts[off_at], i, j)

        return nested
    if isinstance(part, Slot):
        slot = reader(part)

        @numba.njit(inline="always")
        def stored(consts, b0, t0, b1, t1, i, j):
            return slot(b0, t0, i, j)

        return stored
    const = off_at - 1 if part == "const" else -1

    @numba.njit(inline="always")
    def constant(consts, b0, t0, b1, t1, i, j):
        return consts[const] if const >= 0 else np.float32(0)

    return constant


@functools.cache
def factors(form: Form) -> Callable:
    """An njit ``(consts, s1, t1, ..., s5, t5, i, j) -> (z, s, o)``: block ``(i, j)``'s
    zero point, scale and offset, float32 (0, 1, 0 where absent)."""
    zp = _factor(form.zero_point, 0, 1)
    scale = _factor(form.scale, 2, 3)
    off = _factor(form.offset, 4, 5 if isinstance(form.offset, LevelSlots) else 2)
    has_scale = form.scale is not None

    @numba.njit(inline="always")
    def block(consts, s1, t1, s2, t2, s3, t3, s4, t4, s5, t5, i, j):
        z = zp(consts, s1, t1, s1, t1, i, j)
        s = np.float32(1)
        if has_scale:
            s = scale(consts, s2, t2, s3, t3, i, j)
        o = off(consts, s4, t4, s5, t5, i, j)
        return z, s, o

    return block


def _factor_row(part: Slot | LevelSlots | str | None, zp_at: int, off_at: int) -> Callable:
    """An njit ``(consts, b0, t0, b1, t1, i, out)``: :func:`_factor`'s value at ``(i, j)``
    for every ``j < len(out)`` (one row of the weight's grid), a two-level part's scale
    decoded once a run of blocks that share it (not once a block)."""
    if not isinstance(part, LevelSlots):
        one = _factor(part, zp_at, off_at)
        # float16 / bfloat16 factors stored along the row: LANES a step
        halves = isinstance(part, Slot) and part.kind in (FLOAT16, BFLOAT16)
        brain = int(isinstance(part, Slot) and part.kind == BFLOAT16)

        @numba.njit(inline="always")
        def each(consts, b0, t0, b1, t1, i, out):
            n, done = out.shape[0], 0
            if halves:
                row = b0[i]
                for c in range(n // LANES):
                    # numba binds the intrinsic's typing context: mypy counts it
                    half_values(out, row, np.uint64(c * LANES), brain)  # type: ignore[call-arg]
                done = (n // LANES) * LANES
            for j in range(done, n):
                out[j] = one(consts, b0, t0, b1, t1, i, j)

        return each
    codes = reader(part.codes)
    scales = reader(part.scales) if part.scales is not None else _dummy_reader()
    bi, bj = part.block
    has_scale = part.scales is not None
    affine = _affine(part)
    slot = part.codes
    # integer codes along the row (a bit stream, or whole bytes): LANES groups at a time
    bits, packed, signed, _ = slot.step
    vector = slot.kind in (UNSIGNED, SIGNED) and (
        slot.axis == 1 or (slot.axis == -1 and slot.width == 1)
    )
    step = LANES * slot.group  # codes a step

    @numba.njit(inline="always")
    def level(consts, b0, t0, b1, t1, i, out):
        zp, off = consts[zp_at], consts[off_at]
        n = out.shape[0]
        done = 0
        if vector:
            row = b0[i]
            for c in range(n // step):
                # numba binds the intrinsic's typing context: mypy counts it as an argument
                code_values(out, row, np.uint64(c * LANES), bits, packed, signed)  # type: ignore[call-arg]
            done = (n // step) * step
        for j in range(done, n):
            out[j] = codes(b0, t0, i, j)
        for u in range((n + bj - 1) // bj):
            sup = scales(b1, t1, i // bi, u) if has_scale else np.float32(1)
            for j in range(np.uint64(u * bj), np.uint64(min(n, (u + 1) * bj))):
                out[j] = affine(out[j], zp, sup, off)

    return level


def row_factors(form: Form) -> Callable:
    """An njit ``(consts, s1, t1, ..., s5, t5, i, zb, sb, ob)``: the factors of every block
    of row ``i`` of the weight's grid (layout ROWS) into ``zb``, ``sb``, ``ob``: as
    :func:`factors` gives them, a row at a time."""
    zp = _factor_row(form.zero_point, 0, 1)
    scale = _factor_row(form.scale, 2, 3)
    off = _factor_row(form.offset, 4, 5 if isinstance(form.offset, LevelSlots) else 2)
    has_scale = form.scale is not None

    @numba.njit(inline="always")
    def row(consts, s1, t1, s2, t2, s3, t3, s4, t4, s5, t5, i, zb, sb, ob):
        zp(consts, s1, t1, s1, t1, i, zb)
        if has_scale:
            scale(consts, s2, t2, s3, t3, i, sb)
        else:
            sb[:] = 1
        off(consts, s4, t4, s5, t5, i, ob)

    return row
