"""One decoder layer of a real model, as a porting user writes it in JAX, for
``benchmarks.models``: Llama-style (RMSNorm, rotary attention with grouped KV heads over a
KV cache, RMSNorm, SwiGLU MLP) or with a gpt-oss-style MoE MLP (a linear router, top-k
experts, SwiGLU experts); and the output head.

Every projection calls ``matmul(x, w)``, one of:

- ``"front"``: ``emulate.matmul(x, w, target=...)`` on the weight as its importer builds
  it (a QArray), the call a ported model makes (so that a front end routing QArrays to the
  Pallas kernel shows up here);
- ``"pallas"``: ``emulate.pallas.matmul`` on the weight prepared once
  (``emulate.pallas.prepare_weight``), which reaches the kernel today;
- ``"bf16"``: ``jnp.dot`` on bf16 weights, the model the quantized one replaces.

Experts: each token's top-k (token, expert) pairs are sorted by expert and every expert
projection is one grouped matmul over them (``grouped_fn``: ``emulate.ragged_dot`` on the
stacked QArray, ``emulate.pallas.ragged_dot`` on the prepared experts, or
``lax.ragged_dot`` on bf16 ones): an expert no token routes to is not read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import emulate
import emulate.kvcache
import emulate.pallas
from emulate.kvcache import KVCache

__all__ = ["ROUTES", "Shape", "grouped_fn", "head", "layer", "matmul_fn"]

#: How a projection multiplies its weight (see the module docstring).
ROUTES = ("front", "pallas", "bf16")


@dataclasses.dataclass(frozen=True)
class Shape:
    """A decoder's sizes: model width, MLP width (per expert), layers, attention heads,
    KV heads, head width, vocabulary; experts and top_k (0 for a dense MLP); chips over
    which each layer is split tensor-parallel (heads and MLP columns, as Megatron does:
    the sizes here are one chip's share)."""

    dim: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    experts: int = 0
    top_k: int = 0
    chips: int = 1
    eps: float = 1e-5


def _bf16_dot(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(jnp.bfloat16)


def matmul_fn(route: str, target: str) -> Callable[[jax.Array, Any], jax.Array]:
    """``matmul(x, w)`` of a (rows, K) bf16 ``x`` by a (K, N) weight along ``route``; the
    result in bf16. A bf16 weight (the layers a format leaves unquantized) is a plain
    ``jnp.dot`` on every route."""
    if route not in ROUTES:
        raise ValueError(f"route: expected one of {', '.join(ROUTES)}, got {route!r}")

    def mm(x: jax.Array, w: Any) -> jax.Array:
        if route == "bf16" or getattr(w, "dtype", None) == jnp.bfloat16 and not hasattr(w, "codes"):
            return _bf16_dot(x, w)
        if route == "front":
            return emulate.matmul(x, w, target=target).astype(jnp.bfloat16)
        out = emulate.pallas.matmul(x, w, target=target, out_dtype=jnp.float32)
        return out.astype(jnp.bfloat16)

    return mm


def _rms(x: jax.Array, g: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    scale = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (x32 * scale * g).astype(jnp.bfloat16)


def _rope(x: jax.Array, positions: jax.Array) -> jax.Array:
    """Rotary embedding of ``x`` (B, T, heads, head_dim) at ``positions`` (T,), adjacent
    pairs rotated together."""
    d = x.shape[-1]
    angle = positions[:, None].astype(jnp.float32) * 10000.0 ** (-jnp.arange(0, d, 2) / d)
    cos, sin = jnp.cos(angle)[:, None, :], jnp.sin(angle)[:, None, :]
    xf = x.astype(jnp.float32)
    even, odd = xf[..., 0::2], xf[..., 1::2]
    out = jnp.stack([even * cos - odd * sin, even * sin + odd * cos], -1)
    return out.reshape(x.shape).astype(jnp.bfloat16)


def _attention(
    s: Shape, mm: Callable, w: dict, x: jax.Array, cache: KVCache, pos: jax.Array, target: str
):
    """Attention of ``x`` (B, T, D) written into the one-layer KV cache at ``pos`` (every
    sequence's length: an int32 scalar); the T new rows attend to every cached row up to
    their own position, through :func:`emulate.kvcache.attention` (a Pallas kernel that
    reads the cache once as stored, in any of its formats: decode one token, prefill
    blocks of queries)."""
    b, t, _ = x.shape
    rows = x.reshape(b * t, -1)
    positions = pos + jnp.arange(t)
    q = _rope(mm(rows, w["q"]).reshape(b, t, s.heads, s.head_dim), positions)
    k = _rope(mm(rows, w["k"]).reshape(b, t, s.kv_heads, s.head_dim), positions)
    v = mm(rows, w["v"]).reshape(b, t, s.kv_heads, s.head_dim)
    cache = cache.with_lengths(jnp.broadcast_to(pos, (b,))).write(0, k, v)
    with emulate.use_route("kernel"):  # also in the program traced alone, off shard_map
        out = emulate.kvcache.attention(q, cache, 0, target=target).reshape(b * t, -1)
    return mm(out, w["o"]).reshape(x.shape), cache


def _swiglu(mm: Callable, rows: jax.Array, gate: Any, up: Any, down: Any) -> jax.Array:
    h = jax.nn.silu(mm(rows, gate).astype(jnp.float32)) * mm(rows, up).astype(jnp.float32)
    return mm(h.astype(jnp.bfloat16), down)


def grouped_fn(route: str, target: str) -> Callable[[jax.Array, Any, jax.Array], jax.Array]:
    """``gmm(x, w, group_sizes)``: ``lax.ragged_dot`` of (rows, K) bf16 rows sorted by
    expert by stacked (E, K, N) experts along ``route`` (``emulate.ragged_dot`` on the
    QArray, ``emulate.pallas.ragged_dot`` on the prepared experts, ``lax.ragged_dot`` on
    bf16 ones); the result in bf16."""

    def gmm(x: jax.Array, w: Any, group_sizes: jax.Array) -> jax.Array:
        if route == "bf16":
            out = jax.lax.ragged_dot(x, w, group_sizes, preferred_element_type=jnp.float32)
        elif route == "front":
            out = emulate.ragged_dot(
                x, w, group_sizes, preferred_element_type=jnp.float32, target=target
            )
        else:
            out = emulate.pallas.ragged_dot(x, w, group_sizes, target=target, out_dtype=jnp.float32)
        return out.astype(jnp.bfloat16)

    return gmm


def _moe(s: Shape, gmm: Callable, w: dict, rows: jax.Array) -> jax.Array:
    """The routed experts: each row's top-k (row, expert) pairs sorted by expert, one
    grouped matmul per projection over them (an expert no row routes to is not read),
    the results weighted by the routing and summed back into their rows."""
    router = jnp.dot(rows, w["router"], preferred_element_type=jnp.float32)  # (R, E)
    top, idx = jax.lax.top_k(router, s.top_k)
    gates = jax.nn.softmax(top, axis=-1).reshape(-1)  # (R * top_k,)
    experts = idx.reshape(-1)
    order = jnp.argsort(experts)
    source = order // s.top_k  # the row of each sorted pair
    sizes = jnp.zeros((s.experts,), jnp.int32).at[experts].add(1)
    xs = rows[source]
    h = jax.nn.silu(gmm(xs, w["gate"], sizes).astype(jnp.float32))
    h = h * gmm(xs, w["up"], sizes).astype(jnp.float32)
    y = gmm(h.astype(jnp.bfloat16), w["down"], sizes).astype(jnp.float32)
    out = jnp.zeros(rows.shape, jnp.float32).at[source].add(y * gates[order][:, None])
    return out.astype(jnp.bfloat16)


def layer(s: Shape, route: str, target: str, *, collective: bool = True) -> Callable[..., Any]:
    """``step(w, x, cache, pos) -> (x, cache)``: one decoder layer on ``x`` (B, T, D) bf16
    with its one-layer :class:`emulate.kvcache.KVCache` (any format) written at ``pos``
    (an int32 scalar). ``w``: norms ``attn_norm``/``mlp_norm`` (D,) f32, ``q``,
    ``k``, ``v``, ``o``, and ``gate``, ``up``, ``down`` (stacked (E, K, N) with a bf16
    ``router`` for an MoE). With several chips, the partial sums of ``o`` and ``down``
    are summed across them (``psum`` over mesh axis "x"), unless not ``collective`` (a
    program traced alone, outside ``shard_map``, to count its kernels' traffic)."""
    mm = matmul_fn(route, target)

    def step(w: dict, x: jax.Array, cache: KVCache, pos: jax.Array):
        attn, cache = _attention(s, mm, w, _rms(x, w["attn_norm"], s.eps), cache, pos, target)
        if s.chips > 1 and collective:
            attn = jax.lax.psum(attn, "x")
        x = x + attn
        rows = _rms(x, w["mlp_norm"], s.eps).reshape(-1, x.shape[-1])
        if s.experts:
            mlp = _moe(s, grouped_fn(route, target), w, rows)
        else:
            mlp = _swiglu(mm, rows, w["gate"], w["up"], w["down"])
        mlp = mlp.reshape(x.shape)
        if s.chips > 1 and collective:
            mlp = jax.lax.psum(mlp, "x")
        return x + mlp, cache

    return step


def head(s: Shape, route: str, target: str) -> Callable[..., Any]:
    """``logits(w, x)``: the final RMSNorm and the output head on the last position of
    ``x`` (B, T, D): (B, vocab) in bf16. ``w``: ``norm`` (D,) f32, ``head`` (D, vocab)."""
    mm = matmul_fn(route, target)

    def logits(w: dict, x: jax.Array) -> jax.Array:
        return mm(_rms(x[:, -1], w["norm"], s.eps), w["head"])

    return logits
