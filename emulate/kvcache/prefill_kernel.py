"""Prefill attention (many new tokens a sequence) over a stored KV cache layer as one
Pallas TPU kernel: blocks of queries, each reading the stored blocks it sees.

Grid ``(batch, KV heads, query blocks, token blocks)``; a step takes ``bq`` queries of
every query head of one KV head (``groups * bq`` rows) against ``block`` tokens of the
head's window of lanes, with an online softmax in VMEM. Token blocks that no query of the
block sees (causal) are neither read nor computed. The numerics are the decode kernel's
(:mod:`emulate.kvcache.decode_kernel`): queries and softmax weights cut into three exact
bf16 pieces (stacked as rows of one matmul), codes decoded exactly, scales applied to the
scores and weights of their lanes, sums in f32. Here the rows are many, so each scale
block takes its own matmuls (``blocks`` of them for K and for V): the kernel does
``3 * blocks`` times the matrix-unit work of a bf16 flash attention, the price of the
exact pieces.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from emulate.kvcache import blocks, layout
from emulate.kvcache.blocks import Geometry
from emulate.kvcache.formats import CacheFormat
from emulate.pallas.qgroups import select_row

__all__ = ["NAME", "QUERY_BLOCK", "PrefillConfig", "prefill"]

#: The kernel's name in a program.
NAME = "emulate_kv_prefill_attention"
#: Queries of one grid step (a power of two: a row's query is found by a mask).
QUERY_BLOCK = 64
_NT = (((1,), (1,)), ((), ()))


@dataclasses.dataclass(frozen=True)
class PrefillConfig:
    """The static shape of one prefill kernel (as :class:`DecodeConfig`, plus ``queries``,
    the query block)."""

    format: CacheFormat
    geometry: Geometry
    block: int
    compute: str
    queries: int

    @property
    def rows(self) -> int:
        return self.geometry.groups * self.queries


def _kernel(cfg: PrefillConfig, visible_ref, layer_ref, *refs: Any) -> None:
    del layer_ref
    scaled = cfg.format.granularity in ("token", "block")
    if scaled:
        x_ref, k_ref, ks_ref, v_ref, vs_ref, o_ref, m_sc, l_sc, acc_sc = refs
    else:
        x_ref, k_ref, v_ref, o_ref, m_sc, l_sc, acc_sc = refs
        ks_ref = vs_ref = None
    b, h, qi, s = (pl.program_id(i) for i in range(4))
    g, n, bq = cfg.geometry, cfg.block, cfg.queries

    @pl.when(s == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    first_query = visible_ref[b] + qi * bq  # tokens the block's first query sees
    seen_by_last = first_query + bq - 1

    @pl.when(s * n < seen_by_last)
    def _step():
        shape = (cfg.rows, n)
        sees = first_query + (lax.broadcasted_iota(jnp.int32, shape, 0) & (bq - 1))
        seen = s * n + lax.broadcasted_iota(jnp.int32, shape, 1) < sees
        q = x_ref[...].reshape(cfg.rows, g.window)
        ks = _scales(ks_ref, cfg, h) if scaled else None
        vs = _scales(vs_ref, cfg, h) if scaled else None
        parts = blocks.code_parts(k_ref[...], cfg.format, jnp.dtype(cfg.compute))
        logits = None
        for j in range(g.blocks):
            r = _stacked_dot(_pieces(q, g, h, j, cfg.compute), parts, True)
            term = r if ks is None else r * ks[j]
            logits = term if logits is None else logits + term
        assert logits is not None
        logits = jnp.where(seen, logits, -jnp.inf)
        p, alpha, m, lsum = blocks.softmax_step(logits, m_sc[...][:, :1], l_sc[...][:, :1])
        m_sc[...] = jnp.broadcast_to(m, m_sc.shape)
        l_sc[...] = jnp.broadcast_to(lsum, l_sc.shape)
        vparts = blocks.code_parts(
            v_ref[...], cfg.format, jnp.dtype(cfg.compute), s * n, seen_by_last
        )
        out = None
        for j in range(g.blocks):
            pj = p if vs is None else jnp.where(seen, p * vs[j], 0.0)
            pieces = [x.astype(cfg.compute) for x in blocks.split3(pj)]
            if len(vparts) == 2:
                halves = [blocks.tiles_apart(x) for x in pieces]
                lo, hi = (_stacked_dot([x[i] for x in halves], [vparts[i]], False) for i in (0, 1))
                d = lo + hi
            else:
                d = _stacked_dot(pieces, vparts, False)
            if not g.whole_head:
                d = jnp.where(g.lane_mask(h, j, d.shape), d, 0.0)
            out = d if out is None else out + d
        acc_sc[...] = alpha * acc_sc[...] + out

    @pl.when(s == pl.num_programs(3) - 1)
    def _done():
        total = l_sc[...][:, :1]
        out = blocks.normalized(acc_sc[...], total)
        o_ref[...] = _head_lanes(out, g, h).reshape(o_ref.shape).astype(o_ref.dtype)


def _head_lanes(out: jax.Array, g: Geometry, h: Any) -> jax.Array:
    """Head ``h``'s lanes of its window (``h`` traced: each possible offset sliced
    statically, the head's chosen by a scalar compare)."""
    if g.window == g.head_dim:
        return out
    offset = g.offset(h)
    picked = None
    for off in range(0, g.window, g.head_dim):
        lanes = out[:, off : off + g.head_dim]
        picked = lanes if picked is None else jnp.where(offset == off, lanes, picked)
    assert picked is not None
    return picked


