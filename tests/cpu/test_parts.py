"""emulate.cpu.parts: the kernel's readers of stored parts, against numpy's conversions
and bit streams built here from the definition in emulate.numerics.storage's docstring."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import emulate
from emulate.cpu.form import Kind, Slot
from emulate.cpu.parts import float16_value, float32_value, reader


def test_every_float16_is_numpys_float32() -> None:
    codes = np.arange(1 << 16, dtype=np.uint16)
    want = codes.view(np.float16).astype(np.float32)
    got = np.array([float16_value(int(c)) for c in codes], np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_float32_bits() -> None:
    bits = np.array([0, 0x80000000, 1, 0x3F800000, 0x7F800000, 0xFF7FFFFF], np.uint32)
    got = np.array([float32_value(int(b)) for b in bits], np.float32)
    assert np.array_equal(got.view(np.uint32), bits)


def _stream(codes: np.ndarray, bits: int) -> np.ndarray:
    """``codes`` (rows, n) as rows of a little-endian bit stream: code j at stream bits
    [bits*j, bits*(j+1)), least significant bit first (one Python int a row)."""
    nbytes = -(-bits * codes.shape[1] // 8)
    out = np.zeros((codes.shape[0], nbytes), np.uint8)
    for r, row in enumerate(codes):
        acc = sum(int(c) << (bits * j) for j, c in enumerate(row))
        out[r] = np.frombuffer(acc.to_bytes(nbytes, "little"), np.uint8)
    return out


def _read_back_cases() -> list:
    """Every width packed along each axis; by default each width along one axis, the axes
    in turn (each case compiles a reader of its own; the reader's code is one template over
    the width and the axis), the other axis under EMULATE_LONG_TESTS=1."""
    return [
        pytest.param(bits, axis, marks=() if (i + axis) % 2 == 0 else pytest.mark.long)
        for i, bits in enumerate((2, 3, 5, 6, 7))
        for axis in (0, 1)
    ]


@pytest.mark.parametrize(("bits", "axis"), _read_back_cases())
def test_packed_codes_read_back(bits: int, axis: int) -> None:
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 1 << bits, (5, 11), dtype=np.uint8)
    data = _stream(codes, bits) if axis == 1 else _stream(codes.T, bits).T.copy()
    if bits in (2, 6):  # emulate's own packing writes the same stream
        fmt = f"uint{bits}"
        packed = emulate.pack(codes, fmt, axis=axis - 2)
        assert np.array_equal(np.asarray(packed.data), data)
    read = reader(Slot(Kind.UNSIGNED, bits, axis, 1))
    table = np.zeros(1, np.float32)
    got = [[read(data, table, i, j) for j in range(11)] for i in range(5)]
    assert np.array_equal(np.array(got), codes.astype(np.float32))


def test_signed_table_and_float_slots() -> None:
    table = np.zeros(1, np.float32)
    nibbles = np.array([[0x8F, 0x07]], np.uint8)  # codes 15, 8, 7, 0 along the row
    signed = reader(Slot(Kind.SIGNED, 4, 1, 1))
    assert [signed(nibbles, table, 0, j) for j in range(4)] == [-1.0, -8.0, 7.0, 0.0]
    lut = np.arange(16, dtype=np.float32) * 0.5
    assert reader(Slot(Kind.TABLE, 4, 1, 1))(nibbles, lut, 0, 1) == 4.0
    h = np.array([[1.5, -2.25, 65504.0]], np.float16)
    f16 = reader(Slot(Kind.FLOAT16, 16, -1, 2))
    assert [f16(h.view(np.uint8), table, 0, j) for j in range(3)] == [1.5, -2.25, 65504.0]
    b = np.array([[3.0, -0.0078125]], ml_dtypes.bfloat16)
    bf16 = reader(Slot(Kind.BFLOAT16, 16, -1, 2))
    assert [bf16(b.view(np.uint8), table, 0, j) for j in range(2)] == [3.0, -0.0078125]
    f = np.array([[1e-40, -3.5]], np.float32)  # a subnormal survives (no flush)
    f32 = reader(Slot(Kind.FLOAT32, 32, -1, 4))
    got = np.array([f32(f.view(np.uint8), table, 0, j) for j in range(2)], np.float32)
    assert np.array_equal(got.view(np.uint32), f[0].view(np.uint32))
