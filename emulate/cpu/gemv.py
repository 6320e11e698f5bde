"""numba: ``y = x W`` for few rows of ``x`` and a QArray ``W`` kept as stored, one kernel
compiled per :class:`emulate.cpu.form.Form` (:func:`kernel`), and the XLA FFI handler that
calls it (:func:`handler`).

Orientation ROWS (a dot product along each stored row): 16 groups of codes a step in LLVM
vector IR (:mod:`emulate.cpu.lanes`: ``s x (v - z)`` summed a group at a time into 16
lanes, one sum of the lanes a row); codes that fit no step (a last, shorter block, blocks
of other sizes, other widths) one at a time, ``sum x (v - z)`` a block times its scale.
Orientation COLUMNS: per block of K, ``sum x (v - z)`` into a row of block sums, each scaled
once. The block's factors are decoded once (:mod:`emulate.cpu.factors`); where the weight
has offsets, ``offset * sum(x_k)`` over the block is added apart (``xsum``, summed once
per call). So a result element is a float32 sum of products ``x (v - z)``, a group's
or a block's sum scaled once: the segment route of docs/numerics.md ("Block-scaled
operands"), within its bound ``gamma_(K + S + 5) * sum |x| (|W| + |o|)``; the products are
exact for bfloat16 ``x`` and integer ``value - z`` (one rounding for float32 ``x``), the
additions are float32 in an order the compiler chooses (``reassoc``). NaN and Inf
propagate (no ``nnan`` / ``ninf``).

The numba loops run with unsigned indices (numba's signed ones keep LLVM from vectorizing
them).

Rows of ``N`` (layout ROWS) or chunks of :data:`COLUMN_CHUNK` columns (layout COLUMNS) are
spread over numba's threads where its threading layer is thread-safe
(:func:`emulate.cpu.parallel`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba import prange, types

from emulate.cpu import ffi
from emulate.cpu.factors import factors, row_factors
from emulate.cpu.form import Form, Kind, Orientation, vector_step
from emulate.cpu.lanes import LANES, column_lanes, group_lanes
from emulate.cpu.operands import Arg, Factor, StoredBytes, Weight, byte_widths
from emulate.cpu.parts import reader, stack_floats

__all__ = ["COLUMN_CHUNK", "ROW_CHUNK", "handler", "kernel", "listing"]

FAST = {"reassoc", "contract", "nsz", "arcp"}
ROW_CHUNK = 16
COLUMN_CHUNK = 256
#: Rows of codes a pass of the column steps reads before the next 64 columns: few enough
#: that rows a power-of-two bytes apart (N = 4096: 2 KiB or 4 KiB) do not evict each other
#: from the L1 cache's ways (measured at 1 x 4096 x 4096 / 14336, 2 threads: 16 rows
#: 0.83 / 2.42 ms for compressed-tensors int4, against 1.68 / 2.99 ms for a whole block).
ROWS_A_PASS = 16


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

    @numba.njit(fastmath=FAST, inline="always")
    def value(c):
        if signed:
            return c - full * np.floor(c * inv_half)
        return c

    return value


def _column_lanes(form: Form, scalar: Callable) -> Callable:
    """``NIBBLES`` and ``BYTES`` columns: 64 columns a step
    (:func:`emulate.cpu.lanes.column_lanes`, four vectors of :data:`LANES`, kept in
    registers over :data:`ROWS_A_PASS` rows), the columns after the last whole step
    through ``scalar`` (the element loop)."""
    bits, packed, signed, lookup = form.codes.step
    g = form.codes.group
    has_zp = form.zero_point is not None

    @numba.njit(fastmath=FAST, inline="always")
    def step(lanes, row, table, at, x, kr, z):
        column_lanes(lanes, row, table, at, x, kr, z, bits, packed, signed, lookup)

    @numba.njit(fastmath=FAST, inline="always")
    def columns(x, stored, k0, k1, n0, w, zrow, blk):
        codes, table = stored.data, stored.table
        wide = 4 * LANES
        steps = w // wide
        first, last = np.uint64(k0 // g), np.uint64(k1 // g)
        for r0 in range(first, last, np.uint64(ROWS_A_PASS)):
            r1 = min(last, r0 + np.uint64(ROWS_A_PASS))
            for c in range(steps):
                at, o = np.uint64(n0 + c * wide), c * wide
                z0 = zrow[o:] if has_zp else np.float32(0)
                z1 = zrow[o + LANES :] if has_zp else np.float32(0)
                z2 = zrow[o + 2 * LANES :] if has_zp else np.float32(0)
                z3 = zrow[o + 3 * LANES :] if has_zp else np.float32(0)
                b0, b1, b2, b3 = (
                    blk[o:],
                    blk[o + LANES :],
                    blk[o + 2 * LANES :],
                    blk[o + 3 * LANES :],
                )
                for r in range(r0, r1):
                    row, kr = codes[r], r * np.uint64(g)
                    step(b0, row, table, at, x, kr, z0)
                    step(b1, row, table, at + np.uint64(LANES), x, kr, z1)
                    step(b2, row, table, at + np.uint64(2 * LANES), x, kr, z2)
                    step(b3, row, table, at + np.uint64(3 * LANES), x, kr, z3)
        done = steps * wide
        if done < w:
            scalar(x, stored, k0, k1, n0 + done, w - done, zrow[done:], blk[done:])

    return columns


def _column_loop(form: Form) -> Callable:
    """An njit ``(x, stored, k0, k1, n0, w, zrow, blk)``: ``blk[t] += sum x_k (v_(k, n0 + t)
    - zrow[t])`` over ``[k0, k1)`` (layout COLUMNS; the codes ``stored``), one code at a time:
    the forms outside the vector step, and the columns after its last whole step."""
    has_zp = form.zero_point is not None
    value = reader(form.codes)
    one_a_byte, byte = _byte_codes(form)

    @numba.njit(fastmath=FAST, inline="always")
    def per_code(x, stored, k0, k1, n0, w, zrow, blk):
        codes, table = stored.data, stored.table
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
    """Rows outside the vector step (``BITS``; blocks of other sizes): each block's
    ``sum x (v - z)``, the codes read one at a time (:func:`_byte_codes`, else
    :func:`emulate.cpu.parts.reader`), times its scale."""
    value = reader(form.codes)
    one_a_byte, byte = _byte_codes(form)
    bk = form.block[1]

    @numba.njit(fastmath=FAST, inline="always")
    def row_sum(xm, xe, stored, r, zb, sb, lanes):
        codes, table = stored.data, stored.table
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


def _vector_sums(form: Form) -> Callable:
    """``NIBBLES``, ``GROUPS`` and ``BYTES`` rows whose blocks hold a multiple
    or a divisor of :data:`LANES` groups: :data:`LANES` groups of codes at a time
    (:func:`emulate.cpu.lanes.group_lanes`, ``x`` in planes: ``xe``, or ``x`` itself for
    one code a byte), one sum of the lanes a row; the elements after the last whole step
    (a last, shorter block) one at a time, each times its block's scale."""
    bits, packed, signed, lookup = form.codes.step
    g = form.codes.group
    bk = form.block[1]
    per_block = bk // g  # groups a block: bk % g == 0 for these variants
    value = reader(form.codes)

    @numba.njit(fastmath=FAST, inline="always")
    def row_sum(xm, xe, stored, r, zb, sb, lanes):
        codes, table = stored.data, stored.table
        k = xm.shape[0]
        n_groups = k // g  # K % g == 0 for these variants
        planes = xm if g == 1 else xe
        row, plane = codes[r], np.uint64(n_groups)
        for i in range(LANES):
            lanes[i] = 0
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
        acc = np.float32(0)
        for i in range(LANES):
            acc += lanes[i]
        for j in range(steps * LANES * g, k):
            b = j // bk
            acc += sb[b] * (xm[j] * (value(codes, table, r, j) - zb[b]))
        return acc

    return row_sum


