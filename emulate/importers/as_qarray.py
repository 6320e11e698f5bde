"""Stored parts as an ``emulate.QArray``, kept as stored (issue 24's representation): the
one conversion of every importer's record (GGUF's and the safetensors conventions').

:func:`to_qarray` hands a :class:`~emulate.importers.stored.StoredParts` to
``QArray.from_parts``: codes of fewer than 8 bits packed densely along the contraction
axis (``emulate.pack``, axis ``k_axis``), int8 codes as int8, scales in their stored dtype
(a nested StoredParts becomes a nested QArray: GGUF's two-level scales and mins,
bitsandbytes' double-quantized absmax), zero points (packed at their stored width along N
where it holds them), offsets, the codebook, the tensor scale and the act-order
permutation as they are. Written against the agreed representation
(``QArray.from_parts(..., zero_points=, offsets=, codebook=, perm=, perm_axis=)``), which
the quantized-operand layer provides.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from emulate.importers.stored import StoredParts
from emulate.numerics.storage import pack
from emulate.quantized.array import QArray

__all__ = ["to_qarray"]


def _codes(parts: StoredParts) -> Any:
    """Codes as a QArray holds them: int8 as an int8 array, other byte-wide ones as their
    uint8 codes, narrower ones packed densely along the contraction axis."""
    if parts.fmt == "int8":
        return jnp.asarray(parts.codes.view(np.int8))
    if parts.bits >= 8:
        return jnp.asarray(parts.codes)
    return pack(parts.codes, parts.fmt, axis=parts.k_axis)


def _zero_points(parts: StoredParts) -> Any:
    """Per-block zero points packed at their stored width along N (the other of the last
    two axes), as AutoAWQ and GPTQ store them: a split along K at block boundaries then
    never cuts a byte (one group per device is a split AWQ g128 weights allow), and N is
    long enough to split anyway."""
    z = parts.zero_points
    if z is None or isinstance(z, int):
        return z
    z = np.asarray(z)
    if parts.zero_bits < 8 and z.max(initial=0) < (1 << parts.zero_bits):
        axis = -1 if parts.k_axis == -2 else -2
        return pack(z.astype(np.uint8), f"uint{parts.zero_bits}", axis=axis)
    return jnp.asarray(z)


def _per_block(part: Any) -> Any:
    """Scales or offsets: a nested record as a QArray (two-level), an array as it is."""
    if part is None:
        return None
    return to_qarray(part) if isinstance(part, StoredParts) else jnp.asarray(part)


def to_qarray(parts: StoredParts) -> QArray:
    """``parts`` as a QArray of the same logical shape, dtype and meaning."""
    return QArray.from_parts(
        _codes(parts),
        _per_block(parts.scales),
        block_shape=parts.block_shape,
        fmt=parts.fmt,
        tensor_scale=None if parts.tensor_scale is None else jnp.float32(parts.tensor_scale),
        dtype=parts.dtype,
        zero_points=_zero_points(parts),
        offsets=_per_block(parts.offsets),
        codebook=None if parts.codebook is None else jnp.asarray(parts.codebook),
        perm=None if parts.perm is None else jnp.asarray(parts.perm, jnp.int32),
        perm_axis=parts.perm_axis,
    )
