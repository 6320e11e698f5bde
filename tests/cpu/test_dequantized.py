"""emulate.cpu.dequantized: blocks whose factors are NaN, infinite or huge give what the
dequantized product gives (tests/_dequantized_product.py: NaN where a zero meets an
infinite scale), in the few-rows kernel (layouts COLUMNS and ROWS) and the many-rows one.
One special value a test. Each layout and kernel is a weight form of its own (a numba
compile of some 20 s on 2 cores): the rows of the few-rows kernel by default (rows as
stored, (N, K), as GGUF's; its form is tests/cpu/test_gemv.py's shared rows form, 3-bit
codes in byte groups), the others under EMULATE_LONG_TESTS=1."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _dequantized_product import as_dequantized

import emulate
from emulate.cpu import route
from emulate.quantized.array import QArray

K, N = 64, 72  # N: one step of 64 columns and 8 after it (layout COLUMNS)
KN = (((1,), (0,)), ((), ()))
NK = (((1,), (1,)), ((), ()))


def _dot(x, q, dn=KN):
    with emulate.use_cpu_kernel(True):
        f = jax.jit(lambda x: emulate.dot_general(x, q, dn, preferred_element_type=jnp.float32))
        assert "emulate_cpu_gemv_" in f.lower(x).as_text()
        return np.asarray(f(x))


KR, BR = 144, 16  # the rows: K (18 groups of 8 codes: a vector step and a tail), block


def _rows(rng: np.random.Generator, scales: np.ndarray) -> tuple[QArray, np.ndarray]:
    """Rows (N, KR) as stored: uint3 codes packed along K, zero point 4, the float32
    ``scales`` (N, KR / 16) per 16 (tests/cpu/test_gemv.py's shared rows form). Returns it
    and the weight (KR, N) in float64."""
    codes = rng.integers(0, 8, (N, KR), dtype=np.uint8)
    q = QArray.from_parts(
        emulate.pack(codes, "uint3", axis=-1), scales, block_shape=(1, BR), zero_points=4
    )
    with np.errstate(invalid="ignore", over="ignore"):
        w = (codes.astype(np.float64) - 4) * np.repeat(scales.astype(np.float64), BR, axis=1)
    return q, w.T


SPECIALS = [np.nan, np.inf, -np.inf, 2.0**110]


@pytest.mark.long  # a weight form of its own (columns, int8 codes): a numba compile
@pytest.mark.parametrize("special", SPECIALS)
@pytest.mark.parametrize("part", ["scale", "offset"])
def test_a_special_factor_in_columns_gives_the_dequantized_product(part, special) -> None:
    # int8 codes (K, N) with zeros, f32 scales per 32 of K: a special scale (or offset) in
    # a column of the vector steps (3) and one after them (70)
    rng = np.random.default_rng(13)
    codes = rng.integers(-3, 4, (K, N)).astype(np.int8)
    scales = rng.uniform(0.5, 2, (2, N)).astype(np.float32)
    offsets = rng.uniform(-1, 1, (2, N)).astype(np.float32) if part == "offset" else None
    (scales if part == "scale" else offsets)[[0, 1], [3, 70]] = special
    q = QArray.from_parts(codes, scales, block_shape=(32, 1), offsets=offsets)
    w = codes.astype(np.float64) * np.repeat(scales.astype(np.float64), 32, axis=0)
    if offsets is not None:
        w = w + np.repeat(offsets.astype(np.float64), 32, axis=0)
    x = rng.normal(size=(3, K)).astype(np.float32)
    x[1, :8] = 0  # zeros against an infinite scale: NaN in the product
    as_dequantized(_dot(jnp.asarray(x), q), x, w, 2)


@pytest.mark.parametrize(
    "special",
    [np.inf, *(pytest.param(v, marks=pytest.mark.long) for v in (np.nan, -np.inf, 2.0**110))],
)
def test_a_special_scale_in_rows_gives_the_dequantized_product(special) -> None:
    rng = np.random.default_rng(14)
    scales = rng.uniform(0.01, 0.1, (N, KR // BR)).astype(np.float32)
    scales[[2, 40], [0, 5]] = special
    q, w = _rows(rng, scales)
    x = rng.normal(size=(3, KR)).astype(np.float32)
    x[2, 80:] = 0  # zeros against block 5 of row 40
    as_dequantized(_dot(jnp.asarray(x), q, NK), x, w, KR // BR)


def test_subnormal_scales_in_rows_give_the_dequantized_product() -> None:
    # 2**-127 (e8m0's least scale), -3 * 2**-129 and 2**-149: the kernel reads its factors with
    # denormal inputs as zero, so these blocks take the dequantized path, whose values
    # (v - 8) * scale are rounded to float32 and flushed below 2**-126 as dequantize does;
    # x near 2**40 puts the sums far above the bound's underflow term
    rng = np.random.default_rng(15)
    scales = rng.uniform(0.01, 0.1, (N, KR // BR)).astype(np.float32)
    scales[2], scales[40], scales[71, 0] = 2.0**-127, -3 * 2.0**-129, 2.0**-149
    q, w = _rows(rng, scales)  # numpy: no flush
    w = np.where(np.abs(w) < 2.0**-126, 0.0, w)
    x = (rng.normal(size=(3, KR)) * 2.0**40).astype(np.float32)
    got = _dot(jnp.asarray(x), q, NK)
    as_dequantized(got, x, w, KR // BR)
    assert (np.abs(got[:, [2, 40]]) > 2.0**-100).all()  # columns of subnormal scales only


@pytest.mark.long  # two weight forms of their own: numba compiles
@pytest.mark.parametrize("layout", ["columns", "rows"])
def test_the_many_rows_kernel_gives_the_dequantized_product(layout) -> None:
    # more rows than the few-rows kernel takes: the panels hold the dequantized values
    rng = np.random.default_rng(17)
    m = route.MAX_ROWS + 4
    x = rng.normal(size=(m, K if layout == "columns" else KR)).astype(np.float32)
    x[3, :8] = 0
    if layout == "columns":
        codes = rng.integers(-3, 4, (K, 64)).astype(np.int8)
        scales = rng.uniform(0.5, 2, (2, 64)).astype(np.float32)
        scales[[0, 1], [3, 50]] = [np.inf, np.nan]
        q = QArray.from_parts(codes, scales, block_shape=(32, 1))
        w = codes.astype(np.float64) * np.repeat(scales.astype(np.float64), 32, axis=0)
        got = _dot(jnp.asarray(x), q)
    else:
        scales = rng.uniform(0.01, 0.1, (N, KR // BR)).astype(np.float32)
        scales[[2, 40], [0, 1]] = [np.inf, -np.inf]
        q, w = _rows(rng, scales)
        got = _dot(jnp.asarray(x), q, NK)
    as_dequantized(got, x, w, -(-x.shape[1] // (32 if layout == "columns" else BR)))