def _row_body(form: Form) -> Callable:
    """The row loop of ``form`` (layout ROWS): :func:`_vector_sums` where
    :func:`emulate.cpu.form.vector_step` holds, else :func:`_block_sums`."""
    return _vector_sums(form) if vector_step(form) else _block_sums(form)


@numba.njit(inline="always")
def _leaves(w):
    """The arrays and constants of the :class:`~emulate.cpu.operands.Weight` ``w``, one
    flat tuple (depth first): numba's parallel loops take arrays, scalars and flat tuples
    of them, not nested records; :func:`_weight` rebuilds the record inside the loop."""
    return (
        *(w.codes.data, w.codes.table),
        *(w.zero_point.stored.data, w.zero_point.stored.table),
        *(w.zero_point.level_scales.data, w.zero_point.level_scales.table),
        *(w.zero_point.zero_point, w.zero_point.constant),
        *(w.scale.stored.data, w.scale.stored.table),
        *(w.scale.level_scales.data, w.scale.level_scales.table),
        *(w.scale.zero_point, w.scale.constant),
        *(w.offset.stored.data, w.offset.stored.table),
        *(w.offset.level_scales.data, w.offset.level_scales.table),
        *(w.offset.zero_point, w.offset.constant),
    )


@numba.njit(inline="always")
def _weight(leaves):
    """The :class:`~emulate.cpu.operands.Weight` of :func:`_leaves`' tuple."""
    (c, ct, z, zt, zs, zst, zz, zc, s, st, ss, sst, sz, sc, o, ot, os, ost, oz, oc) = leaves
    return Weight(
        StoredBytes(c, ct),
        Factor(StoredBytes(z, zt), StoredBytes(zs, zst), zz, zc),
        Factor(StoredBytes(s, st), StoredBytes(ss, sst), sz, sc),
        Factor(StoredBytes(o, ot), StoredBytes(os, ost), oz, oc),
    )


