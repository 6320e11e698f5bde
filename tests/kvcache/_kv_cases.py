"""Random stored caches for the attention tests: every code of the element format drawn
(NaN and Inf codes only where a test asks for them), scales of the format's kind, each
sequence's own length, and the check of a result against the float64 oracle and the
stated bound (:func:`emulate.kvcache.bounds.attention_bound`)."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from _kv_oracle import FOUR_BIT, LAYOUTS, attention, values

from emulate.kvcache import KVCache, cache_format
from emulate.kvcache.bounds import attention_bound


def _finite_codes(element: str) -> np.ndarray:
    """Every code of ``element`` whose value is finite, as the stored dtype's bits."""
    if element == "bfloat16":
        raise ValueError("bfloat16 values are drawn, not codes")
    if element in FOUR_BIT:
        return np.arange(16, dtype=np.uint8)
    codes = np.arange(256, dtype=np.uint8)
    vals = codes.view(np.int8 if element == "int8" else getattr(ml_dtypes, element))
    return codes[np.isfinite(vals.astype(np.float64))]


def random_cache(
    rng: np.random.Generator,
    name: str,
    *,
    batch: int,
    kv: int,
    head_dim: int,
    capacity: int,
    lengths: list[int],
    special: str | None = None,
) -> KVCache:
    """A one-layer cache of ``name`` with random stored codes and scales everywhere (the
    tokens past each length too: the attention must not read them). ``special``: "nan"
    or "inf" puts such a value (a NaN / Inf code, bfloat16 value or scale) into K of
    token 0 of sequence 0, KV head 0."""
    fmt = cache_format(name)
    element, scale_fmt, width = LAYOUTS[name]
    s, lanes = capacity, kv * head_dim

    def codes() -> np.ndarray:
        if element == "bfloat16":
            v = rng.standard_normal((1, batch, s, lanes)).astype(ml_dtypes.bfloat16)
            return v
        c = rng.choice(_finite_codes(element), size=(1, batch, s, lanes))
        if element in FOUR_BIT:  # two tokens a byte, in tiles of 256 (_kv_oracle's layout)
            t = c.reshape(1, batch, s // 256, 2, 128, lanes)
            return (t[:, :, :, 0] | (t[:, :, :, 1] << 4)).reshape(1, batch, s // 2, lanes)
        return c.view(fmt.code_dtype)

    def scales() -> np.ndarray | None:
        if scale_fmt is None:
            return None
        if scale_fmt == "head":
            return rng.uniform(0.01, 0.1, (1, kv)).astype(np.float32)
        nb = head_dim // (width or head_dim)
        shape = (1, batch, kv * nb, s)
        if scale_fmt == "float32":
            return rng.uniform(0.005, 0.05, shape).astype(np.float32)
        if scale_fmt == "float16":
            return rng.uniform(0.005, 0.05, shape).astype(np.float16).view(np.uint16)
        return rng.integers(120, 126, shape).astype(np.uint8)  # e8m0: 2**-7 .. 2**-2

    k, v, ks, vs = codes(), codes(), scales(), scales()
    if special is not None:
        k, ks = _poison(k, ks, element, scale_fmt, special)
    lens = jnp.asarray(lengths, jnp.int32)
    arrays = [None if a is None else jnp.asarray(a) for a in (k, v, ks, vs)]
    return KVCache(*arrays, lens, fmt, head_dim)


def _poison(k, ks, element, scale_fmt, special):
    k = k.copy()
    if element == "bfloat16":
        k[0, 0, 0, 0] = np.nan if special == "nan" else np.inf
    elif scale_fmt in ("float32", "float16") and special == "nan":
        ks = ks.copy()
        ks[0, 0, 0, 0] = np.float32(np.nan) if scale_fmt == "float32" else 0x7E00
    elif element.startswith("float8"):
        code = {"nan": 0x7F, "inf": 0x7C}[special]  # e4m3fn has no Inf: its NaN code
        k.view(np.uint8)[0, 0, 0, 0] = code
    else:
        raise ValueError(f"no {special} in a {element} cache")
    return k, ks


def check(got, q, cache: KVCache, visible, scale: float, block: int) -> float:
    """``got`` against the oracle within the bound (NaN where the oracle is NaN);
    returns the largest error over the bound."""
    k, v = values(cache, 0, "k"), values(cache, 0, "v")
    want = attention(q, k, v, visible, scale)
    nb = cache.format.blocks(cache.head_dim)
    bound = attention_bound(q, k, v, visible, scale, blocks=nb, block=block)
    got = np.asarray(got, np.float64)
    finite = np.isfinite(bound)
    err = np.abs(got - want)
    bad = finite & ~(err <= bound)
    assert not bad.any(), (
        f"{bad.sum()} outputs past the bound; first at {np.argwhere(bad)[0]}: got "
        f"{got[bad][0]!r}, want {want[bad][0]!r}, bound {bound[bad][0]!r}"
    )
    # where the bound is infinite (a NaN among the visible K), the output is NaN, as the
    # oracle's
    assert np.isnan(got[~finite]).all() and np.isnan(want[~finite]).all()
    return float(np.max(np.where(finite & (bound > 0), err / np.where(bound > 0, bound, 1), 0)))
