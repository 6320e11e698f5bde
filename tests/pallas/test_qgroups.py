"""emulate.pallas.qgroups, the per-K-step work of the kernel's offsets and two-level parts,
run as plain JAX on the CPU (the kernel runs them in Pallas; tests/pallas/test_qoffsets.py
covers them there and with the real TPU compiler): the step's two-level values bit for
bit against a float64 oracle from the codes before packing (every step position of the
groups, 3- to 8-bit codes of both signs, a zero point, a ragged last step, NaN, Inf, -0
and tiny super-block scales kept in their own groups; f32 and bf16 subnormal super-block
scales keep their value, as emulate.dequantize keeps it); the group sums and the offset
term exact on integer-valued bf16, f32 and int8 tiles.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import emulate
from emulate import formats
from emulate.pallas import qgroups, qoffsets

# (code format, groups, columns, groups a super-block, zero point, groups a step, super
# format)
LEVELS = [
    # GGUF Q4_K: 6-bit codes, blocks of 8, 8 groups a step, float16 d (a subnormal among them)
    ("uint6", 40, 128, 8, 0, 8, "float16"),
    ("int5", 21, 8, 4, 0, 6, "float32"),  # steps across super-blocks, a ragged last step
    ("uint3", 9, 4, 2, 3, 1, "bfloat16"),  # one group a step, a zero point
    ("int8", 12, 5, 3, -2, 4, "float32"),  # bytes as stored
]


@pytest.mark.parametrize("fmt, groups, cols, block, zero, count, sf", LEVELS)
def test_step_levels_are_the_dequantized_values_bit_for_bit(fmt, groups, cols, block, zero,
                                                            count, sf):  # fmt: skip
    f = formats.get(fmt)
    rng = np.random.default_rng(groups)
    codes = rng.integers(0, 1 << f.bits, (groups, cols))
    codes[0, :2] = [0, (1 << f.bits) - 1]
    if f.bits == 8:
        data = codes.astype(np.uint8)
    else:
        data = np.asarray(emulate.pack(codes.astype(np.uint8), fmt, axis=0).data)
    supers = (rng.standard_normal((-(-groups // block), cols)) * 3).astype(np.float32)
    tiny = 2.0**-24 if sf == "float16" else 2.0**-120  # float16's smallest subnormal
    supers[0, :4] = [np.nan, np.inf, -0.0, tiny]  # each stays in its own group
    supers = supers.astype(ml_dtypes.bfloat16 if sf == "bfloat16" else sf)
    stored = supers.view(np.uint16) if sf == "float16" else supers  # as the kernel reads it
    level = qoffsets.KernelLevel(fmt, block, sf, zero)
    run = jax.jit(
        lambda b, s, first: qgroups.step_levels(b, qgroups.super_rows(s, sf), level, first, count)
    )
    values = codes - (1 << f.bits) * (codes >= (1 << (f.bits - 1))) if f.signed else codes
    want = (values - zero) * np.repeat(supers.astype(np.float64), block, axis=0)[:groups]
    want = want.astype(np.float32)  # one rounding, as emulate.dequantize
    byte_rows = jnp.asarray(data.astype(np.int32))
    for first in range(0, groups, count):
        got = np.asarray(run(byte_rows, jnp.asarray(stored), jnp.int32(first)))
        n = min(count, groups - first)
        # equal as floats: bit for bit but the sign of a zero (not part of the contract)
        np.testing.assert_array_equal(got[:n], want[first : first + n])


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "int8"])
def test_group_sums_and_the_offset_term_are_exact_on_integers(dtype):
    rng = np.random.default_rng(7)
    m, planes, count, rows = 5, 2, 4, 32
    xi = rng.integers(-100, 101, (planes, m, count * rows))
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    xs = [jnp.asarray(x.astype(dt)) for x in xi]
    got = np.asarray(jax.jit(lambda xs: qgroups.group_sums(xs, count, rows, 0.25))(xs))
    want = xi.reshape(planes, m, count, rows).sum(axis=(0, 3)) * 0.25
    np.testing.assert_array_equal(got, want.astype(np.float32))
    offsets = rng.integers(-64, 64, (count, 7)).astype(np.float32) * 0.5
    term = np.asarray(qgroups.offset_term(jnp.asarray(got), jnp.asarray(offsets)))
    np.testing.assert_array_equal(term, (want @ offsets).astype(np.float32))


# bitsandbytes double quantization (bitsandbytes-foundation/bitsandbytes @ 95f9af3,
# bitsandbytes/functional.py dequantize_4bit: ``absmax = dequantize_blockwise(absmax,
# state2) + offset``; dequantize_blockwise: ``code[A] * absmax2[block]``, both float32):
# (groups, columns, groups a super-block, columns a super-block, columns an output block)
TABLE_LEVELS = [
    (16, 64, 16, 16, 32),  # K = 1024: (16, 16) blocks spanning every group, two blocks
    (64, 16, 64, 4, 8),  # K = 4096: (64, 4) blocks
    (300, 6, 256, 1, 6),  # K = 19200: (256, 1) blocks, a partial last one
]


@pytest.mark.parametrize("groups, n, block, cols, width", TABLE_LEVELS)
def test_table_levels_are_bitsandbytes_float32_arithmetic_bit_for_bit(groups, n, block, cols,
                                                                      width):  # fmt: skip
    rng = np.random.default_rng(groups)
    table = np.sort(rng.uniform(-1, 1, 256)).astype(np.float32)
    table[[0, 100, 255]] = [-1.0, 0.0, 1.0]  # -max, the zero entry, +max
    codes = rng.integers(0, 256, (groups, n))
    codes[0, :3] = [0, 100, 255]
    supers = (np.abs(rng.standard_normal((-(-groups // block), -(-n // cols)))) * 0.02).astype(
        np.float32
    )
    supers[0, -1] = np.nan  # stays in its own columns
    offset = 0.0371
    level = qoffsets.KernelLevel("uint8", block, "float32", 0, emulate.codebooks.codebook(table),
                           offset, cols)  # fmt: skip
    sup = np.repeat(np.repeat(supers, block, axis=0), cols, axis=1)[:groups, :n]
    want = (table[codes] * sup).astype(np.float32) + np.float32(offset)  # float32, as bnb
    run = jax.jit(
        lambda b, s, first, col0: qgroups.step_levels(
            b, qgroups.super_rows(s, "float32"), level, first, groups, col0
        )
    )
    for col0 in range(0, n, width):
        byte_rows = jnp.asarray(codes[:, col0 : col0 + width].astype(np.int32))
        got = np.asarray(run(byte_rows, jnp.asarray(supers), jnp.int32(0), jnp.int32(col0)))
        np.testing.assert_array_equal(_u32(got), _u32(want[:, col0 : col0 + width]))


def _u32(a) -> np.ndarray:
    a = np.where(np.isnan(a), np.float32(np.nan), a).astype(np.float32)  # one NaN's bits
    return a.view(np.uint32)


def test_the_window_of_nested_scales_an_output_block_reads():
    # (columns a nested scale, columns an output block) -> (scales a window, output blocks
    # a window): bn / cols scales when a multiple of 128, else 128 of them; else the row
    assert qgroups.supers_window(4, 256) == (128, 2)  # bnb at K = 4096
    assert qgroups.supers_window(16, 256) == (128, 8)  # bnb at K = 1024
    assert qgroups.supers_window(2, 512) == (256, 1)  # bnb at K = 8192
    assert qgroups.supers_window(2, 256) == (128, 1)
    for cols, bn in ((1, 256), (3, 256), (256, 128), (8, 24)):
        assert qgroups.supers_window(cols, bn) is None


# Subnormal f32 and bf16 super-block scales (a bitsandbytes nested float32 absmax2 can be
# one) keep their value, as emulate.dequantize keeps it: the kernel once split them with a
# float frexp, which flushed them to 0 (review of issue 27). The oracle: the exact product
# rounded to 24 bits, then results below 2**-126 flushed (the CPU and the TPU flush them,
# and emulate.dequantize's documented arithmetic does).
_SUBNORMALS = [2.0**-127, -1.5 * 2.0**-127, 2.0**-133, 1.25 * 2.0**-130]


def _rounded_and_flushed(exact: np.ndarray) -> np.ndarray:
    big = (exact * 2.0**100).astype(np.float32).astype(np.float64)  # 24 bits, no subnormals
    return np.where(np.abs(big) < 2.0**-26, 0.0, big * 2.0**-100).astype(np.float32)


# By default four of the eight (scale dtype, columns, codes or table) triples, each pair of
# values among them once; the other four under EMULATE_LONG_TESTS=1.
_SUBNORMAL_DEFAULT = {("float32", 1, False), ("bfloat16", 4, False), ("float32", 4, True),
                      ("bfloat16", 1, True)}  # fmt: skip


@pytest.mark.parametrize(
    "sf, cols, table",
    [
        pytest.param(
            sf, cols, table,
            marks=() if (sf, cols, table) in _SUBNORMAL_DEFAULT else pytest.mark.long,
            id=f"{'table' if table else 'codes'}-{cols}-{sf}",
        )
        for table in (False, True)
        for cols in (1, 4)
        for sf in ("float32", "bfloat16")
    ],
)  # fmt: skip
def test_subnormal_super_scales_keep_their_value(sf, cols, table):
    rng = np.random.default_rng(cols)
    groups, n, block = 8, 16, 4 if cols == 1 else 8
    codes = rng.integers(0, 256, (groups, n))
    codes[0, :2] = [0, 255]
    cb = np.sort(rng.uniform(-4, 4, 256)).astype(np.float32)
    cb[[0, 255]] = [-4.0, 4.0]
    values = cb[codes].astype(np.float64) if table else codes - 3.0  # zero point 3
    tiny = _SUBNORMALS + ([2.0**-149] if sf == "float32" else [])
    shape = (groups // block, n // cols)
    supers = rng.choice(tiny, shape).astype(np.float32)
    supers.flat[: len(tiny)] = tiny[: supers.size]
    supers = supers.astype(ml_dtypes.bfloat16 if sf == "bfloat16" else np.float32)
    book = emulate.codebooks.codebook(cb) if table else None
    level = qoffsets.KernelLevel("uint8", block, sf, 0 if table else 3, book, 0.0, cols)
    sup = np.repeat(np.repeat(supers.astype(np.float64), block, axis=0), cols, axis=1)
    want = _rounded_and_flushed(values * sup)
    assert np.count_nonzero(want) > want.size // 4  # most products are normal numbers
    run = jax.jit(
        lambda b, s, col0: qgroups.step_levels(b, qgroups.super_rows(s, sf), level, 0, groups, col0)
    )
    width = 8
    for col0 in range(0, n, width):
        byte_rows = jnp.asarray(codes[:, col0 : col0 + width].astype(np.int32))
        s = supers if cols > 1 else supers[:, col0 : col0 + width]  # the block's columns
        got = np.asarray(run(byte_rows, jnp.asarray(s), jnp.int32(col0)))
        np.testing.assert_array_equal(got, want[:, col0 : col0 + width])


def test_scales_of_several_columns_need_the_blocks_first_column():
    # without col0 (or spread) every output block but the first would silently get the
    # first block's scales: refused at trace time, naming the argument
    level = qoffsets.KernelLevel("uint8", 4, "float32", 0, None, 0.0, 4)
    b, s = jnp.zeros((4, 8), jnp.int32), jnp.ones((1, 4), jnp.float32)
    message = (
        r"^col0: expected the weight column of the block's first column \(or spread=\) for "
        r"super-block scales of 4 columns each, got None$"
    )
    with pytest.raises(ValueError, match=message):
        qgroups.step_levels(b, qgroups.super_rows(s, "float32"), level, 0, 4)
    got = qgroups.step_levels(b, qgroups.super_rows(s, "float32"), level, 0, 4, col0=8)
    np.testing.assert_array_equal(np.asarray(got), np.zeros((4, 8), np.float32))
