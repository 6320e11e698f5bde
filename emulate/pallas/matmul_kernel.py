"""``emulate.pallas.matmul``: ``x @ w`` with a low-precision weight decoded tile by tile in VMEM.

One ``pallas_call``, grid ``(M / bm, N / bn, K / bk)``, K innermost ("arbitrary"), M and N
"parallel". The weight is the kernel's operand exactly as the caller stores it: nothing
copies, converts, pads or relayouts it outside the kernel.

A call reads its operands once (:func:`emulate.pallas.matmul_args.matmul_args`, which
raises every error about ``x``, ``w``, their formats, the target and ``out_dtype``), takes
its blocks (:func:`emulate.pallas.matmul_config.config`: ``block_shape``, VMEM) and runs
the kernel. :func:`kernel_body`, :func:`weight_planes`, :func:`decode_x`, :func:`scale_operands` and
:func:`kernel_result` are the kernel's pieces that another kernel on the same records
reuses (:mod:`emulate.pallas.gmm_kernel`).

* ``w``, one of three layouts:

  - *dense*: int8 / uint8 / float8 arrays, or uint8 codes (float6 codes too), one code
    per byte (an int4 / uint4 / float4 array too: ml_dtypes holds one element a byte);
    block ``(bk, bn)``. A float8 tile is bitcast to int8 in the kernel.
  - *K-planar*: a :class:`emulate.pallas.weights.KernelWeight` (:func:`prepare_weight`),
    sub-byte codes in tiles of ``128 * g`` rows whose ``g`` code positions are runs of
    128 consecutive rows; block ``(bk / g * b, bn)`` bytes (``g`` codes per ``b``-byte
    group). Decoded and stacked in VMEM, a tile's rows are in order, so ``x`` is
    multiplied as it is.
  - *packed*: an :class:`emulate.Packed` weight in :func:`emulate.pack`'s layout with one
    byte per group (4-bit formats: element ``2j`` the low nibble of byte ``j``); block
    ``(bk / g, bn)``. Code ``t`` of a byte multiplies column plane ``x[:, t::g]``: ``x``
    is split into ``g`` planes outside the kernel (a strided copy of the activations; a
    K-planar weight needs none). A Packed weight of 3 or 5 bytes per group (6-bit, 3-bit,
    5-bit) is put in the K-planar layout on each call (a copy of the weight): prepare it
    once instead.

  Rows past the weight's end in the last K block (Pallas copies a partial edge block)
  are masked to code 0 (+0 in every format) in the kernel; columns past N only reach
  output columns that are dropped.
* ``x`` (M, K) is read as stored too (bf16 / f32 values, int8 / uint8 / float8 arrays,
  uint8 codes; float16 is widened outside) and decoded in the kernel, tile by tile, into
  the type the target's matrix unit takes (outside, where a ``block_shape`` is off the
  stored type's sublane tiling). It is not padded: rows past M in a partial block reach
  only output rows Pallas drops, columns past K are masked to zero in the kernel (``bm``
  is M itself below the sublane tiling). Its block is ``(bm, K)``, index ``(i, 0)``,
  where two copies fit the VMEM budget: fetched once per output row block and sliced per
  K step in the kernel; otherwise ``(bm, bk)``, fetched for each column block.
* In the kernel the codes are cut out of their bytes with shifts and masks, decoded
  exactly with the bit formulas of :mod:`emulate.numerics.codecs` into int8 (x
  ``2**scale``), bf16 or f32, and ``x @ w`` is added to a VMEM scratch accumulator: int32
  for integer pairs and the other exact-class pairs (each float dot cut at the plan's
  K-chunk so that its f32 sum is exact, then converted), f32 otherwise. An exact pair
  with a float result keeps the int32 sum as two limbs (``hi * 2**16 + lo``), so no step
  can overflow. The accumulator is written to the output once, at the last K step.
* Outside the kernel the sum is rounded once into the result type
  (:mod:`emulate.numerics.accumulate`; nothing to do for an f32 or int32 result).
"""

