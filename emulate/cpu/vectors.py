"""LLVM vector IR on numba's arrays, the building blocks of the CPU kernel's vector steps
(:mod:`emulate.cpu.lanes`): pointers into 1-D and 2-D arrays, loads and stores of
:data:`~emulate.cpu.form.LANES` float32s, splats, and the in-order dot product
(:func:`dot`: no fast-math flags, so LLVM keeps the order of every sum). Each takes the
``(context, builder)`` of an ``@intrinsic``'s codegen, a numba array type and its LLVM
value where it reads an array.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils

from emulate.cpu.form import LANES

__all__ = [
    "F32",
    "I32",
    "I64",
    "I8",
    "VF",
    "VI",
    "add_at",
    "add_into",
    "as_index",
    "block_floats",
    "dot",
    "fmuladd",
    "load_at",
    "load_floats",
    "load_groups",
    "pointer_at",
    "row_at",
    "row_count",
    "splat_float",
    "splat_int",
]

F32, I32, I64, I8 = ir.FloatType(), ir.IntType(32), ir.IntType(64), ir.IntType(8)
#: Vectors of :data:`~emulate.cpu.form.LANES` float32s and int32s.
VF, VI = ir.VectorType(F32, LANES), ir.VectorType(I32, LANES)


def splat_int(v: int) -> ir.Constant:
    return ir.Constant(VI, [v] * LANES)


def as_index(builder: Any, v: Any) -> Any:
    """An integer argument as an i64 index."""
    return builder.zext(v, I64) if v.type.width < 64 else v


def load_groups(context: Any, builder: Any, aty: Any, codes: Any, start: Any, nb: int) -> Any:
    """The bytes of :data:`LANES` groups of ``nb`` bytes from group ``start`` on."""
    at = pointer_at(context, builder, aty, codes, builder.mul(start, ir.Constant(I64, nb)))
    return builder.load(builder.bitcast(at, ir.VectorType(I8, LANES * nb).as_pointer()), align=1)


def fmuladd(builder: Any, a: Any, b: Any, c: Any) -> Any:
    """``a * b + c`` lane by lane (``llvm.fmuladd``: one fused multiply-add where the host
    has them, the same on every path of the kernel)."""
    fnty = ir.FunctionType(a.type, [a.type] * 3)
    name = f"llvm.fmuladd.v{a.type.count}f32"
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), [a, b, c])


def dot(builder: Any, xs: list[Any], values: list[Any]) -> Any:
    """``sum_q xs[q] * values[q]``, lane by lane, float32, in order: the first product,
    then each next one fused into the sum. No fast-math flags here or anywhere in the
    steps: LLVM may not reorder them, so a row's sums do not depend on the path (one row
    or many) that computed them."""
    total = builder.fmul(xs[0], values[0])
    for xq, v in zip(xs[1:], values[1:]):
        total = fmuladd(builder, xq, v, total)
    return total


def add_at(builder: Any, at: Any, v: Any) -> None:
    """``*at += v`` for the :data:`LANES` float32s at pointer ``at`` (float32*)."""
    into = builder.bitcast(at, v.type.as_pointer())
    builder.store(builder.fadd(builder.load(into, align=4), v), into, align=4)


def add_into(context: Any, builder: Any, aty: Any, lanes: Any, v: Any) -> None:
    """``lanes += v``: the :data:`LANES` float32s of the array ``lanes``."""
    add_at(builder, context.make_array(aty)(context, builder, lanes).data, v)


def row_at(context: Any, builder: Any, aty: Any, array: Any, row: Any, index: Any) -> Any:
    """A pointer to element ``[row, index]`` (i64s) of the 2-D ``array`` whose rows are
    contiguous (any row stride)."""
    a = context.make_array(aty)(context, builder, array)
    stride = cgutils.unpack_tuple(builder, a.strides, 2)[0]  # bytes
    bytes_ = builder.bitcast(a.data, I8.as_pointer())
    start = builder.bitcast(builder.gep(bytes_, [builder.mul(row, stride)]), a.data.type)
    return builder.gep(start, [index])


def row_count(context: Any, builder: Any, aty: Any, array: Any) -> Any:
    """The number of rows of the 2-D ``array`` (i64)."""
    a = context.make_array(aty)(context, builder, array)
    return cgutils.unpack_tuple(builder, a.shape, 2)[0]


def pointer_at(context: Any, builder: Any, aty: Any, array: Any, index: Any) -> Any:
    """A pointer to element ``index`` (i64) of the 1-D ``array``."""
    data = context.make_array(aty)(context, builder, array).data
    return builder.gep(data, [index])


def load_floats(context: Any, builder: Any, aty: Any, array: Any, index: Any) -> Any:
    return load_at(builder, pointer_at(context, builder, aty, array, index))


def load_at(builder: Any, at: Any) -> Any:
    """The :data:`LANES` float32s at pointer ``at``."""
    return builder.load(builder.bitcast(at, VF.as_pointer()), align=4)


def block_floats(context: Any, builder: Any, aty: Any, v: Any, start: Any, per: int) -> Any:
    """Each lane's block value: ``v`` itself (a scalar), or ``v[(start + t) // per]`` of
    the array ``v`` (``per`` groups a block: a multiple of :data:`LANES` or a divisor)."""
    if not isinstance(aty, types.Array):
        return splat_float(builder, v)
    first = builder.udiv(start, ir.Constant(I64, per))
    if per % LANES == 0:
        return splat_float(builder, builder.load(pointer_at(context, builder, aty, v, first)))
    blocks = ir.VectorType(F32, LANES // per)
    p = pointer_at(context, builder, aty, v, first)
    few = builder.load(builder.bitcast(p, blocks.as_pointer()), align=4)
    return builder.shuffle_vector(few, few, ir.Constant(VI, [t // per for t in range(LANES)]))


def splat_float(builder: Any, v: Any) -> Any:
    one = builder.insert_element(ir.Constant(VF, ir.Undefined), v, ir.Constant(I32, 0))
    return builder.shuffle_vector(one, one, splat_int(0))
