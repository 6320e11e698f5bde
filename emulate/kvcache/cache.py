"""The KV cache record: :class:`KVCache`, every layer's K and V as stored (codes and
scales, stacked along a leading layer axis) and each sequence's length.

A pytree: ``jax.jit`` takes it whole, donates it (``donate_argnums``) and a decode step's
:meth:`KVCache.write` then updates it in place; ``nnx`` holds it in a variable
(:class:`emulate.flax.KVCacheVariable`). Its layout is :mod:`emulate.kvcache.layout`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from emulate.kvcache import layout, writing
from emulate.kvcache.formats import CacheFormat, cache_format
from emulate.numerics import codecs
from emulate.numerics.pytree import PytreeRecord
from emulate.quantized.layout import Stored, layout_of
from emulate.quantized.quantizing import quantize

__all__ = ["KVCache", "head_scales"]


@dataclasses.dataclass(frozen=True)
class KVCache(
    PytreeRecord,
    data=("k", "v", "k_scales", "v_scales", "lengths"),
    static=("format", "head_dim"),
):
    """K and V of every layer as stored, and the length of each sequence.

    Attributes:
      k, v: codes, ``(layers, batch, rows, kv_heads * head_dim)`` in
        ``format.code_dtype`` (:mod:`emulate.kvcache.layout`: one token a row, or two
        4-bit tokens a byte).
      k_scales, v_scales: per-token or block scales ``(layers, batch, kv_heads * nb,
        capacity)`` in ``format.scale_dtype``; per-head scales ``(layers, kv_heads)``
        float32; None for a bfloat16 cache.
      lengths: ``(batch,)`` int32, the tokens each sequence holds (positions
        ``0 .. lengths - 1``).
      format: the :class:`CacheFormat`.
      head_dim: the width of one head.

    Build one with :meth:`create`; ``jax.eval_shape(lambda: KVCache.create(...))`` gives
    its abstract form (for ``emulate.compiler.compile``) without allocating.
    """

    k: Any
    v: Any
    k_scales: Any
    v_scales: Any
    lengths: Any
    format: CacheFormat
    head_dim: int

    @classmethod
    def create(
        cls,
        layers: int,
        batch: int,
        kv_heads: int,
        head_dim: int,
        length: int,
        format: str | CacheFormat = "bfloat16",  # noqa: A002 - the cache's format
        *,
        k_scales: Any = None,
        v_scales: Any = None,
    ) -> KVCache:
        """An empty cache (every length 0) for ``length`` tokens per sequence (the capacity
        is ``length`` rounded up to a multiple of :data:`emulate.kvcache.layout.TILE`).

        Args:
          layers, batch, kv_heads, head_dim, length: positive ints (``head_dim`` a multiple
            of 8 and of the format's block).
          format: a :class:`CacheFormat` or the name of one (:data:`FORMATS`).
          k_scales, v_scales: per-head formats only: the fixed scales, a float or an array
            broadcastable to ``(layers, kv_heads)`` (a token's value ``x`` is stored as
            ``x / scale``, saturated). Default 1.0 for the float8 formats; int8 needs them
            (int8 holds integers: pick ``max|x| / 127`` per head, as
            :func:`emulate.kvcache.head_scales` does from sample K / V).

        Raises:
          ValueError: a size that is not a positive int, a head_dim the format does not
            take, scales for a format without per-head scales, or per-head int8 without
            scales.
        """
        fmt = cache_format(format)
        for name, value in (("layers", layers), ("batch", batch), ("kv_heads", kv_heads)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        fmt.check_head_dim(head_dim)
        s = layout.capacity(length)
        shape = (layers, *layout.code_shape(fmt, batch, s, kv_heads, head_dim))
        k, v = (jnp.zeros(shape, fmt.code_dtype) for _ in "kv")  # two buffers: both donated
        ks = vs = None
        if fmt.granularity == "head":
            ks, vs = (
                _head_scales(value, fmt, layers, kv_heads, arg)
                for value, arg in ((k_scales, "k_scales"), (v_scales, "v_scales"))
            )
        elif k_scales is not None or v_scales is not None:
            raise ValueError(
                f"k_scales, v_scales: the {fmt.name} cache has no fixed per-head scales "
                "(pass them with a *_per_head format)"
            )
        elif fmt.granularity is not None:
            scale_shape = layout.scale_shape(fmt, batch, s, kv_heads, head_dim)
            assert scale_shape is not None and fmt.scale_dtype is not None
            ks, vs = (jnp.zeros((layers, *scale_shape), fmt.scale_dtype) for _ in "kv")
        lengths = jnp.zeros((batch,), jnp.int32)
        return cls(k, v, ks, vs, lengths, fmt, head_dim)

    # --- sizes --------------------------------------------------------------------------

    @property
    def layers(self) -> int:
        return int(self.k.shape[0])

    @property
    def batch(self) -> int:
        return int(self.k.shape[1])

    @property
    def kv_heads(self) -> int:
        return int(self.k.shape[3]) // self.head_dim

    @property
    def capacity(self) -> int:
        """Tokens each sequence can hold."""
        rows = int(self.k.shape[2])
        return 2 * rows if self.format.packed else rows

    @property
    def nbytes(self) -> int:
        """Bytes stored: codes, scales and lengths."""
        leaves = jax.tree.leaves(self)
        return int(sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize for v in leaves))

    # --- updates --------------------------------------------------------------------------

    def write(self, layer: Any, k: Any, v: Any) -> KVCache:
        """The cache with the K and V rows ``k``, ``v`` (B, T, kv_heads, head_dim) of ``T``
        new tokens quantized into ``layer`` at positions ``lengths .. lengths + T - 1`` of
        each sequence (:mod:`emulate.kvcache.writing`); the lengths stay (call
        :meth:`advance` once every layer has written). Tokens past the capacity are
        dropped. Under ``jax.jit`` with the cache donated this updates it in place.

        Raises:
          ValueError: shapes that do not match the cache's.
        """
        self._check_rows(k, "k")
        self._check_rows(v, "v")
        if k.shape != v.shape:
            raise ValueError(f"v: shape {tuple(v.shape)} differs from k's {tuple(k.shape)}")
        parts: dict[str, Any] = {}
        for name, rows in (("k", k), ("v", v)):
            fixed = (
                getattr(self, f"{name}_scales")[layer]
                if self.format.granularity == "head"
                else None
            )
            codes, scales = writing.token_codes(rows, self.format, fixed)
            stored = getattr(self, f"{name}_scales") if self.format.granularity != "head" else None
            new_codes, new_scales = writing.put(
                getattr(self, name), stored, layer, self.lengths, codes, scales, self.format
            )
            parts[name] = new_codes
            if new_scales is not None:
                parts[f"{name}_scales"] = new_scales
        return dataclasses.replace(self, **parts)

    def advance(self, count: Any) -> KVCache:
        """The cache with every length increased by ``count`` (an int or a (batch,) int
        array: the tokens each sequence took in this step)."""
        return dataclasses.replace(self, lengths=self.lengths + jnp.asarray(count, jnp.int32))

    def with_lengths(self, lengths: Any) -> KVCache:
        """The cache with ``lengths`` (batch,) in place of its own (0 starts a sequence
        anew: its old tokens are never read again)."""
        lengths = jnp.broadcast_to(jnp.asarray(lengths, jnp.int32), (self.batch,))
        return dataclasses.replace(self, lengths=lengths)

    # --- reading --------------------------------------------------------------------------

    def dequantized(self, layer: int) -> tuple[jax.Array, jax.Array]:
        """K and V of ``layer`` as float32 (batch, capacity, kv_heads, head_dim): each code
        decoded times its scale (a float32 product), every position (valid or not)."""
        return self._values(self.k, self.k_scales, layer), self._values(
            self.v, self.v_scales, layer
        )

    def _values(self, codes: Any, scales: Any, layer: int) -> jax.Array:
        fmt, hd, kv = self.format, self.head_dim, self.kv_heads
        c = layout.token_codes(codes[layer], fmt)
        b, s = c.shape[:2]
        if fmt.granularity is None:
            return c.astype(jnp.float32).reshape(b, s, kv, hd)
        vals = codecs.decode(c, fmt.element, to=jnp.float32).reshape(b, s, kv, hd)
        if fmt.granularity == "head":
            return vals * scales[layer][:, None]
        nb = fmt.blocks(hd)
        raw = scales[layer].reshape(b, kv, nb, s)
        sc = (
            raw
            if fmt.scale_format == "float32"
            else codecs.decode(raw, fmt.scale_format, to=jnp.float32)
        )
        sc = jnp.repeat(jnp.transpose(sc, (0, 3, 1, 2)), hd // nb, axis=-1)  # (b, s, kv, hd)
        return vals * sc

    def _check_rows(self, x: Any, arg: str) -> None:
        want = (self.batch, None, self.kv_heads, self.head_dim)
        shape = tuple(getattr(x, "shape", ()))
        if len(shape) != 4 or any(w is not None and w != g for w, g in zip(want, shape)):
            raise ValueError(
                f"{arg}: expected (batch {self.batch}, tokens, kv_heads {self.kv_heads}, "
                f"head_dim {self.head_dim}), got shape {shape}"
            )


def _head_scales(value: Any, fmt: CacheFormat, layers: int, kv_heads: int, arg: str) -> jax.Array:
    if value is None:
        if fmt.element == "int8":
            raise ValueError(
                f"{arg}: a {fmt.name} cache needs its fixed scales (int8 holds integers: "
                "max|x| / 127 per head; emulate.kvcache.head_scales computes them)"
            )
        value = 1.0
    try:
        s = jnp.broadcast_to(jnp.asarray(value, jnp.float32), (layers, kv_heads))
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"{arg}: expected a float or an array of shape ({layers}, {kv_heads}): {e}"
        ) from None
    return s


def head_scales(x: Any, format: str | CacheFormat) -> jax.Array:  # noqa: A002 - the format
    """Fixed per-head scales for a ``*_per_head`` format from sample K (or V) values ``x``
    (layers, tokens, kv_heads, head_dim): per layer and head, :func:`emulate.quantize`'s
    ``absmax`` scale over the samples (their largest magnitude times ``fl(1 / max)`` of
    the element format, a float32). Returns (layers, kv_heads) float32 for
    :meth:`KVCache.create`'s ``k_scales`` / ``v_scales``.

    Raises:
      ValueError: a format without per-head scales, or ``x`` not 4-D.
    """
    fmt = cache_format(format)
    if fmt.granularity != "head":
        raise ValueError(f"format: {fmt.name} has no fixed per-head scales")
    if len(getattr(x, "shape", ())) != 4:
        raise ValueError(
            f"x: expected (layers, tokens, kv_heads, head_dim), got shape {getattr(x, 'shape', x)}"
        )
    x = jnp.asarray(x, jnp.float32)
    q = quantize(x, fmt.element, axis=(1, 3), scale_fmt="float32", scale_rule="absmax")
    scale = layout_of(q).scale
    assert isinstance(scale, Stored)  # float32 scales: one level
    return scale.data.reshape(x.shape[0], x.shape[2])
