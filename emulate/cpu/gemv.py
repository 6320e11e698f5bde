"""numba: ``y = x W`` for few rows of ``x`` and a QArray ``W`` kept as stored, one kernel
compiled per :class:`emulate.cpu.form.Form` (:func:`kernel`), and the XLA FFI handler that
calls it (:func:`handler`).

Per block of K (the weight's block along K), the kernel decodes the block's factors once
(:func:`factors`), sums ``x_k (value(code_k) - z)`` over the block in float32, multiplies
that sum by the block's scale and, where the weight has offsets, adds ``offset * sum(x_k)``
over the block (``xsum``, summed once per call). So a result element is the float32 sum of
``S`` segment sums, each scaled once: the segment route of docs/numerics.md ("Block-scaled
operands"), within its bound ``gamma_(K + S + 5) * sum |x| (|W| + |o|)``; the products are
exact for bfloat16 ``x`` and integer ``value - z`` (one rounding for float32 ``x``), the
additions are float32 in an order the compiler chooses (``reassoc``). NaN and Inf
propagate (no ``nnan`` / ``ninf``).

The element loops run with unsigned indices (numba's signed ones keep LLVM from
vectorizing them) and decode 4-bit codes in float32 arithmetic (``h = floor(c / 16)``,
``lo = c - 16 h``): numba widens integer arithmetic to 64 bits, a quarter of the lanes.
Rows of ``N`` (layout ROWS) or chunks of :data:`COLUMN_CHUNK` columns (layout COLUMNS) are
spread over numba's threads where its threading layer is thread-safe
(:func:`emulate.cpu.parallel`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numba
import numpy as np
from numba import prange, types

from emulate.cpu import ffi
from emulate.cpu.factors import factors, row_factors
from emulate.cpu.form import (
    COLUMNS,
    GROUPS,
    NIBBLES,
    SIGNED,
    Form,
    slot_widths,
)
from emulate.cpu.parts import reader, stack_floats
from emulate.numerics.storage import group_shape

__all__ = ["COLUMN_CHUNK", "ROW_CHUNK", "handler", "kernel"]

FAST = {"reassoc", "contract", "nsz", "arcp"}
ROW_CHUNK = 16
COLUMN_CHUNK = 256
F16 = np.float32(16.0)
INV16 = np.float32(0.0625)
INV8 = np.float32(0.125)


def _nibbles(kind: int) -> Callable:
    """An njit ``byte -> (low, high)``: the values of a byte's two 4-bit integer codes in
    float32 arithmetic (``h = floor(c / 16)``, ``lo = c - 16 h``)."""

    @numba.njit(fastmath=FAST, inline="always")
    def values(byte):
        c = np.float32(byte)
        h = np.floor(c * INV16)
        lo = c - F16 * h
        if kind == SIGNED:
            return lo - F16 * np.floor(lo * INV8), h - F16 * np.floor(h * INV8)
        return lo, h

    return values


def _float_code(kind: int, bits: int) -> Callable:
    """An njit ``c -> float32`` for an integer code ``c`` held as a float32."""
    full = np.float32(1 << bits)
    inv_half = np.float32(2.0 ** (1 - bits))

    @numba.njit(fastmath=FAST, inline="always")
    def value(c):
        if kind == SIGNED:
            return c - full * np.floor(c * inv_half)
        return c

    return value


def _group_code(bits: int, q: int) -> Callable:
    """An njit ``(lo, hi) -> float32``: code ``q`` of a group whose bytes are ``lo`` (bytes
    0 to 2) and ``hi`` (bytes 3 and 4) as float32 integers: stream bits ``[o, o + b)``,
    ``o = b q``, as ``floor(w / 2**o) - 2**b floor(w / 2**(o + b))`` (exact: integers below
    2**24); the code across bytes 2 and 3 of a 5-bit group joined from both."""
    o, full = bits * q, np.float32(1 << bits)
    if o + bits <= 24:
        down, up = np.float32(2.0**-o), np.float32(2.0 ** -(o + bits))

        @numba.njit(fastmath=FAST, inline="always")
        def low(lo, hi):
            return np.floor(lo * down) - full * np.floor(lo * up)

        return low
    if o >= 24:
        down, up = np.float32(2.0 ** -(o - 24)), np.float32(2.0 ** -(o + bits - 24))

        @numba.njit(fastmath=FAST, inline="always")
        def high(lo, hi):
            return np.floor(hi * down) - full * np.floor(hi * up)

        return high
    down, split = np.float32(2.0**-o), np.float32(2.0 ** (24 - o))
    carry, inv_carry = np.float32(2.0 ** (o + bits - 24)), np.float32(2.0 ** -(o + bits - 24))

    @numba.njit(fastmath=FAST, inline="always")
    def across(lo, hi):
        return np.floor(lo * down) + split * (hi - carry * np.floor(hi * inv_carry))

    return across


def _row_groups(kind: int, bits: int) -> Callable:
    """The row loop of :data:`GROUPS`, an njit ``(xe, codes, z, d)``: ``d[t] = sum
    x (v - z)`` over group ``t``'s ``g`` codes (``nb`` bytes), for every group of one
    stored row, in float32 arithmetic (:func:`_group_code`); ``x`` in ``g`` planes
    (``xe[q * K / g + t] = x[g t + q]``, :mod:`emulate.cpu.call`). One long loop over the
    row (blocks of 16 are too short for LLVM to vectorize a loop over one); the kernel adds
    each block's ``d`` after."""
    g, nb = group_shape(bits)
    value = _float_code(kind, bits)
    c0, c1, c2, c3 = (_group_code(bits, q) for q in range(4))
    c4, c5, c6, c7 = (_group_code(bits, q) for q in range(4, 8)) if g == 8 else (c0,) * 4
    b256, b65536 = np.float32(256), np.float32(65536)

    @numba.njit(fastmath=FAST, inline="always")
    def groups(xe, codes, z, d):
        plane = np.uint64(d.shape[0])
        for t in range(plane):
            at = t * np.uint64(nb)
            lo = np.float32(codes[at])
            if nb > 1:
                lo += b256 * np.float32(codes[at + np.uint64(1)])
                lo += b65536 * np.float32(codes[at + np.uint64(2)])
            hi = np.float32(0)
            if nb > 3:
                hi = np.float32(codes[at + np.uint64(3)])
                hi += b256 * np.float32(codes[at + np.uint64(4)])
            p = xe[t] * (value(c0(lo, hi)) - z)
            p += xe[plane + t] * (value(c1(lo, hi)) - z)
            p += xe[np.uint64(2) * plane + t] * (value(c2(lo, hi)) - z)
            p += xe[np.uint64(3) * plane + t] * (value(c3(lo, hi)) - z)
            if g == 8:
                p += xe[np.uint64(4) * plane + t] * (value(c4(lo, hi)) - z)
                p += xe[np.uint64(5) * plane + t] * (value(c5(lo, hi)) - z)
                p += xe[np.uint64(6) * plane + t] * (value(c6(lo, hi)) - z)
                p += xe[np.uint64(7) * plane + t] * (value(c7(lo, hi)) - z)
            d[t] = p

    return groups


