"""Quantized KV caches and the attention that reads them as stored (work in progress)."""

from emulate.kvcache.cache import KVCache
from emulate.kvcache.formats import FORMATS, CacheFormat, cache_format

__all__ = ["FORMATS", "CacheFormat", "KVCache", "cache_format"]
