"""numba: the weight's rows (layout ROWS) or a block of a column (layout COLUMNS) whose
factors leave the kernel's arithmetic (:func:`emulate.cpu.factors.ordinary`: a NaN,
infinite or subnormal scale, offset or zero point, one of at least 2**100, or a tensor
scale whose product with a block's scale leaves float32's normal range), computed as the
dequantized product: each element's value as :func:`emulate.dequantize` computes it
(``(v - z) * m * 2**e1 * 2**e2 + o``, every step rounded to float32 and flushed below
2**-126 as XLA:CPU flushes), times ``x``, summed in float32. NaN and Inf then come out as
the dequantized product gives them: a zero code against an infinite scale is NaN there,
where the kernel's block sum times the scale would hide it. Slow (one element at a time),
and only reached by such blocks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numba
import numpy as np

from emulate.cpu.factors import factors, scale_parts
from emulate.cpu.form import Form
from emulate.cpu.parts import flushed, reader, rounded

__all__ = ["column_block", "row", "value"]


def value(form: Form) -> Callable:
    """An njit ``(v, z, m, p1, p2, o) -> float32``: the dequantized value of a code of value
    ``v`` in a block of factors ``z``, ``m * p1 * p2``, ``o``."""
    has_zp, has_offset = form.zero_point is not None, form.offset is not None

    @numba.njit(inline="always")
    def value(v, z, m, p1, p2, o):
        if has_zp:
            v = flushed(np.float32(v - z))
        v = flushed(rounded(np.float32(v * m)))
        v = flushed(rounded(np.float32(v * p1)))
        v = flushed(rounded(np.float32(v * p2)))
        if has_offset:
            v = flushed(np.float32(v + o))
        return v

    return value


@functools.cache
def row(form: Form) -> Callable:
    """Layout ROWS: an njit ``(x, weight, r, acc)``: ``acc[m] = sum_j x[m, j] * w[r, j]``
    for every row ``m`` of ``x`` (M, K), ``w`` the dequantized weight."""
    code, block, parts, element = reader(form.codes), factors(form), scale_parts(form), value(form)
    bn, bk = form.block

    @numba.njit
    def dequantized_row(x, weight, r, acc):
        m_rows, k = x.shape
        for m in range(m_rows):
            acc[m] = 0
        for b in range((k + bk - 1) // bk):
            z, _, o = block(weight, r // bn, b)
            mm, p1, p2 = parts(weight, r // bn, b)
            for j in range(b * bk, min(k, (b + 1) * bk)):
                w = element(code(weight.codes.data, weight.codes.table, r, j), z, mm, p1, p2, o)
                for m in range(m_rows):
                    acc[m] += x[m, j] * w

    return dequantized_row


@functools.cache
def column_block(form: Form) -> Callable:
    """Layout COLUMNS: an njit ``(x, weight, k0, k1, n, acc)``: ``acc[m] += sum_k x[m, k] *
    w[k, n]`` over ``k`` in ``[k0, k1)`` (one block along K) for every row ``m`` of ``x``."""
    code, block, parts, element = reader(form.codes), factors(form), scale_parts(form), value(form)
    bk, bn = form.block

    @numba.njit
    def dequantized_column(x, weight, k0, k1, n, acc):
        z, _, o = block(weight, k0 // bk, n // bn)
        mm, p1, p2 = parts(weight, k0 // bk, n // bn)
        for k in range(k0, k1):
            w = element(code(weight.codes.data, weight.codes.table, k, n), z, mm, p1, p2, o)
            for m in range(x.shape[0]):
                acc[m] += x[m, k] * w

    return dequantized_column