def _rows_kernel(form: Form, parallel: bool) -> Callable:
    """Orientation ROWS: :data:`ROW_CHUNK` rows a task; per row its blocks' factors
    (:func:`emulate.cpu.factors.row_factors`), then per row of ``x`` the element loop of
    the form's variant, and the offsets times ``x``'s block sums apart."""
    row_sum, fill_factors = _row_body(form), row_factors(form)
    bn, bk = form.block
    has_offset = form.offset is not None

    @numba.njit(parallel=parallel, fastmath=FAST)
    def rows(x, xe, xsum, weight, out):
        m_rows, k = x.shape
        n = out.shape[1]
        nb = (k + bk - 1) // bk
        leaves = _leaves(weight)
        for task in prange((n + ROW_CHUNK - 1) // ROW_CHUNK):
            weight = _weight(leaves)
            zb = np.empty(nb, np.float32)
            sb = np.empty(nb, np.float32)
            ob = np.empty(nb, np.float32)
            lanes = numba.carray(stack_floats(LANES), (LANES,), np.float32)
            for r in range(task * ROW_CHUNK, min(n, (task + 1) * ROW_CHUNK)):
                fill_factors(weight, r // bn, zb, sb, ob)
                for m in range(m_rows):
                    acc = row_sum(x[m], xe[m], weight.codes, r, zb, sb, lanes)
                    if has_offset:
                        for b in range(nb):
                            acc += ob[b] * xsum[m, b]
                    out[m, r] = acc

    return rows


def _columns_kernel(form: Form, parallel: bool) -> Callable:
    loop, block = _column_loop(form), factors(form)
    if vector_step(form):
        loop = _column_lanes(form, loop)
    bk, bn = form.block
    has_offset = form.offset is not None

    @numba.njit(parallel=parallel, fastmath=FAST)
    def columns(x, xe, xsum, weight, out):
        m_rows, k = x.shape
        n = out.shape[1]
        nb = (k + bk - 1) // bk
        leaves = _leaves(weight)
        for task in prange((n + COLUMN_CHUNK - 1) // COLUMN_CHUNK):
            weight = _weight(leaves)
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
                    zr[t], sr[t], orow[t] = block(weight, b, (n0 + t) // bn)
                k0 = b * bk
                for m in range(m_rows):
                    blk[:] = 0
                    loop(x[m], weight.codes, k0, min(k, k0 + bk), n0, w, zr, blk)
                    for t in range(w):
                        acc[m, t] += blk[t] * sr[t]
                        if has_offset:
                            acc[m, t] += orow[t] * xsum[m, b]
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


@numba.njit(inline="always")
def _stored(frame, i, width):
    """The stored part at argument ``i`` (its table at ``i + 1``)."""
    return StoredBytes(_bytes(frame, i, width), _vector(frame, i + 1))


def _weight_of(form: Form) -> Callable:
    """An njit ``frame -> Weight``: the weight's parts from XLA's call frame, by the
    positions of :class:`~emulate.cpu.operands.Arg` (the order
    :func:`emulate.cpu.operands.wire` flattens them in)."""
    w_codes, w_zp, w_zps, w_s, w_ss, w_o, w_os = byte_widths(form)

    @numba.njit(inline="always")
    def weight_of(frame):
        c = _vector(frame, Arg.CONSTANTS)
        return Weight(
            _stored(frame, Arg.CODES, w_codes),
            Factor(
                _stored(frame, Arg.ZERO_POINT, w_zp),
                _stored(frame, Arg.ZERO_POINT_SCALES, w_zps),
                c[0],
                c[1],
            ),
            Factor(
                _stored(frame, Arg.SCALE, w_s), _stored(frame, Arg.SCALE_SCALES, w_ss), c[2], c[3]
            ),
            Factor(
                _stored(frame, Arg.OFFSET, w_o), _stored(frame, Arg.OFFSET_SCALES, w_os), c[4], c[5]
            ),
        )

    return weight_of


@functools.cache
def handler(form: Form, parallel: bool) -> object:
    """The numba cfunc that XLA calls for ``form`` (:mod:`emulate.cpu.ffi`): its operands
    are :func:`emulate.cpu.operands.wire`'s, its one result ``out``."""
    run = kernel(form, parallel)
    weight_of = _weight_of(form)

    @numba.cfunc(types.int64(types.int64))
    def call(frame):
        if ffi.answer_metadata(frame) or not ffi.is_execute(frame):
            return 0
        out_shape = (ffi.ret_dim(frame, 0, 0), ffi.ret_dim(frame, 0, 1))
        out = numba.carray(ffi.pointer(ffi.ret_data(frame, 0)), out_shape, np.float32)
        x, xe, xsum = _floats(frame, Arg.X), _floats(frame, Arg.XE), _floats(frame, Arg.XSUM)
        run(x, xe, xsum, weight_of(frame), out)
        return 0

    return call


def listing(form: Form, what: str = "asm", parallel: bool = False) -> str:
    """The code compiled for ``form``'s kernel (:func:`kernel`, every step inlined into it):
    its optimized LLVM IR (``what="llvm"``) or this host's assembly (``"asm"``), for the
    types the handler calls it with (docs/cpu_kernel.md). Compiles the kernel first if
    needed (seconds).

    Raises:
      ValueError: ``what`` is neither "llvm" nor "asm".
    """
    if what not in ("llvm", "asm"):
        raise ValueError(f"what: expected 'llvm' or 'asm', got {what!r}")
    handler(form, parallel)  # compiles the kernel for the frame's types
    run: Any = kernel(form, parallel)  # a numba dispatcher
    code = run.inspect_llvm() if what == "llvm" else run.inspect_asm()
    return "\n".join(code.values())
