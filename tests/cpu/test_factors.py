"""emulate.cpu.factors: a weight's per-block factors, bit for bit as dequantize rounds
them (numpy float32 arithmetic on the stored parts as the oracle), read from inside a
kernel compiled with fast-math flags (which must not fuse a two-level part's steps)."""

from __future__ import annotations

import numba
import numpy as np
import pytest

import emulate
from emulate.cpu.factors import factors, row_factors
from emulate.cpu.form import slot_widths, weight_form, weight_operands
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


def _operands(q: QArray, contracting: int) -> tuple:
    """The kernel's consts and six (bytes, table) slots as numpy arrays (bytes 2-D)."""
    form = weight_form(q, contracting)
    consts, slots = weight_operands(q, form)
    arrays = []
    for i, (a, width) in enumerate(zip(slots[::2], slot_widths(form))):
        b = np.ascontiguousarray(np.asarray(a))
        b = b.reshape(b.shape[0], -1) if b.ndim == 2 else b.reshape(1, -1)
        arrays += [b.view(np.uint8).reshape(b.shape[0], -1), np.asarray(slots[2 * i + 1])]
        assert arrays[-2].shape[1] % width == 0
    return form, np.asarray(consts), arrays


@pytest.mark.parametrize(
    ("k", "per", "scale_dtype"),
    [(2304, 8, np.float32), pytest.param(1088, 16, np.float32, marks=pytest.mark.long)],
)
def test_two_level_scales_are_dequantizes_bits(k: int, per: int, scale_dtype) -> None:
    # 72 (34) blocks a row: vector steps of 64 codes and a tail; (v - 5) * s + 0.37 rounded
    # twice (float32 s: the product rounds), which one fused multiply-add would not
    q, want = _two_level(k, 32, per, scale_dtype)
    form, consts, (s0, t0, s1, t1, s2, t2, s3, t3, s4, t4, s5, t5) = _operands(q, 1)
    fill = row_factors(form)

    @numba.njit(fastmath={"reassoc", "contract", "nsz", "arcp"})
    def rows(out):
        nb = out.shape[1]
        zb, ob = np.empty(nb, np.float32), np.empty(nb, np.float32)
        for i in range(out.shape[0]):
            fill(consts, s1, t1, s2, t2, s3, t3, s4, t4, s5, t5, i, zb, out[i], ob)

    got = np.zeros_like(want)
    rows(got)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    block = factors(form)

    @numba.njit(fastmath={"reassoc", "contract", "nsz", "arcp"})
    def each(out):
        for i in range(out.shape[0]):
            for j in range(out.shape[1]):
                out[i, j] = block(consts, s1, t1, s2, t2, s3, t3, s4, t4, s5, t5, i, j)[1]

    got[:] = 0
    each(got)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