def _column_loop(form: Form) -> Callable:
    """An njit ``(x, codes, table, k0, k1, n0, w, zrow, blk)``: ``blk[t] += sum x_k
    (v_(k, n0 + t) - zrow[t])`` over ``[k0, k1)`` (layout COLUMNS)."""
    kind = form.codes.kind
    has_zp = form.zero_point is not None
    if form.variant == NIBBLES:
        values = _nibbles(kind)

        @numba.njit(fastmath=FAST, inline="always")
        def nibbles(x, codes, table, k0, k1, n0, w, zrow, blk):
            for r in range(k0 >> 1, k1 >> 1):
                xe, xo = x[2 * r], x[2 * r + 1]
                row = codes[r]
                base = np.uint64(n0)
                for t in range(np.uint64(w)):
                    lo, hi = values(row[base + t])
                    if has_zp:
                        lo, hi = lo - zrow[t], hi - zrow[t]
                    blk[t] += xe * lo + xo * hi

        return nibbles
    # one code a byte read straight from the row (the generic reader's 2-D index ran
    # 2.4x slower); a bit stream along K through emulate.cpu.parts.reader
    value = reader(form.codes)
    byte = _float_code(kind, form.codes.bits)
    one_a_byte = form.codes.axis == -1

    @numba.njit(fastmath=FAST, inline="always")
    def per_code(x, codes, table, k0, k1, n0, w, zrow, blk):
        base = np.uint64(n0)
        for k in range(k0, k1):
            xk, row = x[k], codes[k if one_a_byte else 0]
            for t in range(np.uint64(w)):
                if one_a_byte:
                    v = byte(np.float32(row[base + t]))
                else:
                    v = value(codes, table, k, base + t)
                blk[t] += xk * (v - zrow[t] if has_zp else v)

    return per_code


