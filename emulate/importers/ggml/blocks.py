"""GGML quantized tensors as :class:`~emulate.importers.stored.StoredParts`: the block
table, the builders of the record for GGML's layouts, and the bit-field readers shared by
the block parsers.

A GGML tensor stores its rows along the last axis, each row a sequence of blocks of
``block_size`` elements in ``type_size`` bytes (:data:`BLOCKS`). The parsers in
``legacy``, ``kquants`` and ``iq`` undo each type's element order and
return the record through :func:`ggml_parts`: one uint8 code per element in logical
order, the block scales, offsets and tables exactly as stored, blocks along the last axis
(``k_axis = -1``), and the value ggml's own decoder returns (float32). Two-level scales
and mins (the K-quants, IQ4_XS) are nested records (:func:`sub_block_scales`): a small
integer code per sub-block times the super-block's float16, computed in float32 (exact:
an f16 times an integer of at most 8 bits). Pure numpy; nothing here imports JAX.
"""

from __future__ import annotations

import numpy as np

from emulate.importers.stored import StoredParts

__all__ = [
    "BLOCKS",
    "bit_planes",
    "crumbs",
    "element_bits",
    "f16_at",
    "ggml_parts",
    "split_nibbles",
    "sub_block_scales",
]

#: GGML type name -> (elements per block, bytes per block), for the types emulate reads.
BLOCKS: dict[str, tuple[int, int]] = {
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "Q2_K": (256, 84),
    "Q3_K": (256, 110),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
    "IQ4_NL": (32, 18),
    "IQ4_XS": (256, 136),
    "MXFP4": (32, 17),
}

_ELEMENT_BITS = {
    "uint2": 2,
    "uint3": 3,
    "uint4": 4,
    "uint5": 5,
    "uint6": 6,
    "int8": 8,
    "float4_e2m1fn": 4,
}


def element_bits(element: str) -> int:
    """Bits of one code of ``element`` (``"uint2"`` ... ``"int8"``, ``"float4_e2m1fn"``)."""
    return _ELEMENT_BITS[element]


def sub_block_scales(
    codes: np.ndarray, element: str, super_scales: np.ndarray, zero_point: int = 0
) -> StoredParts:
    """Two-level scales (or offsets) of a K-quant or IQ4_XS tensor, block-major, as stored.

    Sub-block ``j`` of a super-block has the scale ``(value(codes[:, j]) - zero_point) *
    super_scales``.

    Args:
      codes: uint8 ``(n_blocks, n_sub)``: one code per sub-block, ``element`` bits
        (``int8``: two's complement, Q6_K).
      element: ``"uint4"``, ``"uint6"`` or ``"int8"``.
      super_scales: float16 ``(n_blocks, 1)``: the super-block's ``d``, or ``-dmin`` for
        the mins of Q2_K, Q4_K and Q5_K (negating an f16 is exact, so the offset is added
        like every other offset).
      zero_point: subtracted from each code (32 for Q3_K's and IQ4_XS's 6-bit scales).
    """
    bits = element_bits(element)
    return StoredParts(
        codes=np.ascontiguousarray(codes),
        fmt=element,
        bits=bits,
        block_shape=(1, codes.shape[1]),
        scales=super_scales,
        dtype="float32",
        source=f"{element} sub-block codes times the super-block's float16",
        stored_bits=codes.size * bits + super_scales.size * 16,
        zero_points=zero_point or None,
        k_axis=-1,
    )


def ggml_parts(
    blocks: np.ndarray,
    name: str,
    ggml_type: str,
    codes: np.ndarray,
    element: str,
    scales: np.ndarray | StoredParts,
    *,
    zero_point: int = 0,
    offsets: np.ndarray | StoredParts | None = None,
    codebook: np.ndarray | None = None,
) -> StoredParts:
    """The record of one GGML tensor, block-major (``emulate.importers.ggml`` reshapes it
    to the tensor's rows).

    Args:
      blocks: the tensor's blocks, uint8 ``(n_blocks, type_size)`` (their bits are the
        file's).
      name: the tensor's name. ggml_type: a key of :data:`BLOCKS`.
      codes: uint8 ``(n_blocks, block_size)``, one code per element, ``element`` bits:
        ``"uint2"`` ... ``"uint6"``, ``"int8"`` or ``"float4_e2m1fn"``.
      scales: per block of elements, ``(n_blocks, block_size // block)``: float16,
        float8_e8m0fnu (MXFP4: ``2**(byte - 127)``; byte 255 is ``2**128`` to ggml), or
        :func:`sub_block_scales`.
      zero_point: the implicit offset of unsigned codes (Q4_0: 8, Q5_0: 16, Q6_K: 32,
        Q3_K: 4), else 0.
      offsets: None, float16 per block (Q4_1, Q5_1: ``m``), or :func:`sub_block_scales`
        (Q2_K, Q4_K, Q5_K: ``-dmin * m``), added after scaling.
      codebook: None, or the int8 table the codes index (IQ4_NL, IQ4_XS).
    """
    return StoredParts(
        codes=codes,
        fmt=element,
        bits=element_bits(element),
        block_shape=(1, codes.shape[1] // scales.shape[1]),
        scales=scales,
        dtype="float32",
        source=f"GGUF {ggml_type}: {name}",
        stored_bits=blocks.size * 8,
        zero_points=zero_point or None,
        offsets=offsets,
        codebook=codebook,
        k_axis=-1,
        name=name,
    )


def f16_at(blocks: np.ndarray, start: int) -> np.ndarray:
    """The little-endian float16 at byte ``start`` of each block: shape ``(n_blocks, 1)``."""
    return np.ascontiguousarray(blocks[:, start : start + 2]).view("<f2").astype(np.float16)


def split_nibbles(qs: np.ndarray, group: int) -> np.ndarray:
    """4-bit codes of ggml's split-halves order: each run of ``group`` bytes holds
    ``2 * group`` elements, the low nibbles the first ``group``, the high nibbles the rest.
    ``qs``: uint8 ``(n_blocks, n_bytes)``; returns ``(n_blocks, 2 * n_bytes)``."""
    runs = qs.reshape(qs.shape[0], -1, 1, group)
    return np.concatenate([runs & 0x0F, runs >> 4], axis=2).reshape(qs.shape[0], -1)


def crumbs(qs: np.ndarray, group: int) -> np.ndarray:
    """2-bit fields in ggml's order: each run of ``group`` bytes holds ``4 * group``
    elements, bits 0-1 of every byte first, then bits 2-3, 4-5 and 6-7.
    ``qs``: uint8 ``(n_blocks, n_bytes)``; returns ``(n_blocks, 4 * n_bytes)``."""
    runs = qs.reshape(qs.shape[0], -1, 1, group)
    shifts = np.arange(0, 8, 2, dtype=np.uint8).reshape(1, 1, 4, 1)
    return ((runs >> shifts) & 0x03).reshape(qs.shape[0], -1)


def bit_planes(qh: np.ndarray, group: int) -> np.ndarray:
    """1-bit fields in ggml's plane order: each run of ``group`` bytes holds ``8 * group``
    elements, bit ``b`` of byte ``j`` being element ``b * group + j``.
    ``qh``: uint8 ``(n_blocks, n_bytes)``; returns ``(n_blocks, 8 * n_bytes)``."""
    runs = qh.reshape(qh.shape[0], -1, 1, group)
    shifts = np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
    return ((runs >> shifts) & 0x01).reshape(qh.shape[0], -1)
