"""The error bound of attention over a stored KV cache (docs/numerics.md, "Attention over a
quantized KV cache"), in numpy float64: :func:`score_bound` and :func:`attention_bound`.

The contract is stated against the *dequantized* cache (each code's value times its
scales, as real numbers: what the cache holds). Quantizing K and V when they are written
is a separate, stated rounding (:mod:`emulate.kvcache.writing`); it is not part of this
bound. With ``u = 2**-24``, ``gamma_n = n u / (1 - n u)``, ``f`` the scores' factor (the
softmax scale, times a per-head K scale), ``w`` the width of a scale block (``head_dim``
for per-token, per-head and unscaled formats) and ``nb = head_dim / w``:

- scores: ``|s_t - s*_t| <= gamma_(w + nb + 4) * |f| * sum_d |q_d K_td| + 2**-100``
  (``delta_t``), where ``s*_t = f * sum_d q_d K_td`` exactly;
- outputs: ``|o_e - o*_e| <= R * sum_t w*_t |V_te| + u_out |o*_e| + 2**-100``, where
  ``w*`` are the exact softmax weights of the visible tokens, ``o*`` the exact output,
  ``R = exp(2 (Delta + kappa)) (1 + gamma_(n + 2 m + 6)) / (1 - gamma_(n + 2 m + 4)) - 1``,
  ``Delta = max_t delta_t``, ``n`` the visible tokens, ``m`` the blocks they span,
  ``kappa = (m + 2) (eps_exp + 2 u) + u * y``, ``y`` the spread of the scores (largest
  minus smallest, plus ``2 Delta``), ``eps_exp`` the relative error of the exponential
  (:data:`EXP_ERROR`), ``u_out`` the unit roundoff of the output type (0 for float32, whose
  last rounding ``gamma`` counts).

A query that sees no token gives 0 (bound 0). Where a visible score or value is not
finite the bound is ``inf`` (the output is then NaN or infinite; the tests check that).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["EXP_ERROR", "U", "attention_bound", "gamma", "score_bound"]

#: float32 unit roundoff.
U = 2.0**-24
#: The relative error assumed of ``exp`` on float32: 2**-16. Measured: XLA:CPU (jax 0.10.2)
#: 8.2e-8 (1.4 ulp); a real TPU v5e 6.5e-6 in a Pallas kernel and in XLA alike.
EXP_ERROR = 2.0**-16
_TINY = 2.0**-100


def gamma(n: float | np.ndarray) -> np.ndarray:
    """``n u / (1 - n u)`` (inf where ``n u >= 1``)."""
    nu = np.asarray(n, np.float64) * U
    return np.where(nu < 1, nu / np.maximum(1 - nu, 1e-300), np.inf)


def score_bound(q: np.ndarray, k: np.ndarray, factor: float, blocks: int = 1) -> np.ndarray:
    """``delta`` of every score: ``q`` (..., head_dim) a query, ``k`` (tokens, head_dim)
    the dequantized keys it reads (float64), ``factor`` the scores' factor, ``blocks``
    the scale blocks per head. Returns (..., tokens)."""
    hd = q.shape[-1]
    mags = np.abs(q) @ np.abs(k).T
    return gamma(hd // blocks + blocks + 4) * abs(factor) * mags + _TINY


def attention_bound(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    visible: np.ndarray,
    factor: float,
    *,
    blocks: int = 1,
    block: int,
    out_roundoff: float = 0.0,
    exp_error: float = EXP_ERROR,
) -> np.ndarray:
    """The bound of every output of :func:`emulate.kvcache.attention`.

    Args:
      q: (B, T, H, head_dim) the queries.
      k, v: (B, S, KV, head_dim) the dequantized cache (float64: codes times scales,
        per-head V scales included).
      visible: (B,) the tokens query 0 sees (query ``t`` sees ``visible + t``).
      factor: the scores' factor (the softmax scale; ``k`` holds every scale, per-head
        ones included).
      blocks: scale blocks per head (``head_dim / 32`` for q8_0, q4_0, MXFP4; else 1).
      block: tokens a kernel step reads (the call's ``block``).
      out_roundoff: the output type's unit roundoff (2**-8 for bfloat16, 2**-11 float16,
        0 for float32).
      exp_error: :data:`EXP_ERROR`.

    Returns:
      (B, T, H, head_dim) float64.
    """
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    b, t, h, hd = q.shape
    kv = k.shape[2]
    out = np.zeros(q.shape)
    for bi in range(b):
        for ti in range(t):
            n = int(min(max(int(visible[bi]) + ti, 0), k.shape[1]))
            if n == 0:
                continue
            for hi in range(h):
                kh = hi // (h // kv)
                out[bi, ti, hi] = _one(q[bi, ti, hi], k[bi, :n, kh], v[bi, :n, kh], factor, blocks,
                                       block, out_roundoff, exp_error)  # fmt: skip
    return out


def _one(q, k, v, factor, blocks, block, out_roundoff, exp_error) -> np.ndarray:
    n = k.shape[0]
    if not (np.all(np.isfinite(q)) and np.all(np.isfinite(k)) and np.all(np.isfinite(v))):
        return np.full(v.shape[1], np.inf)
    s = factor * (k @ q)
    delta = float(score_bound(q, k, factor, blocks).max())
    spread = float(s.max() - s.min()) + 2 * delta
    m = math.ceil(n / block)
    kappa = (m + 2) * (exp_error + 2 * U) + U * spread
    r = math.exp(2 * (delta + kappa)) * (1 + gamma(n + 2 * m + 6)) / (1 - gamma(n + 2 * m + 4)) - 1
    w = np.exp(s - s.max())
    w /= w.sum()
    exact = w @ v
    return r * (w @ np.abs(v)) + out_roundoff * np.abs(exact) + _TINY
