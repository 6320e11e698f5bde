"""Three kernels of your own: the example suite of docs/testing.md checks them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl


def int4_weight_only(x, w):
    """x (M, K) float32 times w, an int4 emulate.QArray (K, N) with float32 group scales."""
    codes = w.unpacked_codes().astype(jnp.float32)  # -8..7
    scales = jnp.repeat(w.scales, w.block_shape[0], axis=0)[: codes.shape[0]]
    return jnp.dot(x, codes * scales, precision=lax.Precision.HIGHEST)


def _bf16_fp8_block(x_ref, w_ref, o_ref):
    # float8_e4m3fn -> bfloat16 is exact; TPU v4 has no float8 matmul, so widen in-kernel,
    # through float32: Mosaic extends float8 straight to bfloat16 only in compatibility mode.
    w = w_ref[...].astype(jnp.float32).astype(jnp.bfloat16)
    o_ref[...] = jnp.dot(x_ref[...], w, preferred_element_type=jnp.float32)


@jax.jit
def bf16_fp8(x, w):
    """A Pallas kernel (interpret mode here): bfloat16 x float8_e4m3fn summed in float32."""
    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.float32)
    return pl.pallas_call(_bf16_fp8_block, out_shape=out, interpret=True)(x, w)


@jax.jit
def int8_matmul(a, b):
    """int8 x int8 summed in int32."""
    return jnp.dot(a, b, preferred_element_type=jnp.int32)
