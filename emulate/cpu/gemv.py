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
    BITS,
    BYTES,
    COLUMNS,
    GROUPS,
    NIBBLES,
    SIGNED,
    Form,
    slot_widths,
)
from emulate.cpu.parts import stack_floats
from emulate.numerics.storage import group_shape

__all__ = ["COLUMN_CHUNK", "ROW_CHUNK", "handler", "kernel"]

FAST = {"reassoc", "contract", "nsz", "arcp"}
ROW_CHUNK = 16
COLUMN_CHUNK = 256
F16 = np.float32(16.0)
INV16 = np.float32(0.0625)
INV8 = np.float32(0.125)


def _nibbles(kind: int) -> Callable:
    """An njit ``(byte, table) -> (low, high)``: the values of a byte's two 4-bit integer
    codes in float32 arithmetic (``h = floor(c / 16)``, ``lo = c - 16 h``)."""

    @numba.njit(fastmath=FAST, inline="always")
    def values(byte, table):
        c = np.float32(byte)
        h = np.floor(c * INV16)
        lo = c - F16 * h
        if kind == SIGNED:
            return lo - F16 * np.floor(lo * INV8), h - F16 * np.floor(h * INV8)
        return lo, h

    return values


def _code_value(kind: int, bits: int) -> Callable:
    """An njit ``(c, table) -> float32`` for an unsigned integer code ``c``."""
    half, full = 1 << (bits - 1), 1 << bits

    @numba.njit(fastmath=FAST, inline="always")
    def value(c, table):
        if kind == SIGNED:
            return np.float32(np.int64(c) - full if c >= half else np.int64(c))
        return np.float32(c)

    return value


def _row_loop(form: Form) -> Callable:
    """An njit ``(x, xe, xo, codes, table, k0, k1, z) -> float32``: ``sum x_k (v_k - z)``
    over ``[k0, k1)`` of one stored row (layout ROWS)."""
    kind, bits = form.codes.kind, form.codes.bits
    if form.variant == NIBBLES:
        values = _nibbles(kind)

        @numba.njit(fastmath=FAST, inline="always")
        def nibbles(x, xe, xo, codes, table, k0, k1, z):
            p = np.float32(0)
            j0 = np.uint64(k0 >> 1)
            for t in range(np.uint64((k1 - k0) >> 1)):
                j = j0 + t
                lo, hi = values(codes[j], table)
                p += xe[j] * (lo - z) + xo[j] * (hi - z)
            return p

        return nibbles
    value = _code_value(kind, bits)
    if form.variant == BYTES:

        @numba.njit(fastmath=FAST, inline="always")
        def per_byte(x, xe, xo, codes, table, k0, k1, z):
            p = np.float32(0)
            base = np.uint64(k0)
            for t in range(np.uint64(k1 - k0)):
                k = base + t
                p += x[k] * (value(codes[k], table) - z)
            return p

        return per_byte
    mask = np.uint64((1 << bits) - 1)

    @numba.njit(fastmath=FAST, inline="always")
    def per_bits(x, xe, xo, codes, table, k0, k1, z):
        p = np.float32(0)
        last = np.uint64(codes.shape[0] - 1)
        for k in range(np.uint64(k0), np.uint64(k1)):
            bit = k * np.uint64(bits)
            at = bit >> np.uint64(3)
            nxt = np.uint64(codes[at + np.uint64(1)]) if at < last else np.uint64(0)
            window = np.uint64(codes[at]) | (nxt << np.uint64(8))
            c = (window >> (bit & np.uint64(7))) & mask
            p += x[k] * (value(c, table) - z)
        return p

    return per_bits


