"""The oracle of the KV cache tests, in numpy float64 (never the code under test): a
cache's stored K and V read back from its arrays (the 4-bit token layout unpacked here,
codes and scales decoded by :mod:`emulate.reference`), and softmax attention over them."""

from __future__ import annotations

import numpy as np

from emulate import reference

#: Element format, scale format (None: none) and scale block width (None: the head) of
#: each named cache format, restated here rather than read from the code under test.
LAYOUTS = {
    "bfloat16": ("bfloat16", None, None),
    "int8": ("int8", "float32", None),
    "float8_e4m3fn": ("float8_e4m3fn", "float32", None),
    "float8_e5m2": ("float8_e5m2", "float32", None),
    "int8_per_head": ("int8", "head", None),
    "float8_e4m3fn_per_head": ("float8_e4m3fn", "head", None),
    "float8_e5m2_per_head": ("float8_e5m2", "head", None),
    "q8_0": ("int8", "float16", 32),
    "q4_0": ("int4", "float16", 32),
    "mxfp4": ("float4_e2m1fn", "float8_e8m0fnu", 32),
}
FOUR_BIT = ("int4", "float4_e2m1fn")


def token_codes(codes: np.ndarray, element: str) -> np.ndarray:
    """(B, rows, lanes) stored codes -> (B, tokens, lanes), one code a token: 4-bit codes
    sit in tiles of 256 tokens, token ``256 t + r`` in the low nibble of byte row ``128 t
    + r`` and token ``256 t + 128 + r`` in its high nibble."""
    if element not in FOUR_BIT:
        return codes
    b, rows, lanes = codes.shape
    tiles = codes.reshape(b, rows // 128, 128, lanes)
    pair = np.stack([tiles & 15, tiles >> 4], axis=2)  # (b, tiles, 2, 128, lanes)
    return pair.reshape(b, 2 * rows, lanes)


def values(cache, layer: int, which: str) -> np.ndarray:
    """K or V of ``layer`` as float64 (B, tokens, KV, head_dim): codes times scales,
    exactly."""
    element, scale_fmt, width = LAYOUTS[cache.format.name]
    hd, kv = cache.head_dim, cache.kv_heads
    raw = np.asarray(getattr(cache, which)[layer])
    c = token_codes(raw, element)
    b, s, _ = c.shape
    if element == "bfloat16":
        return c.astype(np.float64).reshape(b, s, kv, hd)
    if element in FOUR_BIT:
        v = reference.decode(c.astype(np.uint8), element, to=np.float64)
    else:
        v = reference.decode(c, element, to=np.float64)
    v = v.reshape(b, s, kv, hd)
    scales = np.asarray(getattr(cache, f"{which}_scales")[layer])
    if scale_fmt == "head":
        return v * scales.astype(np.float64)[None, None, :, None]
    nb = hd // (width or hd)
    if scale_fmt == "float32":
        sc = scales.astype(np.float64)
    else:
        sc = reference.decode(scales, scale_fmt, to=np.float64)
    sc = sc.reshape(b, kv, nb, s).transpose(0, 3, 1, 2)  # (b, s, kv, nb)
    return v * np.repeat(sc, hd // nb, axis=-1)


def attention(q, k, v, visible, scale: float) -> np.ndarray:
    """Softmax attention in float64: query ``t`` of sequence ``b`` over the first
    ``visible[b] + t`` tokens of its KV head (head ``h`` reads ``h // (H / KV)``); 0 where
    it sees none."""
    q = np.asarray(q, np.float64)
    b, t, h, hd = q.shape
    kv = k.shape[2]
    out = np.zeros(q.shape)
    for bi in range(b):
        for ti in range(t):
            n = min(int(visible[bi]) + ti, k.shape[1])
            if n <= 0:
                continue
            for hi in range(h):
                kh = hi // (h // kv)
                with np.errstate(invalid="ignore", over="ignore"):
                    s = scale * (k[bi, :n, kh] @ q[bi, ti, hi])
                    w = np.exp(s - s.max())
                    out[bi, ti, hi] = (w / w.sum()) @ v[bi, :n, kh]
    return out
