"""Pallas TPU kernels for the emulate.pallas.check tests and the check-kernel CLI tests.

Line numbers matter: the tests find the ``# site:`` markers to know where each
``tpu.matmul`` comes from.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import emulate.pallas

_DN = (((1,), (0,)), ((), ()))


def _raw_int8_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.int32)  # site: raw


def raw_int8(x, w):
    """The kernel of the mission error: int8 x int8 tiles through jnp.dot."""
    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.int32)
    return pl.pallas_call(_raw_int8_kernel, out_shape=out)(x, w)


def _fixed_int8_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = emulate.pallas.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.int32)


def fixed_int8(x, w):
    """The same kernel written with emulate.pallas.dot (target: the current one)."""
    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.int32)
    return pl.pallas_call(_fixed_int8_kernel, out_shape=out)(x, w)


def _mixed_kernel(a_ref, b_ref, o_ref):
    o_ref[...] = lax.dot_general(  # site: mixed
        a_ref[...], b_ref[...], _DN, preferred_element_type=jnp.float32
    )


def mixed(a, b):
    """A dot of two different operand types, as lax.dot_general takes them."""
    out = jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), jnp.float32)
    return pl.pallas_call(_mixed_kernel, out_shape=out)(a, b)


def _looped_kernel(x_ref, w_ref, o_ref):
    def body(i, acc):
        x = x_ref[:, pl.ds(i * 128, 128)]
        w = w_ref[pl.ds(i * 128, 128), :]
        return acc + jnp.dot(x, w, preferred_element_type=jnp.int32)  # site: looped

    o_ref[...] = lax.fori_loop(0, 2, body, jnp.zeros(o_ref.shape, jnp.int32))


@jax.jit
def looped_int8(x, w):
    """An int8 dot inside a fori_loop inside the kernel, the kernel inside jit and scan."""
    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.int32)
    call = pl.pallas_call(_looped_kernel, out_shape=out)

    def step(carry, _):
        return carry + call(x, w), None

    total, _ = lax.scan(step, jnp.zeros(out.shape, jnp.int32), None, length=2)
    return total


def _probe_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=o_ref.dtype)


def probe_matmul(x, w, *, acc):
    """The recorded probe's one-line kernel (emulate.compiler's), accumulating in acc."""
    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), acc)
    return pl.pallas_call(_probe_kernel, out_shape=out)(x, w)


def _divided_kernel(x_ref, w_ref, o_ref):
    # Integer division in a kernel body: Pallas's lowering calls pltpu.get_tpu_info().
    step = pl.program_id(0) // 2
    acc = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.int32)  # site: divided
    o_ref[...] = acc + step


def divided_int8(x, w):
    """An int8 dot in a kernel whose lowering reads pltpu.get_tpu_info()."""
    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.int32)
    return pl.pallas_call(_divided_kernel, out_shape=out, grid=(2,))(x, w)


def _quantize_int8_kernel(x_ref, w_ref, o_ref):
    xq = jnp.round(x_ref[...]).astype(jnp.int8)  # site: quantize-cast
    o_ref[...] = jnp.dot(xq, w_ref[...], preferred_element_type=jnp.int32)  # site: quantize-dot


def quantize_int8(x, w):
    """An in-kernel activation quantizer (issue 28): bf16 activations rounded and cast to
    int8 in the kernel, then an int8 x int8 dot."""
    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.int32)
    return pl.pallas_call(_quantize_int8_kernel, out_shape=out)(x, w)


def _mesh_body(x_hbm, w_hbm, o_hbm):
    def block(x_ref, w_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.int32)  # site: mesh

    spec = pl.BlockSpec((128, 128), lambda i: (0, 0))
    pltpu.emit_pipeline(block, grid=(1,), in_specs=[spec, spec], out_specs=spec)(
        x_hbm, w_hbm, o_hbm
    )


def mesh_int8(x, w):
    """A ``pl.kernel`` kernel on a TensorCore mesh made while it is traced (as qwix's qmm
    does): ``create_tensorcore_mesh`` asks JAX which device it runs on."""
    mesh = pltpu.create_tensorcore_mesh("core")
    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.int32)
    return pl.kernel(_mesh_body, out_type=out, mesh=mesh)(x, w)


def _bf16_sum_kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...]).astype(o_ref.dtype)  # site: bf16-sum


def bf16_sum(x, w):
    """A dot without preferred_element_type: bf16 operands summed in bf16 (issue 25)."""
    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.float32)
    return pl.pallas_call(_bf16_sum_kernel, out_shape=out)(x, w)


def interpreted_mixed(a, b):
    """The mixed kernel in interpret mode: plain XLA operations, no Mosaic module."""
    out = jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), jnp.float32)
    return pl.pallas_call(_mixed_kernel, out_shape=out, interpret=True)(a, b)


def _transposed_int8_kernel(x_ref, w_ref, o_ref):
    w = w_ref[...].T  # site: transpose
    o_ref[...] = emulate.pallas.dot(x_ref[...], w, preferred_element_type=jnp.int32)


def transposed_int8(x, w):
    """An (N, K) int8 weight transposed in the kernel before emulate.pallas.dot (issue 49):
    Mosaic transposes 8-bit values only in compatibility mode."""
    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[0]), jnp.int32)
    return pl.pallas_call(_transposed_int8_kernel, out_shape=out)(x, w)
