"""Decode attention (one new token a sequence) over a stored KV cache layer as one Pallas
TPU kernel that reads each stored byte once.

Grid ``(batch, token blocks)``; a step reads one block of ``block`` tokens of one sequence,
every KV head (one code row holds them all), with its scales, and runs an online softmax
(running maximum, sum and f32 accumulator in VMEM) per KV head. A sequence's blocks past
its length are neither read (the index maps stay on its last block, so no copy is made)
nor computed. Per KV head and block:

- scores: the head's stacked query rows (:mod:`emulate.kvcache.queries`: three exact bf16
  pieces of the scaled query, times each scale block's lanes) times the decoded codes of
  the head's window, one matmul; the rows of each scale block times that block's scales
  (tokens along the lanes, as stored), summed;
- the softmax weights of the visible tokens, times each scale block's V scales, cut into
  three exact bf16 pieces and stacked in VMEM; one matmul against the decoded V codes;
  the rows of each block kept on that block's lanes, summed into the accumulator.

Everything the matrix unit multiplies is an exact bf16 value (f32 operands holding them
on v2 and v3), every sum f32: docs/numerics.md states the bound. The layer is a scalar
operand, so a model that scans its layers passes the stacked cache without slicing it.
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

__all__ = ["NAME", "DecodeConfig", "decode"]

#: The kernel's name in a program (benchmarks count its traffic by it).
NAME = "emulate_kv_decode_attention"
_NT = (((1,), (1,)), ((), ()))  # a @ b.T


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """The static shape of one decode kernel: format, head geometry, tokens a step, and
    the matrix unit's operand type ("float32" on v2 and v3, else "bfloat16")."""

    format: CacheFormat
    geometry: Geometry
    block: int
    compute: str

    @property
    def rows(self) -> int:
        """Code rows of one block."""
        return layout.code_rows(self.format, self.block)


def _kernel(cfg: DecodeConfig, visible_ref, layer_ref, *refs: Any) -> None:
    del layer_ref  # read by the index maps only
    scaled = cfg.format.granularity in ("token", "block")
    if scaled:
        x_ref, k_ref, ks_ref, v_ref, vs_ref, o_ref, q_sc, m_sc, l_sc, acc_sc, p_sc = refs
    else:
        x_ref, k_ref, v_ref, o_ref, q_sc, m_sc, l_sc, acc_sc, p_sc = refs
        ks_ref = vs_ref = None
    b, s = pl.program_id(0), pl.program_id(1)
    g, n = cfg.geometry, cfg.block

    @pl.when(s == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)
        for h in range(g.kv_heads):  # the stacked query rows, once a sequence
            pieces = blocks.split3(x_ref[h])
            for i, piece in enumerate(pieces):
                for j in range(g.blocks):
                    kept = (
                        piece
                        if g.blocks == 1
                        else jnp.where(g.lane_mask(h, j, piece.shape), piece, 0.0)
                    )
                    q_sc[h, _group_rows(g, i * g.blocks + j)] = kept.astype(q_sc.dtype)

    visible = visible_ref[b]

    @pl.when(s * n < visible)
    def _step():
        token = s * n + lax.broadcasted_iota(jnp.int32, (g.groups, n), 1)
        seen = token < visible
        ks = blocks.scale_rows(ks_ref[...], cfg.format) if scaled else None
        vs = blocks.scale_rows(vs_ref[...], cfg.format) if scaled else None
        for h in range(g.kv_heads):
            lanes = slice(g.start(h), g.start(h) + g.window)
            logits = _scores(cfg, q_sc[h], k_ref[:, lanes], ks, h)
            logits = jnp.where(seen, logits, -jnp.inf)
            p, alpha, m, lsum = blocks.softmax_step(logits, m_sc[h][:, :1], l_sc[h][:, :1])
            m_sc[h] = jnp.broadcast_to(m, m_sc.shape[1:])
            l_sc[h] = jnp.broadcast_to(lsum, l_sc.shape[1:])
            out = _values(cfg, p, seen, v_ref[:, lanes], vs, h, p_sc, s * n, visible)
            acc_sc[h] = alpha * acc_sc[h] + out

    @pl.when(s == pl.num_programs(1) - 1)
    def _done():
        for h in range(g.kv_heads):
            total = l_sc[h][:, :1]
            out = blocks.normalized(acc_sc[h], total)
            o_ref[h] = out[:, g.offset(h) : g.offset(h) + g.head_dim].astype(o_ref.dtype)