from __future__ import annotations

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
from emulate.numerics import accumulate
from emulate.numerics.codecs import decode
from emulate.numerics.storage import (
    Packed,
    split_group_bytes,
    to_codes,
)
from emulate.pallas import compute, qcodebook, qoffsets, qsteps, qweight, word_step, words
from emulate.pallas.matmul_args import matmul_args, refuse_relayout
from emulate.pallas.matmul_config import Config, config
from emulate.pallas.qweight import KernelQWeight
from emulate.pallas.weights import TILE_GROUPS, WORD_ORDER_BITS, KernelWeight, kernel_codes
from emulate.quantized.array import QArray

__all__ = [
    "decode_x",
    "interpret_mode",
    "kernel_body",
    "kernel_result",
    "matmul",
    "scale_operands",
    "weight_planes",
]


def _codes(w_ref: Any, cfg: Config, k: Any) -> jax.Array:
    """The loaded weight block as int32 byte values, rows past the weight's end zeroed."""
    w = w_ref[...]
    if jnp.issubdtype(w.dtype, jnp.floating):  # float8: Mosaic bitcasts to int8, not uint8
        w = lax.bitcast_convert_type(w, jnp.int8)
    c = w.astype(jnp.int32) & 0xFF
    rows = cfg.w_block_rows
    if cfg.stored.rows % rows:  # a partial last block: what lies past the end is garbage
        valid = cfg.stored.rows - k * rows
        c = jnp.where(lax.broadcasted_iota(jnp.int32, c.shape, 0) < valid, c, 0)
    return c


def _word_order_codes(w_ref: Any, cfg: Config, k: Any) -> jax.Array:
    """A loaded block of word-order 4- or 6-bit tiles (:mod:`emulate.pallas.words`) as its
    int32 codes in K order, the tiles past the weight's end zeroed."""
    s = cfg.stored
    bits = 8 * s.nbytes // s.group
    c = words.natural_codes(words.words(w_ref[...]), cfg.interpret, bits)
    rows = cfg.w_block_rows
    if s.rows % rows:  # a partial last block: whole tiles of garbage past the end
        valid = (s.rows - k * rows) // s.nbytes * s.group
        c = jnp.where(lax.broadcasted_iota(jnp.int32, c.shape, 0) < valid, c, 0)
    return c


