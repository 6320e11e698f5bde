"""A small Pallas matmul the compiler tests compile (in this process and in the compiler
child, which imports it by reference), and argument specs for it."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def spec(fmt: str, shape: tuple[int, int] = (128, 128)) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.dtype(fmt))


def _kernel(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=o_ref.dtype)


def matmul(x, w, *, acc):
    """``x @ w`` in one Pallas kernel, accumulated and stored in ``acc``."""
    from jax.experimental import pallas as pl

    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), jnp.dtype(acc))
    return pl.pallas_call(_kernel, out_shape=out)(x, w)
