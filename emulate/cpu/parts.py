"""numba readers of a QArray's stored parts, one element at a time, each compiled for one
:class:`emulate.cpu.form.Slot` (its kind, code width and packing are constants of the
compiled code: no branch on them at run time).

The kernel gets every stored array as a 2-D ``uint8`` array of its raw bytes (XLA passes
the array as it is; the handler reads its buffer as bytes) and, for
:attr:`~emulate.cpu.form.Kind.TABLE` slots, a float32 table of the value of every code.
Element ``(i, j)``:

- ``axis == -1``: ``width`` bytes at ``[i, j*width : (j+1)*width]``, little-endian;
- ``axis == 1``: packed along the columns (:class:`emulate.Packed`'s bit stream: code
  ``j`` at stream bits ``[bits*j, bits*(j+1))``, least significant bit first);
- ``axis == 0``: packed along the rows (code ``i`` of column ``j`` at stream bit
  ``bits*i`` of the column; stream byte ``r`` is row ``r``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from emulate.cpu.form import Kind, Slot
from emulate.cpu.operands import Factor, StoredBytes, Weight

__all__ = [
    "F32_MIN_NORMAL",
    "flat",
    "flushed",
    "float16_value",
    "float32_value",
    "frexp32",
    "pow2",
    "reader",
    "rounded",
    "stack_floats",
    "subnormal",
    "unflat",
]

#: The least normal float32, 2**-126.
F32_MIN_NORMAL = np.float32(2.0**-126)


@intrinsic
def _f32_from_bits(typingctx: Any, bits32: Any) -> Any:
    """The float32 whose bits are the low 32 bits of ``bits32`` (an LLVM bitcast)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        low = builder.trunc(args[0], ir.IntType(32))
        return builder.bitcast(low, ir.FloatType())

    return types.float32(bits32), codegen


@intrinsic
def _bits_of_f32(typingctx: Any, value: Any) -> Any:
    """The bits of the float32 ``value`` as a uint32 (an LLVM bitcast: no arithmetic, so a
    subnormal keeps its bits under flush-to-zero)."""
    if value != types.float32:
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(value), codegen


@intrinsic
def _fence(typingctx: Any, value: Any) -> Any:
    """``value`` (float32) through ``llvm.arithmetic.fence``."""
    if value != types.float32:
        return None

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType()])
        fence = cgutils.get_or_insert_function(builder.module, fnty, "llvm.arithmetic.fence.f32")
        return builder.call(fence, [args[0]])

    return types.float32(value), codegen


@intrinsic
def stack_floats(typingctx: Any, count: Any) -> Any:
    """A ``void*`` to ``count`` (a compile-time constant) float32s on the calling
    function's stack (an ``alloca`` in its entry block), for ``numba.carray``."""
    if not isinstance(count, types.IntegerLiteral):
        return None
    n = count.literal_value

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        space = cgutils.alloca_once(builder, ir.ArrayType(ir.FloatType(), n))
        return builder.bitcast(space, ir.IntType(8).as_pointer())

    return types.voidptr(count), codegen


@numba.njit(inline="always")
def rounded(value: np.float32) -> np.float32:
    """``value`` (float32) as it is, fenced (``llvm.arithmetic.fence``): a fast-math caller
    cannot fuse its rounding into a later operation (a multiply and an add into one FMA,
    one rounding instead of two)."""
    return _fence(value)


@numba.njit(cache=True, inline="always")
def float32_value(bits32: int) -> np.float32:
    """The float32 value of float32 bits ``bits32``."""
    return _f32_from_bits(np.uint64(bits32))


@numba.njit(cache=True, inline="always")
def float16_value(h: int) -> np.float32:
    """The float32 value of float16 bits ``h`` (exact: every float16 is a float32)."""
    h = np.uint64(h)
    sign = (h >> np.uint64(15)) << np.uint64(31)
    e = (h >> np.uint64(10)) & np.uint64(31)
    m = h & np.uint64(1023)
    if e == 0:  # zero and subnormals: m * 2**-24, exact
        v = np.float32(m) * np.float32(2.0**-24)
        return -v if sign else v
    if e == 31:  # Inf, and NaN made quiet as numpy's conversion does
        quiet = np.uint64(0x00400000) if m else np.uint64(0)
        return _f32_from_bits(sign | np.uint64(0x7F800000) | quiet | (m << np.uint64(13)))
    return _f32_from_bits(sign | ((e + np.uint64(112)) << np.uint64(23)) | (m << np.uint64(13)))


@numba.njit(inline="always")
def frexp32(value: np.float32) -> tuple[np.float32, int]:
    """``(m, e)`` with ``value == m * 2**e`` and ``1 <= |m| < 2``, from the bits of the
    float32 ``value`` (subnormals included, nothing flushed); zero gives ``(+-0, 0)``, Inf
    and NaN ``(themselves, 0)``: :func:`emulate.numerics.bits.frexp_bits` in numba."""
    bits = np.uint64(_bits_of_f32(np.float32(value)))
    sign = bits & np.uint64(0x80000000)
    field = (bits >> np.uint64(23)) & np.uint64(255)
    mant = bits & np.uint64(0x7FFFFF)
    if field == 255 or (field == 0 and mant == 0):
        return np.float32(value), 0
    if field == 0:  # subnormal: normalize the mantissa
        top = 0
        while (mant >> np.uint64(top + 1)) != 0:
            top += 1
        frac = (mant << np.uint64(23 - top)) & np.uint64(0x7FFFFF)
        return _f32_from_bits(sign | np.uint64(127 << 23) | frac), top - 149
    return _f32_from_bits(sign | np.uint64(127 << 23) | mant), int(field) - 127


