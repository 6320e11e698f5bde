"""emulate.cpu.gemm: the many-rows kernel (more rows than emulate.cpu.route.MAX_ROWS)
through emulate.dot_general, against the float64 product of the dequantized weight
(emulate.reference) and exact integer sums. Special factors: tests/cpu/test_dequantized.py.
The rows layout (a second weight form, a numba compile of some 20 s on 2 cores) is long
(EMULATE_LONG_TESTS=1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import emulate
import emulate.bounds
from emulate.cpu import route
from emulate.quantized.array import QArray

KN = (((1,), (0,)), ((), ()))
NK = (((1,), (1,)), ((), ()))
K = 320  # two panels of K: 256 and 64


def _dot(x, q, dn):
    with emulate.use_cpu_kernel(True):
        f = jax.jit(lambda x: emulate.dot_general(x, q, dn, preferred_element_type=jnp.float32))
        assert "emulate_cpu_gemv_" in f.lower(x).as_text()
        return np.asarray(f(x))


def _columns(rng: np.random.Generator, n: int = 48) -> tuple[QArray, np.ndarray]:
    """int4 codes (K, n) packed along K, e8m0 scales per 32 (2**-3 .. 2**2): 3 strips."""
    codes = rng.integers(-8, 8, (K, n)).astype(ml_dtypes.int4)
    scales = (2.0 ** rng.integers(-3, 3, (K // 32, n))).astype(ml_dtypes.float8_e8m0fnu)
    q = QArray.from_parts(emulate.pack(codes, axis=0), scales, block_shape=(32, 1))
    return q, emulate.reference.dequantize(codes, scales, (32, 1), exact=True)


def _rows(rng: np.random.Generator, n: int = 70) -> tuple[QArray, np.ndarray]:
    """GGUF-like rows (n, K): uint4 codes, zero point 8, float16 scales per 32, and the
    weight (K, n) in float64: a task of 64 rows and one of 6."""
    codes = rng.integers(0, 16, (n, K), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, (n, K // 32)).astype(np.float16)
    q = QArray.from_parts(
        emulate.pack(codes, "uint4", axis=-1), scales, block_shape=(1, 32), zero_points=8
    )
    w = (codes.astype(np.float64) - 8) * np.repeat(scales.astype(np.float64), 32, axis=1)
    return q, w.T


@pytest.mark.parametrize("layout", ["columns", pytest.param("rows", marks=pytest.mark.long)])
def test_many_rows_within_the_bound_and_independent_of_the_batch(layout: str) -> None:
    # 6-row (3-row) tiles and their remainders; the first 17 rows alone give the same bits
    rng = np.random.default_rng(1)
    q, w = _columns(rng) if layout == "columns" else _rows(rng)
    dn = KN if layout == "columns" else NK
    x = rng.normal(size=(40, K)).astype(np.float32)
    got = _dot(jnp.asarray(x), q, dn)
    bound = emulate.bounds.qarray_bound(x, w, KN, segments=K // 32)
    assert (np.abs(got - x.astype(np.float64) @ w) <= bound).all()
    m = route.MAX_ROWS + 1
    assert np.array_equal(_dot(jnp.asarray(x[:m]), q, dn).view(np.uint32), got[:m].view(np.uint32))


def test_integers_with_power_of_two_scales_are_exact() -> None:
    rng = np.random.default_rng(2)
    q, w = _columns(rng)
    x = rng.integers(-100, 100, (route.MAX_ROWS + 3, K)).astype(np.float32)
    exact = x.astype(np.int64) @ (w * 8).astype(np.int64)  # w * 8: integers
    assert np.array_equal(_dot(jnp.asarray(x), q, KN), (exact / 8).astype(np.float32))


def test_nan_and_inf_activations_propagate() -> None:
    # the columns' weight form (the default many-rows test's: one numba compile for both)
    rng = np.random.default_rng(3)
    q, w = _columns(rng)
    x = rng.normal(size=(route.MAX_ROWS + 2, K)).astype(np.float32)
    x[0, 3], x[1, 100], x[17, 300] = np.nan, np.inf, -np.inf
    got = _dot(jnp.asarray(x), q, KN)
    with np.errstate(invalid="ignore"):
        want = x.astype(np.float64) @ w
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isinf(got), np.isinf(want))
