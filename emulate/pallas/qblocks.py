"""Scale blocks of several columns in :func:`emulate.pallas.matmul`: FP8 e4m3 weights with
one scale per 128 x 128 block (DeepSeek-V3's ``weight_scale_inv``, compressed-tensors'
"block" strategy, the ``fp8`` quantization config's ``weight_block_size``) and any QArray
of ``(G, C)`` blocks, ``C`` a multiple of 128 columns short of N.

The scales enter the kernel as stored, ``(ceil(K / G), ceil(N / C))``: one block holding
all of them (:func:`spec`: Mosaic takes a block whose last dim is the array's own, and
the index never changes, so Pallas fetches it once per call). No copy is made outside
the kernel: a prepared weight costs the QArray's bytes.

In the kernel (:func:`widen`), a group's row of scales (``(1, ceil(N / C))``, as
:func:`emulate.pallas.qsteps.scale_rows` holds them: f32 factors, or the int32 bits of
float32 and bfloat16 scales) becomes the output block's ``(1, bn)`` row: each slice of
``w = gcd(bn, C)`` lanes (a multiple of 128, inside one block column) takes its block's
factor, picked with a one-hot lane sum (exact: the other lanes add +0, and bits are
summed as integers; NaN and Inf stay in their block, where a one-hot dot would spread them with
``NaN * 0``) and broadcast along the slice. Lanes past the last block column get 0 (their
output columns lie past N, dropped). The group path of :mod:`emulate.pallas.qsteps` then
applies the row as it does a per-column scale row: the numerics are those of ``(G, 1)``
groups (each group's partial sum in f32 times its scale, added in f32).

Not built (refused by :func:`emulate.pallas.qweight.split`): blocks of a width that is not
a multiple of 128 columns, and zero points or offsets with column blocks.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["LANES", "spec", "widen"]

#: Column blocks must be a multiple of this many columns (the lane width).
LANES = 128


def spec(shape: tuple[int, int]) -> Any:
    """The BlockSpec of the whole ``(rows, columns)`` scale array: one block, index (0, 0)."""
    from jax.experimental import pallas as pl  # noqa: PLC0415 - kernel-side only

    return pl.BlockSpec(tuple(shape), lambda i, j, k: (0, 0))


def widen(row: jax.Array, columns: int, bn: int, j: Any) -> jax.Array:
    """In the kernel: ``row`` (R, B) of one scale per block column (f32 or int32 bits), as
    the (R, bn) rows of output block ``j`` (dynamic) of ``bn`` columns: lane ``c`` takes
    block column ``(j * bn + c) // columns`` (0 past the last one). ``columns`` and
    ``bn``: multiples of 128."""
    r, b = row.shape
    width = math.gcd(bn, columns)
    lane = lax.broadcasted_iota(jnp.int32, (r, b), 1)
    zero = jnp.zeros((), row.dtype)
    pieces = []
    for s in range(bn // width):
        at = (j * bn + s * width) // columns
        col = jnp.sum(jnp.where(lane == at, row, zero), axis=1, keepdims=True)
        pieces.append(jnp.broadcast_to(col, (r, width)))
    return pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces, axis=1)
