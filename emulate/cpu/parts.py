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

__all__ = ["float16_value", "float32_value", "reader", "rounded", "stack_floats"]


@intrinsic
def _f32_from_bits(typingctx: Any, bits32: Any) -> Any:
    """The float32 whose bits are the low 32 bits of ``bits32`` (an LLVM bitcast)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        low = builder.trunc(args[0], ir.IntType(32))
        return builder.bitcast(low, ir.FloatType())

    return types.float32(bits32), codegen


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

    @numba.njit(inline="always")
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
