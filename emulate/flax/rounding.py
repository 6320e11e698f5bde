"""Keys for stochastic rounding in quantized flax layers: :func:`rounding_key`.

A layer whose scheme rounds stochastically (``Scheme.rounding == "stochastic"``, e.g.
``dataclasses.replace(emulate.mx.MXFP4, rounding="stochastic", random_bits=8)`` in a
:class:`emulate.flax.Rule`) quantizes its kernel with a key drawn from the innermost
``with rounding_key(key):`` around the call: the ``n``-th quantization inside the block
uses ``jax.random.fold_in(key, n)``, so layers (and calls of one layer) round
independently, and the same key and program give the same rounding.

Pass the key into the jitted step as an argument and enter the block inside it::

    @nnx.jit
    def train_step(model, optimizer, x, y, key):
        with emulate.flax.rounding_key(key):
            loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
        optimizer.update(model, grads)
        return loss

A key set outside a jitted function would be a constant of its compiled program, reused
by every later call: reading one there is a ValueError.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator

import jax
import jax.numpy as jnp

from emulate.numerics.rounding import check_rounding

__all__ = ["rounding_key", "next_key"]


@dataclasses.dataclass
class _Draws:
    key: jax.Array
    count: int = 0


_CURRENT: contextvars.ContextVar[_Draws | None] = contextvars.ContextVar(
    "emulate_flax_rounding_key", default=None
)


@contextlib.contextmanager
def rounding_key(key: jax.Array) -> Iterator[None]:
    """Within the block, stochastically rounding layers draw their keys from ``key``
    (a ``jax.random.key`` or ``PRNGKey``; TypeError otherwise)."""
    check_rounding("stochastic", key, 1)
    token = _CURRENT.set(_Draws(key))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def next_key(where: str) -> jax.Array:
    """The key of the next stochastic quantization (of ``where``, named in errors).

    Raises:
      ValueError: no :func:`rounding_key` block is open, or its key is a concrete array
        read while a jitted function is being traced.
    """
    draws = _CURRENT.get()
    if draws is None:
        raise ValueError(
            f"key: {where} rounds stochastically and needs a key: call the model inside "
            "`with emulate.flax.rounding_key(key):`"
        )
    staged = isinstance(jnp.zeros(()) + 0, jax.core.Tracer)
    if staged and not isinstance(draws.key, jax.core.Tracer):
        raise ValueError(
            f"key: {where} is being traced (jit) with the rounding key of a block opened "
            "outside the traced function, which would make it a constant of the compiled "
            "program: pass the key as an argument and open rounding_key inside"
        )
    key = jax.random.fold_in(draws.key, draws.count)
    draws.count += 1
    return key
