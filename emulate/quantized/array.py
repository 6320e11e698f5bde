"""The quantized-array record, :class:`QArray`: low-precision codes times block scales,
with optional zero points, offsets, codebook and act-order permutation, and
:func:`dequantize`, its values.

A :class:`QArray` of logical shape ``S`` holds codes of one element format (an array of
that dtype, uint8 codes for float6 and the 2- to 6-bit integer formats, or
:class:`emulate.Packed`), one scale per block of ``block_shape`` elements
(``scales.shape[d] == ceil(S[d] / block_shape[d])``), and an optional float32
``tensor_scale``. Element ``i`` stands for::

    W[i] = (value(codes[i]) - zero_point[block(i)]) * scale[block(i)] * tensor_scale
           + offset[block(i)]

where ``value(c)`` is the format's decoding times ``2**element_exponent``, or
``codebook[c]``; zero points, offsets and codebook are optional
(:mod:`emulate.quantized.checks` says what each may be). ``scales`` and ``offsets`` may
themselves be QArrays of the scale grid's shape (two-level scales: GGUF K-quants' 6-bit
sub-block scales times an f16 super-block scale; bitsandbytes' double quantization). With
``perm`` (act-order) the codes are stored with axis ``perm_axis`` permuted: ``W`` read in
logical order is ``W_stored`` with ``W[..., perm[j], ...] == W_stored[..., j, ...]``, so
that ``x @ W == x[..., perm] @ W_stored``.

:func:`~emulate.quantized.values.dequantize` computes ``W`` in float32 in that order of
operations: ``value - zero point`` (exact for integers), times the scale (one rounding;
exact for power-of-two scales), plus the offset (one rounding).

One ``block_shape`` covers every case: ``block_shape == S`` is one scale for the tensor,
``(K, 1)`` one scale per column of a ``(K, N)`` weight (per output channel), ``(32, 1)`` an
OCP MX block of 32 along K, ``(128, 128)`` a 2-D block. :mod:`emulate.quantized.quantizing`
makes QArrays from float arrays; :meth:`QArray.from_parts` from a checkpoint's stored
parts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike

from emulate import formats
from emulate.codebooks import Codebook
from emulate.formats import Format, FormatLike
from emulate.numerics.storage import Packed, is_array, unpack_codes
from emulate.quantized.checks import (
    SCALE_FORMATS,
    as_format_array,
    full_block,
    grid_shape,
    is_int,
    leaf_shape,
    logical_dtype,
    scale_format_of,
    stored_codebook,
    stored_codes,
    stored_offsets,
    stored_perm,
    stored_tensor_scale,
    stored_zero_points,
    validate_qarray,
)
from emulate.quantized.index import index_leading
from emulate.quantized.values import (
    dequantize,
    scale_parts,
)

__all__ = [
    "QArray",
    "SCALE_FORMATS",
    "logical_dtype",
    "transpose",
    "validate_qarray",
]


_LEAVES = ("codes", "scales", "tensor_scale", "zero_points", "offsets", "perm")


@jax.tree_util.register_pytree_with_keys_class
@dataclasses.dataclass(frozen=True, eq=False)
class QArray:
    """Codes of a low-precision format with block scales; see the module docstring.

    Attributes:
      codes: an array of the element format's dtype (uint8 codes for float6 and the
        ``formats.CODE_FORMATS``), or a :class:`emulate.Packed` array, of logical shape
        ``shape``.
      scales: an array of ``scale_format``'s dtype (``float8_e8m0fnu``, ``float8_e4m3fn``,
        the other float8 types, ``bfloat16``, ``float16`` or ``float32``; uint8 codes for a
        P3109 or registered scale format, :func:`emulate.numerics.scales.scale_format`),
        shape ``ceil(shape / block_shape)``; or
        a QArray of that shape (two-level scales, ``scale_format`` "float32": its values
        in f32 are the scales).
      tensor_scale: a float32 scalar multiplying everything (NVFP4), or None.
      format_name, scale_format: format names.
      block_shape: the block, one length per dimension.
      shape: the logical shape. dtype: the type :func:`dequantize` returns by default and
        the type the matmuls treat the array as (for the result type).
      element_exponent: each code stands for ``decode(code) * 2**element_exponent`` before
        the block scale: -6 for OCP MXINT8 (int8 elements read as fixed point with six
        fraction bits), 0 otherwise.
      zero_points: None; an int for the whole tensor (static); or per block, an integer
        array or a Packed integer array of the scales' shape, in code units.
      offsets: None; a float for the whole tensor (static); or per block, a float32,
        bfloat16 or float16 array, or a QArray, of the scales' shape, added after scaling.
      codebook: None, or an :class:`emulate.codebooks.Codebook` (static) that the codes
        (unsigned, ``uint{bits}``) index instead of being decoded.
      perm, perm_axis: None, or an int32 permutation of axis ``perm_axis`` (negative,
        counted from the end) in which the codes are stored (act-order).

    Build one with :func:`emulate.quantize`, or from stored parts with :meth:`from_parts`.
    A QArray built directly is checked (:func:`validate_qarray`). Under ``jax.vmap`` its
    leaves lose their leading axes and the record follows; QArrays stacked with
    ``jax.tree.map(jnp.stack, ...)`` become one QArray with one block per index of the
    new leading axis. ``x @ q`` and ``q @ x`` run :func:`emulate.matmul`.

    Where code expects an array it reads ``shape``, ``ndim``, ``size``, ``dtype`` (the
    logical type), ``q[...]`` (``q`` itself, as flax layers read their kernels), ``q[i]`` and
    ``q[a:b]`` on leading axes of block length 1 (one expert of stacked experts) and ``q.T``
    (all axes reversed, a QArray). As a pytree its leaves are ``codes`` (a Packed array's
    ``data``), ``scales``, ``tensor_scale``, ``zero_points``, ``offsets`` and ``perm``
    (those that are arrays), under those names in key paths: a checkpoint stores the
    arrays, ``jit``/``vmap``/``nnx.split`` carry them. An int zero point, a float offset
    and the codebook are static.
    """

    codes: Any
    scales: Any
    tensor_scale: Any
    format_name: str
    scale_format: str
    block_shape: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    element_exponent: int = 0
    zero_points: Any = None
    offsets: Any = None
    codebook: Codebook | None = None
    perm: Any = None
    perm_axis: int | None = None

    def __post_init__(self) -> None:
        # A QArray built by hand is checked here; JAX's rebuilding (tree_unflatten) skips
        # this, as its leaves may be placeholders (it only reconciles the ranks, below).
        validate_qarray(self)

    def tree_flatten_with_keys(self):
        zp, off = self.zero_points, self.offsets
        static_zp = zp if is_int(zp) else None
        static_off = off if isinstance(off, float) else None
        aux = (
            self.format_name,
            self.scale_format,
            self.block_shape,
            self.shape,
            self.dtype,
            self.element_exponent,
            static_zp,
            static_off,
            self.codebook,
            self.perm_axis,
        )
        children = (
            self.codes,
            self.scales,
            self.tensor_scale,
            None if static_zp is not None else zp,
            None if static_off is not None else off,
            self.perm,
        )
        keyed = tuple((jax.tree_util.GetAttrKey(n), c) for n, c in zip(_LEAVES, children))
        return keyed, aux

    def tree_flatten(self):
        keyed, aux = self.tree_flatten_with_keys()
        return tuple(c for _, c in keyed), aux

    @classmethod
    def tree_unflatten(cls, aux, children):
        name, scale_format, block, shape, dtype, ee, zp, off, cb, perm_axis = aux
        codes_shape = leaf_shape(children[0])
        if codes_shape is not None and len(codes_shape) != len(shape):
            # Leaves with more dimensions than the record: QArrays stacked by
            # jax.tree.map(jnp.stack) or returned from jax.vmap, one block per index of the
            # new leading axes. Fewer: the leaves of a QArray mapped over by jax.vmap.
            extra = len(codes_shape) - len(shape)
            if extra > 0:
                shape = tuple(codes_shape[:extra]) + tuple(shape)
                block = (1,) * extra + tuple(block)
            else:
                shape, block = tuple(shape)[-extra:], tuple(block)[-extra:]
        codes, scales, ts, zp_leaf, off_leaf, perm = children
        q = object.__new__(cls)
        values = dict(
            codes=codes,
            scales=scales,
            tensor_scale=ts,
            format_name=name,
            scale_format=scale_format,
            block_shape=block,
            shape=shape,
            dtype=dtype,
            element_exponent=ee,
            zero_points=zp if zp is not None else zp_leaf,
            offsets=off if off is not None else off_leaf,
            codebook=cb,
            perm=perm,
            perm_axis=perm_axis,
        )
        for field in dataclasses.fields(cls):
            object.__setattr__(q, field.name, values[field.name])
        return q

    @classmethod
    def from_parts(
        cls,
        codes: jax.Array | np.ndarray | Packed,
        scales: jax.Array | np.ndarray | QArray,
        *,
        block_shape: Sequence[int],
        fmt: FormatLike | None = None,
        tensor_scale: ArrayLike | None = None,
        dtype: DTypeLike = jnp.float32,
        element_exponent: int = 0,
        zero_points: Any = None,
        offsets: Any = None,
        codebook: Any = None,
        perm: Any = None,
        perm_axis: int | None = None,
        scale_fmt: FormatLike | None = None,
    ) -> QArray:
        """A QArray from stored parts (a checkpoint's codes, scales, zeros, mins ...).

        Args:
          codes: an array of a low-precision format dtype, unsigned integer codes with
            ``fmt`` (with a ``codebook``, ``fmt`` defaults to ``uint{bits}``), or a
            :class:`emulate.Packed` array.
          scales: an array of one of ``SCALE_FORMATS``' dtypes, or uint8 codes of
            ``scale_fmt``, shape ``ceil(codes.shape / block_shape)``; or a QArray of that
            shape (two-level).
          block_shape: one block length per dimension of ``codes``.
          fmt: the codes' format when ``codes`` are raw codes.
          tensor_scale: an optional float32 scalar.
          dtype: the logical dtype (what :func:`dequantize` returns by default).
          element_exponent: the codes' implicit power-of-two scale (-6 for an OCP MXINT8
            checkpoint, whose int8 elements are fixed point with six fraction bits).
          zero_points: None, an int (or 0-d integer array) for the tensor, or an integer
            array / Packed integer array of the scales' shape.
          offsets: None, a float (or 0-d float array) for the tensor, or a float32 /
            bfloat16 / float16 array or a QArray of the scales' shape.
          codebook: None, an :class:`emulate.codebooks.Codebook` or a 1-D table of
            ``2**bits`` entries (:func:`emulate.codebooks.codebook`).
          perm: None or a permutation (integer array) of axis ``perm_axis`` in which the
            codes are stored; ``perm_axis`` may be given counted from the start.
          scale_fmt: the scales' format, any scale format
            (:func:`emulate.numerics.scales.scale_format`: a P3109 or registered float
            format too, whose ``scales`` are then its uint8 codes); default: the scales'
            dtype. Not with a QArray of scales.

        Raises:
          TypeError, ValueError: naming the argument, for a wrong type, dtype or shape.
        """
        cb = None if codebook is None else stored_codebook(codebook)
        if cb is not None and fmt is None and not isinstance(codes, Packed):
            if is_array(codes) and np.dtype(codes.dtype).kind == "u":
                fmt = f"uint{cb.bits}" if cb.bits != 8 else "uint8"
        codes, f, shape = stored_codes(codes, fmt)
        block = full_block(block_shape, shape, "block_shape")
        grid = grid_shape(shape, block)
        if isinstance(scales, QArray):
            if scale_fmt is not None:
                raise ValueError(
                    f"scale_fmt: a QArray of scales is read in float32; got scale_fmt={scale_fmt!r}"
                )
            sf_name = "float32"
            if scales.shape != grid:
                raise ValueError(
                    f"scales: a QArray of scales must have shape {grid} (codes of shape "
                    f"{shape} in blocks of {block}), got {scales.shape}"
                )
        else:
            sf_name = scale_format_of(scales, "scales", scale_fmt).name
            if tuple(scales.shape) != grid:
                raise ValueError(
                    f"scales: expected shape {grid} for codes of shape {shape} in blocks of "
                    f"{block}, got {tuple(scales.shape)}"
                )
            scales = jnp.asarray(scales)
        if tensor_scale is not None:
            tensor_scale = stored_tensor_scale(tensor_scale)
            if tensor_scale.shape != ():
                raise ValueError(f"tensor_scale: expected a scalar, got shape {tensor_scale.shape}")
        if perm is not None:
            perm, perm_axis = stored_perm(perm, perm_axis, shape)
        elif perm_axis is not None:
            raise ValueError(f"perm_axis: given ({perm_axis}) without a perm")
        if not is_int(element_exponent):
            raise TypeError(f"element_exponent: expected an int, got {element_exponent!r}")
        return cls(
            codes,
            scales,
            tensor_scale,
            f.name,
            sf_name,
            block,
            shape,
            logical_dtype(dtype),
            int(element_exponent),
            stored_zero_points(zero_points),
            stored_offsets(offsets),
            cb,
            perm,
            perm_axis,
        )

    @property
    def format(self) -> Format:
        return formats.get(self.format_name)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __getitem__(self, key: Any) -> QArray:
        """``q[i]``, ``q[a:b]``, ``q[i, j]``: leading axes of block length 1 indexed (an
        expert of stacked experts), nothing decoded; ``q[...]`` is ``q``. A blocked axis
        is refused (ValueError): :func:`emulate.quantized.index.index_leading`."""
        return index_leading(self, key)

    @property
    def T(self) -> QArray:  # noqa: N802 (numpy's name)
        """The transpose, all axes reversed: codes, scales and blocks, no decoding."""
        return transpose(self)

    @property
    def nbytes(self) -> int:
        """Bytes of storage: packed codes, scales (a QArray of scales: its own bytes), the
        tensor scale, zero points, offsets, the codebook and the permutation."""
        n = _array_bytes(self.codes, self.format)
        n += self.scales.nbytes if isinstance(self.scales, QArray) else _array_bytes(self.scales)
        n += 4 if self.tensor_scale is not None else 0
        zp, off = self.zero_points, self.offsets
        if zp is not None and not is_int(zp):
            n += _array_bytes(zp)
        if isinstance(off, QArray):
            n += off.nbytes
        elif off is not None and not isinstance(off, float):
            n += _array_bytes(off)
        n += self.codebook.nbytes if self.codebook is not None else 0
        return n + (_array_bytes(self.perm) if self.perm is not None else 0)

    @property
    def bits_per_element(self) -> float:
        """``8 * nbytes / size``: the storage cost of one element, every part counted."""
        return 8 * self.nbytes / max(self.size, 1)

    @property
    def axes(self) -> tuple[int, ...]:
        """The dimensions cut into blocks of more than one element (and more than one block):
        (0,) for MX blocks along K of a (K, N) weight, () for per-tensor or per-channel."""
        return tuple(
            d
            for d, (n, b) in enumerate(zip(self.shape, self.block_shape, strict=True))
            if 1 < b < n
        )

    @property
    def is_affine(self) -> bool:
        """Whether zero points or offsets shift the values (an offset term in a matmul)."""
        return self.zero_points is not None or self.offsets is not None

    @property
    def is_plain(self) -> bool:
        """Codes times scales only: no zero points, offsets, codebook, permutation or
        two-level scales, and codes of a ``formats.LOW_PRECISION`` (or wide) format."""
        return (
            not self.is_affine
            and self.codebook is None
            and self.perm is None
            and not isinstance(self.scales, QArray)
            and self.format_name not in formats.CODE_FORMATS
        )

    def unpacked_codes(self) -> jax.Array:
        """The codes as an array of the format (uint8 codes for float6 and the code
        formats), logical shape, stored order."""
        if isinstance(self.codes, Packed):
            return as_format_array(unpack_codes(self.codes), self.format)
        return self.codes

    def scale_parts(self) -> tuple[jax.Array, jax.Array]:
        """Each block's scale (times the tensor scale) as ``(m, e)``: an f32 ``m`` and an
        int32 ``e`` with ``scale == m * 2**e``, ``1 <= |m| < 4`` (0, Inf or NaN for those
        scales). Kept apart so that scales down to 2**-127 (e8m0) and their products
        with the tensor scale survive backends that flush f32 subnormals."""
        return scale_parts(self)

    def dequantize(self, to: DTypeLike | None = None) -> jax.Array:
        return dequantize(self, to=to)

    def __repr__(self) -> str:
        ts = ", tensor_scale" if self.tensor_scale is not None else ""
        extra = "".join(f", {p}" for p in parts_text(self))
        scales = (
            f"scales {self.scales!r}"
            if isinstance(self.scales, QArray)
            else f"scales {self.scale_format}{list(np.shape(self.scales))}"
        )
        return (
            f"QArray({self.format_name}{list(self.shape)}, {scales} per block "
            f"{self.block_shape}{ts}{extra}, dtype={self.dtype.name})"
        )


def parts_text(q: QArray) -> list[str]:
    """Short names of ``q``'s optional parts: ``zero_points``, ``offsets``,
    ``codebook(NF4)``, ``two_level``, ``perm``."""
    out = []
    if q.zero_points is not None:
        out.append(f"zero_points={q.zero_points}" if is_int(q.zero_points) else "zero_points")
    if q.offsets is not None:
        out.append("offsets")
    if q.codebook is not None:
        out.append(f"codebook({q.codebook.name})")
    if isinstance(q.scales, QArray) or isinstance(q.offsets, QArray):
        out.append("two_level")
    if q.perm is not None:
        out.append("perm")
    return out


def _array_bytes(x: Any, f: Format | None = None) -> int:
    """Bytes of an array or Packed array as stored (4-bit arrays two a byte, as XLA)."""
    data = x.data if isinstance(x, Packed) else x
    count = int(np.prod(data.shape))
    dt = np.dtype(data.dtype)
    if not isinstance(x, Packed) and dt.name in ("int4", "uint4", "float4_e2m1fn"):
        return -(-count // 2)
    if not isinstance(x, Packed) and dt.name in ("int2", "uint2"):
        return -(-count // 4)
    return count * dt.itemsize


def transpose(q: QArray, axes: Sequence[int] | None = None) -> QArray:
    """``q`` with its axes permuted (``axes`` as in ``jnp.transpose``; default reversed).
    Moves codes, scales and per-block parts; Packed codes stay packed along the same
    logical axis, a permutation follows its axis."""
    nd = len(q.shape)
    perm = tuple(reversed(range(nd))) if axes is None else tuple(int(a) % nd for a in axes)
    if sorted(perm) != list(range(nd)):
        raise ValueError(f"axes: expected a permutation of {tuple(range(nd))}, got {axes!r}")

    def move(x: Any) -> Any:
        if x is None or is_int(x) or isinstance(x, float):
            return x
        if isinstance(x, QArray):
            return transpose(x, perm)
        if isinstance(x, Packed):
            along = perm.index(x.axis % nd) - nd
            return Packed(jnp.transpose(x.data, perm), x.format_name, along, x.length)
        return jnp.transpose(x, perm)

    perm_axis = q.perm_axis
    if perm_axis is not None:
        perm_axis = perm.index(perm_axis % nd) - nd
    return dataclasses.replace(
        q,
        codes=move(q.codes),
        scales=move(q.scales),
        block_shape=tuple(q.block_shape[a] for a in perm),
        shape=tuple(q.shape[a] for a in perm),
        zero_points=move(q.zero_points),
        offsets=move(q.offsets),
        perm_axis=perm_axis,
    )
