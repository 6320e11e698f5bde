"""``emulate.pallas.ragged_dot``: a grouped matmul (mixture-of-experts experts) as one
Pallas TPU kernel that reads each routed expert's weight as stored and decodes it in VMEM.

``x`` (M, K) holds rows sorted by group, ``group_sizes`` (G,) the rows of each group, ``w``
(G, K, N) one weight per group; row ``i`` of group ``g`` gives ``x[i] @ w[g]``, the rows
after the last group zeros (``lax.ragged_dot``'s semantics, as :func:`emulate.ragged_dot`).

The kernel is megablox's ``gmm`` in shape: a schedule computed from ``group_sizes`` in
the program (:func:`schedule`, scalar-prefetched into SMEM) lists the *visits*: each
(group, row tile) pair where the group has rows, groups in order. The grid is ``(N / bn,
visits, K / bk)``, K innermost: a visit contracts its row tile with its group's weight
column block over K, and stores only the rows of its group (a row tile shared by two
groups is visited twice in a row, so its output block stays in VMEM between the visits).
A group's weight blocks are fetched only on that group's visits: an expert without rows
is never read, and an expert's weight is read once per row tile its rows touch (once in
all where they fit one tile, as in a decode step; :func:`weight_fetches` lists the
copies). The visit count is bounded statically by ``M / bm + G - 1``; visits past the
real count keep the last real step's block indices (no new copy) and do nothing.

The blocks, their decoding and the dots are :func:`emulate.pallas.matmul`'s
(:mod:`emulate.pallas.route`): ``x`` and ``w`` are read as stored and decoded exactly in
the kernel into the type the target's matrix unit takes; exact-class pairs sum in int32
(as two 16-bit limbs when the result is a float: no overflow), others in f32; the sum is
rounded once, outside the kernel. Built: dense experts, one byte per element (int8,
uint8, float8 arrays or uint8 codes with ``w_format``, float6 codes too). Not built: 4-bit
experts (Packed, int4 / float4 arrays) and QArray experts (block scales, zero points,
codebooks), which :func:`emulate.ragged_dot` runs on the XLA route.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from emulate import formats, targets
from emulate.formats import Format, FormatLike
from emulate.group_sizes import check_group_sizes
from emulate.numerics import accumulate
from emulate.numerics.storage import Packed, is_array, to_codes
from emulate.pallas import route
from emulate.pallas.matmul_kernel import interpret_mode
from emulate.qarray import QArray

__all__ = ["GmmConfig", "ragged_dot", "schedule", "weight_fetches"]

_LANES = 128


@dataclasses.dataclass(frozen=True)
class GmmConfig:
    """One grouped kernel: the route, the shapes, the blocks.

    Attributes:
      route: the pair's :class:`emulate.pallas.route.Route`.
      m, k, n, groups: the problem; bm, bk, bn: the blocks.
      w_dtype: the stored weight's dtype; w_format: its format (codes: the format's).
      x_dtype: the stored activations' dtype.
      limbs: an exact pair with a float result: the int32 sum as two 16-bit limbs.
      interpret: Pallas interpret mode.
    """

    route: route.Route
    m: int
    k: int
    n: int
    groups: int
    bm: int
    bk: int
    bn: int
    w_dtype: str
    w_format: str
    x_dtype: str
    limbs: bool
    interpret: bool

    @property
    def visits(self) -> int:
        """The static bound on visits: every row tile once, plus one per group boundary."""
        return -(-self.m // self.bm) + self.groups - 1

    @property
    def passthrough(self) -> bool:
        """The weight goes to the matrix unit as stored (int8 x int8 natively)."""
        r = self.route
        return self.w_dtype == r.rhs_compute == self.w_format and not r.rhs_scale


def schedule(group_sizes: jax.Array, m: int, bm: int) -> tuple[jax.Array, ...]:
    """The visits of the grouped kernel, computed in the program (``group_sizes`` traced).

    Args:
      group_sizes: (G,) int, each >= 0, summing to at most ``m`` (traced sizes are not
        checked: negative ones count as 0, rows past ``m`` are cut off).
      m: rows; bm: the row tile.

    Returns:
      ``(group, tile, count, starts, ends)``: int32 arrays of the static length
      ``ceil(m / bm) + G - 1`` giving each visit's group and row tile (groups in order,
      each group's tiles in order; past ``count`` the last visit repeated), ``count``
      (1,) the number of real visits, and each group's first row and end (G,).
    """
    gs = jnp.maximum(jnp.asarray(group_sizes).astype(jnp.int32), 0)
    g = gs.shape[0]
    ends = jnp.minimum(jnp.cumsum(gs), m)  # traced sizes past m: cut (no block past the end)
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
    gs = ends - starts
    first = starts // bm
    last = (ends + bm - 1) // bm  # one past the last tile
    tiles = jnp.where(gs > 0, last - first, 0)
    offsets = jnp.cumsum(tiles)  # visits of groups 0..j
    count = offsets[-1]
    v = jnp.arange(-(-m // bm) + g - 1, dtype=jnp.int32)
    v = jnp.minimum(v, jnp.maximum(count - 1, 0))  # past the count: the last visit again
    group = jnp.sum(offsets[None, :] <= v[:, None], axis=1, dtype=jnp.int32)
    group = jnp.minimum(group, g - 1)
    tile = first[group] + v - (offsets[group] - tiles[group])
    return group, tile, count.reshape(1), starts, ends


def _index_maps(nk: int) -> tuple[Any, Any, Any]:
    """The block index maps of x, w and the output, over the grid ``(j, v, k)`` and the
    scalar-prefetched schedule. Past the real visits every index stays the last real
    step's, so nothing is copied again."""

    def x_map(j, v, k, group, tile, count, *_):
        return tile[v], jnp.where(v < count[0], k, nk - 1)

    def w_map(j, v, k, group, tile, count, *_):
        return group[v], jnp.where(v < count[0], k, nk - 1), j

    def o_map(j, v, k, group, tile, *_):
        return tile[v], j

    return x_map, w_map, o_map


