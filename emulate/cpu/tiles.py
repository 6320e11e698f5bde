"""numba: the float32 matrix-multiply micro-kernels of the CPU kernel's many-rows route
(:mod:`emulate.cpu.gemm`), written as LLVM vector IR (:data:`WIDTH` float32 lanes, generic
vectors: AVX2 registers, halves of AVX-512 ones, pairs of NEON ones).

- :func:`broadcast_tile`: ``C[r, :] += sum_k A[r, k] * B[k, :]`` for ``rows`` rows of
  ``A`` (activations, any row stride) and a panel ``B`` of ``vecs * WIDTH`` columns stored
  row after row (the decoded weight of layout COLUMNS): per ``k`` one load of each vector
  of ``B``, one broadcast of each ``A[r, k]``, ``rows * vecs`` fused multiply-adds into
  accumulators kept in registers.
- :func:`dot_tile`: ``C[r, c] += sum_k A[r, k] * B[c, k]`` for ``rows`` rows of ``A`` and
  ``cols`` rows of ``B`` (the decoded weight of layout ROWS, K along each row): per
  :data:`WIDTH` values of ``k`` one load of each row, ``rows * cols`` fused multiply-adds
  into lane accumulators, each summed across its lanes once at the end.

Numerics: no fast-math flags; each ``C`` element's operations and their order are fixed
(:func:`broadcast_tile`: one multiply-add a ``k``, in order, from ``C``'s value;
:func:`dot_tile`: lane ``l`` sums ``k = l mod WIDTH`` in order, the lanes in a fixed tree,
the last ``kc mod WIDTH`` products in order, then one addition into ``C``), whatever the
tile holds: a row's result does not depend on the other rows of its batch. A plain float32
dot product: within ``gamma_K sum |a b|`` of the exact sum of the products.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

__all__ = ["WIDTH", "broadcast_tile", "dot_tile"]

#: float32 lanes of the micro-kernels' vectors.
WIDTH = 8
_F32, _I64, _I32, _I8 = ir.FloatType(), ir.IntType(64), ir.IntType(32), ir.IntType(8)
_V = ir.VectorType(_F32, WIDTH)


def _literal(name: str, value: Any, most: int) -> int | None:
    if not isinstance(value, types.IntegerLiteral):
        return None
    v = value.literal_value
    if not 1 <= v <= most:
        raise ValueError(f"{name}: expected 1 to {most}, got {v}")
    return v


def _element(context: Any, builder: Any, aty: Any, array: Any, row: Any, col: Any) -> Any:
    """A float32* to ``array[row, col]`` (a 2-D array with contiguous rows; i64 indices)."""
    a = context.make_array(aty)(context, builder, array)
    stride = cgutils.unpack_tuple(builder, a.strides, 2)[0]  # bytes
    base = builder.gep(builder.bitcast(a.data, _I8.as_pointer()), [builder.mul(row, stride)])
    return builder.gep(builder.bitcast(base, a.data.type), [col])


def _const(i: int) -> ir.Constant:
    return ir.Constant(_I64, i)


def _fmuladd(builder: Any, a: Any, b: Any, c: Any) -> Any:
    fnty = ir.FunctionType(a.type, [a.type] * 3)
    name = (
        f"llvm.fmuladd.v{a.type.count}f32"
        if isinstance(a.type, ir.VectorType)
        else ("llvm.fmuladd.f32")
    )
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), [a, b, c])


def _indices(values: list[int]) -> ir.Constant:
    return ir.Constant(ir.VectorType(_I32, len(values)), values)


def _splat(builder: Any, v: Any) -> Any:
    one = builder.insert_element(ir.Constant(_V, ir.Undefined), v, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, one, _indices([0] * WIDTH))


def _load_vector(builder: Any, at: Any) -> Any:
    return builder.load(builder.bitcast(at, _V.as_pointer()), align=4)


def _i64(builder: Any, v: Any) -> Any:
    return builder.zext(v, _I64) if v.type.width < 64 else v


@intrinsic
def broadcast_tile(typingctx: Any, c: Any, a: Any, b: Any, kc: Any, rows: Any, vecs: Any) -> Any:
    """``c[r, j] += sum_(k < kc) a[r, k] * b[k * vecs * WIDTH + j]`` for ``r < rows``,
    ``j < vecs * WIDTH``: ``c`` and ``a`` float32 2-D arrays whose rows are contiguous,
    ``b`` a float32 1-D panel (``kc`` rows of ``vecs * WIDTH``), ``kc`` an unsigned count;
    ``rows`` (1 to 6) and ``vecs`` (1 or 2) compile-time constants. No bounds checks."""
    n_rows, n_vecs = _literal("rows", rows, 6), _literal("vecs", vecs, 2)
    if n_rows is None or n_vecs is None:
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        c_v, a_v, b_v, kc_v = args[:4]
        zero = ir.Constant(_I64, 0)
        cols = [ir.Constant(_I64, WIDTH * v) for v in range(n_vecs)]
        acc = [[cgutils.alloca_once(builder, _V) for _ in range(n_vecs)] for _ in range(n_rows)]
        c_at = [
            [_element(context, builder, sig.args[0], c_v, _const(r), j) for j in cols]
            for r in range(n_rows)
        ]
        for r in range(n_rows):
            for v in range(n_vecs):
                builder.store(_load_vector(builder, c_at[r][v]), acc[r][v])
        b_data = context.make_array(sig.args[2])(context, builder, b_v).data
        a_row = [
            _element(context, builder, sig.args[1], a_v, _const(r), zero) for r in range(n_rows)
        ]
        with cgutils.for_range(builder, _i64(builder, kc_v)) as loop:
            k = loop.index
            row = builder.gep(b_data, [builder.mul(k, ir.Constant(_I64, n_vecs * WIDTH))])
            bv = [_load_vector(builder, builder.gep(row, [j])) for j in cols]
            for r in range(n_rows):
                ar = _splat(builder, builder.load(builder.gep(a_row[r], [k])))
                for v in range(n_vecs):
                    builder.store(_fmuladd(builder, ar, bv[v], builder.load(acc[r][v])), acc[r][v])
        for r in range(n_rows):
            for v in range(n_vecs):
                at = builder.bitcast(c_at[r][v], _V.as_pointer())
                builder.store(builder.load(acc[r][v]), at, align=4)
        return context.get_dummy_value()

    return types.none(c, a, b, kc, rows, vecs), codegen


def _lane_sum(builder: Any, v: Any) -> Any:
    """The :data:`WIDTH` lanes of ``v`` summed in a fixed tree: halves added lane by lane
    until one is left."""
    n = WIDTH
    while n > 1:
        half = n // 2
        lo = builder.shuffle_vector(v, v, _indices(list(range(half))))
        hi = builder.shuffle_vector(v, v, _indices(list(range(half, n))))
        v, n = builder.fadd(lo, hi), half
    return builder.extract_element(v, ir.Constant(_I32, 0))


@intrinsic
def dot_tile(typingctx: Any, c: Any, a: Any, b: Any, kc: Any, rows: Any, cols: Any) -> Any:
    """``c[r, j] += sum_(k < kc) a[r, k] * b[j, k]`` for ``r < rows``, ``j < cols``: ``c``,
    ``a`` and ``b`` float32 2-D arrays whose rows are contiguous, ``kc`` an unsigned
    count; ``rows`` (1 to 3) and ``cols`` (1 to 4) compile-time constants. No bounds
    checks."""
    n_rows, n_cols = _literal("rows", rows, 3), _literal("cols", cols, 4)
    if n_rows is None or n_cols is None:
        return None

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        c_v, a_v, b_v, kc_v = args[:4]
        zero = ir.Constant(_I64, 0)
        kc_i = _i64(builder, kc_v)
        whole = builder.udiv(kc_i, ir.Constant(_I64, WIDTH))
        a_row = [
            _element(context, builder, sig.args[1], a_v, _const(r), zero) for r in range(n_rows)
        ]
        b_row = [
            _element(context, builder, sig.args[2], b_v, _const(j), zero) for j in range(n_cols)
        ]
        acc = [[cgutils.alloca_once(builder, _V) for _ in range(n_cols)] for _ in range(n_rows)]
        for r in range(n_rows):
            for j in range(n_cols):
                builder.store(ir.Constant(_V, [0.0] * WIDTH), acc[r][j])
        with cgutils.for_range(builder, whole) as loop:
            k = builder.mul(loop.index, ir.Constant(_I64, WIDTH))
            av = [_load_vector(builder, builder.gep(p, [k])) for p in a_row]
            for j in range(n_cols):
                bv = _load_vector(builder, builder.gep(b_row[j], [k]))
                for r in range(n_rows):
                    builder.store(_fmuladd(builder, av[r], bv, builder.load(acc[r][j])), acc[r][j])
        tails = [[cgutils.alloca_once(builder, _F32) for _ in range(n_cols)] for _ in range(n_rows)]
        for r in range(n_rows):
            for j in range(n_cols):
                builder.store(_lane_sum(builder, builder.load(acc[r][j])), tails[r][j])
        start = builder.mul(whole, ir.Constant(_I64, WIDTH))
        with cgutils.for_range(builder, builder.sub(kc_i, start)) as loop:
            k = builder.add(start, loop.index)
            for r in range(n_rows):
                ar = builder.load(builder.gep(a_row[r], [k]))
                for j in range(n_cols):
                    br = builder.load(builder.gep(b_row[j], [k]))
                    builder.store(_fmuladd(builder, ar, br, builder.load(tails[r][j])), tails[r][j])
        for r in range(n_rows):
            for j in range(n_cols):
                at = _element(context, builder, sig.args[0], c_v, _const(r), _const(j))
                builder.store(builder.fadd(builder.load(at), builder.load(tails[r][j])), at)
        return context.get_dummy_value()

    return types.none(c, a, b, kc, rows, cols), codegen
