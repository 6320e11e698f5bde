"""When the CPU kernel takes a contraction: :func:`choose` (the one owner of that rule).

The kernel (:mod:`emulate.cpu.gemv`) reads the weight once per call and decodes every
block once for all rows of activations, next to their dot products; it is set by the
weight's stored bytes, where XLA's route (:mod:`emulate.engine.qtiled`) decodes tiles to
float32 and runs XLA:CPU's dot. For few rows of activations (decode steps) the kernel wins
(docs/performance.md, "The CPU kernel"): up to :data:`MAX_ROWS` rows each block is
decoded once for all rows next to their dot products (:mod:`emulate.cpu.gemv`); beyond,
a panel at a time into float32 matrix-multiply micro-kernels (:mod:`emulate.cpu.gemm`,
:func:`many_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from emulate import cpu
from emulate.cpu.form import Form, Orientation, vector_step, weight_form
from emulate.quantized.array import QArray

__all__ = ["MAX_ROWS", "choose", "many_rows"]

#: The most rows of activations (the product of the other operand's free dimensions) the
#: kernel takes: every block of the weight is decoded once for all of them.
MAX_ROWS = 16


def choose(
    q: QArray,
    side: int,
    other_shape: Sequence[int],
    dimension_numbers: tuple,
    other_integer: bool = False,
) -> Form | None:
    """The kernel's form for ``q`` (on ``side``: 0 lhs, 1 rhs) contracted with an operand
    of ``other_shape`` (integers where ``other_integer``), or None where the kernel does
    not take it: numba missing, integer activations (the contract sums integer products
    exactly in int32; the kernel sums in float32), batch dimensions, more than one
    contracting dimension, no rows, more rows than :data:`MAX_ROWS` where the many-rows
    kernel does not take the form (:func:`many_rows`), an empty weight (K or N of 0: XLA's
    route gives its zeros), or a weight without a kernel form
    (:func:`emulate.cpu.form.weight_form`)."""
    (lc, rc), (lb, rb) = dimension_numbers
    if not cpu.available() or other_integer or lb or rb or len(lc) != 1 or 0 in q.shape:
        return None
    qc, oc = (lc[0], rc[0]) if side == 0 else (rc[0], lc[0])
    rows = math.prod(n for d, n in enumerate(other_shape) if d != oc)
    if rows < 1:
        return None
    form = weight_form(q, qc)
    if form is None or (rows > MAX_ROWS and not many_rows(form, q.shape[1 - qc])):
        return None
    return form


def many_rows(form: Form, n: int) -> bool:
    """Whether the many-rows kernel (:mod:`emulate.cpu.gemm`: the weight decoded a panel at
    a time into the float32 micro-kernels) takes ``form`` with ``n`` output columns: codes
    that decode a vector step at a time (:func:`emulate.cpu.form.vector_step`), and for
    layout COLUMNS whole strips of 16 columns."""
    return vector_step(form) and (form.orientation == Orientation.ROWS or n % 16 == 0)
