"""emulate.quantized.layout: each part of a QArray described once (absent, constant,
stored, two-level, table), from the QArray's own fields, and computed once per QArray."""

from __future__ import annotations

import dataclasses

import hypothesis.strategies as st
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _pages import section_blocks
from hypothesis import given

import emulate
from emulate import codebooks
from emulate.quantized.layout import Constant, Layout, Level, Stored, describe, kind, layout_of
from emulate.testing import qarrays, quant_spec

K, N = 64, 16


def _awq_like() -> emulate.QArray:
    """uint4 codes packed along K, f16 scales per 32 rows, uint4 zero points packed along N,
    act-order along K, a tensor scale."""
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, (K, N), dtype=np.uint8).astype(ml_dtypes.uint4)
    zeros = rng.integers(0, 16, (K // 32, N), dtype=np.uint8).astype(ml_dtypes.uint4)
    return emulate.QArray.from_parts(
        emulate.pack(codes, axis=0),
        rng.uniform(0.5, 2, (K // 32, N)).astype(np.float16),
        block_shape=(32, 1),
        zero_points=emulate.pack(zeros, axis=1),
        perm=rng.permutation(K).astype(np.int32),
        perm_axis=0,
        tensor_scale=np.float32(0.75),
        dtype=jnp.bfloat16,
    )


def _k_quant_like() -> emulate.QArray:
    """6-bit sub-block scales and mins (uint8 codes, one a byte) times f16 super-block
    scales, over uint4 codes: two-level scales and offsets."""
    rng = np.random.default_rng(1)
    grid = (K // 32, N)

    def level(zero: int | None) -> emulate.QArray:
        return emulate.QArray.from_parts(
            rng.integers(0, 64, grid, dtype=np.uint8),
            rng.uniform(0.01, 0.1, (1, N)).astype(np.float16),
            block_shape=(K // 32, 1),
            fmt="uint6",
            zero_points=zero,
        )

    return emulate.QArray.from_parts(
        rng.integers(0, 16, (K, N), dtype=np.uint8),
        level(None),
        block_shape=(32, 1),
        fmt="uint4",
        offsets=level(3),
    )


def test_each_part_of_a_stored_weight_is_described_as_held():
    q = _awq_like()
    lay = layout_of(q)
    assert (lay.format_name, lay.scale_format, lay.shape, lay.block_shape) == (
        "uint4",
        "float16",
        (K, N),
        (32, 1),
    )
    assert lay.dtype == np.dtype(jnp.bfloat16)
    assert lay.codes == Stored("uint4", np.dtype(np.uint8), 4, 0, (K, N), (1, 1))
    assert lay.scale == Stored("float16", np.dtype(np.float16), 16, None, (2, N), (32, 1))
    assert lay.zero == Stored("uint4", np.dtype(np.uint8), 4, 1, (2, N), (32, 1))
    assert lay.tensor == Stored("float32", np.dtype(np.float32), 32, None, (), (K, N))
    assert lay.perm == Stored("int32", np.dtype(np.int32), 32, None, (K,), (1, 1))
    assert (lay.perm_axis, lay.offset, lay.table, lay.exponent) == (-2, None, None, 0)
    # the arrays are the QArray's own, not compared
    assert lay.codes.array is q.codes and lay.zero.data is q.zero_points.data
    assert lay.scale.array is q.scales and lay.perm.array is q.perm
    assert [kind(p) for p in (lay.codes, lay.zero, lay.offset)] == ["stored", "stored", "absent"]


def test_two_level_parts_are_levels_with_their_own_layout():
    q = _k_quant_like()
    lay = layout_of(q)
    assert isinstance(lay.scale, Level) and isinstance(lay.offset, Level) and lay.two_level
    assert [kind(lay.scale), kind(lay.offset)] == ["two_level", "two_level"]
    sc, off = lay.scale, lay.offset
    assert sc.codes == Stored("uint6", np.dtype(np.uint8), 6, None, (2, N), (1, 1))
    assert sc.scale == Stored("float16", np.dtype(np.float16), 16, None, (1, N), (2, 1))
    assert (sc.zero, off.zero, sc.block_shape, lay.scale_format) == (
        None,
        Constant(3),
        (2, 1),
        "float32",
    )
    assert kind(off.zero) == "constant"
    assert lay.codes == Stored("uint4", np.dtype(ml_dtypes.uint4), 4, None, (K, N), (1, 1))


def test_constants_tables_and_exponents():
    w = np.random.default_rng(2).normal(size=(K, N)).astype(np.float32)
    nf4 = emulate.quantize(w, "uint4", block_shape=(32, 1))
    nf4 = dataclasses.replace(nf4, codebook=codebooks.NF4)
    assert layout_of(nf4).table is codebooks.NF4 and kind(layout_of(nf4).table) == "table"
    q = dataclasses.replace(nf4, codebook=None, zero_points=8, offsets=0.25)
    lay = layout_of(q)
    assert (lay.zero, lay.offset) == (Constant(8), Constant(0.25))
    mxint8 = emulate.quantize(w, emulate.mx.MXINT8, axis=0)
    assert layout_of(mxint8).exponent == -6


def test_unregistered_dtypes_keep_their_width():
    q = emulate.QArray.from_parts(
        np.zeros((K, N), np.uint8),
        np.ones((2, N), np.float32),
        block_shape=(32, 1),
        fmt="uint4",
        zero_points=np.full((2, N), 3, np.int16),
    )
    assert layout_of(q).zero == Stored("int16", np.dtype(np.int16), 16, None, (2, N), (32, 1))
    with pytest.raises(ValueError, match="unknown format 'int16'"):
        _ = layout_of(q).zero.format


def test_computed_once_per_qarray_and_equal_for_equal_parts():
    q = _awq_like()
    assert layout_of(q) is layout_of(q)
    again = dataclasses.replace(q)  # a new QArray of the same parts
    assert layout_of(again) is not layout_of(q) and layout_of(again) == layout_of(q)
    assert layout_of(dataclasses.replace(q, tensor_scale=None)) != layout_of(q)
    assert isinstance(layout_of(q), Layout) and not isinstance(layout_of(q), Level)


def test_not_a_qarray_is_refused():
    with pytest.raises(TypeError, match=r"^q: expected an emulate.QArray, got ndarray$"):
        layout_of(np.zeros((2, 2)))


def test_describe_is_the_qarrays_repr():
    for q in (_awq_like(), _k_quant_like()):
        assert describe(layout_of(q)) == repr(q)
    assert describe(layout_of(_k_quant_like())).startswith(
        "QArray(uint4[64, 16], scales QArray(uint6[2, 16], scales float16[1, 16] per block "
        "(2, 1), dtype=float32) per block (32, 1), offsets, two_level, dtype=float32)"
    )


@given(st.data(), st.sampled_from(sorted(emulate.mx.SCHEMES)), st.booleans())
def test_every_part_is_the_qarrays_own(data, scheme, packed):
    q = data.draw(qarrays(quant_spec(scheme, block=16), (16, 40), packed=packed))
    lay = layout_of(q)
    assert describe(lay) == repr(q)
    assert lay.codes.array is q.codes and lay.scale.array is q.scales
    assert lay.format is q.format and lay.grid == tuple(np.shape(q.scales))
    assert lay.exponent == q.element_exponent
    assert (lay.tensor is None) == (q.tensor_scale is None)
    assert lay.tensor is None or lay.tensor.array is q.tensor_scale
    assert (lay.codes.packed_axis is not None) == isinstance(q.codes, emulate.Packed)
    assert lay.codes.bits == q.format.bits and lay.scale.format_name == q.scale_format
    if isinstance(q.codes, emulate.Packed):
        assert lay.codes.packed_axis == q.codes.axis % 2 and lay.codes.dtype == np.uint8
    else:
        assert lay.codes.dtype == np.dtype(q.codes.dtype)


def test_the_layout_example_of_the_quantized_page_runs():
    (code,) = section_blocks("quantized.md", "The parts as a kernel reads them")
    rng = np.random.default_rng(4)
    n, k = 8, 512

    def uint6(shape):
        return emulate.pack(rng.integers(0, 64, shape, dtype=np.uint8), "uint6", axis=1)

    d = rng.uniform(0.01, 0.1, (n, k // 256)).astype(np.float16)
    scales = emulate.QArray.from_parts(uint6((n, k // 32)), d, block_shape=(1, 8))
    mins = emulate.QArray.from_parts(uint6((n, k // 32)), -d, block_shape=(1, 8))
    codes = emulate.pack(rng.integers(0, 16, (n, k), dtype=np.uint8), "uint4", axis=1)
    w = emulate.QArray.from_parts(codes, scales, block_shape=(1, 32), offsets=mins)
    exec(compile(code, "docs/quantized.md", "exec"), {"w": w})
