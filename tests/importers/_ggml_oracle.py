"""Shared by the GGML/GGUF importer tests: the spec formula written out in numpy, the
oracle (``gguf.quants.dequantize``), the bit-identity assertion and a strategy of random
block bytes.

The parts are recombined with the formula of the agreed representation (issue 24), from
the formula and not from the parser:

    W = (value(code) - zero_point) * scale + offset

with a two-level scale ``(value(sub_code) - sub_zero_point) * super_scale`` and an e8m0
scale applied as ``ldexp(value, byte - 127)``.
"""

from __future__ import annotations

import gguf
import ml_dtypes
import numpy as np
from gguf import GGMLQuantizationType
from hypothesis import strategies as st

from emulate.importers.ggml import BLOCKS
from emulate.importers.stored import StoredParts

# Byte offsets of the float16 fields (d, m, dmin) in each block, from ggml's block structs
# (ggml/src/ggml-common.h): the places where special scales are planted.
F16_FIELDS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
    "MXFP4": (),
}
SPECIAL_F16 = [0x7E00, 0xFE00, 0x7C00, 0xFC00, 0x7BFF, 0xFBFF, 0x0001, 0x8001, 0x0000, 0x8000]
SPECIAL_E8M0 = [0, 1, 2, 126, 127, 128, 253, 254, 255]
QUANTIZABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4")
ELEMENT_BITS = {
    "uint2": 2,
    "uint3": 3,
    "uint4": 4,
    "uint5": 5,
    "uint6": 6,
    "int8": 8,
    "float4_e2m1fn": 4,
}


def _values(codes: np.ndarray, element: str, codebook: np.ndarray | None) -> np.ndarray:
    """The codes' values as float32 (exact: every value here fits in float32)."""
    assert codes.dtype == np.uint8
    assert int(codes.max(initial=0)) < 2 ** ELEMENT_BITS[element]
    if codebook is not None:
        return codebook.astype(np.float32)[codes]
    if element == "int8":
        return codes.view(np.int8).astype(np.float32)
    if element == "float4_e2m1fn":
        return codes.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    return codes.astype(np.float32)


def _per_element(block_values: np.ndarray, block: int) -> np.ndarray:
    return np.repeat(block_values, block, axis=-1)


def _block_values(part: np.ndarray | StoredParts) -> np.ndarray:
    """Float32 per-block scales or offsets: a two-level part as
    ``(value(code) - zero_point) * super_scale``."""
    if isinstance(part, StoredParts):
        sub = _values(part.codes, part.fmt, None) - np.float32(part.zero_points or 0)
        assert isinstance(part.scales, np.ndarray) and part.scales.dtype == np.float16
        return sub * _per_element(part.scales.astype(np.float32), part.block_shape[-1])
    assert part.dtype == np.float16
    return part.astype(np.float32)


@np.errstate(all="ignore")
def terms(p: StoredParts) -> tuple[np.ndarray, np.ndarray | None]:
    """Per element, in float32: ``(value(code) - zero_point) * scale`` and the offset
    (None when the type has none)."""
    v = _values(p.codes, p.fmt, p.codebook) - np.float32(p.zero_points or 0)
    block = p.block_shape[-1]
    scales = p.scales
    if isinstance(scales, np.ndarray) and scales.dtype == ml_dtypes.float8_e8m0fnu:
        exponent = _per_element(scales.view(np.uint8).astype(np.int32) - 127, block)
        scaled = np.ldexp(v, exponent).astype(np.float32)
    else:
        scaled = v * _per_element(_block_values(scales), block)
    if p.offsets is None:
        return scaled, None
    return scaled, _per_element(_block_values(p.offsets), block)


@np.errstate(all="ignore")
def recombine(p: StoredParts) -> np.ndarray:
    """The spec formula in float32, one rounding per operation."""
    scaled, offset = terms(p)
    return scaled if offset is None else scaled + offset


@np.errstate(all="ignore")
def oracle(data: np.ndarray, ggml_type: str) -> np.ndarray:
    return gguf.quants.dequantize(data, GGMLQuantizationType[ggml_type])


def assert_bit_identical(ours: np.ndarray, theirs: np.ndarray, ggml_type: str) -> None:
    assert ours.dtype == theirs.dtype == np.float32
    assert ours.shape == theirs.shape
    nan = np.isnan(theirs)
    np.testing.assert_array_equal(np.isnan(ours), nan)
    a, b = ours[~nan], theirs[~nan]
    if ggml_type == "MXFP4":
        # ggml's MXFP4 table has no -0: e2m1 code 8 (-0) decodes to +0 there. The parts
        # keep the code as stored; only that zero's sign differs.
        a = np.where(a == 0, np.float32(0), a)
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@st.composite
def block_bytes(
    draw, ggml_type: str, shape: tuple[int, int] | None = None
) -> tuple[np.ndarray, tuple[int, int]]:
    """Random rows of blocks, special scales planted in some blocks; ``shape``: (rows,
    blocks a row), drawn when None (give it where each new shape costs a compile)."""
    block_size, type_size = BLOCKS[ggml_type]
    rows, per_row = shape or (
        draw(st.integers(1, 3)),
        draw(st.integers(1, 3 if block_size == 256 else 5)),
    )
    n_blocks = rows * per_row
    raw = draw(st.binary(min_size=n_blocks * type_size, max_size=n_blocks * type_size))
    blocks = np.frombuffer(raw, np.uint8).reshape(n_blocks, type_size).copy()
    for b in draw(st.lists(st.integers(0, n_blocks - 1), max_size=n_blocks)):
        if ggml_type == "MXFP4":
            blocks[b, 0] = draw(st.sampled_from(SPECIAL_E8M0))
        for offset in F16_FIELDS[ggml_type]:
            if draw(st.booleans()):
                special = np.array([draw(st.sampled_from(SPECIAL_F16))], "<u2")
                blocks[b, offset : offset + 2] = special.view(np.uint8)
    return blocks.reshape(rows, per_row * type_size), (rows, per_row * block_size)