def weight_fetches(
    group_sizes: Any, m: int, k: int, n: int, block_shape: Sequence[int]
) -> list[tuple[int, int, int]]:
    """The weight blocks ``(expert, k block, n block)`` the kernel copies from HBM, in
    order, for concrete ``group_sizes``: the grid walked with the kernel's own index maps
    and schedule, a block copied where its index differs from the previous step's (the
    Pallas TPU pipeline's rule). Each is ``bk x bn`` stored elements."""
    bm, bn, bk = (int(b) for b in block_shape)
    nk, nn = -(-k // bk), -(-n // bn)
    sched = [np.asarray(a) for a in schedule(jnp.asarray(group_sizes), m, bm)]
    _, w_map, _ = _index_maps(nk)
    out: list[tuple[int, int, int]] = []
    last = None
    for j in range(nn):
        for v in range(len(sched[0])):
            for kk in range(nk):
                e, kb, nb = (int(i) for i in w_map(j, v, kk, *sched))
                index = (e, kb, nb)
                if index != last:
                    out.append(index)
                last = index
    return out


def _decode_x(xt: jax.Array, cfg: GmmConfig) -> jax.Array:
    r = cfg.route
    if cfg.x_dtype == r.lhs_compute and not r.lhs_scale:
        return xt
    xf = formats.get(r.lhs)
    if not xf.is_low_precision:
        return route.decode_values(xt, r.lhs_compute)
    if jnp.issubdtype(xt.dtype, jnp.floating):  # float8: Mosaic bitcasts to int8
        xt = lax.bitcast_convert_type(xt, jnp.int8)
    return route.decode_codes(xt.astype(jnp.int32) & 0xFF, xf, r.lhs_compute, r.lhs_scale)


def _decode_w(wt: jax.Array, cfg: GmmConfig, k: Any) -> jax.Array:
    """The weight block in the matrix unit's type; rows past K zero (code 0 is +0)."""
    r = cfg.route
    partial_k = cfg.k % cfg.bk
    if cfg.passthrough and not partial_k:
        return wt
    if jnp.issubdtype(wt.dtype, jnp.floating):
        wt = lax.bitcast_convert_type(wt, jnp.int8)
    c = wt.astype(jnp.int32) & 0xFF
    if partial_k:
        rows = lax.broadcasted_iota(jnp.int32, c.shape, 0)
        c = jnp.where(rows < cfg.k - k * cfg.bk, c, 0)
    if cfg.passthrough:
        return c.astype(jnp.int8)
    return route.decode_codes(c, cfg.w_format, r.rhs_compute, r.rhs_scale)


def _kernel(cfg: GmmConfig, group_ref, tile_ref, count_ref, start_ref, end_ref, *refs) -> None:
    x_ref, w_ref = refs[:2]
    n_acc = 2 if cfg.limbs else 1
    outs, accs = refs[2 : 2 + n_acc], refs[2 + n_acc :]
    r = cfg.route
    v, k = pl.program_id(1), pl.program_id(2)
    real = v < count_ref[0]

    @pl.when(real & (k == 0))
    def _init():
        for a in accs:
            a[...] = jnp.zeros(a.shape, a.dtype)

    @pl.when(real)
    def _step():
        xt = _decode_x(x_ref[...], cfg)
        if cfg.k % cfg.bk:  # columns past K: garbage of a partial block
            cols = lax.broadcasted_iota(jnp.int32, xt.shape, 1)
            wide = xt.astype(jnp.float32) if xt.dtype == jnp.bfloat16 else xt
            wide = jnp.where(cols < cfg.k - k * cfg.bk, wide, jnp.zeros((), wide.dtype))
            xt = wide.astype(xt.dtype)
        wt = _decode_w(w_ref[...], cfg, k)
        step = route.exact_dot(xt, wt, r) if r.exact else route.float_dot(xt, wt, r.precision)
        if cfg.limbs:
            accs[0][...] += step >> 16
            accs[1][...] += step & 0xFFFF
        else:
            accs[0][...] += step

    @pl.when(real & (k == pl.num_programs(2) - 1))
    def _store():
        g = group_ref[v]
        rows = tile_ref[v] * cfg.bm + lax.broadcasted_iota(jnp.int32, (cfg.bm, cfg.bn), 0)
        mine = (rows >= start_ref[g]) & (rows < end_ref[g])
        for o, a in zip(outs, accs):
            o[...] = jnp.where(mine, a[...], o[...])


@functools.partial(jax.jit, static_argnames=("cfg",))
def _run(x: jax.Array, w: jax.Array, group_sizes: jax.Array, cfg: GmmConfig) -> jax.Array:
    r = cfg.route
    group, tile, count, starts, ends = schedule(group_sizes, cfg.m, cfg.bm)
    nk = -(-cfg.k // cfg.bk)
    nn = -(-cfg.n // cfg.bn)
    acc_dtype = jnp.int32 if r.exact else jnp.float32
    n_acc = 2 if cfg.limbs else 1

    x_map, w_map, o_map = _index_maps(nk)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=5,
        grid=(nn, cfg.visits, nk),
        in_specs=[
            pl.BlockSpec((cfg.bm, cfg.bk), x_map),
            pl.BlockSpec((None, cfg.bk, cfg.bn), w_map),
        ],
        out_specs=[pl.BlockSpec((cfg.bm, cfg.bn), o_map)] * n_acc,
        scratch_shapes=[pltpu.VMEM((cfg.bm, cfg.bn), acc_dtype)] * n_acc,
    )
    outs = pl.pallas_call(
        functools.partial(_kernel, cfg),
        grid_spec=grid_spec,
        out_shape=[jax.ShapeDtypeStruct((cfg.m, cfg.n), acc_dtype)] * n_acc,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary"),
        ),
        interpret=pltpu.InterpretParams() if cfg.interpret else False,
        name="emulate_ragged_dot",
    )(group, tile, count, starts, ends, x, w)
    if cfg.limbs:
        out = accumulate.round_limbs(*accumulate.normalize(*outs), r.scale, r.out)
    else:
        out = accumulate.round_accumulator(outs[0], r.out)
    # rows after the last group: never stored (whatever the output buffer held)
    held = jnp.arange(cfg.m, dtype=jnp.int32)[:, None] < ends[-1]
    return jnp.where(held, out, jnp.zeros((), out.dtype))


def _experts(w: Any, w_format: FormatLike | None) -> tuple[jax.Array, Format]:
    """(stored weight, format): dense experts, one byte an element."""
    if isinstance(w, (QArray, Packed)) or not is_array(w):
        kind = type(w).__name__
        raise NotImplementedError(
            f"w: the grouped kernel reads dense experts of one byte an element (int8, uint8, "
            f"float8 arrays or uint8 codes with w_format); {kind} experts (4-bit packed, "
            "QArray block scales, zero points, codebooks) are not built in it: use "
            "emulate.ragged_dot, which runs them on the XLA route"
        )
    dt = np.dtype(w.dtype)
    if w_format is None and dt.name in formats.names() and formats.get(dt).xla_storable:
        f = formats.get(dt)
        data = jnp.asarray(w)
    else:
        codes, f = to_codes(w, w_format, arg="w")
        data = jnp.asarray(codes)
    if not f.is_low_precision:
        raise ValueError(f"w: a {f.name} weight needs no decoding; pass low-precision experts")
    if np.dtype(data.dtype).itemsize != 1 or f.bits < 6 and w_format is None:
        raise NotImplementedError(
            f"w: {f.name} experts (4-bit) are not built in the grouped kernel; pass one "
            "byte an element (uint8 codes with w_format) or use emulate.ragged_dot"
        )
    if data.ndim != 3:
        raise ValueError(f"w: expected (G, K, N) experts, got shape {tuple(data.shape)}")
    return data, f


def _blocks(block_shape: Sequence[int] | None, m: int, k: int, n: int, sub: int) -> tuple:
    if block_shape is None:
        bm = min(256, -(-m // sub) * sub)
        return bm, min(512, -(-k // _LANES) * _LANES), min(256, -(-n // _LANES) * _LANES)
    bm, bn, bk = (int(b) for b in block_shape)
    if bm % sub or bn % _LANES or bk % _LANES or min(bm, bn, bk) <= 0:
        raise ValueError(
            f"block_shape: (bm, bn, bk) must be positive, bm a multiple of {sub} (the "
            f"sublane tiling of the decoded x), bn and bk of {_LANES}; got {tuple(block_shape)}"
        )
    return bm, bk, bn


def ragged_dot(
    x: jax.Array | np.ndarray,
    w: jax.Array | np.ndarray,
    group_sizes: jax.Array | np.ndarray,
    *,
    target: targets.TargetLike = None,
    block_shape: Sequence[int] | None = None,
    out_dtype: FormatLike | None = None,
    interpret: bool | None = None,
    x_format: FormatLike | None = None,
    w_format: FormatLike | None = None,
) -> jax.Array:
    """``lax.ragged_dot(x, w, group_sizes)`` as one grouped Pallas TPU kernel (see the
    module docstring for the schedule and what is built).

    Args:
      x: (M, K) rows sorted by group: bfloat16 or float32, or an int8 / uint8 / float8
        array (uint8 codes with ``x_format``).
      w: (G, K, N) experts: int8 / uint8 / float8 arrays, or uint8 codes with
        ``w_format`` (float6 codes too).
      group_sizes: (G,) int, >= 0, summing to at most M (traced values are not checked).
      target: a TPU target; default the current one.
      block_shape: ``(bm, bn, bk)``; default bm up to 256 rows, bn up to 256, bk up to 512.
      out_dtype: the result type (as ``preferred_element_type``); default ``lax``'s.
      interpret: None: interpret mode unless JAX's default backend is a TPU.

    Returns:
      (M, N): each row the product with its group's weight, exact for exact-class pairs
      (integers, fp4 and e2m3 with integers: bit-identical to
      :func:`emulate.reference.ragged_dot`), within the bound of mode "fast" otherwise;
      rows after the last group zero.

    Raises:
      NotImplementedError: experts the kernel does not read yet (4-bit, Packed, QArray).
      ValueError: a non-TPU target; shapes that do not fit; concrete group sizes that
        are negative or sum to more than M; a block shape off the tiling.
      TypeError: a weight or activation that is no array.
    """
    t = targets.current_target(target)
    if t.kind != "tpu":
        raise ValueError(f"target: a TPU kernel, and the target is {t.name}; pass a TPU target")
    wdata, wf = _experts(w, w_format)
    if x_format is None and np.dtype(x.dtype).name in ("float16",):
        x = jnp.asarray(x, jnp.float32)
    xv, xf = jnp.asarray(x), formats.get(x_format or x.dtype)
    if x_format is not None:
        xv = jnp.asarray(to_codes(x, x_format, arg="x")[0])
    g, kw, n = wdata.shape
    if xv.ndim != 2 or xv.shape[1] != kw or np.shape(group_sizes) != (g,):
        raise ValueError(
            f"x, w, group_sizes: expected (M, K), (G, K, N) and (G,), got {tuple(xv.shape)}, "
            f"{tuple(wdata.shape)} and {tuple(np.shape(group_sizes))}"
        )
    m, k = xv.shape
    check_group_sizes(group_sizes, m, "x")
    vf = formats.get("int8") if wf.name in formats.CODE_FORMATS else wf
    r = route.route(xf, vf, target=t, preferred_element_type=out_dtype)
    if 0 in (m, n, k):
        return jnp.zeros((m, n), formats.get(r.out).dtype)
    sub = {"float32": 8, "bfloat16": 16, "int8": 32}[r.lhs_compute]
    bm, bk, bn = _blocks(block_shape, m, k, n, sub)
    limbs = r.exact and not formats.get(r.out).is_integer
    cfg = GmmConfig(
        r, m, k, n, g, bm, bk, bn, np.dtype(wdata.dtype).name, wf.name,
        np.dtype(xv.dtype).name, limbs, interpret_mode(interpret),
    )  # fmt: skip
    return _run(xv, wdata, jnp.asarray(group_sizes), cfg)
