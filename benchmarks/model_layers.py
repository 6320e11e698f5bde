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

Experts: ``emulate.ragged_dot`` is not on this branch, so the routed experts run as a loop
of per-expert matmuls: at batch 1 over the top-k slots, each slot's expert picked from the
stacked weight by a dynamic index (only the routed experts are read); at more tokens over
every expert, each once on all tokens, weighted by the routing (an expert no token routes
to is read all the same).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import emulate
import emulate.pallas

__all__ = ["ROUTES", "Shape", "head", "layer", "matmul_fn"]

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


def _attention(s: Shape, mm: Callable, w: dict, x: jax.Array, cache: tuple, pos: jax.Array):
    """Attention of ``x`` (B, T, D) written into the KV cache at ``pos``; the T new rows
    attend to every cached row up to their own position."""
    b, t, _ = x.shape
    k_cache, v_cache = cache
    rows = x.reshape(b * t, -1)
    positions = pos + jnp.arange(t)
    q = _rope(mm(rows, w["q"]).reshape(b, t, s.heads, s.head_dim), positions)
    k = _rope(mm(rows, w["k"]).reshape(b, t, s.kv_heads, s.head_dim), positions)
    v = mm(rows, w["v"]).reshape(b, t, s.kv_heads, s.head_dim)
    k_cache = jax.lax.dynamic_update_slice(k_cache, k, (0, pos, 0, 0))
    v_cache = jax.lax.dynamic_update_slice(v_cache, v, (0, pos, 0, 0))
    q = q.reshape(b, t, s.kv_heads, s.heads // s.kv_heads, s.head_dim)
    logits = jnp.einsum("btkgh,bskh->bkgts", q, k_cache, preferred_element_type=jnp.float32)
    logits = logits / math.sqrt(s.head_dim)
    visible = jnp.arange(k_cache.shape[1])[None, :] <= positions[:, None]  # (T, S)
    weights = jax.nn.softmax(jnp.where(visible, logits, -1e30), axis=-1).astype(jnp.bfloat16)
    out = jnp.einsum("bkgts,bskh->btkgh", weights, v_cache).reshape(b * t, -1)
    return mm(out, w["o"]).reshape(x.shape), (k_cache, v_cache)


def _swiglu(mm: Callable, rows: jax.Array, gate: Any, up: Any, down: Any) -> jax.Array:
    h = jax.nn.silu(mm(rows, gate).astype(jnp.float32)) * mm(rows, up).astype(jnp.float32)
    return mm(h.astype(jnp.bfloat16), down)


def _expert(w: Any, e: Any) -> Any:
    """Expert ``e`` (a traced index) of a stacked (E, K, N) weight: every leaf indexed."""
    return jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, e, 0, keepdims=False), w)


def _moe(s: Shape, mm: Callable, w: dict, rows: jax.Array) -> jax.Array:
    router = jnp.dot(rows, w["router"], preferred_element_type=jnp.float32)  # (R, E)
    top, idx = jax.lax.top_k(router, s.top_k)
    gates = jax.nn.softmax(top, axis=-1)  # (R, top_k)
    out = jnp.zeros(rows.shape, jnp.float32)
    if rows.shape[0] == 1:  # decode at batch 1: only the routed experts are read
        for slot in range(s.top_k):
            e = idx[0, slot]
            y = _swiglu(mm, rows, _expert(w["gate"], e), _expert(w["up"], e), _expert(w["down"], e))
            out = out + gates[:, slot : slot + 1] * y.astype(jnp.float32)
        return out.astype(jnp.bfloat16)
    for e in range(s.experts):  # every expert once, on every row, weighted by the routing
        weight = jnp.sum(jnp.where(idx == e, gates, 0.0), axis=-1, keepdims=True)
        y = _swiglu(mm, rows, _expert(w["gate"], e), _expert(w["up"], e), _expert(w["down"], e))
        out = out + weight * y.astype(jnp.float32)
    return out.astype(jnp.bfloat16)


def layer(s: Shape, route: str, target: str, *, collective: bool = True) -> Callable[..., Any]:
    """``step(w, x, k_cache, v_cache, pos) -> (x, k_cache, v_cache)``: one decoder layer
    on ``x`` (B, T, D) bf16 with the caches (B, S, KV heads, head_dim) bf16 written at
    ``pos`` (an int32 scalar). ``w``: norms ``attn_norm``/``mlp_norm`` (D,) f32, ``q``,
    ``k``, ``v``, ``o``, and ``gate``, ``up``, ``down`` (stacked (E, K, N) with a bf16
    ``router`` for an MoE). With several chips, the partial sums of ``o`` and ``down``
    are summed across them (``psum`` over mesh axis "x"), unless not ``collective`` (a
    program traced alone, outside ``shard_map``, to count its kernels' traffic)."""
    mm = matmul_fn(route, target)

    def step(w: dict, x: jax.Array, k_cache: jax.Array, v_cache: jax.Array, pos: jax.Array):
        attn, cache = _attention(s, mm, w, _rms(x, w["attn_norm"], s.eps), (k_cache, v_cache), pos)
        if s.chips > 1 and collective:
            attn = jax.lax.psum(attn, "x")
        x = x + attn
        rows = _rms(x, w["mlp_norm"], s.eps).reshape(-1, x.shape[-1])
        if s.experts:
            mlp = _moe(s, mm, w, rows)
        else:
            mlp = _swiglu(mm, rows, w["gate"], w["up"], w["down"])
        mlp = mlp.reshape(x.shape)
        if s.chips > 1 and collective:
            mlp = jax.lax.psum(mlp, "x")
        return x + mlp, *cache

    return step


def head(s: Shape, route: str, target: str) -> Callable[..., Any]:
    """``logits(w, x)``: the final RMSNorm and the output head on the last position of
    ``x`` (B, T, D): (B, vocab) in bf16. ``w``: ``norm`` (D,) f32, ``head`` (D, vocab)."""
    mm = matmul_fn(route, target)

    def logits(w: dict, x: jax.Array) -> jax.Array:
        return mm(_rms(x[:, -1], w["norm"], s.eps), w["head"])

    return logits
