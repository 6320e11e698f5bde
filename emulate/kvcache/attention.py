"""Attention over a :class:`emulate.kvcache.KVCache` layer: :func:`attention`, and the route
it takes (:func:`attention_route`).

On a TPU target the cache is read once as stored by a Pallas kernel
(:mod:`emulate.kvcache.decode_kernel` for one new token a sequence,
:mod:`emulate.kvcache.prefill_kernel` for blocks of queries); elsewhere by the XLA route
(:mod:`emulate.kvcache.xla_route`), with the same numerics contract. The decision is
the project's kernel-route owner's (:func:`emulate.routing.choose`, for the
:class:`emulate.routing.KernelOp` ``_Attention``; its settings: :func:`emulate.use_route`),
and :func:`emulate.inspect` shows it per call.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from emulate import routing, targets
from emulate.engine import sites
from emulate.kvcache import blocks, layout, queries, xla_route
from emulate.kvcache.blocks import Geometry
from emulate.kvcache.cache import KVCache
from emulate.kvcache.formats import CacheFormat
from emulate.routing.pallas_ops import pallas_unlowered
from emulate.routing.setting import WeightRoute

__all__ = ["KERNEL_NAME", "attention", "attention_route", "default_block"]

#: The kernel route's name (:class:`emulate.WeightRoute`'s ``kernel_name``).
KERNEL_NAME = "emulate.kvcache.attention"
#: Stored bytes of K codes one kernel step reads, by default (:func:`default_block`).
_STEP_BYTES = 512 * 1024
_MAX_BLOCK = 2048
_DECODED = 128 * 1024
_STACKED = 64 * 1024


def default_block(fmt: CacheFormat, geometry: Geometry, capacity: int) -> int:
    """Tokens a kernel step (and an XLA route loop trip) reads: about 512 KiB of K codes,
    between 256 and 2048 tokens, fewer where the decoded block would crowd VMEM (at most
    128 Ki elements of a head's decoded window, 64 Ki of its stacked scores: measured
    to fit the 16 MiB of v2 to v4 with the heads of gpt-oss and Llama); a multiple of
    :data:`emulate.kvcache.layout.TILE` that divides ``capacity``."""
    g = geometry
    row = g.kv_heads * g.head_dim * fmt.bits / 8
    want = min(_MAX_BLOCK, max(layout.TILE, _STEP_BYTES // row))
    want = min(want, _DECODED // g.window, _STACKED // (g.row_groups * g.groups))
    block = min(max(int(want) // layout.TILE, 1) * layout.TILE, capacity)
    while capacity % block:
        block -= layout.TILE
    return block


@dataclasses.dataclass(frozen=True)
class _Call:
    """A checked attention call as :func:`emulate.routing.choose` reads it: its target, its
    operands ``x = (scaled queries, visible, layer)`` and ``w = (k, k_scales, v,
    v_scales)`` (the stacked cache arrays), and why the kernel cannot take it (None)."""

    target: targets.Target
    x: tuple
    w: tuple
    why: str | None

    def read_back(self) -> _Call:
        return self


@dataclasses.dataclass(frozen=True)
class _Attention:
    """The attention kernels as a :class:`emulate.routing.KernelOp`: what their program is
    specialized on, their kernel and their XLA route (its own: ``xla_route`` is unused)."""

    format: CacheFormat
    geometry: Geometry
    block: int
    target: targets.Target
    out_dtype: str = "float32"
    interpret: bool = False
    xla_route: Any = None
    side: str = "rhs"
    kernel_name: ClassVar[str] = KERNEL_NAME
    platform: ClassVar[str] = "tpu"
    interpretable: ClassVar[bool] = True
    map_batches: ClassVar[bool] = False
    compiles_when_traced: ClassVar[bool] = False

    def operands(self, call: _Call) -> tuple[tuple, tuple]:
        return call.x, call.w

    def refusal(self, call: _Call, x: tuple, w: tuple) -> str | None:
        return call.why

    def unlowered(self) -> str | None:
        return pallas_unlowered()

    def advice(self, w: Any) -> str:
        return ""

    @property
    def compute(self) -> str:
        """What the matrix unit multiplies: f32 on v2 and v3 (Mosaic runs f32 x f32
        only), bf16 elsewhere (exact either way: bf16 values)."""
        f32 = not self.target.compiles("bfloat16", "bfloat16")
        return str(blocks.compute_dtype(f32))

    def kernel(self, x: tuple, w: tuple) -> jax.Array:
        from emulate.kvcache import decode_kernel, prefill_kernel

        xs, visible, layer = x
        k, ks, v, vs = w
        xq = queries.windowed(xs, self.geometry)
        if xs.shape[1] == 1:
            cfg = decode_kernel.DecodeConfig(self.format, self.geometry, self.block, self.compute)
            o = decode_kernel.decode(
                xq[:, 0], k, ks, v, vs, visible, layer, cfg, self.out_dtype, self.interpret
            )
            return o[:, None]  # (B, 1, KV, G, hd)
        return prefill_kernel.prefill(
            xq, k, ks, v, vs, visible, layer, self.format, self.geometry, self.block,
            self.compute, self.out_dtype, self.interpret,
        )  # fmt: skip

    def xla(self, x: tuple, w: tuple) -> jax.Array:
        xs, visible, layer = x
        k, ks, v, vs = (None if a is None else a[layer] for a in w)
        assert k is not None and v is not None
        out = xla_route.attend(xs, k, ks, v, vs, visible, self.format, self.block)
        return out.astype(self.out_dtype)


def _checked(q: Any, cache: Any, layer: Any) -> None:
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache: expected an emulate.kvcache.KVCache, got {type(cache).__name__}")
    shape = tuple(getattr(q, "shape", ()))
    if len(shape) != 4:
        raise ValueError(
            f"q: expected (batch, tokens, heads, head_dim), got shape {shape or type(q).__name__}"
        )
    b, t, h, hd = shape
    if not jnp.issubdtype(q.dtype, jnp.floating):
        raise TypeError(f"q: expected a float array, got {q.dtype}")
    if b != cache.batch or hd != cache.head_dim or t < 1 or h % cache.kv_heads:
        raise ValueError(
            f"q: shape {shape} does not fit the cache (batch {cache.batch}, head_dim "
            f"{cache.head_dim}, a multiple of its {cache.kv_heads} KV heads, tokens >= 1)"
        )
    if isinstance(layer, (int, np.integer)) and not 0 <= layer < cache.layers:
        raise ValueError(f"layer: {layer} is not a layer of the cache's {cache.layers}")
    if not isinstance(layer, (int, np.integer)) and (
        getattr(layer, "shape", None) != () or not jnp.issubdtype(layer.dtype, jnp.integer)
    ):
        raise TypeError(f"layer: expected an int or an integer scalar array, got {layer!r}")


def _call(
    q: Any, cache: KVCache, layer: Any, scale: Any, visible: Any, block: int | None, target: Any
) -> tuple[_Attention, tuple, tuple, jax.Array | None]:
    """The op, its operands and the per-head V scales (or None) of a checked call."""
    _checked(q, cache, layer)
    t = targets.current_target(target)
    fmt, kv, hd = cache.format, cache.kv_heads, cache.head_dim
    g = Geometry(kv, q.shape[2] // kv, hd, fmt.blocks(hd))
    n = default_block(fmt, g, cache.capacity) if block is None else block
    if n % layout.TILE or cache.capacity % n:
        raise ValueError(
            f"block: expected a multiple of {layout.TILE} that divides the capacity "
            f"{cache.capacity}, got {n}"
        )
    factor = jnp.full((kv,), 1 / math.sqrt(hd) if scale is None else scale, jnp.float32)
    v_heads = None
    lay = jnp.asarray(layer, jnp.int32)
    if fmt.granularity == "head":
        factor = factor * cache.k_scales[lay]
        v_heads = cache.v_scales[lay]
    seen = cache.lengths + 1 if visible is None else jnp.asarray(visible, jnp.int32)
    xs = queries.scaled_queries(q, kv, factor)
    stored = (cache.k, None, cache.v, None)
    if fmt.granularity in ("token", "block"):
        stored = (cache.k, cache.k_scales, cache.v, cache.v_scales)
    seen = jnp.broadcast_to(seen, (cache.batch,))
    out = "float32" if v_heads is not None else str(jnp.dtype(q.dtype))
    return _Attention(fmt, g, n, t, out), (xs, seen, lay), stored, v_heads


def attention(
    q: Any,
    cache: KVCache,
    layer: Any,
    *,
    scale: float | None = None,
    visible: Any = None,
    block: int | None = None,
    target: targets.TargetLike = None,
) -> jax.Array:
    """Softmax attention of the queries ``q`` over ``layer`` of ``cache`` as stored.

    ``q`` holds the queries of the ``T`` tokens just written (:meth:`KVCache.write`,
    before :meth:`KVCache.advance`): query ``t`` of sequence ``b`` sits at position
    ``lengths[b] + t`` and sees the cache's tokens ``0 .. lengths[b] + t`` (causal). Query
    head ``h`` reads KV head ``h // (heads / kv_heads)`` (grouped-query attention).

    Args:
      q: (batch, T, heads, head_dim) float; ``heads`` a multiple of the cache's KV heads.
      cache: the :class:`KVCache`.
      layer: an int, or an int32 scalar (a layer loop's index).
      scale: the scores' factor; default ``1 / sqrt(head_dim)``.
      visible: (batch,) int32 or an int, the tokens query 0 sees (default ``lengths +
        1``); query ``t`` sees ``visible + t``. 0 for query 0 of a sequence: it sees
        nothing, and its output is 0.
      block: tokens a kernel step reads (a multiple of 256 dividing the capacity);
        default :func:`default_block`.
      target: the target (default the current one): on a TPU target the kernel, else
        the XLA route (:func:`attention_route`).

    Returns:
      (batch, T, heads, head_dim) in ``q``'s dtype. Numerics: docs/numerics.md,
      "Attention over a quantized KV cache".

    Raises:
      TypeError, ValueError: naming the argument, for shapes that do not fit the cache, a
        layer out of range, a block the capacity does not take; under
        ``emulate.use_route("kernel")``, a call the kernel cannot take.
    """
    op, x, w, v_heads = _call(q, cache, layer, scale, visible, block, target)
    call, route = _route(op, x, w)
    b, t, h, hd = q.shape
    with sites.scope(_tag(q, cache, op, route)):
        if route.kernel:
            out = routing.run(call, op, route)
        else:
            out = op.xla(x, w)
    if v_heads is not None:
        out = out * v_heads[:, None, None]
    return out.reshape(b, t, h, hd).astype(q.dtype)


def _route(op: _Attention, x: tuple, w: tuple) -> tuple[_Call, WeightRoute]:
    why = None
    if jnp.dtype(x[0].dtype) != jnp.float32:  # the scaled queries are f32 by construction
        why = "queries must be float"
    call = _Call(op.target, x, w, why)
    route = routing.choose(call, op)
    assert route is not None  # an op: a route
    return call, route


def attention_route(
    q: Any,
    cache: KVCache,
    layer: Any,
    *,
    block: int | None = None,
    target: targets.TargetLike = None,
) -> WeightRoute:
    """The route :func:`attention` would take for these arguments (arrays or
    ``jax.ShapeDtypeStruct`` s), decided as for a TPU lowering, without running it;
    ``print(r.explain())`` says why.

    Raises:
      ValueError, TypeError: as :func:`attention`.
    """
    found: list[WeightRoute] = []

    def probe(q: Any, cache: KVCache) -> jax.Array:
        op, x, w, _ = _call(q, cache, layer, None, None, block, target)
        found.append(_route(op, x, w)[1])
        return jnp.zeros(())

    with routing.planning():
        jax.eval_shape(probe, q, cache)
    return found[0]


def _tag(q: Any, cache: KVCache, op: _Attention, route: WeightRoute) -> sites.SiteTag:
    b, t, h, hd = q.shape
    s = cache.capacity
    fmt = cache.format
    lhs = sites.operand_text(str(jnp.dtype(q.dtype)), q.shape)
    rhs = f"{fmt.element}[2,{b},{s},{cache.kv_heads},{hd}]:kvcache({fmt.name})"
    label = route.label() if route.kernel else f"xla: {route.reason}"
    label = label if op.target.kind == "tpu" else ""
    return sites.SiteTag(
        "attention", lhs, rhs, "float32", op.target.name, "fast", 4 * b * t * h * s * hd, label
    )
