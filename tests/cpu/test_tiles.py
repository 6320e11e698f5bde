"""emulate.cpu.tiles: the float32 micro-kernels against exact integer products (every
product and sum exact in float32: the bits must match), every row and column count."""

from __future__ import annotations

import functools

import numba
import numpy as np
import pytest

from emulate.cpu.tiles import WIDTH, broadcast_tile, dot_tile


@functools.cache
def _broadcast(rows: int, vecs: int):
    @numba.njit
    def run(c, a, b, kc):
        broadcast_tile(c, a, b, np.uint64(kc), rows, vecs)

    return run


@functools.cache
def _dot(rows: int, cols: int):
    @numba.njit
    def run(c, a, b, kc):
        dot_tile(c, a, b, np.uint64(kc), rows, cols)

    return run


@pytest.mark.parametrize(("rows", "vecs"), [(6, 2), (1, 2), (4, 1)])
def test_broadcast_tiles_add_the_product(rows: int, vecs: int) -> None:
    rng = np.random.default_rng(rows)
    kc, width = 37, vecs * WIDTH
    a = rng.integers(-8, 8, (rows, 50)).astype(np.float32)  # rows 50 apart: a view of x
    b = rng.integers(-8, 8, (kc, width)).astype(np.float32)
    c = rng.integers(-8, 8, (rows, width + 3)).astype(np.float32)
    want = c.copy()
    want[:, :width] += a[:, :kc] @ b
    _broadcast(rows, vecs)(c, a, b.reshape(-1), kc)
    assert np.array_equal(c, want)


@pytest.mark.parametrize(("rows", "cols"), [(3, 4), (1, 1), (2, 3)])
@pytest.mark.parametrize("kc", [37, 8, 5])
def test_dot_tiles_add_the_product(rows: int, cols: int, kc: int) -> None:
    # kc: lanes and a tail, whole lanes, a tail alone
    rng = np.random.default_rng(kc + rows)
    a = rng.integers(-8, 8, (rows, 40)).astype(np.float32)
    b = rng.integers(-8, 8, (cols, 40)).astype(np.float32)
    c = rng.integers(-8, 8, (rows, 6)).astype(np.float32)
    want = c.copy()
    want[:, :cols] += a[:, :kc] @ b[:, :kc].T
    _dot(rows, cols)(c[:, :cols], a, b, kc)
    assert np.array_equal(c, want)


def test_tile_sizes_are_checked() -> None:
    with pytest.raises(Exception, match="rows: expected 1 to 6, got 7"):
        _broadcast(7, 2)(
            np.zeros((7, 16), np.float32), np.zeros((7, 1), np.float32), np.zeros(16, np.float32), 1
        )
