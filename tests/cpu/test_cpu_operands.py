"""emulate.cpu.operands: the kernel's operands by role, in the order the handler reads them
(plain JAX: no compile)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

import emulate
from emulate.cpu.form import weight_form
from emulate.cpu.operands import CONSTANTS, Arg, byte_widths, weight_operands, wire
from emulate.quantized.array import QArray


def _two_level() -> QArray:
    """uint4 codes (4, 256) with a constant zero point 8, two-level scales (6-bit codes,
    zero point 5, offset 0.25, float16 super-scales) and a float32 offset a block."""
    rng = np.random.default_rng(0)
    inner = QArray.from_parts(
        emulate.pack(rng.integers(0, 64, (4, 8), dtype=np.uint8), "uint6", axis=-1),
        np.full((4, 1), 0.5, np.float16),
        block_shape=(1, 8),
        zero_points=5,
        offsets=0.25,
    )
    codes = emulate.pack(rng.integers(0, 16, (4, 256), dtype=np.uint8), "uint4", axis=-1)
    offsets = np.full((4, 8), -1.5, np.float32)
    return QArray.from_parts(codes, inner, block_shape=(1, 32), zero_points=8, offsets=offsets)


def test_each_part_travels_at_its_position() -> None:
    q = _two_level()
    form = weight_form(q, 1)
    x = np.ones((1, 256), np.float32)
    args = wire(x, x[:, :1], x[:, :8], weight_operands(q, form))
    assert len(args) == Arg.OFFSET_SCALES + 2 == 18
    assert args[Arg.X] is x
    assert np.array_equal(args[Arg.CODES], q.codes.data)
    assert np.array_equal(args[Arg.SCALE], q.scales.codes.data)
    assert np.array_equal(args[Arg.SCALE_SCALES], q.scales.scales)
    assert np.array_equal(args[Arg.OFFSET], offsets := np.full((4, 8), -1.5, np.float32))
    assert args[Arg.OFFSET].dtype == offsets.dtype
    for absent in (Arg.ZERO_POINT, Arg.ZERO_POINT_SCALES, Arg.OFFSET_SCALES):
        assert args[absent].shape == (1, 1)
    constants = dict(zip(CONSTANTS, np.asarray(args[Arg.CONSTANTS]).tolist(), strict=True))
    assert constants == {
        "zero_point.zero_point": 0.0,
        "zero_point.constant": 8.0,
        "scale.zero_point": 5.0,
        "scale.constant": 0.25,
        "offset.zero_point": 0.0,
        "offset.constant": 0.0,
        "tensor": 1.0,
    }
    # codes, zero point (+ its scales), scale codes (+ float16 scales), offsets (+ scales)
    assert byte_widths(form) == (1, 1, 1, 1, 2, 4, 1)


def test_table_codes_carry_their_values(monkeypatch) -> None:
    # uint8 codes of float8_e4m3fn: the table holds each code's value (ml_dtypes' decode)
    import emulate.cpu

    monkeypatch.setattr(emulate.cpu, "table_lookups", lambda bits=4: True)
    w = np.random.default_rng(1).normal(size=(64, 16)).astype(np.float32)
    q = emulate.quantize(w, "float8_e4m3fn", block_shape=32, axis=0)
    args = wire(w, w, w, weight_operands(q, weight_form(q, 0)))
    want = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    assert np.array_equal(np.asarray(args[Arg.CODES + 1]), want, equal_nan=True)
    assert np.array_equal(args[Arg.CODES], q.codes)
