"""A small flax NNX decoder (grouped-query attention, a KV cache, a ``lax.while_loop``
greedy sampler) ported to MX weights in one call with ``emulate.flax.quantize_model``.

The model is plain flax NNX (``Embed``, ``Einsum``, ``Linear``): nothing in it knows about
emulate. ``port(model)`` quantizes the attention projections to MXFP8 (e4m3), the MLP to
MXFP4 and the tied embedding to per-channel int8, in place; the same code then runs the
emulated matmuls for whatever target is current. Run it::

    python examples/flax_decoder.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

import emulate
import emulate.flax

VOCAB, D, HEADS, KV_HEADS, HEAD_DIM, HIDDEN, MAX_LEN = 64, 64, 4, 2, 16, 128, 16


class Attention(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.q = nnx.Einsum("BTD,DNH->BTNH", (D, HEADS, HEAD_DIM), rngs=rngs)
        self.kv = nnx.Einsum("BTD,CDKH->CBTKH", (2, D, KV_HEADS, HEAD_DIM), rngs=rngs)
        self.o = nnx.Einsum("BTNH,NHD->BTD", (HEADS, HEAD_DIM, D), rngs=rngs)

    def __call__(self, x, pos, cache):
        """``x`` (B, T, D) at positions ``pos..pos+T-1``; ``cache`` (2, B, MAX_LEN, K, H)."""
        b, t, _ = x.shape
        q = self.q(x)
        kv = self.kv(x)
        cache = jax.lax.dynamic_update_slice(cache, kv, (0, 0, pos, 0, 0))
        k, v = cache[0], cache[1]
        q = q.reshape(b, t, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM)
        logits = jnp.einsum("BTKGH,BSKH->BKGTS", q, k) / jnp.sqrt(HEAD_DIM).astype(q.dtype)
        query_pos = pos + jnp.arange(t)[:, None]
        mask = jnp.arange(MAX_LEN)[None, :] <= query_pos
        logits = jnp.where(mask, logits, -1e30)
        attn = jnp.einsum("BKGTS,BSKH->BTKGH", jax.nn.softmax(logits, axis=-1), v)
        return self.o(attn.reshape(b, t, HEADS, HEAD_DIM)), cache


class Decoder(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.embed = nnx.Embed(VOCAB, D, rngs=rngs)
        self.norm1 = nnx.RMSNorm(D, rngs=rngs)
        self.attn = Attention(rngs)
        self.norm2 = nnx.RMSNorm(D, rngs=rngs)
        self.up = nnx.Linear(D, HIDDEN, rngs=rngs)
        self.down = nnx.Linear(HIDDEN, D, rngs=rngs)
        self.final = nnx.RMSNorm(D, rngs=rngs)

    def __call__(self, tokens, pos, cache):
        """Logits (B, T, VOCAB) for ``tokens`` (B, T) at ``pos``, and the updated cache."""
        x = self.embed(tokens)
        a, cache = self.attn(self.norm1(x), pos, cache)
        x = x + a
        x = x + self.down(jax.nn.gelu(self.up(self.norm2(x))))
        return self.embed.attend(self.final(x)), cache


def empty_cache(batch: int) -> jax.Array:
    return jnp.zeros((2, batch, MAX_LEN, KV_HEADS, HEAD_DIM), jnp.float32)


def generate(model: Decoder, prompt: jax.Array, steps: int) -> jax.Array:
    """Greedy decoding: the prompt in one call, then one token per ``while_loop`` step."""
    b, t = prompt.shape
    logits, cache = model(prompt, 0, empty_cache(b))
    out = jnp.zeros((b, t + steps), jnp.int32).at[:, :t].set(prompt)
    first = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
    out = out.at[:, t].set(first)

    def cond(state):
        return state[0] < t + steps - 1

    def body(state):
        i, out, cache = state
        tok = jax.lax.dynamic_slice_in_dim(out, i, 1, axis=1)
        logits, cache = model(tok, i, cache)
        nxt = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
        return i + 1, jax.lax.dynamic_update_slice_in_dim(out, nxt[:, None], i + 1, axis=1), cache

    _, out, _ = jax.lax.while_loop(cond, body, (jnp.int32(t), out, cache))
    return out


RULES = [
    emulate.flax.Rule("attn/.*", emulate.mx.MXFP8_E4M3),
    emulate.flax.Rule("up|down", emulate.mx.MXFP4),
    emulate.flax.Rule("embed", "int8"),
]


def port(model: Decoder, *, qat: bool = False) -> Decoder:
    """The one call: quantize the decoder's weights in place."""
    return emulate.flax.quantize_model(model, RULES, qat=qat)


def main() -> None:
    model = port(Decoder(nnx.Rngs(0)))
    prompt = jnp.array([[1, 2, 3, 4]], jnp.int32)
    for target in ("tpu_v4", "tpu_v7x"):
        with emulate.target(target):
            tokens = jax.jit(generate, static_argnums=2)(model, prompt, 8)
        print(target, tokens.tolist())


if __name__ == "__main__":
    main()
