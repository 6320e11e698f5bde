"""Quantized KV caches and the attention that reads them as stored.

A decode step's KV cache is what fills an old chip once the weights are quantized:
:class:`KVCache` stores every layer's K and V in one of :data:`FORMATS` (bfloat16; int8
or float8 with a scale per (token, KV head) or per KV head; llama.cpp's q8_0 / q4_0
blocks; OCP MXFP4), and :func:`attention` reads it as stored: on a TPU target one Pallas
kernel decodes each block of codes in VMEM (every generation, v2 to 7x), elsewhere the
XLA route does the same arithmetic.

::

    cache = emulate.kvcache.KVCache.create(layers, batch, kv_heads, head_dim, 4096, "q4_0")

    def step(params, cache, x):                    # jit it with donate_argnums=1
        for i, layer in enumerate(params):
            q, k, v = project(layer, x)            # (B, T, heads / kv_heads, head_dim)
            cache = cache.write(i, k, v)           # quantized at positions lengths..
            x = attend_out(layer, emulate.kvcache.attention(q, cache, i))
        return x, cache.advance(x.shape[1])

Modules: :mod:`~emulate.kvcache.formats` (the cache formats), :mod:`~emulate.kvcache.layout`
(where codes and scales lie), :mod:`~emulate.kvcache.writing` (quantizing written
tokens), :mod:`~emulate.kvcache.cache` (the record), :mod:`~emulate.kvcache.blocks`,
:mod:`~emulate.kvcache.queries`, :mod:`~emulate.kvcache.decode_kernel`,
:mod:`~emulate.kvcache.prefill_kernel` (the kernels), :mod:`~emulate.kvcache.xla_route`,
:mod:`~emulate.kvcache.bounds` (the numerics contract) and
:mod:`~emulate.kvcache.attention` (the entry and its route).
"""

from emulate.kvcache.attention import attention, attention_route, default_block
from emulate.kvcache.bounds import attention_bound
from emulate.kvcache.cache import KVCache, head_scales
from emulate.kvcache.formats import FORMATS, CacheFormat, cache_format

__all__ = [
    "FORMATS",
    "CacheFormat",
    "KVCache",
    "attention",
    "attention_bound",
    "attention_route",
    "cache_format",
    "default_block",
    "head_scales",
]
