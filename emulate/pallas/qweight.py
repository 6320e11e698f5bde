"""Block-scaled (:class:`emulate.QArray`) weights in :func:`emulate.pallas.matmul`.

A 2-D ``(K, N)`` QArray of codes times block scales is read as stored: its codes as the
kernel reads any weight (:mod:`emulate.pallas.weights`), its scales as one more kernel
operand. Which blocks the kernel applies and where (:class:`Scaling`):

* *constant along K* (blocks of K rows or more: per output channel ``(K, 1)``, per tensor
  ``(K, N)``): the kernel sums the codes exactly as for a plain weight; the scales multiply
  the f32 sum once, ``times_pow2(acc * m, e)`` with ``(m, e)`` as
  :meth:`emulate.QArray.scale_parts` gives them (the product :func:`emulate.dot_general`
  takes for one segment): in the kernel at its last K step, which then stores the result
  type (:func:`emulate.pallas.qsteps.store_factors`; an exact pair's int32 sum is rounded
  once into f32 there);
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
* *blocks of several columns* (``(G, C)``, ``C`` a multiple of 128 short of N: FP8 e4m3
  weights with 128 x 128 block scales, DeepSeek-V3 style): as groups along K (blocks
  spanning K: one group, as :func:`emulate.pallas.qoffsets.grouped` makes it), the scale array
  one resident block as stored, ``(ceil(K/G), ceil(N/C))``, each group's row spread over
  the output block's lanes in the kernel (:func:`emulate.pallas.qsteps.widen`).

Scale types in the kernel: float32 and bfloat16 are split into ``(m, e)`` from their bits
and applied as two normal factors (:func:`emulate.pallas.qsteps.scale_rows`; a subnormal
scale keeps its value, as in :func:`emulate.dot_general`); float8 scales are decoded from
their bits; float8_e8m0fnu scales are applied as two normal powers of two (2**-127
included); float16 scales go in as uint16 bits (Mosaic refuses float16 operands:
"Invalid vector type for load"), a bitcast outside the kernel on every call (XLA:TPU
copies for it) unless the weight is prepared once with
:func:`prepare_weight`, which also puts sub-byte codes in the K-planar layout.

Zero points, offsets (``W = (q - z) * s + o``) and two-level scales and offsets (GGUF
K-quants; bitsandbytes' double quantization, whose absmax codes index a 256-entry map) are
applied per group in the kernel (:mod:`emulate.pallas.qoffsets`, which says
what it builds); scales constant along K are then one group spanning K, applied per K
step. Codebooks (decoded in VMEM by a select tree) and act-order permutations (the
activations' columns gathered outside the kernel): :mod:`emulate.pallas.qcodebook`.

Codes of the 2- to 6-bit integer formats (``emulate.formats.CODE_FORMATS``: GGUF Q2_K,
Q3_K, Q5_K, Q6_K, Q5_0 / Q5_1, 2- and 3-bit GPTQ), stored one per byte or
:func:`emulate.pack`-ed: read as any sub-byte weight (:mod:`emulate.pallas.weights`; the
K-planar layout of the width, 3 bytes per 4 codes for 6-bit (in word order), 5 per 8
for 5-bit), cut out of their bytes in the kernel and decoded as integers into int8 values
(every one fits), which then take the int8 routes: int8 activations are exact (bit for
bit :func:`emulate.dot_general`); at decode with float activations 6-bit codes take
:mod:`emulate.pallas.word_step` as 4-bit ones do; zero points of their width stay packed
(:mod:`emulate.pallas.qoffsets`). A prepared weight pads K to whole tiles of ``128 * g`` rows
(512 for 2- and 6-bit, 1024 for 3- and 5-bit codes).

Not built in the kernel (NotImplementedError naming the part): the zero points, offsets
and two-level parts :mod:`emulate.pallas.qoffsets` refuses, blocks of several columns
short of N that are not a multiple of 128 columns or that come with zero points or
offsets, groups along K that are not a multiple of 16 rows.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats
from emulate.codebooks import Codebook
from emulate.formats import Format
from emulate.numerics.bits import times_pow2
from emulate.numerics.pytree import PytreeRecord
from emulate.numerics.scales import scale_frexp
from emulate.pallas import qoffsets
from emulate.pallas.compute import refuse
from emulate.pallas.weights import KernelWeight, kernel_codes, kernel_layout, planar_weight
from emulate.quantized.array import QArray
from emulate.quantized.checks import as_format_array
from emulate.quantized.layout import Layout, layout_of
from emulate.quantized.values import dequantize

__all__ = [
    "KernelQWeight",
    "QParts",
    "Scaling",
    "apply_outside",
    "check_format",
    "prepare_weight",
    "result_type",
    "split",
    "values",
]

_LANES = 128
#: Group scales: groups along K of a multiple of this many rows (NVFP4's 16 included).
_MIN_GROUP = 16
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
      affine: zero points and offsets (:class:`emulate.pallas.qoffsets.Affine`), or None.
      columns: columns of N per scale block, for blocks of several columns short of N (a
        multiple of 128: :func:`emulate.pallas.qsteps.widen`); else 0.
    """

    group: int
    along_k: bool
    per_column: bool
    scale_format: str
    rows: int
    element_exponent: int = 0
    tensor_scaled: bool = False
    affine: qoffsets.Affine | None = None
    columns: int = 0


