"""Pallas TPU kernels for the emulate.pallas.check tests and the check-kernel CLI tests.

Line numbers matter: the tests find the ``# site:`` markers to know where each
``tpu.matmul`` comes from.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

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