def weight_planes(w_ref: Any, cfg: Config, k: Any) -> list[list[jax.Array]]:
    """The weight block as the matrix unit takes it: one (bk, bn) tile in K order (dense
    and K-planar layouts) or one tile per code position (packed layout); each a list of
    one tile, or of a codebook's bfloat16 pieces (:mod:`emulate.pallas.qcodebook`)."""
    r = cfg.compute
    s = cfg.stored
    wf = formats.get(cfg.codebook.code_format if cfg.codebook else s.code or r.rhs)
    if cfg.w_passthrough:
        if s.dtype == r.rhs_compute and s.rows % cfg.w_block_rows == 0:
            return [[w_ref[...]]]
        c = _codes(w_ref, cfg, k).astype(jnp.int8)
        dt = jnp.dtype(formats.get(r.rhs_compute).dtype)
        return [[c if dt == jnp.int8 else lax.bitcast_convert_type(c, dt)]]
    if s.layout == "planar" and wf.bits in WORD_ORDER_BITS:  # whole words, K order
        planes = [_word_order_codes(w_ref, cfg, k)]
    elif s.layout == "dense":
        planes = [_codes(w_ref, cfg, k)]
    elif s.layout == "packed":
        planes = split_group_bytes([_codes(w_ref, cfg, k)], wf.bits)
    else:  # K-planar: per tile, g runs of 128 consecutive rows
        c = _codes(w_ref, cfg, k)
        per_tile = TILE_GROUPS * s.nbytes
        runs = []
        for t in range(c.shape[0] // per_tile):
            parts = [
                c[t * per_tile + p * TILE_GROUPS : t * per_tile + (p + 1) * TILE_GROUPS]
                for p in range(s.nbytes)
            ]
            runs += split_group_bytes(parts, wf.bits)
        planes = [jnp.concatenate(runs, axis=0) if len(runs) > 1 else runs[0]]
    if cfg.codebook is not None:
        return [qcodebook.decode(p, cfg.codebook, r.rhs_compute) for p in planes]
    return [[compute.decode_codes(p, wf, r.rhs_compute, r.rhs_scale)] for p in planes]


def _decode_outside(x: jax.Array, xf: Format, r: compute.Compute) -> jax.Array:
    """x decoded by XLA before the kernel, into the type the matrix unit takes."""
    if not xf.is_low_precision:
        return compute.decode_values(x, r.lhs_compute)
    codes = to_codes(x, xf)[0] if x.dtype != jnp.uint8 else x
    return compute.decode_codes(codes, xf, r.lhs_compute, r.lhs_scale)


def decode_x(xt: jax.Array, cfg: Config) -> jax.Array:
    """A loaded x tile in the type the matrix unit takes (exact: widening, or the bit
    formulas on codes)."""
    r = cfg.compute
    if cfg.x_dtype == r.lhs_compute:  # stored so (no format has a scale there) or decoded
        return xt
    xf = formats.get(r.lhs)
    if not xf.is_low_precision:
        return compute.decode_values(xt, r.lhs_compute)
    if jnp.issubdtype(xt.dtype, jnp.floating):  # float8: Mosaic bitcasts to int8
        xt = lax.bitcast_convert_type(xt, jnp.int8)
    return compute.decode_codes(xt.astype(jnp.int32) & 0xFF, xf, r.lhs_compute, r.lhs_scale)


def _write(o_ref: Any, value: jax.Array) -> None:
    o_ref[...] = value


def _kernel(cfg: Config, *refs: Any) -> None:
    kernel_body(cfg, refs)


def kernel_body(cfg: Config, refs: Sequence[Any], store: Any = _write) -> None:
    """The kernel's body on one grid step ``(i, j, k)``, K the third grid axis: the refs
    are the inputs (x planes, weight, scale operands), outputs and scratch of
    :func:`matmul`'s call; ``store(o_ref, value)`` writes a finished output block (another
    kernel passes one that writes only some of its rows)."""
    r = cfg.compute
    xs = refs[: cfg.x_planes]
    w_ref = refs[cfg.x_planes]
    rest = refs[cfg.x_planes + 1 :]
    s_ref = ts_refs = None
    if cfg.group_scaled or cfg.scaled_in_kernel:
        s_ref, rest = rest[0], rest[1:]
    n_aff = cfg.scaling.affine.operands if cfg.scaling and cfg.scaling.affine else 0
    aff_refs, rest = rest[:n_aff], rest[n_aff:]
    if cfg.scaled_in_kernel and cfg.tensor_scaled:
        ts_refs, rest = rest[:2], rest[2:]
    n_acc = 2 if cfg.limbs else 1
    if cfg.word_step:  # a 4-bit weight in whole words, at decode
        word_step.body(cfg, xs[0], w_ref, s_ref, aff_refs, ts_refs, rest[0], rest[1:], store)
        return
    outs, accs, spread_refs = rest[:n_acc], rest[n_acc : 2 * n_acc], rest[2 * n_acc :]
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        for a in accs:
            a[...] = jnp.zeros(a.shape, a.dtype)

    width = cfg.bk // cfg.x_planes
    tiles = []
    for xr, wts in zip(xs, weight_planes(w_ref, cfg, k)):
        if cfg.x_resident:
            xt = xr[:, pl.ds(pl.multiple_of(k * width, width), width)]
        else:
            xt = xr[...]
        xt = decode_x(xt, cfg)
        if cfg.x_planes == 1 and cfg.k % cfg.bk:  # past K: garbage of a partial block
            cols = lax.broadcasted_iota(jnp.int32, xt.shape, 1)
            # TPU v4 has no select on bf16 vectors: select in f32, then round (exactly)
            wide = xt.astype(jnp.float32) if xt.dtype == jnp.bfloat16 else xt
            wide = jnp.where(cols < cfg.k - k * width, wide, jnp.zeros((), wide.dtype))
            xt = wide.astype(xt.dtype)
        tiles += [(xt, wt) for wt in wts]
    if cfg.group_scaled:
        accs[0][...] += qsteps.group_scaled_step(tiles, s_ref, cfg, k, aff_refs, spread_refs)
    else:
        step = None
        for xt, wt in tiles:
            d = compute.exact_dot(xt, wt, r) if r.exact else compute.float_dot(xt, wt, r.precision)
            step = d if step is None else step + d
        assert step is not None
        if cfg.limbs:
            accs[0][...] += step >> 16
            accs[1][...] += step & 0xFFFF
        else:
            accs[0][...] += step

    @pl.when(k == pl.num_programs(2) - 1)
    def _store():
        if cfg.scaled_in_kernel:
            store(outs[0], qsteps.scaled_result(accs[0][...], s_ref, ts_refs, cfg))
            return
        for o, a in zip(outs, accs):
            store(o, a[...])


def scale_operands(
    cfg: Config, scales: Any, tensor_scale: Any, affine: Sequence[Any]
) -> tuple[list[Any], list[Any], list[Any]]:
    """A QArray weight's kernel operands after the weight (scales, zero points, offsets,
    two-level parts; the tensor scale's two parts where the kernel applies it), their
    BlockSpecs over the ``(i, j, k)`` grid, and the VMEM scratch of two-level scales of
    several columns (spread once a block); three empty lists for a plain weight."""
    extra: list[Any] = []
    extra_specs: list[Any] = []
    if cfg.group_scaled or cfg.scaled_in_kernel:
        sc = cfg.scaling
        assert sc is not None
        # every row of the scales, zero points, offsets (emulate.pallas.qoffsets)
        extra = [scales, *affine]
        cols = (1, *(sc.affine.operand_cols if sc.affine is not None else ()))
        extra_specs = [
            qoffsets.spec(a.shape, sc.per_column, cfg.bn, c) for a, c in zip(extra, cols)
        ]
        if sc.columns:  # scale blocks of several columns: all of them, resident
            extra_specs[0] = qsteps.column_blocks_spec(scales.shape)
    if cfg.scaled_in_kernel and cfg.tensor_scaled:
        extra += list(qsteps.tensor_parts(tensor_scale))
        extra_specs += [pl.BlockSpec((1, 1), lambda i, j, k: (0, 0))] * 2
    spread_scratch: list[Any] = []
    if cfg.group_scaled and cfg.scaling is not None and cfg.scaling.affine is not None:
        spreads = cfg.scaling.affine.spreads
        spread_scratch = [pltpu.VMEM((1, cfg.bn), jnp.int32)] * len(spreads)
    return extra, extra_specs, spread_scratch


def kernel_result(
    outs: Sequence[jax.Array], cfg: Config, scales: Any, tensor_scale: Any
) -> jax.Array:
    """The kernel's outputs as the result: as written where the kernel scaled and stored
    the result type, else the accumulator (or its limbs) rounded once, and a QArray's
    scales the kernel did not apply, then one more rounding."""
    r = cfg.compute
    if cfg.scaled_in_kernel:
        return outs[0]
    if cfg.limbs:
        hi, lo = accumulate.normalize(*outs)
        acc = accumulate.round_limbs(hi, lo, r.scale, r.out)
    else:
        acc = accumulate.round_accumulator(outs[0], r.out)
    if cfg.scaling is None:
        return acc
    # a QArray weight: its scales not applied in the kernel, then one rounding
    acc = qweight.apply_outside(acc, scales, tensor_scale, cfg.scaling)
    return accumulate.round_accumulator(acc, cfg.out)


def varying_struct(shape: tuple[int, ...], dtype: Any, operands: Sequence[Any]) -> Any:
    """The kernel's output type: ``shape`` and ``dtype``, varying over the mesh axes any
    operand varies over. Inside ``jax.shard_map`` (``check_vma=True``, its default)
    ``pallas_call`` needs that said; elsewhere every operand's set is empty."""
    mats = [jax.typeof(a).mat for a in operands]
    varying = frozenset().union(*(m.varying for m in mats))
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=mats[0].update(varying=varying))


