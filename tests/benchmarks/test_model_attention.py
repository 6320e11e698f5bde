"""benchmarks.model_attention's decode kernel (interpret mode) against softmax attention
computed in numpy float64 over the visible rows."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from benchmarks.model_attention import decode_attention


def test_decode_attention_matches_softmax_over_the_visible_rows():
    rng = np.random.default_rng(0)
    b, kv, g, hd, s, pos = 2, 2, 4, 64, 256, 150  # 150: inside the second block of 128
    q, k, v = (
        rng.standard_normal(shape) for shape in ((b, kv, g, hd), (b, kv, s, hd), (b, kv, s, hd))
    )
    q, k, v = (np.asarray(jnp.asarray(a, jnp.bfloat16), np.float64) for a in (q, k, v))
    got = decode_attention(
        jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.bfloat16), jnp.asarray(v, jnp.bfloat16),
        jnp.int32(pos), block=128, interpret=True,
    )  # fmt: skip
    logits = np.einsum("bkgh,bksh->bkgs", q, k)[..., : pos + 1] / np.sqrt(hd)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    want = np.einsum("bkgs,bksh->bkgh", w / w.sum(-1, keepdims=True), v[:, :, : pos + 1])
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)