def _block_sums(form: Form) -> Callable:
    """:data:`BYTES` and :data:`BITS` rows: each block's ``sum x (v - z)``, times its
    scale. One code a byte read straight from the row (the generic reader's 2-D index ran
    Q8_0 4x slower); a bit stream through :func:`emulate.cpu.parts.reader`."""
    value = reader(form.codes)
    byte = _float_code(form.codes.kind, form.codes.bits)
    one_a_byte = form.codes.axis == -1
    bk = form.block[1]

    @numba.njit(fastmath=FAST, inline="always")
    def row_sum(xm, em, om, codes, table, r, zb, sb, consts, scratch, lanes):
        k, row = xm.shape[0], codes[r]
        acc = np.float32(0)
        for b in range(zb.shape[0]):
            z, p = zb[b], np.float32(0)
            for j in range(np.uint64(b * bk), np.uint64(min(k, (b + 1) * bk))):
                v = byte(np.float32(row[j])) if one_a_byte else value(codes, table, r, j)
                p += xm[j] * (v - z)
            acc += p * sb[b]
        return acc

    return row_sum


def _lane_sums(form: Form) -> Callable:
    """:data:`NIBBLES` rows: each byte's ``scale * (x_lo (lo - z) + x_hi (hi - z))`` added
    into one of at most 16 accumulators on the stack (``lanes``: a vector register), one
    sum of them a row. A sum a block ends every 16 bytes in a horizontal sum that LLVM does
    not vectorize across blocks (Q4_0 8.0 -> 5.9 ms single-threaded at 4096 x 14336). The
    bound is the segment route's: per element the product and the scale (one rounding
    each) and one addition a lane. (One code a byte measured slower this way: Q8_0 keeps
    :func:`_block_sums`.)"""
    bk = form.block[1]
    per = bk // 2  # bytes a block
    width = math.gcd(per, 16)
    chunks = per // width
    pair = _nibbles(form.codes.kind)

    @numba.njit(fastmath=FAST, inline="always")
    def row_sum(xm, em, om, codes, table, r, zb, sb, consts, scratch, lanes):
        row = codes[r]
        full = xm.shape[0] // bk
        for i in range(width):
            lanes[i] = 0
        for b in range(full):
            z, s = zb[b], sb[b]
            for chunk in range(chunks):
                base = (b * chunks + chunk) * width
                for i in range(width):
                    j = base + i
                    lo, hi = pair(row[j])
                    lanes[i] += s * (em[j] * (lo - z) + om[j] * (hi - z))
        if full < zb.shape[0]:  # a last, shorter block
            z, s = zb[full], sb[full]
            for j in range(full * per, xm.shape[0] // 2):
                lo, hi = pair(row[j])
                lanes[0] += s * (em[j] * (lo - z) + om[j] * (hi - z))
        acc = np.float32(0)
        for i in range(width):
            acc += lanes[i]
        return acc

    return row_sum


def _group_sums(form: Form) -> Callable:
    """:data:`GROUPS` rows (a zero point the same for every block): the row's group sums in
    one long loop (:func:`_row_groups`), then each block's sum of them, scaled."""
    groups = _row_groups(form.codes.kind, form.codes.bits)
    per_block = form.block[1] // group_shape(form.codes.bits)[0]
    const_zp = form.zero_point == "const"

    @numba.njit(fastmath=FAST, inline="always")
    def row_sum(xm, em, om, codes, table, r, zb, sb, consts, scratch, lanes):
        d = scratch[: zb.shape[0] * per_block]
        groups(em, codes[r], consts[0] if const_zp else np.float32(0), d)
        acc = np.float32(0)
        for b in range(zb.shape[0]):
            p = np.float32(0)
            for i in range(b * per_block, (b + 1) * per_block):
                p += d[i]
            acc += p * sb[b]
        return acc

    return row_sum


def _rows_kernel(form: Form, parallel: bool) -> Callable:
    """Layout ROWS: :data:`ROW_CHUNK` rows a task; per row its blocks' factors
    (:func:`emulate.cpu.factors.row_factors`), then per row of ``x`` the element loop of
    the form's variant, and the offsets times ``x``'s block sums apart."""
    body = {NIBBLES: _lane_sums, GROUPS: _group_sums}.get(form.variant, _block_sums)
    row_sum, fill_factors = body(form), row_factors(form)
    bn, bk = form.block
    has_offset = form.offset is not None

    @numba.njit(parallel=parallel, fastmath=FAST)
    def rows(x, xe, xo, xsum, consts, s0, t0, s1, t1, s2, t2, s3, t3, s4, t4, s5, t5, out):
        m_rows, k = x.shape
        n = out.shape[1]
        nb = (k + bk - 1) // bk
        for task in prange((n + ROW_CHUNK - 1) // ROW_CHUNK):
            zb = np.empty(nb, np.float32)
            sb = np.empty(nb, np.float32)
            ob = np.empty(nb, np.float32)
            scratch = np.empty(k, np.float32)
            lanes = numba.carray(stack_floats(16), (16,), np.float32)
            for r in range(task * ROW_CHUNK, min(n, (task + 1) * ROW_CHUNK)):
                fill_factors(consts, s1, t1, s2, t2, s3, t3, s4, t4, s5, t5, r // bn, zb, sb, ob)
                for m in range(m_rows):
                    acc = row_sum(x[m], xe[m], xo[m], s0, t0, r, zb, sb, consts, scratch, lanes)
                    if has_offset:
                        for b in range(nb):
                            acc += ob[b] * xsum[m, b]
                    out[m, r] = acc

    return rows


def _columns_kernel(form: Form, parallel: bool) -> Callable:
    loop, block = _column_loop(form), factors(form)
    bk, bn = form.block
    has_offset = form.offset is not None

    @numba.njit(parallel=parallel, fastmath=FAST)
    def columns(x, xe, xo, xsum, consts, s0, t0, s1, t1, s2, t2, s3, t3, s4, t4, s5, t5, out):
        m_rows, k = x.shape
        n = out.shape[1]
        nb = (k + bk - 1) // bk
        for task in prange((n + COLUMN_CHUNK - 1) // COLUMN_CHUNK):
            n0 = task * COLUMN_CHUNK
            w = min(n, n0 + COLUMN_CHUNK) - n0
            acc = np.zeros((m_rows, COLUMN_CHUNK), np.float32)
            # the block sums live on the stack: LLVM then knows that the element loop's
            # stores alias none of its loads, and vectorizes it without runtime checks
            blk = numba.carray(stack_floats(COLUMN_CHUNK), (COLUMN_CHUNK,), np.float32)
            zr = np.empty(COLUMN_CHUNK, np.float32)
            sr = np.empty(COLUMN_CHUNK, np.float32)
            orow = np.empty(COLUMN_CHUNK, np.float32)
            for b in range(nb):
                for t in range(w):
                    zr[t], sr[t], orow[t] = block(
                        consts, s1, t1, s2, t2, s3, t3, s4, t4, s5, t5, b, (n0 + t) // bn
                    )
                k0 = b * bk
                for m in range(m_rows):
                    blk[:] = 0
                    loop(x[m], s0, t0, k0, min(k, k0 + bk), n0, w, zr, blk)
                    for t in range(w):
                        acc[m, t] += blk[t] * sr[t]
                        if has_offset:
                            acc[m, t] += orow[t] * xsum[m, b]
            out[:, n0 : n0 + w] = acc[:, :w]

    return columns


@functools.cache
def kernel(form: Form, parallel: bool) -> Callable:
    """The njit kernel of ``form``: ``(x, xe, xo, xsum, consts, s0, t0, ..., s5, t5,
    out)`` with ``x`` (M, K) float32, ``xe`` / ``xo`` its even and odd columns (layout
    ROWS with 4-bit codes; any (M, 1) array otherwise), ``xsum`` (M, blocks along K) the
    block sums of ``x`` (where the weight has offsets), the six (bytes, table) slots of
    :func:`emulate.cpu.form.weight_operands`, and ``out`` (M, N) float32."""
    return (_columns_kernel if form.layout == COLUMNS else _rows_kernel)(form, parallel)


@numba.njit(cache=True)
def _floats(frame, i):
    shape = (ffi.arg_dim(frame, i, 0), ffi.arg_dim(frame, i, 1))
    return numba.carray(ffi.pointer(ffi.arg_data(frame, i)), shape, np.float32)


@numba.njit(cache=True)
def _bytes(frame, i, width):
    """Argument ``i`` (a 2-D array of any type, ``width`` bytes an element) as bytes."""
    shape = (ffi.arg_dim(frame, i, 0), ffi.arg_dim(frame, i, 1) * width)
    return numba.carray(ffi.pointer(ffi.arg_data(frame, i)), shape, np.uint8)


@numba.njit(cache=True)
def _vector(frame, i):
    return numba.carray(
        ffi.pointer(ffi.arg_data(frame, i)), (ffi.arg_dim(frame, i, 0),), np.float32
    )


@functools.cache
def handler(form: Form, parallel: bool) -> object:
    """The numba cfunc that XLA calls for ``form`` (:mod:`emulate.cpu.ffi`); its operands
    are :func:`kernel`'s, in order, and its one result is ``out``."""
    run = kernel(form, parallel)
    w0, w1, w2, w3, w4, w5 = slot_widths(form)

    @numba.cfunc(types.int64(types.int64))
    def call(frame):
        if ffi.answer_metadata(frame) or not ffi.is_execute(frame):
            return 0
        out_shape = (ffi.ret_dim(frame, 0, 0), ffi.ret_dim(frame, 0, 1))
        out = numba.carray(ffi.pointer(ffi.ret_data(frame, 0)), out_shape, np.float32)
        run(
            _floats(frame, 0),
            _floats(frame, 1),
            _floats(frame, 2),
            _floats(frame, 3),
            _vector(frame, 4),
            _bytes(frame, 5, w0),
            _vector(frame, 6),
            _bytes(frame, 7, w1),
            _vector(frame, 8),
            _bytes(frame, 9, w2),
            _vector(frame, 10),
            _bytes(frame, 11, w3),
            _vector(frame, 12),
            _bytes(frame, 13, w4),
            _vector(frame, 14),
            _bytes(frame, 15, w5),
            _vector(frame, 16),
            out,
        )
        return 0

    return call
