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

The experts are :func:`emulate.pallas.matmul`'s weights with a leading expert axis, and a
visit runs that kernel's body (:func:`emulate.pallas.matmul_kernel.kernel_body`) on its
blocks: every operand of one expert (codes, scales, zero points, offsets, two-level
parts; :func:`emulate.pallas.matmul_args.matmul_args` reads them) has one more block
dimension, indexed by the visit's group. Built: dense one-byte experts (int8, uint8,
float8, uint8 codes with ``w_format``), 4-bit and other sub-byte experts (int4 / float4
arrays and :class:`emulate.Packed` packed along K; K-planar when prepared once with
:func:`prepare_experts`), and stacked QArrays whose scales change along K (OCP MX such as
gpt-oss MXFP4, GGUF K-quants' two-level scales and mins, AWQ / GPTQ groups with zero
points, NVFP4's e4m3 block scales with one float32 tensor scale for all the experts, not
mapped over them). Not built (NotImplementedError naming it): codebooks, act-order
permutations, scales constant along K, blocks of several columns and two-level parts
spread over several columns; :func:`prepare_experts` of experts with a tensor scale (the
kernel reads them as they are).
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
from emulate.formats import FormatLike
from emulate.group_sizes import as_group_sizes, check_group_sizes
from emulate.numerics.storage import Packed, is_array
from emulate.pallas import matmul_kernel, qweight
from emulate.pallas.matmul_args import matmul_args
from emulate.pallas.matmul_config import Config, config
from emulate.pallas.qweight import KernelQWeight, Scaling, prepare_weight
from emulate.pallas.weights import KernelWeight
from emulate.quantized.array import QArray
from emulate.quantized.layout import layout_of

__all__ = ["prepare_experts", "ragged_dot", "schedule", "weight_fetches"]


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


