"""numba: ``y = x W`` for many rows of ``x`` (more than :data:`emulate.cpu.route.MAX_ROWS`):
the weight decoded once per call, a block of :data:`KC` values of K and a tile of N at a
time, into a float32 panel (the values ``dequantize`` gives: ``(v - z) * s + o``, each
step rounded to float32), which the micro-kernels of :mod:`emulate.cpu.tiles` multiply
with ``x`` into ``y``. No full-size temporary: one panel a task (at most 128 KiB).

Orientation COLUMNS (codes ``(K, N)``): the panel holds strips of 16 columns, ``KC`` rows each
(:func:`emulate.cpu.lanes.column_values` decodes 16 columns of a row of codes), and
:func:`emulate.cpu.tiles.broadcast_tile` multiplies 6 rows of ``x`` with a strip. Orientation
ROWS (codes ``(N, K)``): the panel holds :data:`ROWS_A_TILE` rows of the weight, ``KC``
values each (:func:`emulate.cpu.lanes.code_values`), and
:func:`emulate.cpu.tiles.dot_tile` multiplies 3 rows of ``x`` with 4 of the panel. Blocks
whose factors are not :func:`~emulate.cpu.factors.ordinary` take each element's value as
:mod:`emulate.cpu.dequantized` computes it.

Numerics: ``y`` is the float32 product of ``x`` and the dequantized weight, each element
a sum in an order fixed by the code (:mod:`emulate.cpu.tiles`): within ``gamma_K sum |x
W|`` of the exact product with the dequantized values, and NaN and Inf as the dequantized
product gives them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numba
import numpy as np
from numba import prange

from emulate.cpu import dequantized
from emulate.cpu.factors import factors, ordinary, row_factors, scale_parts
from emulate.cpu.form import Form, Orientation
from emulate.cpu.lanes import LANES, code_values, column_values
from emulate.cpu.parts import flat, reader, rounded, unflat
from emulate.cpu.tiles import broadcast_tile, dot_tile

__all__ = ["KC", "ROWS_A_TILE", "STRIPS", "kernel"]

#: Values of K a panel holds.
KC = 256
#: Strips of 16 columns a task of layout COLUMNS decodes (128 columns).
STRIPS = 8
#: Rows of the weight a task of layout ROWS decodes.
ROWS_A_TILE = 64
_STRIP = 16


def _value(form: Form) -> Callable:
    """An njit ``(weight, i, j, k, n) -> float32``: element ``(k, n)`` of the stored codes
    (``(i, j)`` its block) as :mod:`emulate.cpu.dequantized` computes it."""
    code, block, parts = reader(form.codes), factors(form), scale_parts(form)
    value = dequantized.value(form)

    @numba.njit(inline="always")
    def element(weight, i, j, r, c):
        z, _, o = block(weight, i, j)
        m, p1, p2 = parts(weight, i, j)
        return value(code(weight.codes.data, weight.codes.table, r, c), z, m, p1, p2, o)

    return element


@numba.njit(inline="always")
def _broadcast_rows(c, a, b, kc):
    """:func:`emulate.cpu.tiles.broadcast_tile` for ``c.shape[0]`` (1 to 6) rows of 16."""
    rows = c.shape[0]
    if rows == 6:
        broadcast_tile(c, a, b, kc, 6, 2)
    elif rows == 5:
        broadcast_tile(c, a, b, kc, 5, 2)
    elif rows == 4:
        broadcast_tile(c, a, b, kc, 4, 2)
    elif rows == 3:
        broadcast_tile(c, a, b, kc, 3, 2)
    elif rows == 2:
        broadcast_tile(c, a, b, kc, 2, 2)
    else:
        broadcast_tile(c, a, b, kc, 1, 2)


def _columns_panel(form: Form) -> Callable:
    """An njit ``(weight, k0, k1, n0, strips, panel, vals, z, s, o, fine)``: the decoded
    weight at rows ``[k0, k1)`` and columns ``[n0, n0 + 16 strips)`` into ``panel``
    (strip after strip, each ``KC`` rows of 16)."""
    bits, packed, signed, lookup = form.codes.step
    g = form.codes.group
    bk, bn = form.block
    block, element = factors(form), _value(form)
    has_offset = form.offset is not None

    @numba.njit
    def panel_of(weight, k0, k1, n0, strips, panel, vals, z, s, o, fine):
        codes, table = weight.codes.data, weight.codes.table
        for strip in range(strips):
            n = n0 + strip * _STRIP
            out = panel[strip * KC * _STRIP :]
            b_now = -1
            for r in range(k0 // g, (k1 + g - 1) // g):
                b = (r * g) // bk
                if b != b_now:
                    b_now = b
                    for t in range(_STRIP):
                        z[t], s[t], o[t] = block(weight, b, (n + t) // bn)
                        fine[t] = ordinary(z[t]) & ordinary(s[t]) & ordinary(o[t])
                column_values(vals, codes[r], table, np.uint64(n), z, bits, packed, signed, lookup)
                for q in range(g):
                    k = r * g + q
                    if k >= k1:
                        break
                    row = out[(k - k0) * _STRIP :]
                    for t in range(_STRIP):
                        w = rounded(np.float32(vals[q * LANES + t] * s[t]))
                        row[t] = np.float32(w + o[t]) if has_offset else w
                    for t in range(_STRIP):
                        if not fine[t]:
                            row[t] = element(weight, b, (n + t) // bn, k, n + t)

    return panel_of


def _columns_kernel(form: Form, parallel: bool) -> Callable:
    panel_of = _columns_panel(form)
    g = form.codes.group

    @numba.njit(parallel=parallel)
    def columns(x, xe, xsum, weight, out):
        m_rows, k = x.shape
        n = out.shape[1]
        tile = STRIPS * _STRIP
        parts = flat(weight)
        for task in prange((n + tile - 1) // tile):
            weight = unflat(parts)
            n0 = task * tile
            strips = (min(n, n0 + tile) - n0) // _STRIP
            panel = np.empty(STRIPS * KC * _STRIP, np.float32)
            vals = np.empty(g * LANES, np.float32)
            z = np.empty(_STRIP, np.float32)
            s = np.empty(_STRIP, np.float32)
            o = np.empty(_STRIP, np.float32)
            fine = np.empty(_STRIP, np.bool_)
            out[:, n0 : n0 + strips * _STRIP] = 0
            for k0 in range(0, k, KC):
                k1 = min(k, k0 + KC)
                kc = np.uint64(k1 - k0)
                panel_of(weight, k0, k1, n0, strips, panel, vals, z, s, o, fine)
                for m0 in range(0, m_rows, 6):
                    m1 = min(m_rows, m0 + 6)
                    a = x[m0:m1, k0:k1]
                    for strip in range(strips):
                        c0 = n0 + strip * _STRIP
                        b = panel[strip * KC * _STRIP :]
                        _broadcast_rows(out[m0:m1, c0 : c0 + _STRIP], a, b, kc)

    return columns


def _dot_cols(rows: int) -> Callable:
    """An njit :func:`emulate.cpu.tiles.dot_tile` for ``rows`` rows and ``c.shape[1]``
    (1 to 4) columns."""

    @numba.njit(inline="always")
    def tile(c, a, b, kc):
        cols = c.shape[1]
        if cols == 4:
            dot_tile(c, a, b, kc, rows, 4)
        elif cols == 3:
            dot_tile(c, a, b, kc, rows, 3)
        elif cols == 2:
            dot_tile(c, a, b, kc, rows, 2)
        else:
            dot_tile(c, a, b, kc, rows, 1)

    return tile


_DOT1, _DOT2, _DOT3 = (_dot_cols(r) for r in (1, 2, 3))


@numba.njit(inline="always")
def _dot_tile(c, a, b, kc):
    """:func:`emulate.cpu.tiles.dot_tile` for ``c``'s shape (1 to 3 rows, 1 to 4 cols)."""
    rows = c.shape[0]
    if rows == 3:
        _DOT3(c, a, b, kc)
    elif rows == 2:
        _DOT2(c, a, b, kc)
    else:
        _DOT1(c, a, b, kc)


