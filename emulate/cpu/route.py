"""When the CPU kernel takes a contraction: :func:`choose` (the one owner of that rule).

The kernel (:mod:`emulate.cpu.gemv`) reads the weight once per call and decodes every
block next to its dot product; it is set by the weight's stored bytes, where XLA's route
(:mod:`emulate.engine.qtiled`) decodes tiles to float32 and runs XLA:CPU's dot. For few
rows of activations (decode steps) the kernel wins; for many XLA's matrix-matrix dot does
(docs/performance.md, "The CPU kernel"): it takes at most :data:`FEW_ROWS` rows, and up
to :data:`MAX_ROWS` where XLA's route decodes slowly (two-level factors, 4-bit tables).
The kernel decodes the weight once per row of activations, so its time grows with the
rows; XLA's tiles are decoded once per call.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from emulate import cpu
from emulate.cpu.form import Form, Kind, LevelSlots, weight_form
from emulate.quantized.array import QArray

__all__ = ["FEW_ROWS", "MAX_ROWS", "choose", "max_rows"]

#: The most rows of activations (the product of the other operand's free dimensions) the
#: kernel takes for any form. At 4 rows and 4096 x 14336 the kernel and XLA's route were
#: within 20% of each other for the one-level forms (compressed-tensors and Q4_0 faster in
#: the kernel, AWQ, GPTQ and FP8 blocks on XLA's); at 8 rows XLA's route ran AWQ 1.8x
#: faster (benchmarks.qcpu, docs/performance.md, "Fourth pass").
FEW_ROWS = 4
#: The most rows the kernel takes where XLA's route decodes slowly: two-level scales or
#: offsets (the K-quants, bitsandbytes' double quantization) and 4-bit tables (codebooks,
#: float4): at 8 rows the kernel ran Q4_K 3.3x, NF4 2.9x and Q2_K 4.6x faster.
MAX_ROWS = 8


def max_rows(form: Form) -> int:
    """The most rows of activations the kernel takes for ``form``."""
    two_level = isinstance(form.scale, LevelSlots) or isinstance(form.offset, LevelSlots)
    four_bit_table = form.codes.kind == Kind.TABLE and form.codes.bits == 4
    return MAX_ROWS if two_level or four_bit_table else FEW_ROWS


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
    contracting dimension, more rows than :func:`max_rows`, an empty weight (K or N of 0:
    XLA's route gives its zeros), or a weight without a kernel form
    (:func:`emulate.cpu.form.weight_form`)."""
    (lc, rc), (lb, rb) = dimension_numbers
    if not cpu.available() or other_integer or lb or rb or len(lc) != 1 or 0 in q.shape:
        return None
    qc, oc = (lc[0], rc[0]) if side == 0 else (rc[0], lc[0])
    rows = math.prod(n for d, n in enumerate(other_shape) if d != oc)
    if not 1 <= rows <= MAX_ROWS:
        return None
    form = weight_form(q, qc)
    return form if form is not None and rows <= max_rows(form) else None
