"""Port a GGUF model: a tiny llama-style decoder written as a GGUF file, loaded into a flax
NNX model with its weights kept as stored, decoding greedy tokens on TPU plans.

1. ``write_gguf`` builds random weights for a llama-style decoder (token embeddings;
   blocks of RMSNorm, attention with rotary embeddings and grouped KV heads, RMSNorm, a
   SwiGLU MLP; a final RMSNorm and an output head) and writes them with ``gguf``'s
   GGUFWriter under llama.cpp's tensor names, in one of two mixes:

   - ``"Q4_K_M"``: like llama.cpp's Q4_K_M, Q4_K for most matrices and Q6_K for
     ``attn_v``, ``ffn_down`` and ``output`` (quantized by the small numpy quantizers
     below: ``gguf.quants`` quantizes only Q4_0 ... Q8_0 and MXFP4), F32 norms;
   - ``"Q8_0"``: Q8_0 attention and embeddings, MXFP4 MLP (``gguf.quants``' quantizers).

2. ``port`` is the one call: ``emulate.flax.load_weights(model, load_gguf(path))`` on
   an abstract ``model = nnx.eval_shape(lambda: Llama(config))`` (no weights made before
   the file's). GGUF names map to the model's Hugging Face style paths by the
   default rule, each ``(out, in)`` matrix arrives as an ``(in, out)`` QArray kernel
   (codes and scales moved, nothing decoded), and every projection runs through
   emulate's matmul on the current target.

3. ``main`` decodes greedy tokens on the ``tpu_v4`` and ``tpu_v5e`` plans (on the CPU)
   and checks them against the float model that holds ``gguf.quants.dequantize``'s
   weights; ``decode_rates`` times the decode on the ``cpu`` target: tokens per second
   of the ported model next to the float model's.

4. The AWQ half: ``write_awq`` writes the same weights as an AutoAWQ GEMM checkpoint (a
   directory: ``model.safetensors`` with int4 ``qweight``/``qzeros`` packed eight to an
   int32 along the output features in AWQ's nibble order ``[0, 2, 4, 6, 1, 3, 5, 7]``,
   f16 ``scales`` per group of 128 inputs, float16 embeddings, norms and ``lm_head``; and
   ``config.json`` with its ``quantization_config``), ``port_awq`` loads it in one call
   (``load_weights(Llama(config), load_safetensors(path))``) and ``main_awq`` checks the
   greedy tokens against the float model holding AutoAWQ's own dequantization
   (``awq_dequantize``, ``(q - z) * s`` in float16).

Rotary embeddings rotate adjacent pairs ``(x[2i], x[2i+1])``, as llama.cpp does for GGUF
llama files (its converter permutes Hugging Face's q/k rows to that order). Run it::

    python examples/gguf_llama.py
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
import time

import gguf
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from gguf import GGMLQuantizationType

import emulate
import emulate.flax
import emulate.kvcache
from emulate.importers.gguf import load_gguf, read_gguf
from emulate.importers.safetensors import load_safetensors
from emulate.kvcache import KVCache

# --- the model --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 128
    dim: int = 256  # a multiple of 256: K-quants are 256-element super-blocks
    hidden: int = 512
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    rope_base: float = 10000.0
    eps: float = 1e-5
    max_len: int = 16

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @classmethod
    def from_hf(cls, config: dict) -> Config:
        """From a Hugging Face llama ``config.json``."""
        return cls(
            vocab=int(config["vocab_size"]),
            dim=int(config["hidden_size"]),
            hidden=int(config["intermediate_size"]),
            layers=int(config["num_hidden_layers"]),
            heads=int(config["num_attention_heads"]),
            kv_heads=int(config["num_key_value_heads"]),
            rope_base=float(config["rope_theta"]),
            eps=float(config["rms_norm_eps"]),
            max_len=int(config["max_position_embeddings"]),
        )

    @classmethod
    def from_gguf(cls, metadata: dict) -> Config:
        def get(key: str):
            return metadata[f"llama.{key}"]

        return cls(
            vocab=int(get("vocab_size")),
            dim=int(get("embedding_length")),
            hidden=int(get("feed_forward_length")),
            layers=int(get("block_count")),
            heads=int(get("attention.head_count")),
            kv_heads=int(get("attention.head_count_kv")),
            rope_base=float(get("rope.freq_base")),
            eps=float(get("attention.layer_norm_rms_epsilon")),
            max_len=int(get("context_length")),
        )


def _linear(n_in: int, n_out: int, rngs: nnx.Rngs) -> nnx.Linear:
    return nnx.Linear(n_in, n_out, use_bias=False, rngs=rngs)


def rope(x: jax.Array, base: float, positions: jax.Array | None = None) -> jax.Array:
    """Rotary embedding of ``x`` (B, T, heads, head_dim) at ``positions`` (B, T) (default
    0..T-1 for every sequence), adjacent pairs rotated together."""
    t, d = x.shape[1], x.shape[-1]
    pos = jnp.arange(t)[None, :] if positions is None else positions
    angle = pos[..., None] * base ** (-jnp.arange(0, d, 2) / d)  # (B or 1, T, d/2)
    cos, sin = jnp.cos(angle)[:, :, None, :], jnp.sin(angle)[:, :, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    return jnp.stack([even * cos - odd * sin, even * sin + odd * cos], -1).reshape(x.shape)


class Attention(nnx.Module):
    def __init__(self, c: Config, rngs: nnx.Rngs):
        self.c = c
        self.q_proj = _linear(c.dim, c.heads * c.head_dim, rngs)
        self.k_proj = _linear(c.dim, c.kv_heads * c.head_dim, rngs)
        self.v_proj = _linear(c.dim, c.kv_heads * c.head_dim, rngs)
        self.o_proj = _linear(c.heads * c.head_dim, c.dim, rngs)

    def __call__(self, x: jax.Array, cache: KVCache | None = None, layer: int = 0):
        """Causal attention over ``x`` (B, T, dim); with a ``cache``, over the cache too:
        the T new tokens at each sequence's length, written into ``layer`` and read as
        stored (``emulate.kvcache.attention``); then returns ``(out, cache)``."""
        c, (b, t, _) = self.c, x.shape
        pos = None if cache is None else cache.lengths[:, None] + jnp.arange(t)[None, :]
        q = rope(self.q_proj(x).reshape(b, t, c.heads, c.head_dim), c.rope_base, pos)
        k = rope(self.k_proj(x).reshape(b, t, c.kv_heads, c.head_dim), c.rope_base, pos)
        v = self.v_proj(x).reshape(b, t, c.kv_heads, c.head_dim)
        if cache is not None:
            cache = cache.write(layer, k, v)
            out = emulate.kvcache.attention(q, cache, layer)
            return self.o_proj(out.reshape(b, t, c.heads * c.head_dim)), cache
        q = q.reshape(b, t, c.kv_heads, c.heads // c.kv_heads, c.head_dim)
        logits = jnp.einsum("btkgh,bskh->bkgts", q, k) / np.sqrt(c.head_dim).astype(np.float32)
        causal = jnp.arange(t)[None, :] <= jnp.arange(t)[:, None]
        weights = jax.nn.softmax(jnp.where(causal, logits, -1e30), axis=-1)
        out = jnp.einsum("bkgts,bskh->btkgh", weights, v).reshape(b, t, c.heads * c.head_dim)
        return self.o_proj(out)


class Mlp(nnx.Module):
    def __init__(self, c: Config, rngs: nnx.Rngs):
        self.gate_proj = _linear(c.dim, c.hidden, rngs)
        self.up_proj = _linear(c.dim, c.hidden, rngs)
        self.down_proj = _linear(c.hidden, c.dim, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nnx.Module):
    def __init__(self, c: Config, rngs: nnx.Rngs):
        self.input_layernorm = nnx.RMSNorm(c.dim, epsilon=c.eps, rngs=rngs)
        self.self_attn = Attention(c, rngs)
        self.post_attention_layernorm = nnx.RMSNorm(c.dim, epsilon=c.eps, rngs=rngs)
        self.mlp = Mlp(c, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))

    def cached(self, x: jax.Array, cache: KVCache, layer: int) -> tuple[jax.Array, KVCache]:
        """The block over ``x`` (B, T, dim) with the KV cache's ``layer``."""
        attn, cache = self.self_attn(self.input_layernorm(x), cache, layer)
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x)), cache


