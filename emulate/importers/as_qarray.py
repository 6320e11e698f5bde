"""Stored parts as an ``emulate.QArray``, kept as stored (issue 24's representation).

:func:`to_qarray` hands a :class:`~emulate.importers.conventions.parts.StoredParts` to
``QArray.from_parts``: codes of fewer than 8 bits packed densely along the contraction
axis (``emulate.pack``), scales in their stored dtype (a nested StoredParts becomes a
nested QArray: bitsandbytes' double-quantized absmax), zero points (packed at their stored
width along N where it holds them), offsets, the codebook, the tensor scale and the act-order
permutation as they are. Written against the agreed representation
(``QArray.from_parts(..., zero_points=, offsets=, codebook=, perm=, perm_axis=)``), which
the quantized-operand layer provides.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from emulate.importers.conventions.parts import StoredParts
from emulate.numerics.storage import pack
from emulate.quant import QArray

__all__ = ["to_qarray"]

#: The contraction axis of a logical ``(..., K, N)`` weight: codes pack along it.
PACK_AXIS = -2
#: Zero points (one per block, ``(..., K / group, N)``) pack along N, as AutoAWQ and GPTQ
#: store them: a split along K at block boundaries then never cuts a byte (one group per
#: device is a split AWQ g128 weights allow), and N is long enough to split anyway.
ZERO_POINT_AXIS = -1


def _codes(parts: StoredParts) -> Any:
    if parts.bits >= 8:
        return jnp.asarray(parts.codes)
    return pack(parts.codes, parts.fmt, axis=PACK_AXIS)


def _zero_points(parts: StoredParts) -> Any:
    z = parts.zero_points
    if z is None or isinstance(z, int):
        return z
    z = np.asarray(z)
    if parts.zero_bits < 8 and z.max(initial=0) < (1 << parts.zero_bits):
        return pack(z.astype(np.uint8), f"uint{parts.zero_bits}", axis=ZERO_POINT_AXIS)
    return jnp.asarray(z)


def to_qarray(parts: StoredParts) -> QArray:
    """``parts`` as a QArray of the same logical shape, dtype and meaning."""
    scales: Any = (
        to_qarray(parts.scales)
        if isinstance(parts.scales, StoredParts)
        else jnp.asarray(parts.scales)
    )
    return QArray.from_parts(
        _codes(parts),
        scales,
        block_shape=parts.block_shape,
        fmt=parts.fmt,
        tensor_scale=None if parts.tensor_scale is None else jnp.float32(parts.tensor_scale),
        dtype=parts.dtype,
        zero_points=_zero_points(parts),
        offsets=None if parts.offsets is None else jnp.asarray(parts.offsets),
        codebook=None if parts.codebook is None else jnp.asarray(parts.codebook),
        perm=None if parts.perm is None else jnp.asarray(parts.perm, jnp.int32),
        perm_axis=parts.perm_axis,
    )