def _group_rows(g: Geometry, group: int) -> slice:
    """Row group ``group`` (piece ``i``, scale block ``j``: ``i * blocks + j``) of a
    stacked operand."""
    return slice(group * g.groups, (group + 1) * g.groups)


def _rows(x: jax.Array, g: Geometry, group: int) -> jax.Array:
    return x[_group_rows(g, group)]


def _scores(cfg: DecodeConfig, q: jax.Array, codes: jax.Array, ks: Any, h: int) -> jax.Array:
    """(groups, block) f32 scores of head ``h``: stacked query rows times the decoded
    codes, each scale block's rows times its scales, summed."""
    g = cfg.geometry
    parts = blocks.code_parts(codes, cfg.format, jnp.dtype(cfg.compute))
    raw = [lax.dot_general(q, c, _NT, preferred_element_type=jnp.float32) for c in parts]
    r = blocks.tokens_in_order(*raw) if len(raw) == 2 else raw[0]
    logits = None
    for j in range(g.blocks):
        term = _rows(r, g, j)
        for i in range(1, blocks.PIECES):
            term = term + _rows(r, g, i * g.blocks + j)
        if ks is not None:
            term = term * ks[h * g.blocks + j : h * g.blocks + j + 1]
        logits = term if logits is None else logits + term
    assert logits is not None
    return logits


def _values(
    cfg: DecodeConfig,
    p: jax.Array,
    seen: jax.Array,
    codes: jax.Array,
    vs: Any,
    h: int,
    p_sc: Any,
    first: Any,
    visible: Any,
) -> jax.Array:
    """(groups, window) f32: the weights ``p`` of head ``h`` (zero where not ``seen``)
    times the decoded V codes of its window, per scale block, on the head's lanes."""
    g = cfg.geometry
    for j in range(g.blocks):
        pj = (
            p
            if vs is None
            else jnp.where(seen, p * vs[h * g.blocks + j : h * g.blocks + j + 1], 0.0)
        )
        for i, piece in enumerate(blocks.split3(pj)):
            p_sc[_group_rows(g, i * g.blocks + j), :] = piece.astype(p_sc.dtype)
    stacked = p_sc[...]
    # tokens past the sequence's end may hold anything (NaN codes, an old sequence's
    # tokens): their weight is 0, and 0 * NaN must not reach the sum
    parts = blocks.code_parts(codes, cfg.format, jnp.dtype(cfg.compute), first, visible)
    weights = blocks.tiles_apart(stacked) if len(parts) == 2 else [stacked]
    o = None
    for w, c in zip(weights, parts):
        d = jnp.dot(w, c, preferred_element_type=jnp.float32)
        o = d if o is None else o + d
    assert o is not None
    if not g.whole_head:  # each row group keeps its head's block's lanes
        o = jnp.where(_group_lanes(g, h, o.shape), o, 0.0)
    out = None
    for group in range(g.row_groups):
        term = _rows(o, g, group)
        out = term if out is None else out + term
    assert out is not None
    return out


def _group_lanes(g: Geometry, h: int, shape: tuple[int, ...]) -> jax.Array:
    """(rows, window) bool: the lanes of head ``h``'s scale block ``j`` in each row of
    row group ``i * blocks + j`` (one select on the whole stacked product)."""
    row = lax.broadcasted_iota(jnp.int32, shape, 0)
    keep = None
    for group in range(g.row_groups):
        rows = (row >= group * g.groups) & (row < (group + 1) * g.groups)
        cond = rows & g.lane_mask(h, group % g.blocks, shape)
        keep = cond if keep is None else keep | cond
    assert keep is not None
    return keep


