"""ggml's K-quants: 256-element super-blocks with integer sub-block scales (Q2_K ... Q6_K).

Each parser takes the blocks of a tensor, uint8 ``(n_blocks, type_size)``, and returns a
:class:`~emulate.importers.stored.StoredParts` of shape ``(n_blocks, 256)`` whose
scales (and offsets) are two-level (``blocks.sub_block_scales``): a small integer per
sub-block times the super-block's float16.
Block layouts (ggml's ``block_q2_K`` ... ``block_q6_K``; ``d``, ``dmin`` little-endian
float16), with ``s``, ``m`` the sub-block's scale and min codes:

- Q2_K ``scales[16], qs[64], d, dmin``: 16 sub-blocks of 16; ``W = d*s*q - dmin*m`` with
  ``s`` the low and ``m`` the high nibble of ``scales[j]``; ``q`` 2-bit, four per byte:
  within each half of ``qs`` (32 bytes, 128 elements), bits ``2t..2t+1`` of byte ``j``
  are element ``32t + j``.
- Q3_K ``hmask[32], qs[64], scales[12], d``: 16 sub-blocks of 16;
  ``W = d*(s - 32)*(q - 4)`` with ``q = low2 | high << 2`` (uint3): the low two bits as
  Q2_K's, the third bit of element ``32b + j`` is bit ``b`` of ``hmask[j]``. The 6-bit
  ``s``: the low nibble of ``scales[i]`` is sub-block ``i``, its high nibble sub-block
  ``i + 8`` (``i < 8``); bits ``2t..2t+1`` of ``scales[8 + i]`` are the two high bits of
  sub-block ``4t + i``.
- Q4_K ``d, dmin, scales[12], qs[128]``: 8 sub-blocks of 32; ``W = d*s*q - dmin*m``,
  ``q`` 4-bit in split halves per 32 bytes (low nibbles elements ``64c .. 64c+31``, high
  nibbles the next 32). The 6-bit ``s`` and ``m`` of sub-blocks 0-3 are the low six bits
  of ``scales[0:4]`` and ``scales[4:8]``; of sub-blocks 4-7 the nibbles of
  ``scales[8:12]`` (low: ``s``, high: ``m``) under the top two bits of ``scales[0:4]``
  (``s``) and ``scales[4:8]`` (``m``).
- Q5_K ``d, dmin, scales[12], qh[32], qs[128]``: as Q4_K with a fifth bit: element
  ``32b + j``'s is bit ``b`` of ``qh[j]``.
- Q6_K ``ql[128], qh[64], scales[16], d``: 16 sub-blocks of 16; ``W = d*s*(q - 32)``, ``s``
  int8; each half (128 elements) takes 64 bytes of ``ql`` (split halves of 64) for the low
  four bits and 32 bytes of ``qh`` (2-bit fields as Q2_K's) for the high two.
"""

from __future__ import annotations

import numpy as np

from emulate.importers.ggml.blocks import (
    bit_planes,
    crumbs,
    f16_at,
    ggml_parts,
    split_nibbles,
    sub_block_scales,
)
from emulate.importers.stored import StoredParts

__all__ = ["parse_q2_k", "parse_q3_k", "parse_q4_k", "parse_q5_k", "parse_q6_k"]


def _parts(
    blocks: np.ndarray,
    name: str,
    ggml_type: str,
    codes: np.ndarray,
    element: str,
    scales: StoredParts,
    offsets: StoredParts | None = None,
    zero_point: int = 0,
) -> StoredParts:
    return ggml_parts(
        blocks, name, ggml_type, codes, element, scales, zero_point=zero_point, offsets=offsets
    )


def k_scale_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit sub-block scales and mins of Q4_K/Q5_K from their 12 bytes.

    ``packed``: uint8 ``(n_blocks, 12)``; returns two uint8 ``(n_blocks, 8)`` arrays.
    """
    low_s, low_m, nibbles = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([low_s & 0x3F, (nibbles & 0x0F) | ((low_s >> 6) << 4)], axis=1)
    mins = np.concatenate([low_m & 0x3F, (nibbles >> 4) | ((low_m >> 6) << 4)], axis=1)
    return scales, mins


def _negated(x: np.ndarray) -> np.ndarray:
    # Flipping the f16 sign bit: exact, and NaN stays NaN.
    return (x.view(np.uint16) ^ np.uint16(0x8000)).view(np.float16)


def parse_q2_k(blocks: np.ndarray, name: str) -> StoredParts:
    """Q2_K: uint2 codes; uint4 sub-block scales times ``d``, mins times ``-dmin``."""
    packed = blocks[:, 0:16]
    codes = crumbs(blocks[:, 16:80], 32)
    scales = sub_block_scales(packed & 0x0F, "uint4", f16_at(blocks, 80))
    offsets = sub_block_scales(packed >> 4, "uint4", _negated(f16_at(blocks, 82)))
    return _parts(blocks, name, "Q2_K", codes, "uint2", scales, offsets)


def parse_q3_k(blocks: np.ndarray, name: str) -> StoredParts:
    """Q3_K: uint3 codes with zero point 4; uint6 sub-block scales (zero point 32) times
    ``d``."""
    low = crumbs(blocks[:, 32:96], 32)
    high = bit_planes(blocks[:, 0:32], 32)
    codes = low | (high << 2)
    packed = blocks[:, 96:108]
    sub = split_nibbles(packed[:, 0:8], 8) | (crumbs(packed[:, 8:12], 4) << 4)
    scales = sub_block_scales(sub, "uint6", f16_at(blocks, 108), 32)
    return _parts(blocks, name, "Q3_K", codes, "uint3", scales, zero_point=4)


def parse_q4_k(blocks: np.ndarray, name: str) -> StoredParts:
    """Q4_K: uint4 codes; uint6 sub-block scales times ``d``, mins times ``-dmin``."""
    s, m = k_scale_mins(blocks[:, 4:16])
    codes = split_nibbles(blocks[:, 16:144], 32)
    scales = sub_block_scales(s, "uint6", f16_at(blocks, 0))
    offsets = sub_block_scales(m, "uint6", _negated(f16_at(blocks, 2)))
    return _parts(blocks, name, "Q4_K", codes, "uint4", scales, offsets)


def parse_q5_k(blocks: np.ndarray, name: str) -> StoredParts:
    """Q5_K: uint5 codes; uint6 sub-block scales times ``d``, mins times ``-dmin``."""
    s, m = k_scale_mins(blocks[:, 4:16])
    codes = split_nibbles(blocks[:, 48:176], 32) | (bit_planes(blocks[:, 16:48], 32) << 4)
    scales = sub_block_scales(s, "uint6", f16_at(blocks, 0))
    offsets = sub_block_scales(m, "uint6", _negated(f16_at(blocks, 2)))
    return _parts(blocks, name, "Q5_K", codes, "uint5", scales, offsets)


def parse_q6_k(blocks: np.ndarray, name: str) -> StoredParts:
    """Q6_K: uint6 codes with zero point 32; int8 sub-block scales times ``d``."""
    codes = split_nibbles(blocks[:, 0:128], 64) | (crumbs(blocks[:, 128:192], 32) << 4)
    scales = sub_block_scales(blocks[:, 192:208], "int8", f16_at(blocks, 208))
    return _parts(blocks, name, "Q6_K", codes, "uint6", scales, zero_point=32)
