"""Block-scaled (:class:`emulate.QArray`) weights in :func:`emulate.pallas.matmul`.

A 2-D ``(K, N)`` QArray of codes times block scales is read as stored: its codes as the
kernel reads any weight (:mod:`emulate.pallas.weights`), its scales as one more kernel
operand. Which blocks the kernel applies and where (:class:`Scaling`):

* *constant along K* (blocks of K rows or more: per output channel ``(K, 1)``, per tensor
  ``(K, N)``): the kernel sums the codes exactly as for a plain weight; the scales multiply
  the f32 sum once, ``times_pow2(acc * m, e)`` with ``(m, e)`` as
  :meth:`emulate.QArray.scale_parts` gives them (the product :func:`emulate.dot_general`
  takes for one segment): in the kernel at its last K step, which then stores the result
  type (:func:`store_factors`; an exact pair's int32 sum is rounded once into f32 there);
  outside the kernel for a float16 result or a K whose exact sum could pass int32 (then
  kept as two int32 limbs; :func:`apply_outside`).
* *groups along K* (blocks of ``G`` rows, ``G`` a multiple of 16: ``(G, 1)`` one scale
  per group and column, NVFP4 (16), OCP MX (32) and GPTQ / AWQ style; ``(G, N)`` one per
  group; a dot of ``G`` rows per group, which Mosaic compiles down to 16 rows on v2 to
  7x, compatibility mode on and off; where element x scale products are exact in bf16
  (NVFP4), a K step holds several groups and x blocks have 256 rows or more, the decoded
  tile's rows are multiplied by their groups' scales instead and one dot runs per step,
  :func:`rows_scaled`): in the
  kernel, each group's partial sum (exact for exact-class pairs: int32, then f32) is
  multiplied by its scale in f32 and added to an f32 accumulator. The scales' block spans
  every group (``(ceil(K/G), bn)`` or ``(ceil(K/G), 1)``), fetched once per output block;
  the kernel picks a group's row with a one-hot sum over the block's rows (Mosaic cannot
  prove a dynamic single-row load of an 8- or 16-bit block aligned: error E2003). The
  tensor scale and ``2**element_exponent`` follow at the last K step.

Scale types in the kernel: float32 and bfloat16 widen exactly (a bfloat16 subnormal
flushes); float8 scales are decoded from their bits; float8_e8m0fnu scales are applied as
two normal powers of two (2**-127 included); float16 scales go in as uint16 bits (Mosaic
refuses float16 operands: "Invalid vector type for load"), a bitcast outside the kernel
on every call (XLA:TPU copies for it) unless the weight is prepared once with
:func:`prepare_weight`, which also puts sub-byte codes in the K-planar layout.

Codebooks (decoded in VMEM by a select tree) and act-order permutations (the activations'
columns gathered outside the kernel): :mod:`emulate.pallas.qcodebook`.

Not built in the kernel (NotImplementedError naming the part): zero points, offsets,
two-level scales, the 2- to 6-bit integer code formats, blocks of several columns other
than all N, groups along K that are not a multiple of 16 rows.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats
from emulate.codebooks import Codebook
from emulate.formats import Format
from emulate.numerics import codecs
from emulate.numerics.bits import frexp, pow2_normal, times_pow2
from emulate.numerics.scales import scale_frexp
from emulate.numerics.storage import Packed, group_shape
from emulate.pallas import route, weights
from emulate.pallas.weights import KernelWeight, kernel_codes
from emulate.qarray import QArray, dequantize, parts_text
from emulate.qparts import as_format_array

__all__ = [
    "KernelQWeight",
    "Scaling",
    "apply_outside",
    "check_format",
    "group_scale",
    "group_scaled_step",
    "prepare_weight",
    "result_type",
    "scale_rows",
    "scaled_result",
    "split",
    "store_factors",
    "tensor_parts",
    "values",
]

_LANES = 128
#: Group scales: groups along K of a multiple of this many rows (NVFP4's 16 included).
_MIN_GROUP = 16
#: The narrowest lane slice of an x column plane a group may take (Mosaic compiles it).
_HALF_LANES = 64
#: (element format, scale format) whose products are exact in bfloat16 (NVFP4: e2m1 values
#: have 2 significant bits and exponents -1 to 2, e4m3 scales 4 bits and -9 to 8), so a
#: K step of several groups may scale the weight tile's rows and run one dot.
_ROW_SCALED = {("float4_e2m1fn", "float8_e4m3fn")}
#: ... from this many rows of x a block on (measured on a v5e, 4096 x 4096 NVFP4: at
#: M = 512, bm = 256, one dot a step took 732 us against 1068 us for one a group; at
#: M = 1 and 64 it took 343 and 365 us against 303 and 323: the row scaling costs the
#: vector unit more than the short dots cost the matrix unit).
_ROW_SCALED_MIN_BM = 256
#: How each scale format enters the kernel: its stored type, or the type it is bitcast to.
_KERNEL_SCALE = {"float16": "uint16"}


@dataclasses.dataclass(frozen=True)
class Scaling:
    """The static side of a QArray weight's scales in the kernel.

    Attributes:
      group: rows of K per scale; ``along_k`` is False when one block spans all K.
      along_k: whether the scales change along K (applied per group in the kernel).
      per_column: one scale per column (else one for all N columns).
      scale_format: the scales' format ("float16", "float8_e8m0fnu", ...).
      rows: rows of the scale array (``ceil(K / group)``; 1 when not along K).
      element_exponent: the QArray's (codes stand for ``value * 2**element_exponent``).
      tensor_scaled: whether the QArray has a tensor scale.
    """

    group: int
    along_k: bool
    per_column: bool
    scale_format: str
    rows: int
    element_exponent: int = 0
    tensor_scaled: bool = False


@jax.tree_util.register_pytree_with_keys_class
@dataclasses.dataclass(frozen=True, eq=False)
class KernelQWeight:
    """A (K, N) QArray weight as :func:`emulate.pallas.matmul` reads it without any copy:
    make it once with :func:`prepare_weight` and keep it in place of the QArray.

    Attributes:
      codes: the codes as the kernel reads them: an 8-bit array as stored, or a
        :class:`emulate.pallas.KernelWeight` (sub-byte codes, K-planar).
      scales: the scales as stored, float16 ones as their uint16 bits (the same bytes).
      tensor_scale: the QArray's float32 tensor scale, or None.
      format_name, scale_format, block_shape, shape, dtype, element_exponent: the QArray's.
      codebook, perm, perm_axis: the QArray's (:mod:`emulate.pallas.qcodebook`).
    """

    codes: Any
    scales: Any
    tensor_scale: Any
    format_name: str
    scale_format: str
    block_shape: tuple[int, int]
    shape: tuple[int, int]
    dtype: np.dtype
    element_exponent: int = 0
    codebook: Codebook | None = None
    perm: Any = None
    perm_axis: int | None = None

    def tree_flatten_with_keys(self):
        keys = ("codes", "scales", "tensor_scale", "perm")
        leaves = (self.codes, self.scales, self.tensor_scale, self.perm)
        children = tuple((jax.tree_util.GetAttrKey(k), v) for k, v in zip(keys, leaves))
        aux = (
            self.format_name,
            self.scale_format,
            self.block_shape,
            self.shape,
            self.dtype,
            self.element_exponent,
            self.codebook,
            self.perm_axis,
        )
        return children, aux

    def tree_flatten(self):
        keyed, aux = self.tree_flatten_with_keys()
        return tuple(v for _, v in keyed), aux

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        for name, v in zip(("codes", "scales", "tensor_scale", "perm"), children):
            object.__setattr__(obj, name, v)
        for name, v in zip(
            (
                "format_name",
                "scale_format",
                "block_shape",
                "shape",
                "dtype",
                "element_exponent",
                "codebook",
                "perm_axis",
            ),
            aux,
        ):
            object.__setattr__(obj, name, v)
        return obj

    @property
    def format(self) -> Format:
        return formats.get(self.format_name)

    @property
    def nbytes(self) -> int:
        """Bytes of the codes and scales as held (the tensor scale: 4), the codebook and
        the permutation."""
        codes = self.codes.data if isinstance(self.codes, KernelWeight) else self.codes
        arrays = [codes, self.scales] + ([self.perm] if self.perm is not None else [])
        total = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in arrays)
        total += self.codebook.nbytes if self.codebook is not None else 0
        return total + (4 if self.tensor_scale is not None else 0)

    def __repr__(self) -> str:
        return (
            f"KernelQWeight({self.format_name}{list(self.shape)}, scales {self.scale_format} "
            f"per block {self.block_shape})"
        )


def _refuse(arg: str, what: str, why: str = "") -> None:
    raise NotImplementedError(
        f"{arg}: emulate.pallas.matmul does not decode {what} in the kernel"
        + (f" ({why})" if why else "")
        + "; use emulate.dot_general for this QArray"
    )


def _scaling(q: QArray | KernelQWeight, arg: str) -> Scaling:
    """Check what the kernel builds for ``q``'s blocks and say how it applies them."""
    if len(q.shape) != 2:
        raise ValueError(f"{arg}: expected a 2-D (K, N) QArray, got shape {tuple(q.shape)}")
    k, n = q.shape
    bk, bn = q.block_shape
    if bn != 1 and bn < n:
        _refuse(
            arg,
            f"blocks of {bn} columns",
            f"block_shape {tuple(q.block_shape)}: one scale per column (G, 1) or per group "
            "for all N columns (G, N) are built",
        )
    along_k = bk < k
    if along_k and bk % _MIN_GROUP:
        _refuse(
            arg,
            f"groups of {bk} rows along K",
            f"group scales are applied per group of a multiple of {_MIN_GROUP} rows",
        )
    return Scaling(
        group=bk if along_k else max(k, 1),
        along_k=along_k,
        per_column=bn == 1 and n > 1,
        scale_format=q.scale_format,
        rows=-(-k // bk) if along_k else 1,
        element_exponent=int(q.element_exponent),
        tensor_scaled=q.tensor_scale is not None,
    )


def split(
    w: QArray | KernelQWeight, arg: str = "w"
) -> tuple[Any, jax.Array, Scaling, KernelQWeight | QArray]:
    """(codes as :func:`emulate.pallas.matmul` reads a weight, scales as the kernel reads
    them, :class:`Scaling`, ``w``) for a QArray or prepared weight.

    Raises:
      NotImplementedError: a part of the QArray the kernel does not decode (module
        docstring), named with what is built.
      ValueError: not 2-D.
    """
    if isinstance(w, KernelQWeight):
        return w.codes, jnp.asarray(w.scales), _scaling(w, arg), w
    # the codebook and the permutation: emulate.pallas.qcodebook
    parts = [p for p in parts_text(w) if not p.startswith("codebook(") and p != "perm"]
    if parts:
        _refuse(arg, f"a QArray's {', '.join(parts)}", "only codes times block scales are built")
    if w.format_name in formats.CODE_FORMATS:
        _refuse(arg, f"{w.format_name} codes", "2- to 6-bit integer code formats")
    s = _scaling(w, arg)
    codes = w.codes
    if isinstance(codes, Packed) and (codes.ndim != 2 or codes.axis != -2):
        codes = weights.prepare_weight(codes)  # packed along N: into the K-planar layout
    elif isinstance(codes, Packed) and s.along_k:
        g = group_shape(codes.format.bits)[0]
        if group_shape(codes.format.bits)[1] > 1 or (s.group // g) % _HALF_LANES:
            # a group's rows in each column plane of x must be whole half-lane slices
            codes = weights.prepare_weight(codes)
    return codes, _kernel_scales(w.scales, s.scale_format), s, w


def _kernel_scales(scales: Any, fmt: str) -> jax.Array:
    s = jnp.asarray(scales)
    if fmt in _KERNEL_SCALE and s.dtype != jnp.dtype(_KERNEL_SCALE[fmt]):
        s = lax.bitcast_convert_type(s, jnp.dtype(_KERNEL_SCALE[fmt]))
    return s


def check_format(w: QArray | KernelQWeight, w_format: Any) -> None:
    """ValueError when ``w_format`` (None: nothing to check) names another format than
    the QArray weight's."""
    if w_format is not None and formats.get(w_format, arg="w_format").name != w.format_name:
        raise ValueError(
            f"w_format: {formats.get(w_format).name} disagrees with the QArray w's format "
            f"{w.format_name}"
        )


def prepare_weight(w: Any, w_format: Any = None) -> KernelWeight | KernelQWeight:
    """A weight in the layout :func:`emulate.pallas.matmul` reads as stored; call it once
    and keep the result in place of the weight.

    A QArray becomes a :class:`KernelQWeight` of the same bytes: sub-byte codes in the
    K-planar layout (plus zero codes up to a whole tile), 8-bit codes as they are,
    float16 scales as their uint16 bits. Anything else: as
    :func:`emulate.pallas.weights.prepare_weight`.

    Raises:
      NotImplementedError: a QArray part the kernel does not decode (:func:`split`).
      TypeError, ValueError: as :func:`emulate.pallas.weights.prepare_weight`; a QArray
        that is not 2-D.
    """
    if isinstance(w, KernelQWeight):
        return w
    if not isinstance(w, QArray):
        return weights.prepare_weight(w, w_format)
    check_format(w, w_format)
    codes, scales, _, _ = split(w)
    if isinstance(codes, Packed) or (
        not isinstance(codes, KernelWeight) and np.dtype(codes.dtype).itemsize * 8 != 8
    ):
        codes = weights.prepare_weight(codes)
    return KernelQWeight(
        codes,
        scales,
        w.tensor_scale,
        w.format_name,
        w.scale_format,
        (int(w.block_shape[0]), int(w.block_shape[1])),
        (int(w.shape[0]), int(w.shape[1])),
        w.dtype,
        int(w.element_exponent),
        w.codebook,
        w.perm,
        w.perm_axis,
    )


def as_qarray(w: KernelQWeight) -> QArray:
    """The QArray a :class:`KernelQWeight` was prepared from (codes unpacked to one per
    byte, float16 scales as float16)."""
    codes = w.codes
    if isinstance(codes, KernelWeight):
        codes = as_format_array(kernel_codes(codes), w.format)
    scales = w.scales
    if w.scale_format in _KERNEL_SCALE:
        scales = lax.bitcast_convert_type(jnp.asarray(scales), jnp.float16)
    return QArray(
        codes,
        scales,
        w.tensor_scale,
        w.format_name,
        w.scale_format,
        tuple(w.block_shape),
        tuple(w.shape),
        np.dtype(w.dtype),
        w.element_exponent,
        codebook=w.codebook,
        perm=w.perm,
        perm_axis=w.perm_axis,
    )


def values(w: QArray | KernelQWeight) -> jax.Array:
    """The weight's values in float32 (:func:`emulate.dequantize`), for the gradient."""
    q = as_qarray(w) if isinstance(w, KernelQWeight) else w
    return dequantize(q, to=jnp.float32)


def apply_outside(acc: jax.Array, scales: jax.Array, tensor_scale: Any, s: Scaling) -> jax.Array:
    """The f32 accumulator ``(M, N)`` times what the kernel did not apply. Scales constant
    along K (``scales`` as :func:`split` gives them), with the tensor scale and
    ``2**element_exponent``: ``times_pow2(acc * m, e)`` with ``(m, e)`` as
    :meth:`emulate.QArray.scale_parts` gives them, the product :func:`emulate.dot_general`
    takes for one segment. Scales along K: the tensor scale and ``2**element_exponent``
    alone (the kernel applied the scales)."""
    if s.along_k:
        m, e = jnp.float32(1), jnp.int32(0)
    else:
        v = scales
        if s.scale_format in _KERNEL_SCALE:
            v = lax.bitcast_convert_type(v, jnp.dtype(s.scale_format))
        m, e = scale_frexp(v, s.scale_format)
    if tensor_scale is not None:
        mt, et = scale_frexp(jnp.asarray(tensor_scale, jnp.float32), "float32")
        m, e = m * mt, e + et
    if s.element_exponent:
        e = e + s.element_exponent
    if s.along_k and tensor_scale is None and not s.element_exponent:
        return acc
    return times_pow2(acc * m, e)


# --- in the kernel -----------------------------------------------------------------------


def scale_rows(block: jax.Array, scale_format: str) -> tuple[jax.Array, jax.Array | None]:
    """A loaded scale block as f32 ``(value, None)``, or for float8_e8m0fnu ``(2**(e//2),
    2**(e - e//2))`` (both normal f32; NaN for the NaN code): one row per group."""
    f = formats.get(scale_format)
    if scale_format == "float32":
        return block, None
    if scale_format == "bfloat16":
        return block.astype(jnp.float32), None
    if block.dtype.itemsize == 1 and jnp.issubdtype(block.dtype, jnp.floating):
        block = lax.bitcast_convert_type(block, jnp.int8)  # Mosaic bitcasts to int8
    c = block.astype(jnp.int32) & f.code_mask
    if scale_format == "float8_e8m0fnu":
        e = c - 127
        half = e // 2
        nan = c == 255
        lo = jnp.where(nan, jnp.float32(jnp.nan), pow2_normal(jnp.where(nan, 0, half)))
        return lo, pow2_normal(jnp.where(nan, 0, e - half))
    return lax.bitcast_convert_type(codecs.decode_float_bits(c, f), jnp.float32), None


def store_factors(block: jax.Array | None, s: Scaling) -> tuple[Any, Any]:
    """In the kernel, at the store: ``(m, e)`` of the scales constant along K for a loaded
    (1, C) scale block, as :meth:`emulate.QArray.scale_parts` gives them (before the tensor
    scale and element exponent); ``(1, 0)`` for scales along K (applied per group)."""
    if s.along_k or block is None:
        return jnp.float32(1), jnp.int32(0)
    if s.scale_format == "float8_e8m0fnu":
        if block.dtype.itemsize == 1 and jnp.issubdtype(block.dtype, jnp.floating):
            block = lax.bitcast_convert_type(block, jnp.int8)  # Mosaic bitcasts to int8
        c = block.astype(jnp.int32) & 0xFF
        m = jnp.where(c == 255, jnp.float32(jnp.nan), jnp.float32(1))
        return m, jnp.where(c == 255, 0, c - 127)
    v, _ = scale_rows(block, s.scale_format)
    return frexp(v)


def tensor_parts(tensor_scale: Any) -> tuple[jax.Array, jax.Array]:
    """A tensor scale's ``(m, e)`` as (1, 1) f32 and int32 arrays (kernel operands)."""
    m, e = scale_frexp(jnp.asarray(tensor_scale, jnp.float32), "float32")
    return m.reshape(1, 1), e.reshape(1, 1)


def _select(rows: jax.Array, index: Any) -> jax.Array:
    """Row ``index`` (dynamic) of ``rows`` (R, C) as (1, C): a one-hot sum, exact (every
    other row contributes +0), NaN and Inf kept."""
    at = lax.broadcasted_iota(jnp.int32, rows.shape, 0) == index
    return jnp.sum(jnp.where(at, rows, jnp.zeros((), rows.dtype)), axis=0, keepdims=True)


def group_scale(
    parts: tuple[jax.Array, jax.Array | None], index: Any
) -> tuple[jax.Array, jax.Array | None]:
    """Group ``index``'s scale factors (as :func:`scale_rows`) as (1, C) rows."""
    lo, hi = parts
    return _select(lo, index), None if hi is None else _select(hi, index)


def scaled_result(acc: jax.Array, s_ref: Any, ts_refs: Any, cfg: Any) -> jax.Array:
    """The f32 sum (or an exact int32 sum, rounded once into f32 and scaled by its
    quantum) times what the K steps did not apply (scales constant along K, the tensor
    scale, ``2**element_exponent``) as :func:`apply_outside` does, rounded once into the
    result type."""
    sc = cfg.scaling
    assert sc is not None
    if acc.dtype == jnp.int32:  # an exact sum that fits int32: rounded once into f32
        acc = acc.astype(jnp.float32)
        if cfg.route.scale:
            acc = acc * jnp.float32(2.0**-cfg.route.scale)
    m, e = store_factors(None if sc.along_k else s_ref[...], sc)
    if ts_refs is not None:
        m, e = m * ts_refs[0][...], e + ts_refs[1][...]
    if sc.element_exponent:
        e = e + sc.element_exponent
    if not sc.along_k or ts_refs is not None or sc.element_exponent:
        acc = times_pow2(acc * m, e)
    return acc.astype(formats.get(cfg.out).dtype)


def rows_scaled(cfg: Any) -> bool:
    """Whether a K step scales the decoded weight tile's rows by their groups' scales and
    runs one dot (:func:`group_scaled_step`): several groups a step, a bf16 float route,
    element x scale products exact in bf16 (:data:`_ROW_SCALED`) and blocks of at least
    :data:`_ROW_SCALED_MIN_BM` rows of x."""
    sc, r = cfg.scaling, cfg.route
    return (
        sc is not None
        and sc.along_k
        and sc.group < cfg.bk
        and not r.exact
        and r.rhs_compute == "bfloat16"
        and cfg.x_planes == 1
        and cfg.codebook is None
        and (r.rhs, sc.scale_format) in _ROW_SCALED
        and cfg.bm >= _ROW_SCALED_MIN_BM
    )


def _row_scaled_step(tiles: list, factors: tuple, cfg: Any, k: Any) -> jax.Array:
    """One K step of :func:`rows_scaled`: the (bk, C) tile of each row's group scale (one
    row selected per group, repeated over the group's rows), times the decoded tile in f32
    (exact, then exactly bf16), one dot with the f32 accumulator."""
    sc = cfg.scaling
    per = cfg.bk // sc.group
    rows = []
    for q in range(per):
        lo, _ = group_scale(factors, k * per + q)
        rows.append(jnp.broadcast_to(lo, (sc.group, lo.shape[1])))
    tile_scale = jnp.concatenate(rows, axis=0)
    total = None
    for xt, wt in tiles:
        ws = (wt.astype(jnp.float32) * tile_scale).astype(jnp.bfloat16)
        d = route.float_dot(xt, ws, cfg.route.precision)
        total = d if total is None else total + d
    assert total is not None
    return total


def group_scaled_step(tiles: list, s_ref: Any, cfg: Any, k: Any) -> jax.Array:
    """One K step of a weight with scales along K: per group of rows, the partial sum of
    every plane (exact for exact-class pairs, then f32) times the group's scale, in f32;
    where :func:`rows_scaled`, the tile's rows times their scales and one dot."""
    r = cfg.route
    sc = cfg.scaling
    assert sc is not None
    if rows_scaled(cfg):
        return _row_scaled_step(tiles, scale_rows(s_ref[...], sc.scale_format), cfg, k)
    factors = scale_rows(s_ref[...], sc.scale_format)
    sub = min(sc.group, cfg.bk)  # K rows per partial sum
    rows = sub // cfg.x_planes  # their rows in each plane
    quantum = jnp.float32(2.0**-r.scale) if r.exact and r.scale else None
    total = None
    for q in range(cfg.bk // sub):
        part = None
        for xt, wt in tiles:
            xs = xt[:, q * rows : (q + 1) * rows]
            ws = wt[q * rows : (q + 1) * rows]
            d = route.exact_dot(xs, ws, r) if r.exact else route.float_dot(xs, ws, r.precision)
            part = d if part is None else part + d
        assert part is not None
        part = part.astype(jnp.float32)
        if quantum is not None:
            part = part * quantum
        lo, hi = group_scale(factors, (k * cfg.bk + q * sub) // sc.group)
        part = part * lo
        if hi is not None:
            part = part * hi
        total = part if total is None else total + part
    assert total is not None
    return total


def result_type(x: jax.Array, xf: Format, w: QArray | KernelQWeight, out_dtype: Any) -> str:
    """The result type of ``x @ w`` for a QArray weight: ``out_dtype``, or what
    ``lax.dot_general`` returns for ``x``'s type and the QArray's ``dtype`` (the QArray's
    for low-precision ``x``); a float type."""
    if out_dtype is not None:
        out = formats.get(out_dtype, arg="out_dtype")
        if not out.is_float or out.is_low_precision:
            raise ValueError(
                f"out_dtype: a QArray weight's product is a float; expected float32, bfloat16 "
                f"or float16, got {out.name}"
            )
        return out.name
    if xf.is_low_precision:
        return np.dtype(w.dtype).name
    return jnp.promote_types(x.dtype, w.dtype).name
