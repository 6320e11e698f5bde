"""numba: ``y = x W`` for a few rows of ``x`` and a QArray ``W`` kept as stored, one
kernel compiled per :class:`emulate.cpu.form.Form` (:func:`kernel`; XLA calls it through
:mod:`emulate.cpu.handler`). docs/cpu_kernel.md tells how a form becomes code.

Every block of the weight is decoded once per call, for all rows of ``x`` at once.

Orientation ROWS (a dot product along each stored row): 16 groups of codes a step in LLVM
vector IR (:mod:`emulate.cpu.lanes`: ``s x (v - z)`` summed a group at a time into 16
lanes per row of ``x``, one sum of the lanes a row); codes that fit no step (a last,
shorter block, blocks of other sizes, other widths) one at a time, ``sum x (v - z)`` a
block times its scale. Orientation COLUMNS: per block of K, ``sum x (v - z)`` into a row of
block sums per row of ``x``, each scaled once (64 columns a step: with one row of ``x``
the codes are decoded into registers next to the dot; with more, a pass of rows of codes
is decoded once into the stack and each row of ``x`` reads it). The block's factors are
decoded once (:mod:`emulate.cpu.factors`); where the weight has offsets, ``offset *
sum(x_k)`` over the block is added apart (``xsum``, summed once per call). Blocks whose
factors are NaN, infinite, huge or subnormal (:func:`emulate.cpu.factors.ordinary`) are
computed as the dequantized product instead (:mod:`emulate.cpu.dequantized`).

Numerics: a result element is a float32 sum of products ``x (v - z)``, a group's or a
block's sum scaled once: the segment route of docs/numerics.md ("Block-scaled operands"),
within its bound ``gamma_(K + S + 5) * sum |x| (|W| + |o|)``; the products are exact for
bfloat16 ``x`` and integer ``value - z`` (one rounding for float32 ``x``). No fast-math
flags: every row's operations and their order are fixed by the code (a multiply-add is
fused where the host has FMA, the same on every path), so a row's bits do not depend on
the other rows of its batch, nor on the threads. NaN and Inf propagate.

The numba loops run with unsigned indices (numba's signed ones keep LLVM from vectorizing
them).

Rows of ``N`` (layout ROWS) or chunks of :data:`COLUMN_CHUNK` columns (layout COLUMNS) are
spread over numba's threads where its threading layer is thread-safe
(:func:`emulate.cpu.parallel`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numba
import numpy as np
from numba import prange

from emulate import moved
from emulate.cpu import dequantized
from emulate.cpu.factors import factors, ordinary, row_factors
from emulate.cpu.form import Form, Kind, Orientation, vector_step
from emulate.cpu.lanes import LANES, column_dot, column_lanes, column_values, group_lanes
from emulate.cpu.parts import flat, reader, stack_floats, unflat
from emulate.cpu.route import MAX_ROWS  # the sums of that many rows of x live on the stack

__all__ = ["COLUMN_CHUNK", "ROW_CHUNK", "kernel"]

ROW_CHUNK = 16
COLUMN_CHUNK = 256
#: Rows of codes a pass of the column steps reads before the next 64 columns: few enough
#: that rows a power-of-two bytes apart (N = 4096: 2 KiB or 4 KiB) do not evict each other
#: from the L1 cache's ways (measured at 1 x 4096 x 4096 / 14336, 2 threads: 16 rows
#: 0.83 / 2.42 ms for compressed-tensors int4, against 1.68 / 2.99 ms for a whole block).
ROWS_A_PASS = 16
_ROW_LANES = MAX_ROWS * LANES
_CHUNK_ROWS = MAX_ROWS * COLUMN_CHUNK


def _byte_codes(form: Form) -> tuple[bool, Callable]:
    """Whether the codes are integers one a byte, read straight from their row (the
    generic reader's 2-D index ran 2.4-4x slower), and the njit ``c -> float32`` of such a
    code ``c`` held as a float32."""
    codes = form.codes
    one_a_byte = codes.axis == -1 and codes.kind != Kind.TABLE  # table codes: their values
    return one_a_byte, _float_code(codes.kind, codes.bits)


def _float_code(kind: Kind, bits: int) -> Callable:
    """An njit ``c -> float32`` for an integer code ``c`` held as a float32."""
    full = np.float32(1 << bits)
    inv_half = np.float32(2.0 ** (1 - bits))
    signed = kind == Kind.SIGNED

    @numba.njit(inline="always")
    def value(c):
        if signed:
            return c - full * np.floor(c * inv_half)
        return c

    return value


def _column_lanes(form: Form, scalar: Callable) -> Callable:
    """``NIBBLES`` and ``BYTES`` columns: 64 columns a step, four vectors of
    :data:`LANES` kept in registers over :data:`ROWS_A_PASS` rows of codes: one row of
    ``x`` decodes next to its dot (:func:`emulate.cpu.lanes.column_lanes`), more rows
    decode the pass once into the stack (:func:`emulate.cpu.lanes.column_values`) and each
    row of ``x`` reads it (:func:`emulate.cpu.lanes.column_dot`: the same arithmetic); the
    columns after the last whole step through ``scalar`` (the element loop)."""
    bits, packed, signed, lookup = form.codes.step
    g = form.codes.group
    has_zp = form.zero_point is not None
    panel_row = 4 * g * LANES  # floats of one row of codes' 64 columns
    panel_floats = ROWS_A_PASS * panel_row

    @numba.njit(inline="always")
    def step(lanes, row, table, at, x, kr, z):
        column_lanes(lanes, row, table, at, x, kr, z, bits, packed, signed, lookup)

    @numba.njit(inline="always")
    def decode(out, row, table, at, z):
        column_values(out, row, table, at, z, bits, packed, signed, lookup)

    @numba.njit(inline="always")
    def columns(x, stored, k0, k1, n0, w, zrow, blk):
        codes, table = stored.data, stored.table
        m_rows = x.shape[0]
        wide = 4 * LANES
        steps = w // wide
        first, last = np.uint64(k0 // g), np.uint64(k1 // g)
        panel = numba.carray(stack_floats(panel_floats), (panel_floats,), np.float32)
        for r0 in range(first, last, np.uint64(ROWS_A_PASS)):
            r1 = min(last, r0 + np.uint64(ROWS_A_PASS))
            for c in range(steps):
                at, o = np.uint64(n0 + c * wide), c * wide
                z0 = zrow[o:] if has_zp else np.float32(0)
                z1 = zrow[o + LANES :] if has_zp else np.float32(0)
                z2 = zrow[o + 2 * LANES :] if has_zp else np.float32(0)
                z3 = zrow[o + 3 * LANES :] if has_zp else np.float32(0)
                if m_rows == 1:
                    b0, b1, b2, b3 = (
                        blk[0, o:],
                        blk[0, o + LANES :],
                        blk[0, o + 2 * LANES :],
                        blk[0, o + 3 * LANES :],
                    )
                    xm = x[0]
                    for r in range(r0, r1):
                        row, kr = codes[r], r * np.uint64(g)
                        step(b0, row, table, at, xm, kr, z0)
                        step(b1, row, table, at + np.uint64(LANES), xm, kr, z1)
                        step(b2, row, table, at + np.uint64(2 * LANES), xm, kr, z2)
                        step(b3, row, table, at + np.uint64(3 * LANES), xm, kr, z3)
                    continue
                for r in range(r0, r1):
                    row, p = codes[r], (r - r0) * np.uint64(panel_row)
                    decode(panel[p:], row, table, at, z0)
                    decode(panel[p + g * LANES :], row, table, at + np.uint64(LANES), z1)
                    decode(panel[p + 2 * g * LANES :], row, table, at + np.uint64(2 * LANES), z2)
                    decode(panel[p + 3 * g * LANES :], row, table, at + np.uint64(3 * LANES), z3)
                for m in range(m_rows):
                    b0, b1, b2, b3 = (
                        blk[m, o:],
                        blk[m, o + LANES :],
                        blk[m, o + 2 * LANES :],
                        blk[m, o + 3 * LANES :],
                    )
                    xm = x[m]
                    for r in range(r0, r1):
                        p, kr = (r - r0) * np.uint64(panel_row), r * np.uint64(g)
                        column_dot(b0, panel[p:], xm, kr, g)
                        column_dot(b1, panel[p + g * LANES :], xm, kr, g)
                        column_dot(b2, panel[p + 2 * g * LANES :], xm, kr, g)
                        column_dot(b3, panel[p + 3 * g * LANES :], xm, kr, g)
        done = steps * wide
        if done < w:
            scalar(x, stored, k0, k1, n0 + done, w - done, zrow[done:], blk[:, done:])

    return columns


def _column_loop(form: Form) -> Callable:
    """An njit ``(x, stored, k0, k1, n0, w, zrow, blk)``: ``blk[m, t] += sum x_(m, k)
    (v_(k, n0 + t) - zrow[t])`` over ``[k0, k1)`` for every row ``m`` of ``x`` (layout
    COLUMNS; the codes ``stored``), one code at a time, decoded once for all rows: the forms
    outside the vector step, and the columns after its last whole step."""
    has_zp = form.zero_point is not None
    value = reader(form.codes)
    one_a_byte, byte = _byte_codes(form)

    @numba.njit
    def per_code(x, stored, k0, k1, n0, w, zrow, blk):
        codes, table = stored.data, stored.table
        base = np.uint64(n0)
        for k in range(k0, k1):
            row = codes[k if one_a_byte else 0]
            for t in range(np.uint64(w)):
                if one_a_byte:
                    v = byte(np.float32(row[base + t]))
                else:
                    v = value(codes, table, k, base + t)
                d = v - zrow[t] if has_zp else v
                for m in range(x.shape[0]):
                    blk[m, t] += x[m, k] * d

    return per_code


def _block_sums(form: Form) -> Callable:
    """Rows outside the vector step (``BITS``; blocks of other sizes): each block's
    ``sum x (v - z)`` per row of ``x``, the codes read one at a time and once for all rows
    (:func:`_byte_codes`, else :func:`emulate.cpu.parts.reader`), times its scale."""
    value = reader(form.codes)
    one_a_byte, byte = _byte_codes(form)
    bk = form.block[1]

    @numba.njit
    def row_sums(x, xe, stored, r, zb, sb, lanes, acc):
        codes, table = stored.data, stored.table
        (m_rows, k), row = x.shape, codes[r]
        part = lanes[:, 0]
        acc[:] = 0
        for b in range(zb.shape[0]):
            z = zb[b]
            part[:] = 0
            for j in range(np.uint64(b * bk), np.uint64(min(k, (b + 1) * bk))):
                v = byte(np.float32(row[j])) if one_a_byte else value(codes, table, r, j)
                for m in range(m_rows):
                    part[m] += x[m, j] * (v - z)
            for m in range(m_rows):
                acc[m] += part[m] * sb[b]

    return row_sums


def _vector_sums(form: Form) -> Callable:
    """``NIBBLES``, ``GROUPS`` and ``BYTES`` rows whose blocks hold a multiple or a divisor
    of :data:`LANES` groups: :data:`LANES` groups of codes at a time, decoded once for
    every row of ``x`` (:func:`emulate.cpu.lanes.group_lanes`, ``x`` in planes: ``xe``, or
    ``x`` itself for one code a byte), one sum of the lanes a row; the elements after the
    last whole step (a last, shorter block) one at a time, each times its block's scale."""
    bits, packed, signed, lookup = form.codes.step
    g = form.codes.group
    bk = form.block[1]
    per_block = bk // g  # groups a block: bk % g == 0 for these variants
    value = reader(form.codes)

    @numba.njit
    def row_sums(x, xe, stored, r, zb, sb, lanes, acc):
        codes, table = stored.data, stored.table
        m_rows, k = x.shape
        n_groups = k // g  # K % g == 0 for these variants
        planes = x if g == 1 else xe
        row, plane = codes[r], np.uint64(n_groups)
        lanes[:] = 0
        steps = n_groups // LANES
        if per_block % LANES == 0:  # whole blocks only: a last, shorter one element-wise
            steps = (k // bk) * (per_block // LANES)
        for c in range(steps):
            at = np.uint64(c * LANES)
            group_lanes(
                lanes,
                row,
                table,
                at,
                planes,
                plane,
                sb,
                zb,
                bits,
                packed,
                signed,
                lookup,
                per_block,
            )
        for m in range(m_rows):
            total = np.float32(0)
            for i in range(LANES):
                total += lanes[m, i]
            acc[m] = total
        for j in range(steps * LANES * g, k):
            b = j // bk
            v = value(codes, table, r, j) - zb[b]
            for m in range(m_rows):
                acc[m] += sb[b] * (x[m, j] * v)

    return row_sums


def _row_body(form: Form) -> Callable:
    """The row loop of ``form`` (layout ROWS): :func:`_vector_sums` where
    :func:`emulate.cpu.form.vector_step` holds, else :func:`_block_sums`."""
    return _vector_sums(form) if vector_step(form) else _block_sums(form)


def _rows_kernel(form: Form, parallel: bool) -> Callable:
    """Orientation ROWS: :data:`ROW_CHUNK` rows of the weight a task; per row its blocks'
    factors (:func:`emulate.cpu.factors.row_factors`), then the element loop of the form's
    variant for every row of ``x`` at once, and the offsets times ``x``'s block sums apart;
    a row whose factors are not all :func:`~emulate.cpu.factors.ordinary` as the
    dequantized product (:func:`emulate.cpu.dequantized.row`)."""
    row_sums, fill_factors = _row_body(form), row_factors(form)
    exceptional = dequantized.row(form)
    bn, bk = form.block
    has_offset = form.offset is not None

    @numba.njit(parallel=parallel)
    def rows(x, xe, xsum, weight, out):
        m_rows, k = x.shape
        n = out.shape[1]
        nb = (k + bk - 1) // bk
        leaves = flat(weight)
        for task in prange((n + ROW_CHUNK - 1) // ROW_CHUNK):
            weight = unflat(leaves)
            zb = np.empty(nb, np.float32)
            sb = np.empty(nb, np.float32)
            ob = np.empty(nb, np.float32)
            lanes = numba.carray(stack_floats(_ROW_LANES), (MAX_ROWS, LANES), np.float32)[:m_rows]
            acc = numba.carray(stack_floats(MAX_ROWS), (MAX_ROWS,), np.float32)
            for r in range(task * ROW_CHUNK, min(n, (task + 1) * ROW_CHUNK)):
                if not fill_factors(weight, r // bn, zb, sb, ob):
                    exceptional(x, weight, r, acc)
                    for m in range(m_rows):
                        out[m, r] = acc[m]
                    continue
                row_sums(x, xe, weight.codes, r, zb, sb, lanes, acc)
                for m in range(m_rows):
                    total = acc[m]
                    if has_offset:
                        for b in range(nb):
                            total += ob[b] * xsum[m, b]
                    out[m, r] = total

    return rows


def _columns_kernel(form: Form, parallel: bool) -> Callable:
    """Orientation COLUMNS: :data:`COLUMN_CHUNK` columns a task; per block of K the chunk's
    factors (:func:`emulate.cpu.factors.factors`), the block sums of every row of ``x``
    (the element loop, or its 64-column steps), each times its scale, and the offsets
    times ``x``'s block sums apart; a column of a block whose factors are not all
    :func:`~emulate.cpu.factors.ordinary` as the dequantized product
    (:func:`emulate.cpu.dequantized.column_block`)."""
    loop, block = _column_loop(form), factors(form)
    exceptional = dequantized.column_block(form)
    if vector_step(form):
        loop = _column_lanes(form, loop)
    bk, bn = form.block
    has_offset = form.offset is not None

    @numba.njit(parallel=parallel)
    def columns(x, xe, xsum, weight, out):
        m_rows, k = x.shape
        n = out.shape[1]
        nb = (k + bk - 1) // bk
        leaves = flat(weight)
        for task in prange((n + COLUMN_CHUNK - 1) // COLUMN_CHUNK):
            weight = unflat(leaves)
            n0 = task * COLUMN_CHUNK
            w = min(n, n0 + COLUMN_CHUNK) - n0
            acc = np.zeros((m_rows, COLUMN_CHUNK), np.float32)
            # the block sums live on the stack: LLVM then knows that the element loop's
            # stores alias none of its loads, and vectorizes it without runtime checks
            blk = numba.carray(stack_floats(_CHUNK_ROWS), (MAX_ROWS, COLUMN_CHUNK), np.float32)[
                :m_rows
            ]
            zr = np.empty(COLUMN_CHUNK, np.float32)
            sr = np.empty(COLUMN_CHUNK, np.float32)
            orow = np.empty(COLUMN_CHUNK, np.float32)
            fine = np.empty(COLUMN_CHUNK, np.bool_)
            column = np.empty(MAX_ROWS, np.float32)
            for b in range(nb):
                for t in range(w):
                    zr[t], sr[t], orow[t] = block(weight, b, (n0 + t) // bn)
                    fine[t] = ordinary(zr[t]) & ordinary(sr[t]) & ordinary(orow[t])
                k0 = b * bk
                k1 = min(k, k0 + bk)
                blk[:, :] = 0
                loop(x, weight.codes, k0, k1, n0, w, zr, blk)
                for m in range(m_rows):
                    for t in range(w):
                        if fine[t]:
                            acc[m, t] += blk[m, t] * sr[t]
                            if has_offset:
                                acc[m, t] += orow[t] * xsum[m, b]
                for t in range(w):
                    if not fine[t]:
                        column[:m_rows] = 0
                        exceptional(x, weight, k0, k1, n0 + t, column)
                        for m in range(m_rows):
                            acc[m, t] += column[m]
            out[:, n0 : n0 + w] = acc[:, :w]

    return columns


@functools.cache
def kernel(form: Form, parallel: bool) -> Callable:
    """The njit kernel of ``form``: ``(x, xe, xsum, weight, out)`` with ``x`` (M, K)
    float32, ``xe`` its columns in ``g`` planes (``xe[:, q K / g + t] = x[:, g t + q]``,
    ``g`` codes a group: layout ROWS in vector steps of codes packed along K; any (M, 1)
    array otherwise), ``xsum`` (M, blocks along K) the block sums of ``x`` (where the
    weight has offsets), ``weight`` the :class:`~emulate.cpu.operands.Weight` (parts as
    2-D uint8 bytes), and ``out`` (M, N) float32."""
    run = _columns_kernel if form.orientation == Orientation.COLUMNS else _rows_kernel
    return run(form, parallel)


__getattr__ = moved.module_getattr(__name__)
