"""Decode attention over a KV cache as one Pallas TPU kernel that reads the cache once,
for ``benchmarks.models`` (both the quantized models and the bf16 model use it).

XLA's einsums over a (B, KV heads, S, head_dim) cache at one new token read it 3.1-3.2x
over on v4 to 7x by libtpu's count (its memory-space assignment copies the cache into VMEM
and reads it there; where it updates the cache in VMEM it writes all of it back). This
kernel walks the cache in blocks of ``block`` rows per (batch, KV head), K innermost, with
an online softmax (running maximum, sum and f32 accumulator in VMEM scratch): each K and V
block is copied from HBM once. Everything inside is f32 (v2 and v3 multiply only f32 x
f32 in Mosaic); rows past ``pos`` are masked out (they are still read: the grid is static).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

__all__ = ["NAME", "decode_attention"]

#: the kernel's name in the program (``benchmarks.models`` counts its traffic by it)
NAME = "decode_attention"
_LANES = 128


def _kernel(block: int, scale: float, pos_ref, q_ref, k_ref, v_ref, o_ref, m_sc, l_sc, acc_sc):
    s = pl.program_id(2)

    @pl.when(s == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    q = q_ref[...].astype(jnp.float32)  # (g, hd)
    k = k_ref[...].astype(jnp.float32)  # (block, hd)
    logits = lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    rows = s * block + lax.broadcasted_iota(jnp.int32, logits.shape, 1)
    logits = jnp.where(rows <= pos_ref[0], logits * scale, -1e30)
    m_prev = m_sc[...][:, :1]  # (g, 1): every lane holds the same value
    m_new = jnp.maximum(m_prev, jnp.max(logits, axis=1, keepdims=True))
    p = jnp.exp(logits - m_new)
    alpha = jnp.exp(m_prev - m_new)
    l_new = alpha * l_sc[...][:, :1] + jnp.sum(p, axis=1, keepdims=True)
    pv = jnp.dot(p, v_ref[...].astype(jnp.float32), preferred_element_type=jnp.float32)
    acc_sc[...] = alpha * acc_sc[...] + pv
    m_sc[...] = jnp.broadcast_to(m_new, m_sc.shape)
    l_sc[...] = jnp.broadcast_to(l_new, l_sc.shape)

    @pl.when(s == pl.num_programs(2) - 1)
    def _done():
        o_ref[...] = (acc_sc[...] / l_sc[...][:, :1]).astype(o_ref.dtype)


def decode_attention(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    pos: jax.Array,
    block: int = 512,
    interpret: bool = False,
) -> jax.Array:
    """One new token's attention: ``q`` (B, KV heads, G, head_dim) (G query heads per KV
    head) over the caches (B, KV heads, S, head_dim), rows ``0..pos`` visible (``pos`` an
    int32 scalar); (B, KV heads, G, head_dim) in ``q``'s dtype. ``block`` rows of the
    cache a step (S a multiple of it, or S itself); ``interpret``: Pallas' interpret mode
    (on the CPU)."""
    b, kv, g, hd = q.shape
    s = k_cache.shape[2]
    block = min(block, s)
    if s % block:
        raise ValueError(f"k_cache: {s} rows, not a multiple of the block of {block}")
    q_spec = pl.BlockSpec((None, None, g, hd), lambda i, h, j, pos: (i, h, 0, 0))
    kv_spec = pl.BlockSpec((None, None, block, hd), lambda i, h, j, pos: (i, h, j, 0))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(b, kv, s // block),
        in_specs=[q_spec, kv_spec, kv_spec],
        out_specs=q_spec,
        scratch_shapes=[
            pltpu.VMEM((g, _LANES), jnp.float32),
            pltpu.VMEM((g, _LANES), jnp.float32),
            pltpu.VMEM((g, hd), jnp.float32),
        ],
    )
    # streamed from HBM (else XLA may copy a whole cache into VMEM first, as on 7x)
    if not interpret:
        k_cache, v_cache = (
            pltpu.with_memory_space_constraint(c, pltpu.HBM) for c in (k_cache, v_cache)
        )
    return pl.pallas_call(
        functools.partial(_kernel, block, 1.0 / math.sqrt(hd)),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")
        ),
        interpret=pltpu.InterpretParams() if interpret else False,
        name=NAME,
    )(jnp.reshape(pos, (1,)).astype(jnp.int32), q, k_cache, v_cache)