def _scales(ref: Any, cfg: PrefillConfig, h: Any) -> list[jax.Array]:
    """Head ``h``'s scale rows (one per scale block), (1, block) f32 each."""
    rows = blocks.scale_rows(ref[...], cfg.format)
    nb = cfg.geometry.blocks
    return [select_row(rows, h * nb + j) for j in range(nb)]


def _pieces(q: jax.Array, g: Geometry, h: Any, j: int, compute: str) -> list[jax.Array]:
    """The exact pieces of the query rows, kept on scale block ``j``'s lanes."""
    out = []
    for piece in blocks.split3(q):
        if g.blocks > 1:
            piece = jnp.where(g.lane_mask(h, j, piece.shape), piece, 0.0)
        out.append(piece.astype(compute))
    return out


def _stacked_dot(pieces: list[jax.Array], parts: list[jax.Array], scores: bool) -> jax.Array:
    """The sum over ``pieces`` of each piece times the decoded parts: scores (``a @
    part.T``, parts in token order) or values (``a @ part``), as one matmul of the pieces
    stacked along the rows (aligned: the rows are a multiple of 8)."""
    stacked = jnp.concatenate(pieces, axis=0)
    rows = pieces[0].shape[0]
    if scores:
        raw = [lax.dot_general(stacked, c, _NT, preferred_element_type=jnp.float32) for c in parts]
        r = blocks.tokens_in_order(*raw) if len(raw) == 2 else raw[0]
    else:
        r = jnp.dot(stacked, parts[0], preferred_element_type=jnp.float32)
    total = r[:rows]
    for i in range(1, len(pieces)):
        total = total + r[i * rows : (i + 1) * rows]
    return total


def prefill(
    xq: jax.Array,
    k: jax.Array,
    k_scales: Any,
    v: jax.Array,
    v_scales: Any,
    visible: jax.Array,
    layer: jax.Array,
    fmt: CacheFormat,
    g: Geometry,
    block: int,
    compute: str,
    out_dtype: Any = jnp.float32,
    interpret: bool = False,
) -> jax.Array:
    """The kernel on scaled, windowed queries ``xq`` (B, T, KV, groups, window) f32 over
    layer ``layer`` of the stacked cache arrays (as :func:`emulate.kvcache.decode_kernel.
    decode`); query ``t`` of sequence ``b`` sees the first ``visible[b] + t`` tokens.
    Returns (B, T, KV, groups, head_dim) in ``out_dtype``."""
    batch, t = xq.shape[:2]
    bq = QUERY_BLOCK
    tq = -(-t // bq) * bq
    x = jnp.moveaxis(xq, 1, 3)  # (B, KV, G, T, window)
    x = jnp.pad(x, [(0, 0)] * 3 + [(0, tq - t), (0, 0)])
    cfg = PrefillConfig(fmt, g, block, compute, bq)
    tokens = 2 * k.shape[2] if fmt.packed else k.shape[2]
    rows = layout.code_rows(fmt, block)

    def last(b: Any, qi: Any, vis: Any) -> Any:
        return jnp.maximum(vis[b] + (qi + 1) * bq - 2, 0) // block

    def codes_at(b: Any, h: Any, qi: Any, s: Any, vis: Any, lay: Any) -> tuple:
        return (lay[0], b, jnp.minimum(s, last(b, qi, vis)), (h * g.head_dim) // g.window)

    def scales_at(b: Any, h: Any, qi: Any, s: Any, vis: Any, lay: Any) -> tuple:
        return (lay[0], b, 0, jnp.minimum(s, last(b, qi, vis)))

    def queries_at(b: Any, h: Any, qi: Any, s: Any, vis: Any, lay: Any) -> tuple:
        return (b, h, 0, qi, 0)

    code_spec = pl.BlockSpec((None, None, rows, g.window), codes_at)
    q_spec = pl.BlockSpec((None, None, g.groups, bq, g.window), queries_at)
    out_spec = pl.BlockSpec((None, None, g.groups, bq, g.head_dim), queries_at)
    scale_spec = (
        None
        if k_scales is None
        else pl.BlockSpec((None, None, k_scales.shape[2], block), scales_at)
    )
    specs, operands = blocks.cache_operands(
        (k, k_scales, v, v_scales), code_spec, scale_spec, interpret
    )
    specs, operands = [q_spec, *specs], [x, *operands]
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(batch, g.kv_heads, tq // bq, tokens // block),
        in_specs=specs,
        out_specs=out_spec,
        scratch_shapes=[
            pltpu.VMEM((cfg.rows, 128), jnp.float32),
            pltpu.VMEM((cfg.rows, 128), jnp.float32),
            pltpu.VMEM((cfg.rows, g.window), jnp.float32),
        ],
    )
    o = pl.pallas_call(
        functools.partial(_kernel, cfg),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct((*x.shape[:-1], g.head_dim), out_dtype),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
        interpret=pltpu.InterpretParams() if interpret else False,
        name=NAME,
    )(visible.astype(jnp.int32), jnp.reshape(layer, (1,)).astype(jnp.int32), *operands)
    return jnp.moveaxis(o[:, :, :, :t], 3, 1)  # (B, T, KV, G, head_dim)
