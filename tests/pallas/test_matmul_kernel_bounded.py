"""emulate.pallas.matmul in TPU interpret mode for the pairs outside the exact class: bf16
(and f32, f16) activations times every low-precision weight format, and native float8
pairs, within emulate.bounds.dot_general_bound of the exact sum, NaN and Inf codes
included, with ragged shapes and several block shapes."""

from __future__ import annotations

import zlib

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import emulate
import emulate.pallas
from emulate import formats
from emulate import testing as et
from emulate.pallas import compute

DN = (((1,), (0,)), ((), ()))

WEIGHTS = [
    "int4",
    "uint4",
    "int8",
    "uint8",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3b11fnuz",
    "float8_e3m4",
    "float6_e2m3fn",
    "float6_e3m2fn",
    "float4_e2m1fn",
]
TPUS = ["tpu_v4", "tpu_v5e", "tpu_v6e", "tpu_v7x"]
# By default one format of each class; uint4 and uint8 (int4's and int8's decode without
# the sign), the other float8 formats (the same decode over another exponent range) and
# the float6 formats are long (EMULATE_LONG_TESTS=1): the 6-bit class runs by default in
# test_float6_codes_and_default_result_type (float6_e3m2fn, bf16 activations, tpu_v6e) and
# a packed float6_e2m3fn weight in tests/pallas/test_matmul_kernel.py
# (test_exact_classes_are_bit_identical_to_the_reference, float6 x float6 on tpu_v4).
LONG_WEIGHTS = {
    "float6_e2m3fn",
    "uint4",
    "uint8",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3b11fnuz",
    "float8_e3m4",
    "float6_e3m2fn",
}


def _codes(fmt: str, shape, rng) -> np.ndarray:
    f = formats.get(fmt)
    codes = rng.integers(0, 1 << f.bits, shape).astype(np.uint8)
    special = et.special_codes(f)  # zeros, +-max, +-min normal/subnormal, +-1, NaN, Inf
    pick = rng.random(shape) < 0.2
    codes[pick] = rng.choice(np.array(special, np.uint8), int(pick.sum()))
    return codes


def _activations(dtype, shape, rng) -> np.ndarray:
    x = (rng.standard_normal(shape) * 8).astype(dtype)
    x.flat[::97] = np.inf
    x.flat[5::131] = 0
    return x


def _block(fmt: str, i: int) -> tuple[int, int, int]:
    group = {4: 2, 6: 4, 8: 1}[formats.get(fmt).bits]
    bk = 128 * group * (1 + i % 2)
    return (16 * (1 + i % 2), 128 * (1 + (i // 2) % 2), bk)


@pytest.mark.parametrize(
    "i, fmt",
    [
        pytest.param(i, f, marks=pytest.mark.long) if f in LONG_WEIGHTS else (i, f)
        for i, f in enumerate(WEIGHTS)
    ],
)
def test_bf16_activations_times_every_weight_format_are_within_the_bound(i, fmt):
    f = formats.get(fmt)
    target = TPUS[i % len(TPUS)]
    rng = np.random.default_rng(zlib.crc32(fmt.encode()))
    m, k, n = 7 + 11 * i % 29, 300 + 37 * i, 150 + 13 * i  # ragged everywhere
    x = _activations(ml_dtypes.bfloat16, (m, k), rng)
    codes = _codes(fmt, (k, n), rng)
    w = codes.view(f.dtype)
    arg = emulate.pack(w, axis=0) if f.packable else w
    out = jnp.float32 if i % 3 else jnp.bfloat16
    got = emulate.pallas.matmul(x, arg, target=target, block_shape=_block(fmt, i), out_dtype=out)
    assert np.asarray(got).dtype == np.dtype(out)
    et.assert_matches_reference(got, x, w, DN, mode="fast", preferred_element_type=out)


def test_float6_codes_and_default_result_type():
    rng = np.random.default_rng(6)
    codes = _codes("float6_e3m2fn", (260, 130), rng)
    x = _activations(ml_dtypes.bfloat16, (5, 260), rng)
    got = emulate.pallas.matmul(x, codes, target="tpu_v6e", w_format="e3m2")
    assert np.asarray(got).dtype == ml_dtypes.bfloat16  # what lax.dot_general gives bf16 x fp6
    w = codes.view(ml_dtypes.float6_e3m2fn)
    et.assert_matches_reference(got, x, w, DN, mode="fast")


@pytest.mark.parametrize(
    "x_dtype, fmt, target, method",
    [
        ("float32", "int4", "tpu_v5e", "f32"),  # f32 x f32 at Precision.HIGHEST
        ("float16", "int8", "tpu_v4", "f32"),  # f16 does not fit bf16
        ("float8_e5m2", "float8_e5m2", "tpu_v7x", "native"),  # codes straight to the MXU
        ("float8_e4m3fn", "float8_e4m3fn", "tpu_v5e", "bf16"),  # both decoded, x outside
    ],
)
def test_other_routes_are_within_the_bound(x_dtype, fmt, target, method):
    r = compute.in_kernel(x_dtype, fmt, target=target, preferred_element_type="float32")
    assert r.method == method
    f = formats.get(fmt)
    rng = np.random.default_rng(zlib.crc32(f"{x_dtype} {fmt}".encode()))
    m, k, n = 9, 700, 140
    if formats.get(x_dtype).is_low_precision:
        x = _codes(x_dtype, (m, k), rng).view(formats.get(x_dtype).dtype)
    else:
        x = _activations(np.dtype(formats.get(x_dtype).dtype), (m, k), rng)
    w = _codes(fmt, (k, n), rng).view(f.dtype)
    arg = emulate.pack(w, axis=0) if f.packable else w
    block = (32, 128, 512) if x_dtype != "float32" else (8, 256, 512)
    got = emulate.pallas.matmul(x, arg, target=target, block_shape=block, out_dtype=jnp.float32)
    et.assert_matches_reference(got, x, w, DN, mode="fast", preferred_element_type=jnp.float32)
