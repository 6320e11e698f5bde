"""When the CPU kernel takes a contraction: :func:`choose` (the one owner of that rule).

The kernel (:mod:`emulate.cpu.gemv`) reads the weight once per call and decodes every
block next to its dot product; it is set by the weight's stored bytes, where XLA's route
(:mod:`emulate.engine.qtiled`) decodes tiles to float32 and runs XLA:CPU's dot. For few
rows of activations (decode steps) the kernel wins; for many XLA's matrix-matrix dot does
(docs/performance.md, "The CPU kernel"): it takes at most :data:`MAX_ROWS` rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from emulate import cpu
from emulate.cpu.form import Form, weight_form
from emulate.quantized.array import QArray

__all__ = ["MAX_ROWS", "choose"]

#: The most rows of activations (the product of the other operand's free dimensions) the
#: kernel takes.
MAX_ROWS = 8


def choose(
    q: QArray, side: int, other_shape: Sequence[int], dimension_numbers: tuple
) -> Form | None:
    """The kernel's form for ``q`` (on ``side``: 0 lhs, 1 rhs) contracted with an operand
    of ``other_shape``, or None where the kernel does not take it: numba missing, batch
    dimensions, more than one contracting dimension, more than :data:`MAX_ROWS` rows, or
    a weight without a kernel form (:func:`emulate.cpu.form.weight_form`)."""
    (lc, rc), (lb, rb) = dimension_numbers
    if not cpu.available() or lb or rb or len(lc) != 1:
        return None
    qc, oc = (lc[0], rc[0]) if side == 0 else (rc[0], lc[0])
    rows = math.prod(n for d, n in enumerate(other_shape) if d != oc)
    if not 1 <= rows <= MAX_ROWS:
        return None
    return weight_form(q, qc)