@dataclasses.dataclass(frozen=True, eq=False)
class KernelQWeight(
    PytreeRecord,
    data=("codes", "scales", "tensor_scale", "affine", "perm"),
    static=(
        "format_name",
        "scale_format",
        "block_shape",
        "matrix",
        "dtype",
        "element_exponent",
        "codebook",
        "perm_axis",
    ),
):
    """A (K, N) QArray weight as :func:`emulate.pallas.matmul` reads it without any copy:
    make it once with :func:`prepare_weight` and keep it in place of the QArray.

    Attributes:
      codes: the codes as the kernel reads them: an 8-bit array as stored, or a
        :class:`emulate.pallas.KernelWeight` (sub-byte codes, K-planar).
      scales: the scales as stored, float16 ones as their uint16 bits (the same bytes).
      tensor_scale: the QArray's float32 tensor scale, or None.
      format_name, scale_format, block_shape, dtype, element_exponent: the QArray's.
      matrix: the (K, N) of the weight, of each expert in stacked experts
        (:func:`emulate.pallas.prepare_experts`, whose arrays have a leading expert axis).
      affine: zero points and offsets as the kernel reads them
        (:class:`emulate.pallas.qoffsets.AffineParts`), or None.
      codebook, perm, perm_axis: the QArray's (:mod:`emulate.pallas.qcodebook`).

    It answers ``shape``, ``dtype``, ``ndim``, ``size`` and ``nbytes`` as the QArray does
    (stacked experts: ``(G, K, N)``).
    """

    codes: Any
    scales: Any
    tensor_scale: Any
    format_name: str
    scale_format: str
    block_shape: tuple[int, int]
    matrix: tuple[int, int]
    dtype: np.dtype
    element_exponent: int = 0
    affine: Any = None
    codebook: Codebook | None = None
    perm: Any = None
    perm_axis: int | None = None

    @property
    def format(self) -> Format:
        return formats.get(self.format_name)

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical shape: :attr:`matrix`, after the codes' leading axes (stacked
        experts: ``(G, K, N)``)."""
        codes = self.codes.data if isinstance(self.codes, KernelWeight) else self.codes
        return (*(int(d) for d in codes.shape[:-2]), *(int(d) for d in self.matrix))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the codes and scales as held (the tensor scale: 4), the codebook and
        the permutation."""
        codes = self.codes.data if isinstance(self.codes, KernelWeight) else self.codes
        arrays = [codes, self.scales] + ([self.perm] if self.perm is not None else [])
        total = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in arrays)
        total += self.affine.nbytes if self.affine is not None else 0
        total += self.codebook.nbytes if self.codebook is not None else 0
        return total + (4 if self.tensor_scale is not None else 0)

    def __getitem__(self, key: Any) -> KernelQWeight:
        """``w[...]`` is ``w`` itself (flax reads a variable's value so); other indexing is
        refused (TypeError), as :meth:`emulate.QArray.__getitem__` refuses it."""
        if key is Ellipsis or (isinstance(key, tuple) and all(k is Ellipsis for k in key)):
            return self
        raise TypeError(f"key: a KernelQWeight supports w[...] only (which returns w), got {key!r}")

    def read_back(self) -> QArray:
        """The QArray it was prepared from (:func:`as_qarray`): how the XLA route reads it
        (:class:`emulate.engine.prepared.Prepared`)."""
        return as_qarray(self)

    def __repr__(self) -> str:
        return (
            f"KernelQWeight({self.format_name}{list(self.shape)}, scales {self.scale_format} "
            f"per block {self.block_shape})"
        )