def _float_code(kind: int, bits: int) -> Callable:
    """An njit ``(c, table) -> float32`` for a code ``c`` held as a float32 integer."""
    full = np.float32(1 << bits)
    inv_half = np.float32(2.0 ** (1 - bits))

    @numba.njit(fastmath=FAST, inline="always")
    def value(c, table):
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
    """The row loop of :data:`GROUPS`, an njit ``(xe, codes, table, z, d)``: ``d[t] = sum
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
    def groups(xe, xo, codes, table, z, d):
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
            p = xe[t] * (value(c0(lo, hi), table) - z)
            p += xe[plane + t] * (value(c1(lo, hi), table) - z)
            p += xe[np.uint64(2) * plane + t] * (value(c2(lo, hi), table) - z)
            p += xe[np.uint64(3) * plane + t] * (value(c3(lo, hi), table) - z)
            if g == 8:
                p += xe[np.uint64(4) * plane + t] * (value(c4(lo, hi), table) - z)
                p += xe[np.uint64(5) * plane + t] * (value(c5(lo, hi), table) - z)
                p += xe[np.uint64(6) * plane + t] * (value(c6(lo, hi), table) - z)
                p += xe[np.uint64(7) * plane + t] * (value(c7(lo, hi), table) - z)
            d[t] = p

    return groups


def _column_loop(form: Form) -> Callable:
    """An njit ``(x, codes, table, k0, k1, n0, w, zrow, blk)``: ``blk[t] += sum x_k
    (v_(k, n0 + t) - zrow[t])`` over ``[k0, k1)`` (layout COLUMNS)."""
    kind, bits = form.codes.kind, form.codes.bits
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
                    lo, hi = values(row[base + t], table)
                    if has_zp:
                        lo, hi = lo - zrow[t], hi - zrow[t]
                    blk[t] += xe * lo + xo * hi

        return nibbles
    value = _code_value(kind, bits)
    mask = np.uint64((1 << bits) - 1)
    packed = form.variant == BITS

    @numba.njit(fastmath=FAST, inline="always")
    def per_code(x, codes, table, k0, k1, n0, w, zrow, blk):
        base = np.uint64(n0)
        for k in range(k0, k1):
            xk = x[k]
            if packed:
                bit = k * bits
                at, shift = bit >> 3, np.uint64(bit & 7)
                has_next = at + 1 < codes.shape[0]
                for t in range(np.uint64(w)):
                    nxt = np.uint64(codes[at + 1, base + t]) if has_next else np.uint64(0)
                    window = np.uint64(codes[at, base + t]) | (nxt << np.uint64(8))
                    v = value((window >> shift) & mask, table)
                    blk[t] += xk * (v - zrow[t] if has_zp else v)
            else:
                row = codes[k]
                for t in range(np.uint64(w)):
                    v = value(row[base + t], table)
                    blk[t] += xk * (v - zrow[t] if has_zp else v)

    return per_code


def _rows_kernel(form: Form, parallel: bool) -> Callable:
    if form.variant == GROUPS:
        return _row_groups_kernel(form, parallel)
    if form.variant == NIBBLES:
        return _row_lanes_kernel(form, parallel)
    loop, fill_factors = _row_loop(form), row_factors(form)
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
            for r in range(task * ROW_CHUNK, min(n, (task + 1) * ROW_CHUNK)):
                fill_factors(consts, s1, t1, s2, t2, s3, t3, s4, t4, s5, t5, r // bn, zb, sb, ob)
                codes = s0[r]
                for m in range(m_rows):
                    acc = np.float32(0)
                    for b in range(nb):
                        k0 = b * bk
                        p = loop(x[m], xe[m], xo[m], codes, t0, k0, min(k, k0 + bk), zb[b])
                        acc += p * sb[b]
                        if has_offset:
                            acc += ob[b] * xsum[m, b]
                    out[m, r] = acc

    return rows


def _row_lanes_kernel(form: Form, parallel: bool) -> Callable:
    """Layout ROWS, 4-bit codes: each byte's ``scale * (x_lo (lo - z) + x_hi (hi - z))``
    added into one of ``lanes`` accumulators on the stack (at most 16: a vector register),
    one sum of them a row. A sum a block ends every 16 bytes in a horizontal sum that LLVM
    does not vectorize across blocks (Q4_0 8.0 -> 5.9 ms single-threaded at 4096 x 14336).
    The bound is the segment route's: per element the product and the scale (one rounding
    each) and one addition a lane. (One code a byte measured slower this way: Q8_0 keeps
    :func:`_rows_kernel`'s block sums.)"""
    fill_factors = row_factors(form)
    bn, bk = form.block
    per = bk // 2  # bytes a block
    lanes = math.gcd(per, 16)
    chunks = per // lanes
    pair = _nibbles(form.codes.kind)
    has_offset = form.offset is not None

    @numba.njit(parallel=parallel, fastmath=FAST)
    def rows(x, xe, xo, xsum, consts, s0, t0, s1, t1, s2, t2, s3, t3, s4, t4, s5, t5, out):
        m_rows, k = x.shape
        n = out.shape[1]
        nb = (k + bk - 1) // bk
        full = k // bk
        for task in prange((n + ROW_CHUNK - 1) // ROW_CHUNK):
            zb = np.empty(nb, np.float32)
            sb = np.empty(nb, np.float32)
            ob = np.empty(nb, np.float32)
            a = numba.carray(stack_floats(16), (16,), np.float32)
            for r in range(task * ROW_CHUNK, min(n, (task + 1) * ROW_CHUNK)):
                fill_factors(consts, s1, t1, s2, t2, s3, t3, s4, t4, s5, t5, r // bn, zb, sb, ob)
                codes = s0[r]
                for m in range(m_rows):
                    em, om = xe[m], xo[m]
                    for i in range(lanes):
                        a[i] = 0
                    off = np.float32(0)
                    for b in range(full):
                        z, s = zb[b], sb[b]
                        for chunk in range(chunks):
                            base = (b * chunks + chunk) * lanes
                            for i in range(lanes):
                                j = base + i
                                lo, hi = pair(codes[j], t0)
                                a[i] += s * (em[j] * (lo - z) + om[j] * (hi - z))
                    if full < nb:  # a last, shorter block
                        z, s = zb[full], sb[full]
                        for j in range(full * per, k // 2):
                            lo, hi = pair(codes[j], t0)
                            a[0] += s * (em[j] * (lo - z) + om[j] * (hi - z))
                    if has_offset:
                        for b in range(nb):
                            off += ob[b] * xsum[m, b]
                    acc = np.float32(0)
                    for i in range(lanes):
                        acc += a[i]
                    out[m, r] = acc + off

    return rows


def _row_groups_kernel(form: Form, parallel: bool) -> Callable:
    """Layout ROWS, :data:`GROUPS` (a zero point the same for every block): each row's
    group sums in one long loop (:func:`_row_groups`), then each block's sum of them,
    scaled."""
    groups = _row_groups(form.codes.kind, form.codes.bits)
    per_block = form.block[1] // group_shape(form.codes.bits)[0]
    fill_factors = row_factors(form)
    bn, bk = form.block
    has_offset = form.offset is not None
    const_zp = form.zero_point == "const"

    @numba.njit(parallel=parallel, fastmath=FAST)
    def rows(x, xe, xo, xsum, consts, s0, t0, s1, t1, s2, t2, s3, t3, s4, t4, s5, t5, out):
        m_rows, k = x.shape
        n = out.shape[1]
        nb = k // bk
        z = consts[0] if const_zp else np.float32(0)
        for task in prange((n + ROW_CHUNK - 1) // ROW_CHUNK):
            zb = np.empty(nb, np.float32)
            sb = np.empty(nb, np.float32)
            ob = np.empty(nb, np.float32)
            d = np.empty(nb * per_block, np.float32)
            for r in range(task * ROW_CHUNK, min(n, (task + 1) * ROW_CHUNK)):
                fill_factors(consts, s1, t1, s2, t2, s3, t3, s4, t4, s5, t5, r // bn, zb, sb, ob)
                for m in range(m_rows):
                    groups(xe[m], xo[m], s0[r], t0, z, d)
                    acc = np.float32(0)
                    for b in range(nb):
                        p = np.float32(0)
                        for i in range(b * per_block, (b + 1) * per_block):
                            p += d[i]
                        acc += p * sb[b]
                        if has_offset:
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
