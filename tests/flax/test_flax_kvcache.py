"""emulate.flax.KVCacheVariable: a model's KV cache as an nnx.Cache, split from the weights,
donated to a jitted step and updated in place."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import emulate.flax
from emulate.kvcache import KVCache


class _Model(nnx.Module):
    def __init__(self) -> None:
        self.w = nnx.Param(jnp.full((2, 64), 0.5))
        self.kv = emulate.flax.KVCacheVariable(KVCache.create(1, 1, 2, 64, 256, "int8"))

    def __call__(self, x: jax.Array) -> jax.Array:
        cache = self.kv.get_value().write(0, x * self.w[...], x)
        self.kv.set_value(cache.advance(x.shape[1]))
        return cache.lengths


def test_the_cache_splits_from_the_weights_and_is_donated() -> None:
    model = _Model()
    graphdef, weights, cache = nnx.split(model, nnx.Not(nnx.Cache), nnx.Cache)
    assert [type(v).__name__ for v in jax.tree.leaves(weights)] == ["ArrayImpl"]
    assert len(jax.tree.leaves(cache)) == 5  # codes, scales of K and V, lengths

    @functools.partial(jax.jit, donate_argnums=1)
    def step(weights, cache, x):
        m = nnx.merge(graphdef, weights, cache)
        return m(x), nnx.state(m, nnx.Cache)

    x = jnp.ones((1, 3, 2, 64))
    old = jax.tree.leaves(cache)
    _, cache = step(weights, cache, x)
    assert all(a.is_deleted() for a in old)  # the cache was updated in place
    _, cache = step(weights, cache, x)
    kv = nnx.merge(graphdef, weights, cache).kv.get_value()
    assert int(kv.lengths[0]) == 6
    k, _ = kv.dequantized(0)
    np.testing.assert_allclose(np.asarray(k[0, :6]), 0.5, rtol=2e-3)
    np.testing.assert_array_equal(np.asarray(k[0, 6:]), 0.0)


def test_a_variable_holds_a_kvcache_only() -> None:
    with pytest.raises(TypeError, match="value: expected an emulate.kvcache.KVCache, got ndarray"):
        emulate.flax.KVCacheVariable(np.zeros(3))