@dataclasses.dataclass(frozen=True, eq=False)
class QParts:
    """A QArray or prepared weight as :func:`emulate.pallas.matmul` reads it (:func:`split`):
    its codes as stored (the call lays them out once, after the route:
    :func:`emulate.pallas.weights.kernel_layout`), every other part as the kernel reads it.

    Attributes:
      codes: the codes as stored: an array, a Packed array or a :class:`KernelWeight`.
      format: the codes' format.
      shape: the weight's (K, N).
      scales: the scales as the kernel reads them (two-level ones: their codes' bytes).
      scaling: the :class:`Scaling`.
      affine: zero points, offsets and two-level parts
        (:class:`emulate.pallas.qoffsets.AffineParts`), or None.
      tensor: the float32 tensor scale, or None.
      codebook: the table the codes index, or None.
      perm, perm_axis: the act-order permutation and its axis, or None.
      dtype: the weight's logical dtype (for the result type).
      weight: the weight in its stored order (without its permutation), for the gradient.
      repacked: the parts other than the codes packed again for the kernel
        (:func:`emulate.pallas.qoffsets.repacked`; none for a prepared weight).
    """

    codes: Any
    format: Format
    shape: tuple[int, int]
    scales: jax.Array
    scaling: Scaling
    affine: qoffsets.AffineParts | None
    tensor: Any
    codebook: Codebook | None
    perm: Any
    perm_axis: int | None
    dtype: np.dtype
    weight: Any
    repacked: tuple[str, ...] = ()


