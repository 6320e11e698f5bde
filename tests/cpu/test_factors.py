"""emulate.cpu.factors: a weight's per-block factors, bit for bit as dequantize rounds
them (numpy float32 arithmetic on the stored parts as the oracle), read from inside a
kernel compiled with fast-math flags (which must not fuse a two-level part's steps)."""

from __future__ import annotations

import numba
import numpy as np
import pytest

import emulate
from emulate.cpu.factors import factors, row_factors
from emulate.cpu.form import weight_form
from emulate.cpu.operands import Factor, StoredBytes, Weight, byte_widths, weight_operands
from emulate.quantized.array import QArray

N = 3


def _two_level(k: int, bk: int, per: int, scale_dtype) -> tuple[QArray, np.ndarray]:
    """uint4 codes (N, k) in blocks of ``bk`` whose scales are a QArray: 6-bit codes packed
    along the row (a bit stream), zero point 5, offset 0.37, ``scale_dtype`` super-scales
    per ``per`` blocks; and the block scales by numpy float32 steps."""
    rng = np.random.default_rng(k)
    nb = k // bk
    c6 = rng.integers(0, 64, (N, nb), dtype=np.uint8)
    sup = rng.uniform(0.001, 0.01, (N, -(-nb // per))).astype(scale_dtype)
    inner = QArray.from_parts(
        emulate.pack(c6, "uint6", axis=-1), sup, block_shape=(1, per), zero_points=5, offsets=0.37
    )
    codes = emulate.pack(rng.integers(0, 16, (N, k), dtype=np.uint8), "uint4", axis=-1)
    q = QArray.from_parts(codes, inner, block_shape=(1, bk))
    s = np.repeat(sup.astype(np.float32), per, axis=1)[:, :nb]
    want = (c6.astype(np.float32) - np.float32(5)) * s + np.float32(0.37)  # float32 steps
    return q, want


def _bytes(s: StoredBytes, width: int) -> StoredBytes:
    """A stored part as the kernel reads it: 2-D uint8 bytes, ``width`` a code."""
    b = np.ascontiguousarray(np.asarray(s.data))
    b = b.reshape(b.shape[0], -1) if b.ndim == 2 else b.reshape(1, -1)
    b = b.view(np.uint8).reshape(b.shape[0], -1)
    assert b.shape[1] % width == 0
    return StoredBytes(b, np.asarray(s.table))


def _operands(q: QArray, contracting: int) -> tuple:
    """The form and the kernel's :class:`Weight` record as numpy arrays (bytes 2-D)."""
    form = weight_form(q, contracting)
    w = weight_operands(q, form)
    widths = iter(byte_widths(form))
    codes = _bytes(w.codes, next(widths))
    factors = [
        Factor(
            _bytes(f.stored, next(widths)),
            _bytes(f.level_scales, next(widths)),
            np.float32(f.zero_point),
            np.float32(f.constant),
        )
        for f in (w.zero_point, w.scale, w.offset)
    ]
    return form, Weight(codes, *factors, np.float32(w.tensor))


@pytest.mark.parametrize(
    ("k", "per", "scale_dtype"),
    [
        # each a numba compile of some 20 s on 2 cores; the kernel reads two-level scales by
        # default through GGUF's Q4_K (tests/importers/test_gguf_qarray.py)
        pytest.param(2304, 8, np.float32, marks=pytest.mark.long),
        pytest.param(1088, 16, np.float32, marks=pytest.mark.long),
    ],
)
def test_two_level_scales_are_dequantizes_bits(k: int, per: int, scale_dtype) -> None:
    # 72 (34) blocks a row: vector steps of 64 codes and a tail; (v - 5) * s + 0.37 rounded
    # twice (float32 s: the product rounds), which one fused multiply-add would not
    q, want = _two_level(k, 32, per, scale_dtype)
    form, weight = _operands(q, 1)
    fill = row_factors(form)

    @numba.njit(fastmath={"reassoc", "contract", "nsz", "arcp"})
    def rows(weight, out):
        nb = out.shape[1]
        zb, ob = np.empty(nb, np.float32), np.empty(nb, np.float32)
        for i in range(out.shape[0]):
            fill(weight, i, zb, out[i], ob)

    got = np.zeros_like(want)
    rows(weight, got)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    block = factors(form)

    @numba.njit(fastmath={"reassoc", "contract", "nsz", "arcp"})
    def each(weight, out):
        for i in range(out.shape[0]):
            for j in range(out.shape[1]):
                out[i, j] = block(weight, i, j)[1]

    got[:] = 0
    each(weight, got)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
