"""benchmarks.contenders: the contenders compute the product they name, and the abstract
weights have the layouts the compile-only benchmark documents."""

from __future__ import annotations

import math

import jax.numpy as jnp
import ml_dtypes
import numpy as np

import emulate
from benchmarks.cases import DN, PAIRS
from benchmarks.contenders import pair_programs, scheme_programs, weight_spec

RNG = np.random.default_rng(3)
# Small integers: every product and partial sum is exact in f32 (|sum| < 2**24), so each
# contender's f32 result equals the int64 matmul, whatever it decodes or rounds on the way.
X = RNG.integers(-8, 9, size=(3, 40))
W = RNG.integers(-100, 101, size=(40, 5))
WANT = (X.astype(np.int64) @ W.astype(np.int64)).astype(np.float32)


def test_the_pair_contenders_compute_the_matmul():
    progs = pair_programs(jnp.float32, "cpu")
    assert list(progs) == ["floor", "astype", "xla", "fast", "exact"]
    x = jnp.asarray(X.astype(ml_dtypes.bfloat16))
    w = jnp.asarray(W.astype(np.int8))
    w_bf16 = jnp.asarray(W.astype(ml_dtypes.bfloat16))
    for key, fn in progs.items():
        got = np.asarray(fn(x, w_bf16 if key == "floor" else w))
        assert got.dtype == np.float32, key
        np.testing.assert_array_equal(got, WANT, err_msg=key)


def test_fast_runs_under_the_route_it_is_given():
    x = jnp.asarray(X.astype(ml_dtypes.bfloat16))
    w = jnp.asarray(W.astype(np.int8))
    for route in (None, "xla"):
        got = pair_programs(jnp.float32, "cpu", route=route)["fast"](x, w)
        np.testing.assert_array_equal(np.asarray(got), WANT)


def test_the_scheme_contenders_compute_the_matmul():
    # int8 codes with power-of-two scales per column: dequantized to bf16 exactly.
    scales = (2.0 ** RNG.integers(-3, 4, size=(1, 5))).astype(np.float32)
    q = emulate.quantize(jnp.asarray(W * scales, jnp.float32), "int8", axis=0)
    values = np.asarray(emulate.dequantize(q, to=jnp.float32))
    want = (X.astype(np.float64) @ values.astype(np.float64)).astype(np.float32)
    x = jnp.asarray(X.astype(ml_dtypes.bfloat16))
    progs = scheme_programs(DN, "cpu")
    assert list(progs) == ["floor", "dequantize", "emulate", "pallas"]
    w_bf16 = jnp.asarray(values.astype(ml_dtypes.bfloat16))
    for key in ("floor", "dequantize", "emulate"):
        got = np.asarray(progs[key](x, w_bf16 if key == "floor" else q))
        np.testing.assert_array_equal(got, want, err_msg=key)


def test_weight_spec_is_the_packed_layout():
    p = weight_spec(PAIRS["float4_e2m1fn"], 64, 32, stored=True)
    assert (p.data.shape, p.data.dtype, p.length, p.axis) == ((32, 32), jnp.uint8, 64, -2)
    assert p.shape == (64, 32)
    raw = weight_spec(PAIRS["float4_e2m1fn"], 64, 32, stored=False)
    assert (raw.shape, raw.dtype) == ((64, 32), jnp.dtype("float4_e2m1fn"))
    assert math.prod(p.data.shape) == 64 * 32 // 2