def _visits(m: int, bm: int, groups: int) -> int:
    """The static bound on visits: every row tile once, plus one per group boundary."""
    return -(-m // bm) + groups - 1


def schedule(group_sizes: jax.Array, m: int, bm: int) -> tuple[jax.Array, ...]:
    """The visits of the grouped kernel, computed in the program (``group_sizes`` traced).

    Args:
      group_sizes: (G,) int, each >= 0, any total (traced sizes are not checked:
        negative ones count as 0; rows past ``m`` are cut off, as in JAX).
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


def weight_fetches(
    group_sizes: Any, m: int, k: int, n: int, block_shape: Sequence[int]
) -> list[tuple[int, int, int]]:
    """The weight blocks ``(expert, k block, n block)`` the kernel copies from HBM, in
    order, for concrete ``group_sizes``: the grid walked with the kernel's own index maps
    and schedule, a block copied where its index differs from the previous step's (the
    Pallas TPU pipeline's rule). Each is ``bk x bn`` stored elements (``bk`` rows of K:
    ``bk / 2`` bytes of a 4-bit expert); a QArray expert's scales and zero points are
    fetched on the same steps, all of the expert's groups at once per column block."""
    bm, bn, bk = (int(b) for b in block_shape)
    nk, nn = -(-k // bk), -(-n // bn)
    sched = [np.asarray(a) for a in schedule(jnp.asarray(group_sizes), m, bm)]
    w_map = _visit_spec(pl.BlockSpec((bk, bn), lambda i, j, k: (k, j)), nk, True).index_map
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


def _expert_count(w: Any) -> int:
    """G of (G, K, N) experts; TypeError / ValueError for anything else."""
    if isinstance(w, QArray):
        shape = tuple(w.shape)
    elif isinstance(w, Packed):
        shape = tuple(w.data.shape)
    elif isinstance(w, (KernelWeight, KernelQWeight)):  # stacked by prepare_experts
        shape = tuple(jax.tree.leaves(w)[0].shape)
    elif is_array(w):
        shape = tuple(np.shape(w))
    else:
        raise TypeError(
            f"w: expected (G, K, N) experts: an array, uint8 codes with w_format, a Packed "
            f"array, a QArray or prepare_experts' result; got {type(w).__name__}"
        )
    if len(shape) != 3:
        raise ValueError(f"w: expected (G, K, N) experts, got shape {shape}")
    return shape[0]


def _refuse_parts(codebook: bool, perm: Any, sc: Scaling | None) -> None:
    """NotImplementedError for an expert part the grouped kernel does not take (a
    codebook, an act-order permutation, the scaling ``sc``)."""
    parts = [
        ("a codebook", codebook),
        ("an act-order permutation", perm is not None),
        ("scales constant along K", sc is not None and not sc.along_k),
        ("scale blocks of several columns", sc is not None and bool(sc.columns)),
        (
            "two-level parts spread over several columns",
            sc is not None and sc.affine is not None and bool(sc.affine.spreads),
        ),
    ]
    there = [name for name, on in parts if on]
    if there:
        raise NotImplementedError(
            f"w: QArray experts with {' and '.join(there)} are not built in the grouped "
            "kernel (built: codes with scales along K, zero points, offsets and two-level "
            "scales; module emulate.pallas.gmm_kernel); use emulate.ragged_dot"
        )


def _visit_spec(spec: Any, nk: int, stacked: bool) -> Any:
    """A BlockSpec of :func:`emulate.pallas.matmul`'s ``(i, j, k)`` grid on the grouped
    grid ``(j, v, k)``: row block the visit's tile, K the last real step's past the
    visits' count, and (``stacked``) a leading expert dimension indexed by the visit's
    group."""
    inner = spec.index_map

    def index_map(j, v, k, group, tile, count, *_):
        kk = jnp.where(v < count[0], k, nk - 1)
        idx = tuple(inner(tile[v], j, kk))
        return (group[v], *idx) if stacked else idx

    shape = (None, *spec.block_shape) if stacked else spec.block_shape
    return pl.BlockSpec(shape, index_map)


def _kernel(cfg: Config, group_ref, tile_ref, count_ref, start_ref, end_ref, *refs) -> None:
    v = pl.program_id(1)

    def store(o_ref: Any, value: jax.Array) -> None:  # this visit's group's rows only
        g = group_ref[v]
        rows = tile_ref[v] * cfg.bm + lax.broadcasted_iota(jnp.int32, value.shape, 0)
        mine = (rows >= start_ref[g]) & (rows < end_ref[g])
        # TPU v4 has no select on bf16 vectors: select in f32, then round (exactly)
        wide = jnp.float32 if value.dtype == jnp.bfloat16 else value.dtype
        out = jnp.where(mine, value.astype(wide), o_ref[...].astype(wide))
        o_ref[...] = out.astype(o_ref.dtype)

    @pl.when(v < count_ref[0])
    def _visit():
        matmul_kernel.kernel_body(cfg, refs, store)


@functools.partial(jax.jit, static_argnames=("cfg", "groups"))
def _run(x: jax.Array, kargs: tuple, group_sizes: jax.Array, cfg: Config, groups: int) -> jax.Array:
    w, scales, tensor_scale, *affine = kargs
    r = cfg.compute
    group, tile, count, starts, ends = schedule(group_sizes, cfg.m, cfg.bm)
    _, _, kp = cfg.padded
    nn, nk = cfg.grid[1:]
    g = cfg.x_planes
    planes = [x]
    if g > 1:  # the packed layout: one column plane of x per code position of a byte
        x = jnp.pad(x, ((0, 0), (0, kp - x.shape[1])))
        planes = [x[:, t::g] for t in range(g)]
    x_spec = pl.BlockSpec((cfg.bm, cfg.bk // g), lambda i, j, k: (i, k))
    w_spec = pl.BlockSpec((cfg.w_block_rows, cfg.bn), lambda i, j, k: (k, j))
    # one expert's operands give the specs; the stacked ones are the kernel's operands
    one = [jax.ShapeDtypeStruct(a.shape[1:], a.dtype) for a in (scales, *affine) if a is not None]
    # (one tensor scale for all the experts, NVFP4's: its two parts last, read by every
    # visit, not stacked; else kernel_result applies it)
    ops, extra_specs, spread_scratch = matmul_kernel.scale_operands(
        cfg, one[0] if one else None, tensor_scale, one[1:]
    )
    n_t = 2 if cfg.scaled_in_kernel and cfg.tensor_scaled else 0
    tensor, tensor_specs = ops[len(ops) - n_t :], extra_specs[len(extra_specs) - n_t :]
    extra_specs = extra_specs[: len(extra_specs) - n_t]
    extra = [scales, *affine] if extra_specs else []
    if not cfg.interpret:  # streamed from HBM, as emulate.pallas.matmul's operands
        planes = [pltpu.with_memory_space_constraint(p, pltpu.HBM) for p in planes]
        w = pltpu.with_memory_space_constraint(w, pltpu.HBM)
        extra = [pltpu.with_memory_space_constraint(e, pltpu.HBM) for e in extra]
    acc_dtype = jnp.int32 if r.exact and not cfg.group_scaled else jnp.float32
    out_dtype = formats.get(cfg.out).dtype if cfg.scaled_in_kernel else acc_dtype
    n_acc = 2 if cfg.limbs else 1
    in_specs = [_visit_spec(x_spec, nk, False)] * g
    in_specs += [_visit_spec(s, nk, True) for s in [w_spec, *extra_specs]]
    in_specs += [_visit_spec(s, nk, False) for s in tensor_specs]
    out_spec = _visit_spec(pl.BlockSpec((cfg.bm, cfg.bn), lambda i, j, k: (i, j)), nk, False)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=5,
        grid=(nn, _visits(cfg.m, cfg.bm, groups), nk),
        in_specs=in_specs,
        out_specs=[out_spec] * n_acc,
        scratch_shapes=[pltpu.VMEM((cfg.bm, cfg.bn), acc_dtype)] * n_acc + spread_scratch,
    )
    outs = pl.pallas_call(
        functools.partial(_kernel, cfg),
        grid_spec=grid_spec,
        out_shape=[jax.ShapeDtypeStruct((cfg.m, cfg.n), out_dtype)] * n_acc,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary"),
            vmem_limit_bytes=cfg.vmem_limit,
        ),
        interpret=pltpu.InterpretParams() if cfg.interpret else False,
        name="emulate_ragged_dot",
    )(group, tile, count, starts, ends, *planes, w, *extra, *tensor)
    out = matmul_kernel.kernel_result(outs, cfg, scales, tensor_scale)
    # rows after the last group: never stored (whatever the output buffer held)
    held = jnp.arange(cfg.m, dtype=jnp.int32)[:, None] < ends[-1]
    return jnp.where(held, out, jnp.zeros((), out.dtype))


def prepare_experts(w: Any, w_format: FormatLike | None = None) -> Any:
    """Stacked experts in the layout :func:`ragged_dot` reads as stored, each expert
    :func:`emulate.pallas.prepare_weight`'s (the K-planar layout of its sub-byte codes,
    the same bytes plus zero codes up to a whole tile; float16 scales as their bits):
    call it once and keep the result in place of the experts.

    Args:
      w: (G, K, N) experts: a stacked QArray, an :class:`emulate.Packed` array packed
        along K (axis 1), an int4 / uint4 / float4_e2m1fn array, or uint8 codes of a
        sub-byte format with ``w_format``.
      w_format: the format of raw codes.

    Returns:
      A :class:`emulate.pallas.KernelWeight` or :class:`emulate.pallas.KernelQWeight`
      whose arrays have a leading axis of G experts (each record describes one expert).

    Raises:
      As :func:`emulate.pallas.prepare_weight` for one expert; ValueError: not (G, K, N);
      NotImplementedError: a QArray with a tensor scale (one for all the experts: not
      stacked per expert; :func:`ragged_dot` reads such experts as they are).
    """
    _expert_count(w)
    if isinstance(w, QArray) and layout_of(w).tensor is not None:
        raise NotImplementedError(
            "w: stacked experts with a tensor scale (NVFP4) are not prepared; pass the QArray "
            "itself to emulate.pallas.ragged_dot / emulate.ragged_dot, which read it as stored"
        )
    if isinstance(w, QArray):  # what ragged_dot refuses is not laid out for it
        p = qweight.split(w[0])
        _refuse_parts(p.codebook is not None, p.perm, p.scaling)
    return jax.vmap(functools.partial(prepare_weight, w_format=w_format))(w)


def ragged_dot(
    x: jax.Array | np.ndarray,
    w: Any,
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
      x: (M, K) rows sorted by group: bfloat16, float16 or float32, or an int8 / uint8 /
        float8 array (uint8 codes with ``x_format``).
      w: (G, K, N) experts, each what :func:`emulate.pallas.matmul` takes as its weight
        with a leading expert axis: int8 / uint8 / float8 arrays, uint8 codes with
        ``w_format``, int4 / float4 arrays, :class:`emulate.Packed` packed along K (axis
        1), a stacked QArray (scales along K, zero points, offsets, two-level scales),
        or :func:`prepare_experts`' result.
      group_sizes: (G,) int, >= 0 (traced values are not checked); a total above M cuts
        the groups at the last row, as in JAX (:mod:`emulate.group_sizes`).
      target: a TPU target; default the current one.
      block_shape: ``(bm, bn, bk)``; default :func:`emulate.pallas.matmul`'s for one
        expert, with bm the rows of an average group (M / G, up to 256, whole sublane
        tiles): each visit reads its row tile of x again.
      out_dtype: the result type (as ``preferred_element_type``); default ``lax``'s
        (a QArray's: :func:`emulate.matmul`'s).
      interpret: None: interpret mode unless JAX's default backend is a TPU.

    Returns:
      (M, N): each row the product with its group's weight, each row's bits those of
      :func:`emulate.pallas.matmul` on its group's rows where that is exact (integer and
      other exact-class pairs: bit-identical to :func:`emulate.reference.ragged_dot`),
      within :func:`emulate.pallas.matmul`'s bound otherwise; rows after the last group
      zero.

    Raises:
      NotImplementedError: expert parts the kernel does not read (module docstring).
      ValueError: a non-TPU target; shapes that do not fit; concrete group sizes that
        are negative; a block shape off the tiling.
      TypeError: a weight or activation that is no array.
    """
    t = targets.current_target(target)
    if t.kind != "tpu":
        raise ValueError(f"target: a TPU kernel, and the target is {t.name}; pass a TPU target")
    groups = _expert_count(w)
    group_sizes = as_group_sizes(group_sizes)
    gs_shape = tuple(np.shape(group_sizes))
    if np.ndim(x) != 2 or gs_shape != (groups,):
        raise ValueError(
            f"x, w, group_sizes: expected (M, K), (G, K, N) and (G,), got "
            f"{tuple(np.shape(x))}, {groups} experts and {gs_shape}"
        )
    check_group_sizes(group_sizes)
    kw: dict[str, Any] = dict(target=t, out_dtype=out_dtype, x_format=x_format, w_format=w_format)
    try:
        first = w[0] if isinstance(w, QArray) else jax.tree.map(lambda leaf: leaf[0], w)
        a = matmul_args(x, first, **kw)  # one expert: the checks and the static config
    except ValueError as e:
        if str(e).startswith("x, w: x's K"):
            msg = f"x, w, group_sizes: expected (M, K), (G, K, N) and (G,); {e}"
            raise ValueError(msg) from None
        raise
    _refuse_parts(a.codebook is not None, a.perm, a.scaling)
    if a.empty:
        return jnp.zeros((a.m, a.n), formats.get(a.out).dtype)
    cfg = config(
        r=a.compute, t=a.target, m=a.m, n=a.n, k=a.k, stored=a.stored,
        w_passthrough=a.passthrough, block_shape=block_shape,
        interpret=matmul_kernel.interpret_mode(interpret, a.x, first), x_dtype=a.x.dtype.name,
        scaling=a.scaling, out=a.out, codebook=a.codebook, long_rows=False, words=False,
    )  # fmt: skip
    if cfg.x_dtype != a.x.dtype.name:
        raise ValueError(
            f"block_shape: bm = {cfg.bm} is off the sublane tiling of x's stored "
            f"{a.x.dtype.name} blocks; pass a multiple of "
            f"{32 // a.x.dtype.itemsize if a.x.dtype.itemsize < 4 else 8}"
        )
    bm = cfg.bm
    if block_shape is None:  # a row tile about one group's rows: each visit re-reads its tile
        bm = min(bm, _round_up(-(-a.m // groups), 32 // a.x.dtype.itemsize))
    cfg = dataclasses.replace(cfg, x_resident=False, bm=bm)  # x blocks follow the visits
    tensor_scale = a.tensor_scale  # one for all the experts: not mapped over them
    if isinstance(w, QArray) and layout_of(w).tensor is not None:
        w = dataclasses.replace(w, tensor_scale=None)
    kargs = jax.vmap(lambda we: matmul_args(x, we, **kw).kernel_operands)(w)
    kargs = (kargs[0], kargs[1], tensor_scale, *kargs[3:])
    return _run(a.x, kargs, jnp.asarray(group_sizes), cfg, groups)
