"""What one step of a model must do on one device, whatever runs it: its shapes
(:data:`STEPS`: sequences, new tokens, cached tokens), the bytes it must move as stored
(:func:`ideal_bytes`), its multiply-adds (:func:`step_flops`), the weight elements it
multiplies (:func:`weight_elements`) and an MoE step's expert group sizes
(:func:`routed_sizes`). The yardsticks :mod:`benchmarks.models` divides by."""

from __future__ import annotations

import numpy as np

import emulate.kvcache
from benchmarks import model_layers, model_specs
from benchmarks import model_weights as mw

#: step name -> (batch, new tokens, KV cache length)
STEPS = {
    "decode-1": (1, 1, 4096),
    "decode-16": (16, 1, 4096),
    "prefill-2048": (1, 2048, 2048),
    #: long contexts, asked for by name (issue 47's 70B goal: 16 sequences of 8192 tokens)
    "decode-16x8192": (16, 1, 8192),
}


def routed_sizes(s: model_layers.Shape, rows: int) -> np.ndarray:
    """The expert group sizes a step's kernel traffic is counted for: the ``rows x top_k``
    (row, expert) pairs spread evenly over as many experts as they can fill (one token's
    top-k: k experts of one row; 16 tokens of gpt-oss: all 32 experts, 2 rows each)."""
    pairs = rows * s.top_k
    used = min(s.experts, pairs)
    sizes = np.zeros(s.experts, np.int32)
    sizes[:used] = pairs // used
    sizes[: pairs % used] += 1
    return sizes


def ideal_bytes(
    m: model_specs.Model, route: str, step: str, lw: dict, hw: dict, cache: str = "bfloat16"
) -> dict[str, int]:
    """Bytes a step must move per layer and for the head: the weights it reads as stored
    (at batch 1, an MoE reads only its top-k experts), the KV cache read once as stored
    in format ``cache`` (its codes and scales), the activations in and out."""
    s = m.shape
    b, t, kv = STEPS[step]
    experts = {"gate", "up", "down"} if s.experts else set()
    weights = sum(mw.nbytes(v) for k, v in lw.items() if k not in experts)
    routed = sum(mw.nbytes(lw[k]) for k in experts)
    if s.experts and b * t == 1:
        routed = routed * s.top_k // s.experts
    fmt = emulate.kvcache.cache_format(cache)
    cache_bytes = int(fmt.bytes_per_token(s.kv_heads, s.head_dim) * b * kv)
    acts = 2 * 2 * b * t * s.dim
    return {
        "layer": weights + routed + cache_bytes + acts,
        "head": mw.nbytes(hw) + 2 * b * s.dim + 2 * b * s.vocab,
        "layer_weights": weights + mw.nbytes({k: lw[k] for k in experts}),
        "cache": cache_bytes,
    }


def step_flops(s: model_layers.Shape, step: str) -> int:
    """Multiply-adds x 2 of one step on one device: every row through each projection
    (an MoE's rows through their top-k experts), the attention over the cache (all of
    it, as the programs compute it) and the head on each sequence's last row."""
    b, t, kv = STEPS[step]
    d, hd = s.dim, s.head_dim
    attn = d * s.heads * hd * 2 + d * s.kv_heads * hd * 2
    mlp = 3 * d * s.hidden * (s.top_k or 1) + (d * s.experts if s.experts else 0)
    scores = 2 * s.heads * hd * kv  # q.k and p.v per row
    return 2 * (s.layers * b * t * (attn + mlp + scores) + b * d * s.vocab)


def weight_elements(s: model_layers.Shape, step: str) -> int:
    """Weight elements one step multiplies on one device: each layer's attention
    projections and the experts its rows reach (every expert once any row uses it; at
    most rows x top-k of them), and the head."""
    b, t, _ = STEPS[step]
    d, hd = s.dim, s.head_dim
    attn = 2 * d * s.heads * hd + 2 * d * s.kv_heads * hd
    used = min(s.experts, b * t * s.top_k) if s.experts else 1
    mlp = 3 * d * s.hidden * used + (d * s.experts if s.experts else 0)
    return (s.layers * (attn + mlp) + d * s.vocab) // s.chips