def _rows_panel(form: Form) -> Callable:
    """An njit ``(weight, k0, k1, r, zb, sb, ob, fine, out)``: row ``r`` of the decoded
    weight at ``[k0, k1)`` into ``out`` (its factors ``zb``, ``sb``, ``ob`` and whether
    they are all ordinary, ``fine``, from :func:`emulate.cpu.factors.row_factors`)."""
    bits, packed, signed, lookup = form.codes.step
    g = form.codes.group
    step = LANES * g
    bn, bk = form.block
    code, element = reader(form.codes), _value(form)
    has_zp, has_offset = form.zero_point is not None, form.offset is not None

    @numba.njit
    def panel_row(weight, k0, k1, r, zb, sb, ob, fine, out):
        codes, table = weight.codes.data, weight.codes.table
        if not fine:
            for k in range(k0, k1):
                out[k - k0] = element(weight, r // bn, k // bk, r, k)
            return
        row = codes[r]
        whole = (k1 - k0) // step
        for c in range(whole):
            at, g0 = np.uint64(c * step), np.uint64(k0 // g + c * LANES)
            code_values(out, at, row, table, g0, bits, packed, signed, lookup)
        for k in range(k0 + whole * step, k1):
            out[k - k0] = code(codes, table, r, k)
        for b in range(k0 // bk, (k1 + bk - 1) // bk):
            z, s, o = zb[b], sb[b], ob[b]
            for k in range(max(k0, b * bk), min(k1, (b + 1) * bk)):
                v = out[k - k0]
                if has_zp:
                    v = np.float32(v - z)
                v = rounded(np.float32(v * s))
                out[k - k0] = np.float32(v + o) if has_offset else v

    return panel_row


def _rows_kernel(form: Form, parallel: bool) -> Callable:
    panel_row, fill_factors = _rows_panel(form), row_factors(form)
    bn, bk = form.block

    @numba.njit(parallel=parallel)
    def rows(x, xe, xsum, weight, out):
        m_rows, k = x.shape
        n = out.shape[1]
        nb = (k + bk - 1) // bk
        parts = flat(weight)
        for task in prange((n + ROWS_A_TILE - 1) // ROWS_A_TILE):
            weight = unflat(parts)
            n0 = task * ROWS_A_TILE
            nt = min(n, n0 + ROWS_A_TILE) - n0
            zb = np.empty((ROWS_A_TILE, nb), np.float32)
            sb = np.empty((ROWS_A_TILE, nb), np.float32)
            ob = np.empty((ROWS_A_TILE, nb), np.float32)
            fine = np.empty(ROWS_A_TILE, np.bool_)
            panel = np.empty((ROWS_A_TILE, KC), np.float32)
            for i in range(nt):
                fine[i] = fill_factors(weight, (n0 + i) // bn, zb[i], sb[i], ob[i])
            out[:, n0 : n0 + nt] = 0
            for k0 in range(0, k, KC):
                k1 = min(k, k0 + KC)
                kc = np.uint64(k1 - k0)
                for i in range(nt):
                    panel_row(weight, k0, k1, n0 + i, zb[i], sb[i], ob[i], fine[i], panel[i])
                for m0 in range(0, m_rows, 3):
                    m1 = min(m_rows, m0 + 3)
                    a = x[m0:m1, k0:k1]
                    for j0 in range(0, nt, 4):
                        j1 = min(nt, j0 + 4)
                        _dot_tile(out[m0:m1, n0 + j0 : n0 + j1], a, panel[j0:j1], kc)

    return rows


@functools.cache
def kernel(form: Form, parallel: bool) -> Callable:
    """The njit many-rows kernel of ``form``: the arguments of
    :func:`emulate.cpu.gemv.kernel` (``xe`` and ``xsum`` unused), any number of rows."""
    run = _columns_kernel if form.orientation == Orientation.COLUMNS else _rows_kernel
    return run(form, parallel)
