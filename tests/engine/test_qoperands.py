"""Zero points subtracted as exact integers: a QArray with integer codes and zero points
multiplies within the plain weight's bound, ``gamma_(K + S + c) * sum |x| |W|`` with ``W``
the exactly dequantized weight (emulate.bounds.qarray_bound), on every XLA route (the CPU
plan and the TPU plans, run on the CPU) and in emulate.pallas.matmul (interpret mode);
symmetric and asymmetric zero points at the extremes of their range (issue 40)."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _sweeps import LONG, examples
from hypothesis import given, settings
from hypothesis import strategies as st

import emulate
import emulate.pallas
from emulate import bounds
from emulate.engine.qoperands import code_operand, offset_coefficients, zero_points_in_codes

DN = (((1,), (0,)), ((), ()))
XLA_TARGETS = ["cpu", "tpu_v5e", "tpu_v4"]
#: (code format, the zero points: a static int or the dtype of an array of them)
ZERO_POINTS = [
    ("uint4", 8),  # GGUF Q4_0, GPTQ / compressed-tensors symmetric int4
    ("uint4", "uint4"),  # AWQ, GPTQ asymmetric
    ("uint8", 128),  # symmetric 8-bit
    ("uint8", "uint8"),
    ("uint5", 16),  # GGUF Q5_0
    ("uint6", 32),  # GGUF Q6_K
    ("uint3", 4),  # GGUF Q3_K
]


def _bits(fmt: str) -> int:
    return int(fmt.removeprefix("uint"))


def _codes_near(rng, z: np.ndarray, bits: int, shape, spread: int) -> np.ndarray:
    """Codes at the zero point or within ``spread`` of it (clipped to the format): ``W``
    small beside ``|v s| + |z s|``, the case the old bound hid."""
    v = z + rng.integers(-spread, spread + 1, shape) * (rng.random(shape) < 0.3)
    return np.clip(v, 0, 2**bits - 1).astype(np.uint8)


def _weight(fmt, zp, k, n, group, rng, extreme: str, spread: int = 1):
    """(QArray, exact W float64): codes near the zero points; array zero points at the
    extreme of their range (``extreme``: "low" 0, "high" the largest code, "mid")."""
    bits = _bits(fmt)
    grid = (k // group, n)
    if isinstance(zp, int):
        z = np.full(grid, zp)
        zero_points = zp
    else:
        value = {"low": 0, "high": 2**bits - 1, "mid": 2 ** (bits - 1)}[extreme]
        z = np.full(grid, value)
        z[::2, ::3] = 2**bits - 1 - value  # both extremes in one weight
        zero_points = z.astype(np.uint8)
    zf = np.repeat(z, group, axis=0)
    codes = _codes_near(rng, zf, bits, (k, n), spread)
    scales = (rng.uniform(0.5, 2, grid) * 2.0 ** rng.integers(-6, 2, grid)).astype(np.float16)
    q = emulate.QArray.from_parts(
        codes, scales, block_shape=(group, 1), fmt=fmt, zero_points=zero_points, dtype="float32"
    )
    w = (codes.astype(np.float64) - zf) * np.repeat(scales.astype(np.float64), group, axis=0)
    return q, w


def _check(got, x, w, segments, route="xla"):
    exact = x.astype(np.float64) @ w
    bound = bounds.qarray_bound(x.astype(np.float64), w, DN, segments=segments, route=route)
    err = np.abs(np.asarray(got, np.float64) - exact)
    assert np.all(err <= bound), float(np.max(err / np.maximum(bound, 1e-300)))


def test_the_codes_are_the_exact_integers_v_minus_z():
    rng = np.random.default_rng(0)
    for fmt, zp, want in [
        ("uint4", 8, "int8"),
        ("uint8", 128, "int8"),
        ("uint8", "uint8", "bfloat16"),
    ]:
        q, w = _weight(fmt, zp, 64, 8, 32, rng, "high", spread=2 ** _bits(fmt))
        op = code_operand(q)
        assert op.format_name == want and zero_points_in_codes(q)
        assert offset_coefficients(q) is None
        s = np.repeat(np.asarray(q.scales, np.float64), 32, axis=0)
        np.testing.assert_array_equal(np.asarray(op.value, np.float64) * s, w)


# By default 4-bit codes on every XLA route and 8-bit codes (the same subtraction of a
# static zero point, from wider codes) on tpu_v5e; 8-bit codes on every route under
# EMULATE_LONG_TESTS=1.
ONE_NONZERO = [("uint4", 8, t) for t in XLA_TARGETS] + [
    ("uint8", 128, t) for t in (XLA_TARGETS if LONG else ["tpu_v5e"])
]


def test_one_nonzero_weight_among_zero_points_is_within_the_plain_bound():
    """Every code at its zero point but one: W has one nonzero; a route that rounds
    sum(x v) and z * sum(x) apart misses the plain bound by far."""
    k, n, group = 256, 8, 128
    rng = np.random.default_rng(1)
    for fmt, zp, target in ONE_NONZERO:
        z = zp
        codes = np.full((k, n), z, np.uint8)
        codes[5, :] = z + 1
        scales = np.full((k // group, n), 0.3, np.float16)
        q = emulate.QArray.from_parts(
            codes, scales, block_shape=(group, 1), fmt=fmt, zero_points=zp, dtype="float32"
        )
        w = (codes.astype(np.float64) - z) * np.float64(np.float16(0.3))
        x = rng.standard_normal((4, k)).astype(np.float32) * 100
        got = emulate.matmul(
            x, q, target=target, precision="highest", preferred_element_type=jnp.float32
        )
        _check(got, x, w, k // group)


# 3 examples of each route by default, 6 under EMULATE_LONG_TESTS=1.
@pytest.mark.parametrize("target", XLA_TARGETS)
@settings(max_examples=examples(3, 6), deadline=None)
@given(
    case=st.sampled_from(ZERO_POINTS),
    extreme=st.sampled_from(["low", "high", "mid"]),
    group=st.sampled_from([32, 64, 256]),
    spread=st.sampled_from([1, 3, 255]),
    x_type=st.sampled_from(["float32", "bfloat16"]),
    seed=st.integers(0, 2**16),
)
def test_xla_routes_are_within_the_plain_weight_bound(
    target, case, extreme, group, spread, x_type, seed
):
    rng = np.random.default_rng(seed)
    fmt, zp = case
    k, n = 256, 16
    q, w = _weight(fmt, zp, k, n, group, rng, extreme, spread)
    x = rng.standard_normal((3, k)).astype(np.dtype(getattr(ml_dtypes, x_type, x_type)))
    got = emulate.matmul(x, q, target=target, precision="highest", preferred_element_type="float32")
    _check(got, x, w, k // group)


# Packed 4-bit codes with a static and with an array of zero points by default; 8-bit
# codes with 8-bit zero points under EMULATE_LONG_TESTS=1.
@pytest.mark.parametrize(
    ("fmt", "zp"),
    [("uint4", 8), ("uint4", "uint4"), pytest.param("uint8", "uint8", marks=pytest.mark.long)],
)
def test_pallas_matmul_is_within_the_plain_weight_bound(fmt, zp):
    rng = np.random.default_rng(7)
    k, n, group = 256, 128, 128
    q, w = _weight(fmt, zp, k, n, group, rng, "high")
    if fmt == "uint4":
        q = emulate.pallas.prepare_weight(q)
    x = (rng.standard_normal((8, k)) * 10).astype(ml_dtypes.bfloat16)
    kernel = functools.partial(emulate.pallas.matmul, target="tpu_v5e", interpret=True)
    got = kernel(x, q, out_dtype=jnp.float32)
    _check(got, x, w, k // group, route="pallas")
