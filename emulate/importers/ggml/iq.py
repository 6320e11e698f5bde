"""ggml's codebook and MX blocks: IQ4_NL, IQ4_XS and MXFP4.

Each parser takes the blocks of a tensor, uint8 ``(n_blocks, type_size)``, and returns a
:class:`~emulate.importers.stored.StoredParts` of shape ``(n_blocks, block_size)``. Block
layouts (ggml's ``block_iq4_nl``, ``block_iq4_xs``, ``block_mxfp4``; ``d`` little-endian
float16):

- IQ4_NL ``d, qs[16]``: ``W = d * KVALUES_IQ4NL[q]``, ``q`` 4-bit in split halves (as
  Q4_0).
- IQ4_XS ``d, scales_h (uint16), scales_l[4], qs[128]``: 8 sub-blocks of 32;
  ``W = d * (s - 32) * KVALUES_IQ4NL[q]`` with the 6-bit ``s`` of sub-block ``j`` made of
  nibble ``j % 2`` of ``scales_l[j // 2]`` (low first) and bits ``2j..2j+1`` of the
  little-endian ``scales_h``; ``q`` in split halves per 16 bytes.
- MXFP4 ``e, qs[16]``: ggml reads ``q`` (split halves) through a table of doubled e2m1
  values and ``e`` as half of ``2**(e - 127)``; the product is the OCP value
  ``e2m1(q) * 2**(e - 127)``, so the parts keep ``q`` as e2m1 codes and ``e`` as an
  e8m0 byte. ggml has no NaN scale: byte 255 means ``2**128`` there.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from emulate.importers.ggml.blocks import f16_at, ggml_parts, split_nibbles, sub_block_scales
from emulate.importers.stored import StoredParts

__all__ = ["KVALUES_IQ4NL", "parse_iq4_nl", "parse_iq4_xs", "parse_mxfp4"]

#: ggml's non-linear 4-bit table, ``kvalues_iq4nl`` in ggml/src/ggml-common.h
#: (ggml-org/llama.cpp, commit aca2e6ce7909064dbfbf3bd168e9ad3db1826e6c); the tests check
#: it against the ``gguf`` package's copy.
KVALUES_IQ4NL = np.array(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8
)
KVALUES_IQ4NL.setflags(write=False)


def parse_iq4_nl(blocks: np.ndarray, name: str) -> StoredParts:
    """IQ4_NL: uint4 codes through :data:`KVALUES_IQ4NL`, one f16 scale per 32."""
    codes = split_nibbles(blocks[:, 2:18], 16)
    return ggml_parts(
        blocks, name, "IQ4_NL", codes, "uint4", f16_at(blocks, 0), codebook=KVALUES_IQ4NL
    )


def parse_iq4_xs(blocks: np.ndarray, name: str) -> StoredParts:
    """IQ4_XS: uint4 codes through :data:`KVALUES_IQ4NL`; uint6 sub-block scales (zero
    point 32) times ``d``."""
    n = blocks.shape[0]
    high_word = np.ascontiguousarray(blocks[:, 2:4]).view("<u2").astype(np.uint16)
    high = (high_word >> np.arange(0, 16, 2, dtype=np.uint16)) & 0x03
    low = np.stack([blocks[:, 4:8] & 0x0F, blocks[:, 4:8] >> 4], axis=2).reshape(n, 8)
    scales = sub_block_scales(
        (low | (high.astype(np.uint8) << 4)).astype(np.uint8), "uint6", f16_at(blocks, 0), 32
    )
    codes = split_nibbles(blocks[:, 8:136], 16)
    return ggml_parts(blocks, name, "IQ4_XS", codes, "uint4", scales, codebook=KVALUES_IQ4NL)


def parse_mxfp4(blocks: np.ndarray, name: str) -> StoredParts:
    """MXFP4: e2m1 codes, one e8m0 exponent byte per 32 (see the module docstring)."""
    codes = split_nibbles(blocks[:, 1:17], 16)
    scales = np.ascontiguousarray(blocks[:, 0:1]).view(ml_dtypes.float8_e8m0fnu)
    return ggml_parts(blocks, name, "MXFP4", codes, "float4_e2m1fn", scales)
