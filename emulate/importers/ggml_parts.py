"""GGML quantized tensors as parts in logical element order: the records, the block table
and the bit-field readers shared by the block parsers.

A GGML tensor stores its rows along the last axis, each row a sequence of blocks of
``block_size`` elements in ``type_size`` bytes (:data:`BLOCKS`). The parsers in
``ggml_legacy``, ``ggml_kquants`` and ``ggml_iq`` undo each type's element order and
return a :class:`GGMLParts`: one uint8 code per element in logical order, and the block
scales, offsets and tables exactly as stored. Element ``i`` of the tensor stands for::

    W[i] = (value(codes[i]) - zero_point) * scale[block(i)] + offset[block(i)]

where ``value`` reads the code as ``element`` (``int8`` as two's complement, ``uintN`` as
unsigned, ``float4_e2m1fn`` as OCP e2m1) or, when ``codebook`` is given, as
``codebook[code]``. ``scale`` and ``offset`` are per block of ``block`` elements along the
last axis; a :class:`SubBlockScales` stands for its own formula (two-level scales). Pure
numpy; nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = [
    "BLOCKS",
    "GGMLParts",
    "SubBlockScales",
    "bit_planes",
    "crumbs",
    "element_bits",
    "f16_at",
    "split_nibbles",
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
_SCALE_BITS = {"float16": 16, "e8m0": 8}


def element_bits(element: str) -> int:
    """Bits of one code of ``element`` (``"uint2"`` ... ``"int8"``, ``"float4_e2m1fn"``)."""
    return _ELEMENT_BITS[element]


@dataclasses.dataclass(frozen=True, eq=False)
class SubBlockScales:
    """Two-level scales (or offsets) of a K-quant or IQ4_XS tensor, as stored.

    Sub-block ``j`` of a row has the scale ``(value(codes[j]) - zero_point) *
    super_scales[j // block]``, computed in float32 (exact: an f16 times an integer of at
    most 8 bits).

    Attributes:
      codes: uint8, shape ``(*rows, n_sub)``: one code per sub-block, ``element`` bits
        (``int8``: two's complement, Q6_K).
      element: ``"uint4"``, ``"uint6"`` or ``"int8"``.
      zero_point: subtracted from each code (32 for Q3_K's and IQ4_XS's 6-bit scales).
      super_scales: float16, shape ``(*rows, n_sub // block)``: the super-block's ``d``,
        or ``-dmin`` for the mins of Q2_K, Q4_K and Q5_K (negating an f16 is exact, so the
        offset is added like every other offset).
      block: sub-blocks per super-block (16 or 8).
    """

    codes: np.ndarray
    element: str
    zero_point: int
    super_scales: np.ndarray
    block: int

    @property
    def bits_per_scale(self) -> float:
        """Stored bits per sub-block: the code plus its share of the f16 super scale."""
        return element_bits(self.element) + 16 / self.block


@dataclasses.dataclass(frozen=True, eq=False)
class GGMLParts:
    """One GGML tensor's stored parts in logical element order (see the module docstring).

    Attributes:
      name: the tensor's name (used in error messages).
      ggml_type: the GGML type name (a key of :data:`BLOCKS`).
      shape: the logical numpy shape (GGUF's dims reversed); rows along the last axis.
      codes: uint8, ``shape``: one code per element, ``element`` bits wide.
      element: the codes' format: ``"uint2"``, ``"uint3"``, ``"uint4"``, ``"uint5"``,
        ``"uint6"``, ``"int8"`` or ``"float4_e2m1fn"``.
      zero_point: the implicit offset of unsigned codes (Q4_0: 8, Q5_0: 16, Q6_K: 32,
        Q3_K: 4), else 0.
      block: elements per scale (and offset) along the last axis.
      scales: per block along the last axis, shape ``(*shape[:-1], shape[-1] // block)``:
        float16 (``scale_format == "float16"``), uint8 exponent bytes (``"e8m0"``: the
        scale is ``2**(byte - 127)`` for every byte, 255 included, as ggml reads it), or
        a :class:`SubBlockScales` (``"two_level"``).
      scale_format: ``"float16"``, ``"e8m0"`` or ``"two_level"``.
      offsets: None, float16 per block (Q4_1, Q5_1: ``m``), or a :class:`SubBlockScales`
        (Q2_K, Q4_K, Q5_K: ``-dmin * m``), added after scaling.
      codebook: None, or the int8 table that ``value`` reads codes through (IQ4_NL,
        IQ4_XS: ggml's ``kvalues_iq4nl``).
    """

    name: str
    ggml_type: str
    shape: tuple[int, ...]
    codes: np.ndarray
    element: str
    zero_point: int
    block: int
    scales: np.ndarray | SubBlockScales
    scale_format: str
    offsets: np.ndarray | SubBlockScales | None = None
    codebook: np.ndarray | None = None

    @property
    def bits_per_element(self) -> float:
        """Bits an element when codes, scales and offsets are packed densely (the tables
        and the zero point, one per tensor, are not counted)."""
        bits = element_bits(self.element) + _bits_per_scale(self.scales, self.scale_format) / (
            self.block
        )
        if self.offsets is not None:
            bits += _bits_per_scale(self.offsets, "float16") / self.block
        return bits

    def __repr__(self) -> str:
        return (
            f"GGMLParts({self.name!r}, {self.ggml_type}, shape={self.shape}, "
            f"{self.bits_per_element:g} bits/element)"
        )


def _bits_per_scale(part: np.ndarray | SubBlockScales, scale_format: str) -> float:
    if isinstance(part, SubBlockScales):
        return part.bits_per_scale
    return _SCALE_BITS[scale_format]


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
