"""A user's own kernels, right and deliberately wrong, for emulate.testing's harness tests.

Plain JAX, importable by name (``_user_kernels:int8_via_f32``) so that the reproducers
check_function writes can import them in a fresh process.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

import emulate

HIGHEST = lax.Precision.HIGHEST


@jax.jit
def int8_exact(a, b):
    """int8 x int8 summed in int32: right for every K below 2**17."""
    return jnp.dot(a.astype(jnp.int32), b.astype(jnp.int32))


@jax.jit
def int8_via_f32(a, b):
    """int8 x int8 summed in float32: wrong once the sums pass 2**24 with odd units."""
    f32 = jnp.float32
    return jnp.dot(a.astype(f32), b.astype(f32), precision=HIGHEST).astype(jnp.int32)


def _dequantize(q: emulate.QArray, signed: bool = True, scale_dtype=jnp.float32):
    codes = q.unpacked_codes()
    v = (
        codes.astype(jnp.float32)
        if signed
        else (lax.bitcast_convert_type(codes.astype(jnp.int8), jnp.uint8) & 0xF).astype(jnp.float32)
    )
    s = q.scales.astype(scale_dtype).astype(jnp.float32)
    s = jnp.repeat(s, q.block_shape[0], axis=0, total_repeat_length=s.shape[0] * q.block_shape[0])
    return v * s[: v.shape[0]]


def int4_weight_only(x, q):
    """x (M, K) float32 times an int4 QArray (K, N) with float32 group scales along K."""
    return jnp.dot(x, _dequantize(q), precision=HIGHEST, preferred_element_type=jnp.float32)


def int4_weight_only_unsigned(x, q):
    """Bug: int4 code 8 (-8) read as +8."""
    w = _dequantize(q, signed=False)
    return jnp.dot(x, w, precision=HIGHEST, preferred_element_type=jnp.float32)


def int4_weight_only_bf16_scales(x, q):
    """Bug: the scales are rounded to bfloat16 before use."""
    w = _dequantize(q, scale_dtype=jnp.bfloat16)
    return jnp.dot(x, w, precision=HIGHEST, preferred_element_type=jnp.float32)


def bf16_fp8(x, w):
    """bfloat16 x float8_e4m3fn, both decoded exactly to float32, summed in float32."""
    f32 = jnp.float32
    return jnp.dot(x.astype(f32), w.astype(f32), precision=HIGHEST)


def bf16_fp8_mixed_dot(x, w):
    """Bug: a mixed bf16 x fp8 dot whose result JAX gives as bfloat16, cast to float32."""
    return lax.dot_general(x, w, (((1,), (0,)), ((), ()))).astype(jnp.float32)


# Pallas kernels summing K blocks of 128 into a float32 output (interpret mode on the CPU):
# right, and with each block's result in bfloat16.
_BK = 128


def _blocks_kernel(block_result):
    def kernel(x_ref, w_ref, o_ref):
        @pl.when(pl.program_id(0) == 0)
        def _():
            o_ref[...] = jnp.zeros_like(o_ref)

        o_ref[...] += block_result(x_ref[...], w_ref[...]).astype(jnp.float32)

    return kernel


def _blocks(block_result, x, w):
    m, k = x.shape
    n = w.shape[1]
    return pl.pallas_call(
        _blocks_kernel(block_result),
        grid=(k // _BK,),
        in_specs=[
            pl.BlockSpec((m, _BK), lambda i: (0, i)),
            pl.BlockSpec((_BK, n), lambda i: (i, 0)),
        ],
        out_specs=pl.BlockSpec((m, n), lambda i: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        interpret=True,
    )(x, w)


@jax.jit
def pallas_blocks(x, w):
    """bfloat16 x bfloat16 in K blocks of 128, each block summed in float32: right."""
    return _blocks(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32), x, w)


@jax.jit
def pallas_blocks_bf16(x, w):
    """Bug: no preferred_element_type, each block's dot is bfloat16 (Mosaic refuses it)."""
    return _blocks(jnp.dot, x, w)


@jax.jit
def xla_blocks_bf16(x, w):
    """Bug (plain JAX): the K blocks' dots return bfloat16, summed in float32."""
    k = x.shape[1]
    parts = [jnp.dot(x[:, i : i + _BK], w[i : i + _BK]) for i in range(0, k, _BK)]
    return sum(p.astype(jnp.float32) for p in parts)


def _int8_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.int32)


@jax.jit
def pallas_int8(x, w):
    """int8 x int8 summed in int32, one block (interpret mode)."""
    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.int32)
    return pl.pallas_call(_int8_kernel, out_shape=out, interpret=True)(x, w)


@jax.jit
def group_sums_scaled(x, q):
    """x (M, K) float32 times a QArray (K, N) with one float32 scale per group of K: each
    group's sum of ``x * code`` in float32, times its scale (right; the reference scales
    each product instead)."""
    codes = q.unpacked_codes().astype(jnp.float32)
    g, k = q.block_shape[0], codes.shape[0]
    out = jnp.zeros((x.shape[0], codes.shape[1]), jnp.float32)
    for i, k0 in enumerate(range(0, k, g)):
        part = jnp.dot(x[:, k0 : k0 + g], codes[k0 : k0 + g], precision=HIGHEST)
        out = out + part * q.scales[i]
    return out
