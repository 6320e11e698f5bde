"""ggml's legacy 32-element blocks: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0.

Each parser takes the blocks of a tensor, uint8 ``(n_blocks, type_size)``, and returns a
:class:`~emulate.importers.stored.StoredParts` of shape ``(n_blocks, 32)``
(``emulate.importers.ggml`` reshapes it to the tensor's rows). Block layouts (ggml's
``block_q4_0`` ... ``block_q8_0``), all scales little-endian float16:

- Q4_0 ``d, qs[16]``: ``W = d * (q - 8)``; byte ``j`` of ``qs`` holds element ``j`` in its
  low nibble and element ``j + 16`` in its high nibble (split halves).
- Q4_1 ``d, m, qs[16]``: ``W = d * q + m``, same nibble order.
- Q5_0 ``d, qh[4], qs[16]``: ``W = d * (q - 16)``; the low four bits as Q4_0, the fifth
  bit of element ``i`` is bit ``i`` of the little-endian 32-bit word ``qh``.
- Q5_1 ``d, m, qh[4], qs[16]``: ``W = d * q + m``, bits as Q5_0.
- Q8_0 ``d, qs[32]``: ``W = d * q``, ``q`` int8 in element order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from emulate.importers.ggml.blocks import f16_at, ggml_parts, split_nibbles
from emulate.importers.stored import StoredParts

__all__ = ["parse_q4_0", "parse_q4_1", "parse_q5_0", "parse_q5_1", "parse_q8_0"]


def _parts(
    blocks: np.ndarray, name: str, ggml_type: str, codes: np.ndarray, element: str, **fields: Any
) -> StoredParts:
    return ggml_parts(blocks, name, ggml_type, codes, element, **fields)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """Bit ``i`` of each block's little-endian 32-bit word, for ``i`` in 0..31."""
    return np.unpackbits(qh, axis=1, bitorder="little")


def parse_q4_0(blocks: np.ndarray, name: str) -> StoredParts:
    """Q4_0: uint4 codes with zero point 8, one f16 scale per 32 elements."""
    codes = split_nibbles(blocks[:, 2:18], 16)
    return _parts(blocks, name, "Q4_0", codes, "uint4", zero_point=8, scales=f16_at(blocks, 0))


def parse_q4_1(blocks: np.ndarray, name: str) -> StoredParts:
    """Q4_1: uint4 codes, an f16 scale and an f16 offset (``m``) per 32 elements."""
    codes = split_nibbles(blocks[:, 4:20], 16)
    return _parts(
        blocks,
        name,
        "Q4_1",
        codes,
        "uint4",
        zero_point=0,
        scales=f16_at(blocks, 0),
        offsets=f16_at(blocks, 2),
    )


def parse_q5_0(blocks: np.ndarray, name: str) -> StoredParts:
    """Q5_0: uint5 codes with zero point 16, one f16 scale per 32 elements."""
    codes = split_nibbles(blocks[:, 6:22], 16) | (_fifth_bits(blocks[:, 2:6]) << 4)
    return _parts(blocks, name, "Q5_0", codes, "uint5", zero_point=16, scales=f16_at(blocks, 0))


def parse_q5_1(blocks: np.ndarray, name: str) -> StoredParts:
    """Q5_1: uint5 codes, an f16 scale and an f16 offset (``m``) per 32 elements."""
    codes = split_nibbles(blocks[:, 8:24], 16) | (_fifth_bits(blocks[:, 4:8]) << 4)
    return _parts(
        blocks,
        name,
        "Q5_1",
        codes,
        "uint5",
        zero_point=0,
        scales=f16_at(blocks, 0),
        offsets=f16_at(blocks, 2),
    )


def parse_q8_0(blocks: np.ndarray, name: str) -> StoredParts:
    """Q8_0: int8 codes (two's complement in the uint8 array), one f16 scale per 32."""
    codes = np.ascontiguousarray(blocks[:, 2:34])
    return _parts(blocks, name, "Q8_0", codes, "int8", zero_point=0, scales=f16_at(blocks, 0))
