"""An NNX variable type for a quantized KV cache: :class:`KVCacheVariable`.

A model holds its :class:`emulate.kvcache.KVCache` (every layer's K and V, stacked) in one
``KVCacheVariable``, an ``nnx.Cache``: ``nnx.state(model, nnx.Cache)`` and
``nnx.split(model, ..., nnx.Cache)`` take it apart from the weights (``nnx.Param`` and
emulate's :class:`~emulate.flax.QuantizedWeight`), so a decode step can donate the cache
alone and update it in place::

    class Llama(nnx.Module):
        def init_cache(self, batch, length, format="q4_0"):
            self.kv = emulate.flax.KVCacheVariable(
                emulate.kvcache.KVCache.create(layers, batch, kv_heads, head_dim, length, format))

        def __call__(self, tokens):                       # (B, T) new tokens
            cache = self.kv.get_value()
            for i, block in enumerate(self.layers):
                x, cache = block(x, cache, i)             # cache.write(i, k, v); attention
            self.kv.set_value(cache.advance(tokens.shape[1]))
            return logits

    graphdef, weights, cache = nnx.split(model, nnx.Not(nnx.Cache), nnx.Cache)

    @functools.partial(jax.jit, donate_argnums=2)
    def step(weights, cache, tokens):
        m = nnx.merge(graphdef, weights, cache)
        return m(tokens), nnx.state(m, nnx.Cache)

``examples/gguf_llama.py`` (``decode_cached``) runs this pattern with 8- and 4-bit caches.
"""

from __future__ import annotations

from typing import Any

try:
    from flax import nnx
except ImportError as e:  # pragma: no cover - exercised where flax is absent
    raise ImportError("emulate.flax needs flax: pip install 'emulate[flax]'") from e

__all__ = ["KVCacheVariable"]


class KVCacheVariable(nnx.Cache):
    """An ``nnx.Cache`` holding a :class:`emulate.kvcache.KVCache` (module docstring).

    Raises:
      TypeError: a value that is not a KVCache (an abstract one from ``nnx.eval_shape`` or
        ``jax.eval_shape`` is one).
    """

    def __init__(self, value: Any, **metadata: Any) -> None:
        from emulate.kvcache.cache import KVCache  # loads the kernels: only when one is held

        if not isinstance(value, KVCache):
            raise TypeError(
                f"value: expected an emulate.kvcache.KVCache, got {type(value).__name__}"
            )
        super().__init__(value, **metadata)