def decode(
    xq: jax.Array,
    k: jax.Array,
    k_scales: Any,
    v: jax.Array,
    v_scales: Any,
    visible: jax.Array,
    layer: jax.Array,
    cfg: DecodeConfig,
    out_dtype: Any = jnp.float32,
    interpret: bool = False,
) -> jax.Array:
    """The kernel on scaled queries ``xq`` (B, KV, groups, window) f32, each at its
    head's lanes of its window (:func:`emulate.kvcache.queries.windowed`), over layer
    ``layer`` (int32 scalar) of the stacked codes ``k``, ``v`` (L, B, code rows, KV *
    head_dim) and their per-token or block scales (L, B, KV * nb, S) (None for per-head
    and unscaled formats). Sequence ``b`` shows its first ``visible[b]`` tokens (B,)
    int32 (0: none; its output is then 0). Returns (B, KV, groups, head_dim) in
    ``out_dtype`` (each head's lanes taken in the kernel: XLA:TPU gave zeros for a lane
    slice at 64 of a (1, 2, 4, 128) kernel result on a real v5e, jax 0.10.2).
    ``interpret``: Pallas' interpret mode (on the CPU)."""
    g, n = cfg.geometry, cfg.block
    batch = k.shape[1]
    tokens = 2 * k.shape[2] if cfg.format.packed else k.shape[2]
    if tokens % n:
        raise ValueError(f"block: {n} tokens do not divide the cache's {tokens}")
    width = k.shape[3]

    def last(b: Any, vis: Any) -> Any:
        return jnp.maximum(vis[b] - 1, 0) // n

    def codes_at(b: Any, s: Any, vis: Any, lay: Any) -> tuple:
        return (lay[0], b, jnp.minimum(s, last(b, vis)), 0)

    def scales_at(b: Any, s: Any, vis: Any, lay: Any) -> tuple:
        return (lay[0], b, 0, jnp.minimum(s, last(b, vis)))

    def per_sequence(b: Any, s: Any, vis: Any, lay: Any) -> tuple:
        return (b, 0, 0, 0)

    code_spec = pl.BlockSpec((None, None, cfg.rows, width), codes_at)
    scale_spec = (
        None if k_scales is None else pl.BlockSpec((None, None, k_scales.shape[2], n), scales_at)
    )
    specs, operands = blocks.cache_operands(
        (k, k_scales, v, v_scales), code_spec, scale_spec, interpret
    )
    specs = [pl.BlockSpec((None, *xq.shape[1:]), per_sequence), *specs]
    operands = [xq, *operands]
    out_shape = (batch, g.kv_heads, g.groups, g.head_dim)
    rows = g.row_groups * g.groups
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(batch, tokens // n),
        in_specs=specs,
        out_specs=pl.BlockSpec((None, *out_shape[1:]), per_sequence),
        scratch_shapes=[
            pltpu.VMEM((g.kv_heads, rows, g.window), jnp.dtype(cfg.compute)),
            pltpu.VMEM((g.kv_heads, g.groups, 128), jnp.float32),
            pltpu.VMEM((g.kv_heads, g.groups, 128), jnp.float32),
            pltpu.VMEM((g.kv_heads, g.groups, g.window), jnp.float32),
            pltpu.VMEM((rows, n), jnp.dtype(cfg.compute)),
        ],
    )
    return pl.pallas_call(
        functools.partial(_kernel, cfg),
        grid_spec=grid_spec,
        out_shape=jax.ShapeDtypeStruct(out_shape, out_dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
        interpret=pltpu.InterpretParams() if interpret else False,
        name=NAME,
    )(visible.astype(jnp.int32), jnp.reshape(layer, (1,)).astype(jnp.int32), *operands)