@functools.partial(jax.jit, static_argnames=("cfg",))
def _run(x: jax.Array, kargs: tuple, cfg: Config) -> jax.Array:
    w, scales, tensor_scale, *affine = kargs
    r = cfg.compute
    _, _, kp = cfg.padded
    nm, nn, nk = cfg.grid
    g = cfg.x_planes
    width = cfg.bk // g
    # x as it is: Pallas copies partial edge blocks, rows past M reach only output rows
    # that are dropped and columns past K are masked in the kernel. For a packed weight,
    # one column plane per code position of a byte (padded: planes of one length).
    planes = [x]
    if word_step.piece_order(cfg):  # f32 tiles in piece order: x's columns to match
        planes = [words.to_piece_order(jnp.pad(x, ((0, 0), (0, kp - x.shape[1]))))]
    if g > 1:
        x = jnp.pad(x, ((0, 0), (0, kp - x.shape[1])))
        planes = [x[:, t::g] for t in range(g)]
    if cfg.x_resident:
        x_spec = pl.BlockSpec((cfg.bm, kp // g), lambda i, j, k: (i, 0))
    else:
        x_spec = pl.BlockSpec((cfg.bm, width), lambda i, j, k: (i, k))
    w_spec = pl.BlockSpec((cfg.w_block_rows, cfg.bn), lambda i, j, k: (k, j))
    acc_dtype = jnp.int32 if r.exact and not cfg.group_scaled else jnp.float32
    n_acc = 2 if cfg.limbs else 1
    extra, extra_specs, spread_scratch = scale_operands(cfg, scales, tensor_scale, affine)
    out_dtype = formats.get(cfg.out).dtype if cfg.scaled_in_kernel else acc_dtype
    out_spec = pl.BlockSpec((cfg.bm, cfg.bn), lambda i, j, k: (i, j))
    interpret = pltpu.InterpretParams() if cfg.interpret else False
    if not cfg.interpret:
        # The kernel streams its blocks from HBM: without this, XLA may copy a whole
        # operand into VMEM before the call (7x does so for a 16 MiB weight), a serial
        # copy the pipeline cannot overlap.
        planes = [pltpu.with_memory_space_constraint(p, pltpu.HBM) for p in planes]
        w = pltpu.with_memory_space_constraint(w, pltpu.HBM)
        # the scales too: 7x otherwise copies them into VMEM before the call (4x their
        # bytes accessed outside the kernel at 64x4096x4096)
        extra = [pltpu.with_memory_space_constraint(e, pltpu.HBM) for e in extra]
    outs = pl.pallas_call(
        functools.partial(_kernel, cfg),
        out_shape=[varying_struct((cfg.m, cfg.n), out_dtype, (*planes, w, *extra))] * n_acc,
        grid=(nm, nn, nk),
        in_specs=[x_spec] * g + [w_spec] + extra_specs,
        out_specs=[out_spec] * n_acc,
        scratch_shapes=word_step.scratch_shapes(cfg)
        if cfg.word_step
        else [pltpu.VMEM((cfg.bm, cfg.bn), acc_dtype)] * n_acc + spread_scratch,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=cfg.vmem_limit,
        ),
        interpret=interpret,
        name="emulate_matmul",
    )(*planes, w, *extra)
    return kernel_result(outs, cfg, scales, tensor_scale)


def interpret_mode(interpret: bool | None, *operands: Any) -> bool:
    """Whether :func:`matmul` runs its kernel in Pallas' interpret mode: as ``interpret``
    says, or (None) unless the program is built for a TPU
    (:func:`emulate.targets.building_for_tpu` of ``operands``).

    Raises:
      TypeError: ``interpret`` is not None, True or False.
      ValueError: ``interpret=False`` for a QArray or prepared QArray among ``operands``
        with no TPU in sight: Pallas lowers its kernel's integer index arithmetic for a
        known chip only ("Unsupported TPU device kind: cpu" otherwise).
    """
    if interpret is not None and not isinstance(interpret, bool):
        raise TypeError(f"interpret: expected None, True or False, got {interpret!r}")
    tpu = targets.building_for_tpu(*operands)
    if interpret is None or interpret:
        return interpret or not tpu
    if not tpu and any(isinstance(a, (QArray, KernelQWeight)) for a in operands):
        raise ValueError(
            "interpret: False builds the Mosaic kernel of a quantized weight, which Pallas "
            'lowers for a known TPU only (else "Unsupported TPU device kind: cpu"), and no '
            f"TPU is in sight (JAX's default backend is {jax.default_backend()}): compile "
            "with emulate.compiler.compile(fn, *specs, target=...), or trace and lower "
            "inside `with jax.default_device(emulate.compiler.device(target)):`; "
            "interpret=None runs the kernel in interpret mode here"
        )
    return False


def matmul(
    x: jax.Array | np.ndarray | Packed,
    w: jax.Array | np.ndarray | Packed,
    *,
    target: targets.TargetLike = None,
    block_shape: Sequence[int] | None = None,
    out_dtype: FormatLike | None = None,
    interpret: bool | None = None,
    x_format: FormatLike | None = None,
    w_format: FormatLike | None = None,
) -> jax.Array:
    """``x @ w`` as one Pallas TPU kernel that decodes the low-precision weight in VMEM.

    Args:
      x: the (M, K) activations: bfloat16, float16 or float32 (weight-only
        quantization), or a low-precision array (int8, float4_e2m1fn, ...; ``uint8``
        codes with ``x_format``; or Packed) for the exact integer pairs. It is decoded
        once, outside the kernel, into the type the matrix unit takes.
      w: the (K, N) weight: an int8 / uint8 / float8 array, ``uint8`` codes with
        ``w_format`` (float6 codes too), or an :class:`emulate.Packed` int4 / uint4 /
        float4_e2m1fn / float6 array packed along K (``emulate.pack(w, axis=0)``), which
        stays packed in HBM; a :class:`emulate.pallas.KernelWeight`; a 2-D block-scaled
        :class:`emulate.QArray` or :class:`emulate.pallas.KernelQWeight`
        (:mod:`emulate.pallas.qweight` says which parts the kernel decodes).
      target: a TPU target name or Target; default the current target, which must then
        be a TPU (``emulate.target("tpu_v5e")`` or ``EMULATE_TARGET``).
      block_shape: ``(bm, bn, bk)``; default from the target: ``bn`` twice its MXU width,
        ``bm`` up to 256 rows, ``bk`` as deep as half its VMEM allows (at most
        ``2**18 / bn``). ``bm`` must be a multiple of the sublane tiling of the decoded
        x type (8 for f32, 16 for bf16, 32 for int8), ``bn`` of 128, ``bk`` of 128 times
        the codes per byte group (2 for 4-bit, 4 for 6-bit formats).
      out_dtype: the result type (as ``preferred_element_type``); default what
        ``lax.dot_general`` returns for the pair (bfloat16 for bf16 x int4, int8 for
        int8 x int8: pass ``jnp.int32`` for the int32 sum).
      interpret: None (default): interpret mode unless the program is built for a TPU (a
        TPU backend or default device, as under :func:`emulate.compiler.compile`; see
        :func:`interpret_mode`); True / False to force it.
      x_format, w_format: the formats of operands passed as raw uint8 codes.

    Returns:
      The (M, N) product. Exact-class pairs (integers with integers, float4_e2m1fn with
      itself or integers) are exact: the int32 sum wrapped into an integer result, or the
      exact sum rounded once into a float result, bit-identical to
      :func:`emulate.reference.dot_general`. Other pairs accumulate exactly decoded
      operands in f32, within the bound of mode "fast"
      (:func:`emulate.bounds.dot_general_bound`).

    Transformations: ``jax.grad`` with respect to ``x`` gives ``g @ decode(w).T``,
    computed in f32 by XLA outside the kernel (the weight holds codes and has no
    gradient, as an integer array); ``jax.vmap`` over ``x``, ``w`` or both runs one kernel
    launch per mapped index (``lax.map``).

    Raises:
      TypeError: an operand that is not an array, Packed or codes; a bad block_shape or
        interpret type.
      ValueError: shapes that are not (M, K) x (K, N); a weight packed along N; a wide
        (bfloat16/float32) weight; a non-TPU target; block sizes off the tiling or too big
        for VMEM; a contraction too long for the exact combination.
      NotImplementedError: a QArray ``x``; a part of a QArray ``w`` the kernel does not
        decode (named, with what is built).
    """
    a = matmul_args(x, w, target=target, out_dtype=out_dtype, x_format=x_format, w_format=w_format)
    if a.empty:  # nothing to launch: an empty contraction sums to zero
        return jnp.zeros((a.m, a.n), formats.get(a.out).dtype)
    interpret = interpret_mode(interpret, a.x, w)
    refuse_relayout(a, w, interpret)
    cfg = config(
        r=a.compute,
        t=a.target,
        m=a.m,
        n=a.n,
        k=a.k,
        stored=a.stored,
        w_passthrough=a.passthrough,
        block_shape=block_shape,
        interpret=interpret,
        x_dtype=a.x.dtype.name,
        scaling=a.scaling,
        out=a.out,
        codebook=a.codebook,
    )
    xv = a.x
    if cfg.x_dtype != xv.dtype.name:  # a block_shape off the stored type's tiling
        xv = _decode_outside(xv, a.x_format, cfg.compute)
    y = _differentiable_run(xv, a.kernel_operands, a.weight, cfg)
    if a.perm is not None and a.perm_axis == -1:  # the weight's columns stored permuted
        y = qcodebook.restore_columns(y, a.perm)
    return y


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _differentiable_run(x: jax.Array, kargs: tuple, w: Any, cfg: Config) -> jax.Array:
    """The kernel, with the gradient of ``x @ decode(w)`` with respect to ``x`` (the
    weight holds codes: it has none, as for any integer array) and any ``jax.vmap``.
    ``kargs``: the kernel's weight arrays (codes, scales or None, tensor scale or None)."""
    return _mapped_run(x, kargs, cfg)


def _run_fwd(x, kargs, w, cfg):
    return _mapped_run(x, kargs, cfg), (x, w)


def _run_bwd(cfg, res, g):
    x, w = res
    if isinstance(w, (QArray, KernelQWeight)):
        wv = qweight.values(w)
    else:
        if isinstance(w, KernelWeight):
            w = kernel_codes(w)
        fmt = None if isinstance(w, Packed) else cfg.compute.rhs
        wv = decode(w, fmt, to=jnp.float32)  # (K, N) values
    dx = jax.lax.dot_general(
        g.astype(jnp.float32),
        wv,
        (((g.ndim - 1,), (1,)), ((), ())),
        precision=jax.lax.Precision.HIGHEST,
    )
    return dx.astype(x.dtype), None, None


_differentiable_run.defvjp(_run_fwd, _run_bwd)


@functools.partial(jax.jit, static_argnames=("cfg",))
def _mapped_run(x: jax.Array, kargs: tuple, cfg: Config) -> jax.Array:
    """:func:`_run`, which ``jax.vmap`` maps one kernel launch at a time (a pallas_call of
    this grid has no batching rule of its own). Jitted: called outside a trace, the
    ``custom_vmap`` built here would otherwise be traced and compiled anew at every call."""

    @jax.custom_batching.custom_vmap
    def run(x, kargs):
        return _run(x, kargs, cfg)

    @run.def_vmap
    def _rule(axis_size, in_batched, x, kargs):
        xb, kb = in_batched
        if any(jax.tree.leaves(kb)):  # map every weight array along the mapped axis
            kargs = jax.tree.map(
                lambda a, b: a if b else jnp.broadcast_to(a, (axis_size, *jnp.shape(a))),
                kargs,
                kb,
            )
            if xb:
                out = jax.lax.map(lambda xw: run(*xw), (x, kargs))
            else:
                out = jax.lax.map(lambda wi: run(x, wi), kargs)
        else:
            out = jax.lax.map(lambda xi: run(xi, kargs), x)
        return out, True

    return run(x, kargs)
