"""A small decoder block with int4 (packed) and float8_e4m3fn weights, run on TPU v4 rules.

TPU v4's matrix unit has no int4 and no float8 circuit: a program that feeds it
``bf16 x int4`` or ``bf16 x e4m3fn`` dots fails to compile there ("Unsupported matmul
RHS type on target"). ``emulate.polyfill`` rewrites those dots for the target and leaves
the rest of the program as it is. Run it::

    python examples/decoder_block.py

It prints what ``emulate.inspect`` reports, then how the polyfilled logits compare with
the same block run on weights decoded to bf16 up front.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import emulate

DN = (((1,), (0,)), ((), ()))


class Int4Linear(nnx.Module):
    """``x @ w * scale`` with w stored as packed int4 and one f32 scale per output column."""

    def __init__(self, d_in: int, d_out: int, *, rngs: nnx.Rngs):
        w = jax.random.normal(rngs.params(), (d_in, d_out)) / np.sqrt(d_in)
        scale = jnp.max(jnp.abs(w), axis=0) / 7.0
        q = emulate.encode(w / scale, "int4", saturate=True)
        packed = emulate.pack(q, axis=0)
        self.codes = nnx.Variable(packed.data)  # uint8, two weights per byte along d_in
        self.length = d_in
        self.scale = nnx.Param(scale)

    def weight(self) -> jax.Array:
        return emulate.unpack(emulate.Packed(self.codes[...], "int4", -2, self.length))

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jax.lax.dot_general(x, self.weight(), DN, preferred_element_type=jnp.float32)
        return (y * self.scale[...]).astype(jnp.bfloat16)


class Fp8Linear(nnx.Module):
    """``x @ w * scale`` with w stored as float8_e4m3fn and a per-tensor f32 scale."""

    def __init__(self, d_in: int, d_out: int, *, rngs: nnx.Rngs):
        w = jax.random.normal(rngs.params(), (d_in, d_out)) / np.sqrt(d_in)
        scale = jnp.max(jnp.abs(w)) / 448.0
        self.w = nnx.Param(emulate.encode(w / scale, "float8_e4m3fn"))
        self.scale = nnx.Param(scale)

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jax.lax.dot_general(x, self.w[...], DN, preferred_element_type=jnp.float32)
        return (y * self.scale[...]).astype(jnp.bfloat16)


class RMSNorm(nnx.Module):
    def __init__(self, d: int):
        self.gain = nnx.Param(jnp.ones((d,), jnp.float32))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
        return (y * self.gain[...]).astype(jnp.bfloat16)


class DecoderBlock(nnx.Module):
    """Causal self-attention (int4 projections) and a gated MLP (float8 weights)."""

    def __init__(self, d_model: int = 64, n_heads: int = 4, d_ff: int = 128, *, rngs: nnx.Rngs):
        self.n_heads = n_heads
        self.norm1, self.norm2 = RMSNorm(d_model), RMSNorm(d_model)
        self.q, self.k, self.v, self.o = (Int4Linear(d_model, d_model, rngs=rngs) for _ in range(4))
        self.gate = Fp8Linear(d_model, d_ff, rngs=rngs)
        self.up = Fp8Linear(d_model, d_ff, rngs=rngs)
        self.down = Fp8Linear(d_ff, d_model, rngs=rngs)

    def attention(self, x: jax.Array) -> jax.Array:
        t, d = x.shape
        h = self.n_heads

        def heads(y):
            return y.reshape(t, h, d // h).transpose(1, 0, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        s = jnp.einsum("htd,hsd->hts", q, k, preferred_element_type=jnp.float32)
        s = s / np.sqrt(d // h) + jnp.where(jnp.tril(jnp.ones((t, t), bool)), 0.0, -1e9)
        p = jax.nn.softmax(s, axis=-1).astype(jnp.bfloat16)
        a = jnp.einsum("hts,hsd->htd", p, v, preferred_element_type=jnp.float32)
        return self.o(a.astype(jnp.bfloat16).transpose(1, 0, 2).reshape(t, d))

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attention(self.norm1(x))
        y = self.norm2(x)
        return x + self.down(jax.nn.silu(self.gate(y)) * self.up(y))


class DecodedLinear(nnx.Module):
    """A linear layer whose weight was decoded to bf16 once, up front."""

    def __init__(self, w: jax.Array, scale: jax.Array):
        self.w = nnx.Param(w)
        self.scale = nnx.Param(scale)

    def __call__(self, x: jax.Array) -> jax.Array:
        y = jax.lax.dot_general(x, self.w[...], DN, preferred_element_type=jnp.float32)
        return (y * self.scale[...]).astype(jnp.bfloat16)


def decoded(block: DecoderBlock) -> DecoderBlock:
    """The same block with every weight decoded to bf16 up front (the plain alternative)."""
    graphdef, state = nnx.split(block)
    clone = nnx.merge(graphdef, state)
    for name in ("q", "k", "v", "o"):
        lin = getattr(clone, name)
        setattr(clone, name, DecodedLinear(emulate.decode(lin.weight()), lin.scale[...]))
    for name in ("gate", "up", "down"):
        lin = getattr(clone, name)
        setattr(clone, name, DecodedLinear(emulate.decode(lin.w[...]), lin.scale[...]))
    return clone


def make(seed: int = 0) -> tuple[DecoderBlock, jax.Array]:
    block = DecoderBlock(rngs=nnx.Rngs(seed))
    x = jax.random.normal(jax.random.key(seed + 1), (16, 64)).astype(jnp.bfloat16)
    return block, x


def main() -> None:
    block, x = make()
    print(emulate.inspect(block, x, target="tpu_v4"))
    run = jax.jit(emulate.polyfill(block, target="tpu_v4"))
    y = run(x).astype(jnp.float32)
    ref = jax.jit(decoded(block))(x).astype(jnp.float32)
    diff = jnp.abs(y - ref)
    print()
    same = int(jnp.sum(y == ref))
    worst = float(jnp.max(diff))
    print(f"logits {y.shape}: identical elements {same}/{y.size}, max |difference| {worst:.3g}")


if __name__ == "__main__":
    main()
