"""Which contractions the CPU kernel takes: :func:`kernel_form` (the one owner of that rule;
:func:`emulate.routing.choose` asks it for a CPU target, beside the route setting).

The kernel reads the weight once per call, as stored; XLA's route
(:mod:`emulate.engine.qtiled`) decodes tiles to float32 and runs XLA:CPU's dot. Up to
:data:`MAX_ROWS` rows of activations each block of the weight is decoded once for all
rows, next to their dot products (:mod:`emulate.cpu.gemv`); beyond, a panel at a time
into float32 matrix-multiply micro-kernels (:mod:`emulate.cpu.gemm`, :func:`many_rows`).
Integer activations stay off the kernel: the contract sums integer x integer exactly in
int32, the kernel sums in float32.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from emulate import cpu, moved
from emulate.cpu.form import Form, Orientation, vector_step, weight_form
from emulate.quantized.array import QArray

__all__ = ["MAX_ROWS", "kernel_form", "many_rows", "max_rows"]

#: The most rows of activations (the product of the other operand's free dimensions) the
#: few-rows kernel takes: every block of the weight is decoded once for all of them.
MAX_ROWS = 16


def kernel_form(
    q: QArray,
    side: int,
    other_shape: Sequence[int],
    dimension_numbers: tuple,
    other_integer: bool = False,
) -> Form | str:
    """The kernel's form for ``q`` (on ``side``: 0 lhs, 1 rhs) contracted with an operand
    of ``other_shape`` (integers where ``other_integer``), or why the kernel does not take
    it (a str): no numba compiler (:func:`emulate.cpu.unavailable`), integer
    activations, batch dimensions, more than one contracting dimension, an empty weight (K
    or N of 0: XLA's route gives its zeros), no rows, a weight without a kernel form
    (:func:`emulate.cpu.form.weight_form`), or more rows than :data:`MAX_ROWS` where the
    many-rows kernel does not take the form (:func:`many_rows`)."""
    (lc, rc), (lb, rb) = dimension_numbers
    why = cpu.unavailable()
    if why is not None:
        return why
    if other_integer:
        return (
            "integer activations: the contract sums integer x integer exactly in int32, "
            "the CPU kernel in float32"
        )
    if lb or rb:
        return "batch dimensions: the CPU kernel multiplies one 2-D weight"
    if len(lc) != 1:
        return f"{len(lc)} contracting dimensions: the CPU kernel contracts one"
    if 0 in q.shape:
        return f"an empty weight (shape {tuple(q.shape)}): XLA's route gives its zeros"
    qc, oc = (lc[0], rc[0]) if side == 0 else (rc[0], lc[0])
    rows = math.prod(n for d, n in enumerate(other_shape) if d != oc)
    if rows < 1:
        return f"{rows} rows of activations: the CPU kernel takes at least 1"
    form = weight_form(q, qc)
    if form is None:
        return (
            "a weight the CPU kernel has no form for (emulate.cpu.form.weight_form: "
            "stacked or act-order, packed along N, wider than a byte, float codes or "
            "codebooks without table lookups in registers, parts it cannot read)"
        )
    if rows > MAX_ROWS and not many_rows(form, q.shape[1 - qc]):
        return (
            f"{rows} rows of activations: the CPU kernel takes 1 to {MAX_ROWS} for this "
            "weight (more where its codes decode a vector step at a time and, stored (K, "
            "N), N is a multiple of 16)"
        )
    return form


def max_rows(form: Form) -> int:
    """The most rows of activations the few-rows kernel takes for ``form``: :data:`MAX_ROWS`
    for every form since issue 50 (more rows: :func:`many_rows`). Kept for code written
    against the docs that named it."""
    return MAX_ROWS


def many_rows(form: Form, n: int) -> bool:
    """Whether the many-rows kernel (:mod:`emulate.cpu.gemm`: the weight decoded a panel at
    a time into the float32 micro-kernels) takes ``form`` with ``n`` output columns: codes
    that decode a vector step at a time (:func:`emulate.cpu.form.vector_step`), and for
    layout COLUMNS whole strips of 16 columns."""
    return vector_step(form) and (form.orientation == Orientation.ROWS or n % 16 == 0)


__getattr__ = moved.module_getattr(__name__)