def _scaling(
    q: Layout | KernelQWeight, arg: str, parts: qoffsets.AffineParts | None = None
) -> Scaling:
    """Check what the kernel builds for ``q``'s blocks and say how it applies them
    (``parts``: its zero points and offsets, :func:`emulate.pallas.qoffsets.kernel_parts`)."""
    if len(q.shape) != 2:
        raise ValueError(f"{arg}: expected a 2-D (K, N) QArray, got shape {tuple(q.shape)}")
    k, n = q.shape
    bk, bn = q.block_shape
    columns = bn if 1 < bn < n else 0
    if columns % _LANES:
        refuse(
            arg,
            f"blocks of {bn} columns",
            f"block_shape {tuple(q.block_shape)}: one scale per column (G, 1), per group "
            f"for all N columns (G, N) or per block of a multiple of {_LANES} "
            "columns are built",
        )
    if columns and parts is not None:
        a = parts.spec
        there = (
            ("zero points", a.zero != "none"),
            ("two-level offsets" if a.offset == "two_level" else "offsets", a.offset != "none"),
            ("two-level scales", a.scale_level is not None),
        )
        refuse(
            arg,
            f"{' and '.join(name for name, on in there if on)} in blocks of {bn} columns",
            "zero points, offsets and two-level scales per column (G, 1) or for all N "
            "columns (G, N) are built",
        )
    along_k = bk < k
    if along_k and bk % _MIN_GROUP:
        refuse(
            arg,
            f"groups of {bk} rows along K",
            f"group scales are applied per group of a multiple of {_MIN_GROUP} rows",
        )
    group, rows = (bk, -(-k // bk)) if along_k else (max(k, 1), 1)
    if parts is not None or columns:  # one group spanning K where the blocks do
        group, along_k = qoffsets.grouped(k, along_k, group)
    if isinstance(q, KernelQWeight):
        kw = q
        exponent, tensor_scaled = int(kw.element_exponent), kw.tensor_scale is not None
    else:
        exponent, tensor_scaled = q.exponent, q.tensor is not None
    return Scaling(
        group=group,
        along_k=along_k,
        per_column=bn == 1 and n > 1,
        columns=columns,
        scale_format=q.scale_format,
        rows=rows,
        element_exponent=exponent,
        tensor_scaled=tensor_scaled,
        affine=None if parts is None else parts.spec,
    )


def split(w: QArray | KernelQWeight, arg: str = "w") -> QParts:
    """A QArray or prepared weight as the kernel reads it (:class:`QParts`): its parts read
    once, from the QArray's :class:`~emulate.quantized.layout.Layout`.

    Raises:
      NotImplementedError: a part of the QArray the kernel does not decode (module
        docstring), named with what is built.
      ValueError: not 2-D.
    """
    if isinstance(w, KernelQWeight):
        kw = w
        s = _scaling(kw, arg, kw.affine)
        kw_order = dataclasses.replace(kw, perm=None, perm_axis=None) if kw.perm is not None else kw
        return QParts(
            kw.codes, kw.format, _shape(kw), jnp.asarray(kw.scales), s, kw.affine, kw.tensor_scale,
            kw.codebook, kw.perm, kw.perm_axis, np.dtype(kw.dtype), kw_order,
        )  # fmt: skip
    lay = layout_of(w)
    # zero points, offsets, two-level parts: emulate.pallas.qoffsets; the codebook and the
    # permutation: emulate.pallas.qcodebook
    affine, level_codes = qoffsets.kernel_parts(lay, arg)
    s = _scaling(lay, arg, affine)
    scales = level_codes if level_codes is not None else _kernel_scales(lay.scale, s.scale_format)
    perm = None if lay.perm is None else lay.perm.array
    stored_order = dataclasses.replace(w, perm=None, perm_axis=None) if perm is not None else w
    return QParts(
        lay.codes.array, lay.format, _shape(lay), scales, s, affine,
        None if lay.tensor is None else lay.tensor.array, lay.table, perm, lay.perm_axis,
        lay.dtype, stored_order, qoffsets.repacked(lay),
    )  # fmt: skip


def _shape(q: Layout | KernelQWeight) -> tuple[int, int]:
    return int(q.shape[0]), int(q.shape[1])


def _kernel_scales(scales: Any, fmt: str) -> jax.Array:
    s = jnp.asarray(scales.array)
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
    float16 scales as their uint16 bits. A sub-byte weight becomes a
    :class:`emulate.pallas.KernelWeight` in the K-planar layout, the bytes of
    ``emulate.pack(w, axis=0)`` plus zero codes up to a whole tile of ``128 * g`` rows
    (:func:`emulate.pallas.weights.planar_weight`). A prepared weight is returned as it is.

    Args:
      w: a 2-D (K, N) QArray; an :class:`emulate.Packed` weight packed along K (axis 0);
        an int4 / uint4 / float4_e2m1fn array; or uint8 codes of a sub-byte format with
        ``w_format``.
      w_format: the format of raw codes (for a QArray: None or its own format).

    Raises:
      NotImplementedError: a QArray part the kernel does not decode (:func:`split`).
      TypeError: ``w`` is not an array, Packed or QArray.
      ValueError: not 2-D, packed along N, a format a byte wide or wider (8-bit weights
        are read as stored: pass them to ``matmul`` directly), a ``w_format`` that
        disagrees with the weight's.
    """
    if isinstance(w, KernelQWeight):
        return w
    if not isinstance(w, QArray):
        return planar_weight(w, w_format)
    check_format(w, w_format)
    p = split(w)
    lay = layout_of(w)
    return KernelQWeight(
        kernel_layout(p.codes, planar=True),
        p.scales,
        p.tensor,
        lay.format_name,
        lay.scale_format,
        (int(lay.block_shape[0]), int(lay.block_shape[1])),
        p.shape,
        lay.dtype,
        lay.exponent,
        p.affine,
        p.codebook,
        p.perm,
        p.perm_axis,
    )


def as_qarray(kw: KernelQWeight) -> QArray:
    """The QArray a :class:`KernelQWeight` was prepared from (codes unpacked to one per
    byte, float16 scales as float16)."""
    codes = kw.codes
    if isinstance(codes, KernelWeight):
        codes = as_format_array(kernel_codes(codes), kw.format)
    scales = kw.scales
    if kw.scale_format in _KERNEL_SCALE:
        scales = lax.bitcast_convert_type(jnp.asarray(scales), jnp.float16)
    parts = {} if kw.affine is None else qoffsets.as_parts(kw.affine, kw.scales)
    return QArray(
        codes,
        parts.pop("scales", scales),
        kw.tensor_scale,
        kw.format_name,
        kw.scale_format,
        tuple(kw.block_shape),
        tuple(kw.shape),
        np.dtype(kw.dtype),
        kw.element_exponent,
        codebook=kw.codebook,
        perm=kw.perm,
        perm_axis=kw.perm_axis,
        **parts,
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


def result_type(xf: Format, dtype: Any, out_dtype: Any) -> str:
    """The result type of ``x @ w`` for a QArray weight of logical ``dtype`` and
    activations of format ``xf``: ``out_dtype``, or what :func:`emulate.matmul` returns
    for ``x``'s type and the QArray's ``dtype``
    (:func:`emulate.formats.promoted`, ``jnp.matmul``'s rule: bfloat16 with float16 gives
    float32; where jnp has none, :func:`emulate.formats.dot_result`'s); a float type."""
    if out_dtype is not None:
        out = formats.get(out_dtype, arg="out_dtype")
        if not out.is_float or out.is_low_precision:
            raise ValueError(
                f"out_dtype: a QArray weight's product is a float; expected float32, bfloat16 "
                f"or float16, got {out.name}"
            )
        return out.name
    wd = np.dtype(dtype).name
    return formats.promoted(xf.name, wd) or formats.dot_result(xf.name, wd).name