@numba.njit(inline="always")
def pow2(n: int) -> np.float32:
    """``2**n`` as a float32 built from its bits, for ``-126 <= n <= 127``."""
    return _f32_from_bits(np.uint64(n + 127) << np.uint64(23))


@numba.njit(inline="always")
def subnormal(value: np.float32) -> bool:
    """Whether the float32 ``value`` is subnormal (nonzero, below 2**-126 in magnitude),
    from its bits: XLA:CPU runs custom calls with denormal inputs read as zero, so the
    arithmetic cannot tell."""
    bits = np.uint64(_bits_of_f32(np.float32(value))) & np.uint64(0x7FFFFFFF)
    return bool(bits != 0) & bool(bits < np.uint64(0x800000))


@numba.njit(inline="always")
def flushed(value: np.float32) -> np.float32:
    """``value``, a float32 below 2**-126 in magnitude flushed to zero (of its sign), as
    XLA:CPU flushes every result."""
    if abs(value) < F32_MIN_NORMAL:
        return np.float32(0) * value
    return value


def _code_reader(bits: int, axis: int, width: int) -> Callable:
    mask = np.uint64((1 << bits) - 1) if bits < 64 else np.uint64(0)
    eight = np.uint64(8)

    @numba.njit(inline="always")
    def code(data, i, j):
        if axis == -1:
            c = np.uint64(0)
            for b in range(width):
                c |= np.uint64(data[i, j * width + b]) << np.uint64(8 * b)
            return c
        if axis == 1:
            bit = j * bits
            r, col = i, bit >> 3
            nxt = np.uint64(data[r, col + 1]) if col + 1 < data.shape[1] else np.uint64(0)
        else:
            bit = i * bits
            r, col = bit >> 3, j
            nxt = np.uint64(data[r + 1, col]) if r + 1 < data.shape[0] else np.uint64(0)
        window = np.uint64(data[r, col]) | (nxt << eight)
        return (window >> np.uint64(bit & 7)) & mask

    return code


@functools.cache
def reader(slot: Slot) -> Callable:
    """An njit function ``(data, table, i, j) -> float32``: the value of element ``(i, j)``
    of ``slot``."""
    code = _code_reader(slot.bits, slot.axis, slot.width)
    kind, bits = slot.kind, slot.bits
    half, full = 1 << (bits - 1), 1 << bits

    @numba.njit
    def value(data, table, i, j):
        c = code(data, i, j)
        if kind == Kind.UNSIGNED:
            return np.float32(c)
        if kind == Kind.SIGNED:
            return np.float32(np.int64(c) - full if c >= half else np.int64(c))
        if kind == Kind.TABLE:
            return table[c]
        if kind == Kind.FLOAT16:
            return float16_value(c)
        if kind == Kind.BFLOAT16:
            return float32_value(c << np.uint64(16))
        return float32_value(c)

    return value


@numba.njit(inline="always")
def flat(w):
    """The arrays and constants of the :class:`~emulate.cpu.operands.Weight` ``w``, one
    flat tuple (depth first): numba's parallel loops take arrays, scalars and flat tuples
    of them, not nested records; :func:`unflat` rebuilds the record inside the loop."""
    return (
        *(w.codes.data, w.codes.table),
        *(w.zero_point.stored.data, w.zero_point.stored.table),
        *(w.zero_point.level_scales.data, w.zero_point.level_scales.table),
        *(w.zero_point.zero_point, w.zero_point.constant),
        *(
            w.scale.stored.data,
            w.scale.stored.table,
            w.scale.level_scales.data,
            w.scale.level_scales.table,
        ),
        *(w.scale.zero_point, w.scale.constant),
        *(w.offset.stored.data, w.offset.stored.table),
        *(w.offset.level_scales.data, w.offset.level_scales.table),
        *(w.offset.zero_point, w.offset.constant),
        w.tensor,
    )


@numba.njit(inline="always")
def unflat(leaves):
    """The :class:`~emulate.cpu.operands.Weight` of :func:`flat`' tuple."""
    (c, ct, z, zt, zs, zst, zz, zc, s, st, ss, sst, sz, sc, o, ot, os, ost, oz, oc, t) = leaves
    return Weight(
        StoredBytes(c, ct),
        Factor(StoredBytes(z, zt), StoredBytes(zs, zst), zz, zc),
        Factor(StoredBytes(s, st), StoredBytes(ss, sst), sz, sc),
        Factor(StoredBytes(o, ot), StoredBytes(os, ost), oz, oc),
        t,
    )