class Decoder(nnx.Module):
    def __init__(self, c: Config, rngs: nnx.Rngs):
        self.embed_tokens = nnx.Embed(c.vocab, c.dim, rngs=rngs)
        self.layers = nnx.List([Block(c, rngs) for _ in range(c.layers)])
        self.norm = nnx.RMSNorm(c.dim, epsilon=c.eps, rngs=rngs)


class Llama(nnx.Module):
    """Parameter paths as Hugging Face names them: ``model/layers/0/self_attn/q_proj``."""

    def __init__(self, c: Config, rngs: nnx.Rngs | None = None):
        rngs = rngs or nnx.Rngs(0)
        self.model = Decoder(c, rngs)
        self.lm_head = _linear(c.dim, c.vocab, rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        """Logits (B, T, vocab) of ``tokens`` (B, T), causal."""
        x = self.model.embed_tokens(tokens)
        for block in self.model.layers:
            x = block(x)
        return self.lm_head(self.model.norm(x))

    def init_cache(self, batch: int, length: int, format: str = "bfloat16") -> None:  # noqa: A002
        """Hold an empty KV cache for ``batch`` sequences of ``length`` tokens in
        ``format`` (:data:`emulate.kvcache.FORMATS`) in an ``emulate.flax.KVCacheVariable``."""
        c = self.model.layers[0].self_attn.c
        cache = KVCache.create(c.layers, batch, c.kv_heads, c.head_dim, length, format)
        self.kv_cache = emulate.flax.KVCacheVariable(cache)

    def decode(self, tokens: jax.Array) -> jax.Array:
        """Logits (B, T, vocab) of the ``T`` next tokens of each sequence (B, T), which
        attend to the cache's tokens and to each other; the cache takes them."""
        cache = self.kv_cache.get_value()
        x = self.model.embed_tokens(tokens)
        for i, block in enumerate(self.model.layers):
            x, cache = block.cached(x, cache, i)
        self.kv_cache.set_value(cache.advance(tokens.shape[1]))
        return self.lm_head(self.model.norm(x))


def greedy(model: Llama, prompt: list[int], steps: int) -> list[int]:
    """``steps`` greedy tokens after ``prompt``: the whole window each step (one compile:
    the window has its final length from the start, and causal attention ignores the
    zeros after position ``i``)."""
    length = len(prompt) + steps
    tokens = np.zeros((1, length), np.int32)
    tokens[0, : len(prompt)] = prompt
    forward = nnx.jit(lambda m, t: m(t))
    for i in range(len(prompt), length):
        logits = forward(model, jnp.asarray(tokens))
        tokens[0, i] = int(jnp.argmax(logits[0, i - 1]))
    return tokens[0, len(prompt) :].tolist()


def decode_cached(
    model: Llama,
    prompt: list[int],
    steps: int,
    format: str = "bfloat16",  # noqa: A002 - the cache's format
    follow: list[int] | None = None,
) -> tuple[list[int], np.ndarray]:
    """``steps`` tokens after ``prompt`` decoded with a KV cache in ``format``: the
    prompt in one step, then one token a step, each step jitted with the cache donated
    (updated in place). The greedy tokens, or ``follow``'s (teacher forcing: the logits
    of another run's tokens); and the logits (steps, vocab) each step gave."""
    model.init_cache(1, len(prompt) + steps, format)
    graphdef, weights, cache = nnx.split(model, nnx.Not(nnx.Cache), nnx.Cache)
    tokens, rows = [], []
    logits, cache = _cached_step(graphdef, weights, cache, jnp.asarray([prompt], jnp.int32))
    for i in range(steps):
        rows.append(np.asarray(logits[0], np.float32))
        tokens.append(int(np.argmax(rows[-1])) if follow is None else follow[i])
        if i + 1 < steps:
            step_in = jnp.asarray([[tokens[-1]]], jnp.int32)
            logits, cache = _cached_step(graphdef, weights, cache, step_in)
    return tokens, np.stack(rows)


@functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
def _cached_step(graphdef, weights, cache, tokens):
    """One decode step of :func:`decode_cached`: the last position's logits and the
    cache (donated: updated in place)."""
    m = nnx.merge(graphdef, weights, cache)
    return m.decode(tokens)[:, -1], nnx.state(m, nnx.Cache)


#: The cache formats of :func:`cache_accuracy`: 8-bit per token and blocks, 4-bit blocks.
CACHE_FORMATS = ("int8", "float8_e4m3fn", "float8_e5m2", "q8_0", "q4_0", "mxfp4")


def cache_accuracy(
    mix: str = "Q4_K_M", config: Config = Config(), steps: int = 256, formats=CACHE_FORMATS
) -> dict[str, dict[str, float]]:
    """Each cache format against the bfloat16 cache over ``steps`` greedy tokens (on the
    ``cpu`` target): the bfloat16 run's tokens are fed to every run, and its logits of
    each next token compared. Per format: ``max_delta`` (the largest |logit difference|),
    ``top1`` (the share of steps whose argmax is the bfloat16 run's token) and ``margin``
    (the largest gap between the bfloat16 run's best and second-best logit among the
    steps where the format chose another token: the near-ties a cache's rounding flips)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tiny-llama.gguf")
        write_gguf(path, config, mix)
        model = port(path)
    prompt = [1, 2, 3, 4]
    with emulate.target("cpu"):
        ref_tokens, ref = decode_cached(model, prompt, steps)
        table = {}
        for fmt in formats:
            _, got = decode_cached(model, prompt, steps, fmt, follow=ref_tokens)
            agree = np.argmax(got, axis=-1) == np.asarray(ref_tokens)
            top2 = np.sort(ref, axis=-1)[:, -2:]
            gaps = (top2[:, 1] - top2[:, 0])[~agree]
            table[fmt] = {
                "max_delta": float(np.abs(got - ref).max()),
                "top1": float(np.mean(agree)),
                "margin": float(gaps.max()) if gaps.size else 0.0,
            }
            got = table[fmt]
            print(
                f"{fmt:16s} max |delta logit| {got['max_delta']:.4f}  top-1 {got['top1']:.3f}"
                f"  flips within a margin of {got['margin']:.3f}"
            )
    return table


# --- K-quant writers (numpy; the block layouts of ggml's Q4_K and Q6_K) --------------------


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype("<f2").view(np.uint8).reshape(*x.shape, 2)


def quantize_q4_k(w: np.ndarray) -> np.ndarray:
    """Q4_K blocks of ``w`` (rows, K), K a multiple of 256: per super-block of 256, an f16
    scale ``d`` and min ``dmin``, 6-bit sub-block scales and mins for its 8 sub-blocks of
    32, 4-bit codes; element = ``d * sc * q - dmin * m``. Returns uint8 (rows, K/256*144)."""
    rows, k = w.shape
    x = w.reshape(-1, 8, 32).astype(np.float32)
    lo, hi = np.minimum(x.min(-1), 0), np.maximum(x.max(-1), 0)
    step, low = (hi - lo) / 15, -lo  # per sub-block: x ~ step * q - low
    d = (step.max(-1) / 63).astype(np.float16)
    dmin = (low.max(-1) / 63).astype(np.float16)
    df, dminf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.round(np.divide(step, df, out=np.zeros_like(step), where=df > 0)), 0, 63)
    m = np.clip(np.round(np.divide(low, dminf, out=np.zeros_like(low), where=dminf > 0)), 0, 63)
    scale, offset = (df * sc)[..., None], (dminf * m)[..., None]
    q = np.divide(x + offset, scale, out=np.zeros_like(x), where=scale > 0)
    q = np.clip(np.round(q), 0, 15).astype(np.uint8)
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    packed = np.zeros((x.shape[0], 12), np.uint8)  # sub-blocks 0-3 whole, 4-7 split
    packed[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    packed[:, 4:8] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    pairs = q.reshape(-1, 4, 2, 32)  # 64 elements per 32 bytes: low nibbles first
    qs = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)
    blocks = np.concatenate([_f16_bytes(d), _f16_bytes(dmin), packed, qs], axis=1)
    return blocks.reshape(rows, k // 256 * 144)


def quantize_q6_k(w: np.ndarray) -> np.ndarray:
    """Q6_K blocks of ``w`` (rows, K), K a multiple of 256: per super-block, 16 int8
    sub-block scales (16 elements each), an f16 ``d``, 6-bit codes stored as 4 low bits
    (``ql``) and 2 high bits (``qh``); element = ``d * scale * (q - 32)``. Returns uint8
    (rows, K/256*210)."""
    rows, k = w.shape
    x = w.reshape(-1, 16, 16).astype(np.float32)
    step = np.abs(x).max(-1) / 31
    d = (step.max(-1) / 127).astype(np.float16)
    df = d.astype(np.float32)[:, None]
    sc = np.clip(np.round(np.divide(step, df, out=np.zeros_like(step), where=df > 0)), -128, 127)
    scale = (df * sc)[..., None]
    q = np.divide(x, scale, out=np.zeros_like(x), where=scale > 0)
    q = (np.clip(np.round(q), -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 4, 32)
    # per half of 128: ql[l] holds elements l (low) and l+64 (high), ql[l+32] l+32 and
    # l+96; qh[l] the high bits of l, l+32, l+64, l+96 in bit pairs 0, 2, 4, 6.
    low = q & 15
    ql = np.concatenate(
        [low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], -1
    )
    qh = sum((q[:, :, j] >> 4) << (2 * j) for j in range(4))
    scales = sc.astype(np.int8).view(np.uint8)
    parts = [ql.reshape(-1, 128), qh.reshape(-1, 64).astype(np.uint8), scales, _f16_bytes(d)]
    blocks = np.concatenate(parts, axis=1)
    return blocks.reshape(rows, k // 256 * 210)


# --- the file -----------------------------------------------------------------------------

#: GGML type of each matrix, by the name's last part; norms are F32.
MIXES: dict[str, dict[str, str]] = {
    "Q4_K_M": {"attn_v": "Q6_K", "ffn_down": "Q6_K", "output": "Q6_K", "*": "Q4_K"},
    "Q8_0": {"ffn_gate": "MXFP4", "ffn_up": "MXFP4", "ffn_down": "MXFP4", "*": "Q8_0"},
}
_OWN_QUANTIZERS = {"Q4_K": quantize_q4_k, "Q6_K": quantize_q6_k}


def random_weights(c: Config, seed: int = 3) -> dict[str, np.ndarray]:
    """llama.cpp's tensor names -> float32 weights, matrices as (out, in)."""
    rng = np.random.default_rng(seed)

    def mat(n_out: int, n_in: int) -> np.ndarray:
        return (rng.normal(size=(n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def norm() -> np.ndarray:
        return rng.uniform(0.8, 1.2, c.dim).astype(np.float32)

    kv = c.kv_heads * c.head_dim
    w = {"token_embd.weight": rng.normal(size=(c.vocab, c.dim)).astype(np.float32)}
    for i in range(c.layers):
        b = f"blk.{i}."
        w |= {
            b + "attn_norm.weight": norm(),
            b + "attn_q.weight": mat(c.dim, c.dim),
            b + "attn_k.weight": mat(kv, c.dim),
            b + "attn_v.weight": mat(kv, c.dim),
            b + "attn_output.weight": mat(c.dim, c.dim),
            b + "ffn_norm.weight": norm(),
            b + "ffn_gate.weight": mat(c.hidden, c.dim),
            b + "ffn_up.weight": mat(c.hidden, c.dim),
            b + "ffn_down.weight": mat(c.dim, c.hidden),
        }
    w |= {"output_norm.weight": norm(), "output.weight": 4 * mat(c.vocab, c.dim)}
    return w


def write_gguf(path: str, c: Config, mix: str = "Q4_K_M", seed: int = 3) -> None:
    """A llama GGUF file of random weights in ``mix`` (a key of :data:`MIXES`)."""
    types = MIXES[mix]
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(c.layers)
    writer.add_context_length(c.max_len)
    writer.add_embedding_length(c.dim)
    writer.add_feed_forward_length(c.hidden)
    writer.add_head_count(c.heads)
    writer.add_head_count_kv(c.kv_heads)
    writer.add_rope_freq_base(c.rope_base)
    writer.add_layer_norm_rms_eps(c.eps)
    writer.add_vocab_size(c.vocab)
    for name, w in random_weights(c, seed).items():
        if w.ndim == 1:
            writer.add_tensor(name, w)
            continue
        kind = name.split(".")[-2]
        t = types.get(kind, types["*"])
        quantizer = _OWN_QUANTIZERS.get(t)
        raw = quantizer(w) if quantizer else gguf.quants.quantize(w, GGMLQuantizationType[t])
        writer.add_tensor(name, raw, raw_dtype=GGMLQuantizationType[t])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# --- porting ------------------------------------------------------------------------------


def port(path: str) -> Llama:
    """The one call: a Llama of the file's config, its weights as stored (QArrays). The
    model is built abstract (``nnx.eval_shape``: shapes only, no random float32 weights,
    which at 8B would be 32 GB) and ``load_weights`` sets every parameter from the file."""
    config = Config.from_gguf(read_gguf(path).metadata)
    return emulate.flax.load_weights(nnx.eval_shape(lambda: Llama(config)), load_gguf(path))


def float_model(path: str) -> Llama:
    """The same model holding float32 weights decoded by ``gguf.quants.dequantize``."""
    reader = gguf.GGUFReader(path)
    weights = {
        t.name: gguf.quants.dequantize(t.data, t.tensor_type).reshape(
            tuple(int(n) for n in reversed(t.shape.tolist()))
        )
        for t in reader.tensors
    }
    config = Config.from_gguf(read_gguf(path).metadata)
    return emulate.flax.load_weights(Llama(config), weights)


def main(mix: str = "Q4_K_M", config: Config = Config(), steps: int = 8) -> dict[str, list[int]]:
    prompt = [1, 2, 3, 4]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tiny-llama.gguf")
        write_gguf(path, config, mix)
        print(read_gguf(path).summary())
        model, reference = port(path), float_model(path)
    tokens = {"float": greedy(reference, prompt, steps)}
    for target in ("tpu_v4", "tpu_v5e"):
        with emulate.target(target):
            tokens[target] = greedy(model, prompt, steps)
    for name, t in tokens.items():
        print(f"{name:8s} {t}")
    assert tokens["tpu_v4"] == tokens["tpu_v5e"] == tokens["float"], tokens
    return tokens


def step_seconds(models: dict[str, Llama], prompt: list[int], steps: int) -> dict[str, float]:
    """Median seconds of one greedy decoding step (the whole window, as :func:`greedy`
    runs it) of each model, the models' steps interleaved (one of each in turn, so that
    a busy period of a shared machine slows all alike), after one step that compiles."""
    tokens = jnp.zeros((1, len(prompt) + steps), jnp.int32)
    tokens = tokens.at[0, : len(prompt)].set(jnp.asarray(prompt, jnp.int32))
    forward = nnx.jit(lambda m, t: m(t))
    times: dict[str, list[float]] = {name: [] for name in models}
    for model in models.values():
        jax.block_until_ready(forward(model, tokens))
    for _ in range(steps):
        for name, model in models.items():
            t0 = time.perf_counter()
            jax.block_until_ready(forward(model, tokens))
            times[name].append(time.perf_counter() - t0)
    return {name: float(np.median(t)) for name, t in times.items()}


def decode_rates(mix: str = "Q4_K_M", config: Config = Config(), steps: int = 20) -> dict:
    """Tokens per second of the float model and of the ported one on the ``cpu`` target,
    printed side by side, and the ported model's time per token over the float one's."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tiny-llama.gguf")
        write_gguf(path, config, mix)
        model, reference = port(path), float_model(path)
    with emulate.target("cpu"):
        seconds = step_seconds({"float": reference, mix: model}, [1, 2, 3, 4], steps)
    rates = {name: 1 / t for name, t in seconds.items()}
    rates["time_ratio"] = rates["float"] / rates[mix]
    print(
        f"decode on the CPU: float {rates['float']:.1f} tokens/s, {mix} "
        f"{rates[mix]:.1f} tokens/s ({rates['time_ratio']:.2f}x the float model's time a token)"
    )
    return rates


# --- the AWQ half: an AutoAWQ GEMM checkpoint of the same weights ------------------------

#: AutoAWQ's AWQ_ORDER: nibble ``i`` (bits ``4i..4i+3``) of a word holds column
#: ``8c + AWQ_ORDER[i]`` of the word's 8 columns.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_GROUP = 128


def awq_pack(q: np.ndarray) -> np.ndarray:
    """Codes ``q`` (rows, N) in [0, 16) as AutoAWQ GEMM stores them: int32 (rows, N/8)."""
    cols = q.reshape(q.shape[0], -1, 8)[:, :, AWQ_ORDER].astype(np.uint32)
    words = np.zeros(cols.shape[:2], np.uint32)
    for i in range(8):
        words |= cols[:, :, i] << np.uint32(4 * i)
    return words.view(np.int32)


def quantize_awq(w: np.ndarray, group: int = AWQ_GROUP) -> dict[str, np.ndarray]:
    """AutoAWQ's asymmetric int4 quantization of ``w`` (out, in) in groups of ``group``
    inputs (``pseudo_quantize_tensor``: ``s = (max - min) / 15``, ``z = -round(min / s)``,
    ``q = clip(round(w / s) + z, 0, 15)``; the activation-aware search of scales is left
    out), packed as its GEMM layer stores it: ``qweight`` (in, out/8), ``qzeros``
    (in/group, out/8), ``scales`` float16 (in/group, out)."""
    n, k = w.shape
    x = w.T.reshape(k // group, group, n).astype(np.float32)
    lo, hi = x.min(1), x.max(1)
    s = (np.maximum(hi - lo, 1e-5) / 15).astype(np.float16)
    s32 = s.astype(np.float32)
    z = np.clip(-np.round(lo / s32), 0, 15)
    q = np.clip(np.round(x / s32[:, None]) + z[:, None], 0, 15).astype(np.uint8)
    return {
        "qweight": awq_pack(q.reshape(k, n)),
        "qzeros": awq_pack(z.astype(np.uint8)),
        "scales": s,
    }


def awq_dequantize(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """AutoAWQ's ``dequantize_gemm`` in numpy: unpack the nibbles, undo the order, and
    ``(q - z) * s`` in float16. Returns float16 (in, out)."""
    shifts = np.arange(0, 32, 4, dtype=np.uint32)
    reverse = np.argsort(AWQ_ORDER)  # column m of a word is nibble reverse[m]

    def unpack(words: np.ndarray) -> np.ndarray:
        nib = (words.view(np.uint32)[:, :, None] >> shifts) & 15
        return nib[:, :, reverse].reshape(words.shape[0], -1).astype(np.int16)

    group = qweight.shape[0] // scales.shape[0]
    z = np.repeat(unpack(qzeros), group, axis=0)
    return (unpack(qweight) - z).astype(np.float16) * np.repeat(scales, group, axis=0)


def hf_config(c: Config) -> dict:
    """A Hugging Face llama ``config.json`` with AutoAWQ's ``quantization_config``."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": c.vocab,
        "hidden_size": c.dim,
        "intermediate_size": c.hidden,
        "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads,
        "num_key_value_heads": c.kv_heads,
        "rope_theta": c.rope_base,
        "rms_norm_eps": c.eps,
        "max_position_embeddings": c.max_len,
        "torch_dtype": "float16",
        "quantization_config": {
            "quant_method": "awq",
            "bits": 4,
            "group_size": AWQ_GROUP,
            "zero_point": True,
            "version": "gemm",
        },
    }


def write_awq(folder: str, c: Config, seed: int = 3) -> None:
    """``folder``/model.safetensors and config.json: :func:`random_weights` under Hugging
    Face's names, the decoder blocks' linear layers as AutoAWQ GEMM int4 g128, the rest
    float16 (AutoAWQ leaves embeddings, norms and ``lm_head`` unquantized)."""
    import json

    from safetensors.numpy import save_file

    tensors: dict[str, np.ndarray] = {}
    for name, w in random_weights(c, seed).items():
        hf = emulate.flax.default_rule(name).replace("/", ".")
        if hf.startswith("model.layers.") and w.ndim == 2:
            layer = hf.removesuffix(".weight")
            tensors |= {f"{layer}.{k}": v for k, v in quantize_awq(w).items()}
        else:
            tensors[hf] = w.astype(np.float16)
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(hf_config(c), f, indent=1)


def _hf_config(folder: str) -> Config:
    import json

    with open(os.path.join(folder, "config.json")) as f:
        return Config.from_hf(json.load(f))


def port_awq(folder: str) -> Llama:
    """The one call for the AWQ checkpoint: every layer as stored (QArrays)."""
    return emulate.flax.load_weights(Llama(_hf_config(folder)), load_safetensors(folder))


def float_model_awq(folder: str) -> Llama:
    """The same model holding AutoAWQ's float16 dequantization, as float32."""
    from safetensors.numpy import load_file

    stored = load_file(os.path.join(folder, "model.safetensors"))
    weights = {}
    for name, t in stored.items():
        if name.endswith(".qweight"):
            layer = name.removesuffix(".qweight")
            w = awq_dequantize(t, stored[f"{layer}.qzeros"], stored[f"{layer}.scales"])
            weights[f"{layer}.weight"] = w.T.astype(np.float32)
        elif not name.endswith((".qzeros", ".scales")):
            weights[name] = t.astype(np.float32)
    return emulate.flax.load_weights(Llama(_hf_config(folder)), weights)


def main_awq(config: Config = Config(), steps: int = 8) -> dict[str, list[int]]:
    prompt = [1, 2, 3, 4]
    with tempfile.TemporaryDirectory() as tmp:
        write_awq(tmp, config)
        model, reference = port_awq(tmp), float_model_awq(tmp)
    tokens = {"float": greedy(reference, prompt, steps)}
    for target in ("tpu_v4", "tpu_v5e"):
        with emulate.target(target):
            tokens[target] = greedy(model, prompt, steps)
    for name, t in tokens.items():
        print(f"AWQ {name:8s} {t}")
    assert tokens["tpu_v4"] == tokens["tpu_v5e"] == tokens["float"], tokens
    return tokens


if __name__ == "__main__":
    main()
    decode_rates()
    main_awq()
    cache_accuracy()
