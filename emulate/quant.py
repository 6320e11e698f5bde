"""Quantized arrays: low-precision codes times block scales (:class:`QArray`), with
:func:`quantize` and :func:`dequantize`.

A :class:`QArray` of logical shape ``S`` holds codes of one element format (an array of
that dtype, or :class:`emulate.Packed` for 4- and 6-bit formats), one scale per block of
``block_shape`` elements (``scales.shape[d] == ceil(S[d] / block_shape[d])``), and an
optional float32 ``tensor_scale``. Element ``i`` stands for::

    decode(codes[i]) * (scales[block(i)] * tensor_scale)

One ``block_shape`` covers every case: ``block_shape == S`` is one scale for the tensor,
``(K, 1)`` one scale per column of a ``(K, N)`` weight (per output channel), ``(32, 1)``
an OCP MX block of 32 along K, ``(128, 128)`` a 2-D block.

How :func:`quantize` picks a block's scale (``scale_rule``), with ``amax`` the block's
largest magnitude and ``emax``, ``M`` the element format's largest value written as
``M * 2**emax`` (``1 <= M < 2``; integers: ``emax = floor(log2(max))``, so int8 gives 6
and int4 2):

- ``ocp_floor``: ``2**(floor(log2 amax) - emax)``; values above ``M * 2**emax`` after
  scaling saturate (OCP MX v1.0, microxcaling, torchao FLOOR).
- ``round_up``: ``2**ceil(log2(amax / max))``, the smallest power of two at which nothing
  saturates (cuBLAS, JAX's scaled_dot_general quantizer, torchao RCEIL).
- ``ceil``: ``2**(ceil(log2 amax) - emax)`` (torchao CEIL).
- ``even``: ``2**(floor(log2 r) - emax)``, ``r`` = ``amax`` rounded to the element's
  mantissa width, carrying into the next binade (torchao EVEN).
- ``absmax``: ``amax * fl(1/max)`` rounded into the scale format, not a power of two
  (per-channel int8/int4, NVFP4 after dividing by the tensor scale, fp8 128x128 blocks).

Power-of-two scales are clamped into the scale format's exponent range (e8m0:
``[-127, 127]``); an all-zero block gets the smallest. Elements are then
``round(x / scale)`` into the element format, round-to-nearest-even, saturating to
``+-max`` (``saturate=True``). For power-of-two scales the division is exact (one
rounding in all); for ``absmax`` it is an f32 division followed by the rounding into the
element format. A block holding NaN or +-Inf gets a NaN scale and zero codes: the whole
block dequantizes to NaN (the OCP rule for a NaN scale). Inputs below ``2**-126`` in
magnitude (f32 subnormals) are read as zero, as XLA does on CPU and TPU.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike

from emulate import formats
from emulate.formats import F32_MIN_NORMAL, Format, FormatLike
from emulate.numerics import codecs
from emulate.numerics.bits import frexp, frexp_normal, pow2, pow2_normal, times_pow2
from emulate.numerics.storage import Packed, is_array, pack, to_codes, unpack_codes

__all__ = [
    "QArray",
    "Scheme",
    "quantize",
    "dequantize",
    "SCALE_RULES",
    "SCALE_FORMATS",
    "element_range",
]

SCALE_RULES = ("ocp_floor", "round_up", "ceil", "even", "absmax")
POW2_RULES = ("ocp_floor", "round_up", "ceil", "even")
SCALE_FORMATS = ("float8_e8m0fnu", "float8_e4m3fn", "bfloat16", "float16", "float32")
ROUNDINGS = ("nearest_even",)


@dataclasses.dataclass(frozen=True)
class Scheme:
    """A named quantization recipe: element format, block, scale format and rule.

    ``block`` gives block lengths along ``axes`` (None: the whole axis). Pass a Scheme as
    ``fmt`` to :func:`quantize`; keyword arguments given there override its fields.
    ``element_exponent``: the elements' implicit power-of-two scale (see
    :class:`QArray`; -6 for MXINT8), which the scale rule counts in the element's range.
    """

    name: str
    format: str
    block: tuple[int, ...] | None
    axes: tuple[int, ...]
    scale_format: str
    scale_rule: str
    tensor_scale: bool = False
    doc: str = ""
    element_exponent: int = 0

    def __repr__(self) -> str:
        return f"Scheme({self.name!r})"


def element_range(fmt: FormatLike) -> tuple[int, float]:
    """``(emax, M)`` with the format's largest value ``max == M * 2**emax``, ``1 <= M < 2``."""
    f = formats.get(fmt)
    emax = math.floor(math.log2(float(f.max)))
    return emax, float(f.max) / 2.0**emax


@jax.tree_util.register_pytree_with_keys_class
@dataclasses.dataclass(frozen=True, eq=False)
class QArray:
    """Codes of a low-precision format with block scales; see the module docstring.

    Attributes:
      codes: an array of the element format's dtype (uint8 codes for float6), or a
        :class:`emulate.Packed` array, of logical shape ``shape``.
      scales: an array of ``scale_format``'s dtype (``float8_e8m0fnu``, ``float8_e4m3fn``,
        ``bfloat16``, ``float16`` or ``float32``), shape ``ceil(shape / block_shape)``.
      tensor_scale: a float32 scalar multiplying everything (NVFP4), or None.
      format_name, scale_format: format names.
      block_shape: the block, one length per dimension.
      shape: the logical shape. dtype: the type :func:`dequantize` returns by default and
        the type the matmuls treat the array as (for the result type).

      element_exponent: each code stands for ``decode(code) * 2**element_exponent`` before
        the block scale: -6 for OCP MXINT8 (int8 elements read as fixed point with six
        fraction bits), 0 otherwise.

    Build one with :func:`quantize`, or from stored parts with :meth:`from_parts`. A
    QArray built directly is checked (formats, block and scale shapes). Under
    ``jax.vmap`` its leaves lose their leading axes and the record follows; QArrays
    stacked with ``jax.tree.map(jnp.stack, ...)`` become one QArray with one block per
    index of the new leading axis.
    ``x @ q`` and ``q @ x`` run :func:`emulate.matmul`.

    Where code expects an array it reads ``shape``, ``ndim``, ``size``, ``dtype`` (the
    logical type), ``q[...]`` (``q`` itself, as flax layers read their kernels) and ``q.T``
    (all axes reversed, a QArray). As a pytree its leaves are ``codes`` (a Packed array's
    ``data``), ``scales`` and ``tensor_scale``, under those names in key paths: a
    checkpoint stores the arrays, ``jit``/``vmap``/``nnx.split`` carry them.
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

    def __post_init__(self) -> None:
        # A QArray built by hand is checked here; JAX's rebuilding (tree_unflatten) skips
        # this, as its leaves may be placeholders (it only reconciles the ranks, below).
        _check_qarray(self)

    def tree_flatten_with_keys(self):
        aux = (
            self.format_name,
            self.scale_format,
            self.block_shape,
            self.shape,
            self.dtype,
            self.element_exponent,
        )
        children = (self.codes, self.scales, self.tensor_scale)
        names = ("codes", "scales", "tensor_scale")
        return tuple((jax.tree_util.GetAttrKey(n), c) for n, c in zip(names, children)), aux

    def tree_flatten(self):
        keyed, aux = self.tree_flatten_with_keys()
        return tuple(c for _, c in keyed), aux

    @classmethod
    def tree_unflatten(cls, aux, children):
        name, scale_format, block, shape, dtype, ee = aux
        codes_shape = _leaf_shape(children[0])
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
        q = object.__new__(cls)
        values = (*children, name, scale_format, block, shape, dtype, ee)
        for field, v in zip([f.name for f in dataclasses.fields(cls)], values, strict=True):
            object.__setattr__(q, field, v)
        return q

    @classmethod
    def from_parts(
        cls,
        codes: jax.Array | np.ndarray | Packed,
        scales: jax.Array | np.ndarray,
        *,
        block_shape: Sequence[int],
        fmt: FormatLike | None = None,
        tensor_scale: ArrayLike | None = None,
        dtype: DTypeLike = jnp.float32,
        element_exponent: int = 0,
    ) -> QArray:
        """A QArray from stored codes and scales (a checkpoint's blocks and scales).

        Args:
          codes: an array of a low-precision format dtype, uint8 codes with ``fmt``, or
            a :class:`emulate.Packed` array.
          scales: an array of one of ``SCALE_FORMATS``' dtypes, shape
            ``ceil(codes.shape / block_shape)``.
          block_shape: one block length per dimension of ``codes``.
          fmt: the codes' format when ``codes`` are raw uint8 codes.
          tensor_scale: an optional float32 scalar.
          dtype: the logical dtype (what :func:`dequantize` returns by default).
          element_exponent: the codes' implicit power-of-two scale (-6 for an OCP MXINT8
            checkpoint, whose int8 elements are fixed point with six fraction bits).

        Raises:
          TypeError, ValueError: naming the argument, for a wrong type, dtype or shape.
        """
        if isinstance(codes, Packed):
            f = codes.format
            if fmt is not None and formats.get(fmt) != f:
                raise ValueError(f"fmt: {formats.get(fmt).name} disagrees with the Packed codes")
            shape = _packed_shape(codes)
        else:
            if not is_array(codes):
                raise TypeError(f"codes: expected an array or Packed, got {type(codes).__name__}")
            raw, f = to_codes(codes, fmt, arg="codes")
            if not f.is_low_precision:
                raise ValueError(f"codes: expected a low-precision format, got {f.name}")
            codes = _as_format_array(raw, f)
            shape = tuple(raw.shape)
        sf = _scale_format(scales, "scales")
        block = _full_block(block_shape, shape, "block_shape")
        want = tuple(-(-n // b) for n, b in zip(shape, block, strict=True))
        if tuple(scales.shape) != want:
            raise ValueError(
                f"scales: expected shape {want} for codes of shape {shape} in blocks of "
                f"{block}, got {tuple(scales.shape)}"
            )
        if tensor_scale is not None:
            tensor_scale = jnp.asarray(tensor_scale, jnp.float32)
            if tensor_scale.shape != ():
                raise ValueError(f"tensor_scale: expected a scalar, got shape {tensor_scale.shape}")
        return cls(
            codes,
            jnp.asarray(scales),
            tensor_scale,
            f.name,
            sf.name,
            block,
            shape,
            _logical_dtype(dtype),
            element_exponent,
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
        """``q[...]`` (or ``q[()]``) is ``q`` itself; other indexing is refused (TypeError),
        since a slice may cut a scale block: index :meth:`dequantize`'s values instead."""
        if key is Ellipsis or (isinstance(key, tuple) and all(k is Ellipsis for k in key)):
            return self
        raise TypeError(
            f"key: a QArray supports q[...] only (which returns q), got {key!r}; index "
            "q.dequantize() for values"
        )

    @property
    def T(self) -> QArray:  # noqa: N802 (numpy's name)
        """The transpose, all axes reversed: codes, scales and blocks, no decoding."""
        return transpose(self)

    @property
    def nbytes(self) -> int:
        """Bytes of storage: packed codes, scales and the tensor scale."""
        data = self.codes.data if isinstance(self.codes, Packed) else self.codes
        n = int(np.prod(data.shape)) * np.dtype(data.dtype).itemsize
        if self.format.bits == 4 and not isinstance(self.codes, Packed):
            n = -(-int(np.prod(data.shape)) // 2)  # XLA stores 4-bit arrays two a byte
        n += int(np.prod(self.scales.shape)) * np.dtype(self.scales.dtype).itemsize
        return n + (4 if self.tensor_scale is not None else 0)

    @property
    def axes(self) -> tuple[int, ...]:
        """The dimensions cut into blocks of more than one element (and more than one block):
        (0,) for MX blocks along K of a (K, N) weight, () for per-tensor or per-channel."""
        return tuple(
            d
            for d, (n, b) in enumerate(zip(self.shape, self.block_shape, strict=True))
            if 1 < b < n
        )

    def unpacked_codes(self) -> jax.Array:
        """The codes as an array of the format (uint8 codes for float6), logical shape."""
        if isinstance(self.codes, Packed):
            return _as_format_array(unpack_codes(self.codes), self.format)
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
        return (
            f"QArray({self.format_name}{list(self.shape)}, scales {self.scale_format}"
            f"{list(np.shape(self.scales))} per block {self.block_shape}{ts}, "
            f"dtype={self.dtype.name})"
        )


def _leaf_shape(x: Any) -> tuple[int, ...] | None:
    """The logical shape of a codes leaf (Packed or array), None for a placeholder."""
    if isinstance(x, Packed):
        data_shape = getattr(x.data, "shape", None)
        return _packed_shape(x) if isinstance(data_shape, tuple) else None
    shape = getattr(x, "shape", None)
    return tuple(shape) if isinstance(shape, tuple) else None


def _check_qarray(q: QArray, arg: str = "QArray") -> None:
    """Refuse a QArray whose parts disagree (names ``arg`` and the part)."""
    f = formats.get(q.format_name, arg=arg)
    sf = formats.get(q.scale_format, arg=arg)
    if f.name in formats.SCALE_ONLY:  # wide floats are allowed: scaled_matmul's f32 operands
        raise ValueError(f"{arg}: format_name {f.name} is a scale type, not an element format")
    if sf.name not in SCALE_FORMATS:
        raise ValueError(f"{arg}: scale_format {sf.name} is not one of {SCALE_FORMATS}")
    shape, block = q.shape, q.block_shape
    if not isinstance(shape, tuple) or not all(map(_is_int, shape)):
        raise TypeError(f"{arg}: shape must be a tuple of ints, got {shape!r}")
    if (
        not isinstance(block, tuple)
        or len(block) != len(shape)
        or not all(_is_int(b) and b >= 1 for b in block)
    ):
        raise ValueError(
            f"{arg}: block_shape must be {len(shape)} positive ints for shape {shape}, got "
            f"{block!r}"
        )
    if not _is_int(q.element_exponent):
        raise TypeError(f"{arg}: element_exponent must be an int, got {q.element_exponent!r}")
    codes_shape = _leaf_shape(q.codes)
    if codes_shape is None:
        raise TypeError(f"{arg}: codes must be an array or Packed, got {type(q.codes).__name__}")
    if codes_shape != shape:
        raise ValueError(f"{arg}: codes have shape {codes_shape}, the record says {shape}")
    if isinstance(q.codes, Packed):
        codes_fmt = q.codes.format_name
    else:  # float6 codes are uint8 (XLA cannot hold float6 arrays)
        codes_fmt = np.dtype(q.codes.dtype).name
        codes_fmt = f.name if codes_fmt == "uint8" and not f.xla_storable else codes_fmt
    if codes_fmt != f.name:
        raise ValueError(f"{arg}: codes are {codes_fmt}, the record says {f.name}")
    want = tuple(-(-n // b) for n, b in zip(shape, block, strict=True))
    scales_shape = getattr(q.scales, "shape", None)
    if scales_shape is None or tuple(scales_shape) != want:
        got = None if scales_shape is None else tuple(scales_shape)
        raise ValueError(
            f"{arg}: scales have shape {got}, expected {want} for shape {shape} in blocks of "
            f"{block}"
        )
    if np.dtype(q.scales.dtype).name != sf.name:
        raise ValueError(
            f"{arg}: scales are {np.dtype(q.scales.dtype).name}, the record says {sf.name}"
        )
    ts = q.tensor_scale
    if ts is not None and not isinstance(ts, (int, float)) and np.shape(ts) != ():
        raise ValueError(f"{arg}: tensor_scale must be None or a scalar, got shape {np.shape(ts)}")


def transpose(q: QArray, axes: Sequence[int] | None = None) -> QArray:
    """``q`` with its axes permuted (``axes`` as in ``jnp.transpose``; default reversed).
    Moves codes and scales; Packed codes stay packed along the same logical axis."""
    nd = len(q.shape)
    perm = tuple(reversed(range(nd))) if axes is None else tuple(int(a) % nd for a in axes)
    if sorted(perm) != list(range(nd)):
        raise ValueError(f"axes: expected a permutation of {tuple(range(nd))}, got {axes!r}")
    codes = q.codes
    if isinstance(codes, Packed):
        along = perm.index(codes.axis % nd) - nd
        codes = Packed(jnp.transpose(codes.data, perm), codes.format_name, along, codes.length)
    else:
        codes = jnp.transpose(codes, perm)
    return dataclasses.replace(
        q,
        codes=codes,
        scales=jnp.transpose(q.scales, perm),
        block_shape=tuple(q.block_shape[a] for a in perm),
        shape=tuple(q.shape[a] for a in perm),
    )


def _packed_shape(p: Packed) -> tuple[int, ...]:
    s = list(p.data.shape)
    s[p.axis] = p.length
    return tuple(s)


def _as_format_array(raw: jax.Array, f: Format) -> jax.Array:
    return codecs.from_codes(jnp.asarray(raw), f)


def _logical_dtype(dtype: DTypeLike) -> np.dtype:
    dt = np.dtype(dtype)
    if dt.name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype: expected float32, bfloat16 or float16, got {dt.name}")
    return dt


def _scale_format(scales: jax.Array | np.ndarray, arg: str) -> Format:
    if not is_array(scales):
        raise TypeError(f"{arg}: expected an array, got {type(scales).__name__}")
    name = np.dtype(scales.dtype).name
    if name not in SCALE_FORMATS:
        raise ValueError(f"{arg}: dtype {name} is not a scale format; accepted: {SCALE_FORMATS}")
    return formats.get(name)


def _full_block(block: Iterable[int], shape: tuple[int, ...], arg: str) -> tuple[int, ...]:
    try:
        b = tuple(operator.index(v) for v in block)
    except TypeError:
        raise TypeError(f"{arg}: expected a sequence of ints, got {block!r}") from None
    if len(b) != len(shape) or any(v < 1 for v in b):
        raise ValueError(
            f"{arg}: expected {len(shape)} positive block lengths for shape {shape}, got {b}"
        )
    return tuple(min(v, n) if n else v for v, n in zip(b, shape, strict=True))


def broadcast_blocks(s: jax.Array, block: tuple[int, ...], shape: tuple[int, ...]) -> jax.Array:
    """Repeat a per-block array over its blocks and cut it to ``shape``."""
    for d, b in enumerate(block):
        if b > 1:
            s = jnp.repeat(s, b, axis=d, total_repeat_length=s.shape[d] * b)
    return s[tuple(slice(0, n) for n in shape)]


def scale_parts(q: QArray) -> tuple[jax.Array, jax.Array]:
    """See :meth:`QArray.scale_parts`."""
    if q.scale_format == "float8_e8m0fnu":
        c = to_codes(q.scales, q.scale_format)[0].astype(jnp.int32)
        m = jnp.where(c == 255, jnp.float32(jnp.nan), jnp.float32(1))
        e = jnp.where(c == 255, 0, c - 127)
    else:
        m, e = frexp(codecs.decode(q.scales, to=jnp.float32))
    if q.tensor_scale is not None:
        mt, et = frexp(jnp.asarray(q.tensor_scale, jnp.float32))
        m, e = m * mt, e + et
    if q.element_exponent:
        e = e + q.element_exponent
    return m, e


# --- quantize ----------------------------------------------------------------------------


def _resolve(
    fmt: FormatLike | Scheme,
    block_shape: int | Sequence[int] | None,
    axis: int | Sequence[int] | None,
    scale_fmt: FormatLike | None,
    scale_rule: str | None,
    tensor_scale: bool | None,
) -> tuple[Format, int | Sequence[int] | None, int | Sequence[int] | None, Format, str, bool, int]:
    ee = 0
    if isinstance(fmt, Scheme):
        ee = fmt.element_exponent
        s = fmt
        block_shape = s.block if block_shape is None else block_shape
        axis = s.axes if axis is None else axis
        scale_fmt = s.scale_format if scale_fmt is None else scale_fmt
        scale_rule = s.scale_rule if scale_rule is None else scale_rule
        tensor_scale = s.tensor_scale if tensor_scale is None else tensor_scale
        fmt = s.format
    f = formats.get(fmt)
    if not f.is_low_precision or f.name == "float8_e8m0fnu":
        raise ValueError(
            f"fmt: expected a low-precision element format or an emulate.mx Scheme, got {f.name}"
        )
    scale_fmt = "float8_e8m0fnu" if scale_fmt is None else scale_fmt
    try:
        sf = formats.get(scale_fmt)
    except (TypeError, ValueError):
        sf = None
    if sf is None or sf.name not in SCALE_FORMATS:
        raise ValueError(f"scale_fmt: expected one of {SCALE_FORMATS}, got {scale_fmt!r}")
    scale_rule = "ocp_floor" if scale_rule is None else scale_rule
    if scale_rule not in SCALE_RULES:
        raise ValueError(f"scale_rule: expected one of {SCALE_RULES}, got {scale_rule!r}")
    if sf.name == "float8_e8m0fnu" and scale_rule == "absmax":
        raise ValueError(
            "scale_rule: 'absmax' makes scales that are not powers of two, which "
            "float8_e8m0fnu cannot hold; use a power-of-two rule or another scale_fmt"
        )
    if ee and scale_rule not in POW2_RULES:
        raise ValueError(
            f"scale_rule: {scale_rule!r} with an implicit element scale 2**{ee} is not built; "
            f"use one of {POW2_RULES}"
        )
    return f, block_shape, axis, sf, scale_rule, bool(tensor_scale), ee


def _blocks(
    shape: tuple[int, ...],
    block_shape: int | Sequence[int] | None,
    axis: int | Sequence[int] | None,
    ragged: bool,
) -> tuple[int, ...]:
    nd = len(shape)
    axes: Sequence[int]
    lens: Sequence[int]
    if block_shape is not None and not _is_int(block_shape):
        if not isinstance(block_shape, (tuple, list)) or not all(map(_is_int, block_shape)):
            raise TypeError(
                "block_shape: expected a positive int or a sequence of positive ints, got "
                f"{type(block_shape).__name__} {block_shape!r}"
            )
    if axis is not None and not _is_int(axis):
        if not isinstance(axis, (tuple, list)) or not all(map(_is_int, axis)):
            raise TypeError(
                f"axis: expected an int or a sequence of ints, got {type(axis).__name__} {axis!r}"
            )
    if axis is None:
        if block_shape is not None and not isinstance(block_shape, (int, np.integer)):
            full = tuple(block_shape)
            if len(full) != nd:
                raise ValueError(
                    f"block_shape: {full} has {len(full)} lengths for a {nd}-dimensional x; "
                    "give one per dimension, or name the blocked axes with axis="
                )
            axes, lens = tuple(range(nd)), full
        elif block_shape is not None:
            raise ValueError(
                f"axis: block_shape={block_shape} needs axis= (the dimension it runs along)"
            )
        else:
            return tuple(shape)  # one scale for the tensor
    else:
        axes_in = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
        axes = []
        for a in axes_in:
            if not isinstance(a, (int, np.integer)) or not -nd <= a < nd:
                raise ValueError(f"axis: {axis!r} is not an axis of x with shape {shape}")
            axes.append(int(a) % nd)
        if len(set(axes)) != len(axes):
            raise ValueError(f"axis: repeated axes in {axis!r}")
        if block_shape is None:
            lens = tuple(shape[a] for a in axes)
        elif isinstance(block_shape, (int, np.integer)):
            lens = (int(block_shape),) * len(axes)
        else:
            lens = tuple(block_shape)
            if len(lens) != len(axes):
                raise ValueError(
                    f"block_shape: {block_shape} gives {len(lens)} lengths for the "
                    f"{len(axes)} axes {tuple(axes_in)}"
                )
    block = [1] * nd  # one scale per index of the axes not named
    for a, b in zip(axes, lens, strict=True):
        if not isinstance(b, (int, np.integer)) or b < 1:
            raise ValueError(f"block_shape: expected positive ints, got {block_shape!r}")
        b = int(b)
        if shape[a] % b and b < shape[a] and not ragged:
            raise ValueError(
                f"block_shape: {b} does not divide axis {a} of length {shape[a]}; pass "
                "ragged=True to let the last block be shorter (it is quantized as if padded "
                "with zeros)"
            )
        block[a] = min(b, shape[a]) if shape[a] else b
    return tuple(block)


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def quantize(
    x: jax.Array | np.ndarray,
    fmt: FormatLike | Scheme,
    *,
    block_shape: int | Sequence[int] | None = None,
    axis: int | Sequence[int] | None = None,
    scale_fmt: FormatLike | None = None,
    scale_rule: str | None = None,
    rounding: str = "nearest_even",
    saturate: bool = True,
    tensor_scale: bool | None = None,
    ragged: bool = False,
    packed: bool = True,
) -> QArray:
    """Quantize ``x`` into a :class:`QArray` of format ``fmt`` with block scales.

    Args:
      x: a float array (jax or numpy; float32, bfloat16, float16, float64 read as f32).
      fmt: the element format (name, dtype or Format), or a :class:`Scheme` such as
        ``emulate.mx.MXFP4`` whose fields are the defaults of the arguments below.
      block_shape: block lengths along ``axis`` (an int for every named axis, or one
        per axis); with ``axis=None``, one length per dimension of ``x``. None: each
        named axis is one block (per-channel scales along the other axes).
      axis: the axis or axes the blocks run along (negative counts from the end).
        ``axis=None, block_shape=None``: one scale for the whole tensor.
      scale_fmt: the scales' format, one of ``SCALE_FORMATS``; default float8_e8m0fnu.
      scale_rule: one of ``SCALE_RULES`` (module docstring); default "ocp_floor".
      rounding: "nearest_even" (the only one built).
      saturate: True clamps scaled values to the format's range; False lets them
        overflow to Inf or NaN as :func:`emulate.encode` does (formats without Inf or
        NaN, such as float4_e2m1fn and the integers, always saturate, so False is an
        error for them).
      tensor_scale: also compute a float32 scale for the whole tensor,
        ``amax(x) / (max(scale_fmt) * max(fmt))``, divided out before the block scales
        (NVFP4's second level); needs ``scale_rule="absmax"``.
      ragged: allow block lengths that do not divide their axis (the last block is
        shorter).
      packed: store 4- and 6-bit codes as :class:`emulate.Packed`, along the first axis
        whose blocks are longer than one element (the last axis when there is none).

    Returns:
      A :class:`QArray` with ``dtype`` = ``x``'s dtype (float32 for float64 input).

    Raises:
      TypeError, ValueError: naming the argument, for an unknown format, rule or
        rounding, axes that ``x`` lacks, a block that does not divide its axis, etc.
    """
    if not is_array(x):
        raise TypeError(f"x: expected a jax or numpy array, got {type(x).__name__}")
    dt = np.dtype(x.dtype)
    if dt.kind != "f" and dt.name not in ("bfloat16",):
        raise TypeError(f"x: expected a float array (float32, bfloat16, float16), got {dt.name}")
    f, block_shape, axis, sf, rule, ts, ee = _resolve(
        fmt, block_shape, axis, scale_fmt, scale_rule, tensor_scale
    )
    for name, flag in (("saturate", saturate), ("ragged", ragged), ("packed", packed)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name}: expected True or False, got {type(flag).__name__} {flag!r}")
    if tensor_scale is not None and not isinstance(tensor_scale, (bool, np.bool_)):
        raise TypeError(f"tensor_scale: expected None, True or False, got {tensor_scale!r}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding: only {ROUNDINGS} is built, got {rounding!r}")
    if not saturate and not (f.has_inf or f.has_nan):
        raise ValueError(
            f"saturate: {f.name} has neither Inf nor NaN, so values beyond its range must "
            "saturate; pass saturate=True"
        )
    if ts and rule != "absmax":
        raise ValueError(f"tensor_scale: needs scale_rule='absmax', got {rule!r}")
    if ts and sf.name not in ("float8_e4m3fn", "float16"):
        raise ValueError(
            f"tensor_scale: needs a narrow scale format (float8_e4m3fn, as NVFP4, or "
            f"float16), got scale_fmt={sf.name}"
        )
    shape = tuple(x.shape)
    block = _blocks(shape, block_shape, axis, ragged)
    logical = np.dtype(jnp.float32) if dt.name == "float64" else _logical_dtype(dt)
    xf = jnp.asarray(np.asarray(x, np.float32) if isinstance(x, np.ndarray) else x)
    codes, scales, tscale = _quantize(
        xf.astype(jnp.float32), f.name, sf.name, rule, block, bool(saturate), ts, ee
    )
    if packed and f.packable and codes.ndim:
        along = [d for d in range(len(shape)) if block[d] > 1]
        codes = pack(codes, f.name, axis=along[0] if along else -1)
    return QArray(codes, scales, tscale, f.name, sf.name, block, shape, logical, ee)


@functools.partial(
    jax.jit, static_argnames=("fmt", "scale_fmt", "rule", "block", "saturate", "ts", "ee")
)
def _quantize(x, fmt, scale_fmt, rule, block, saturate, ts, ee):
    f, sf = formats.get(fmt), formats.get(scale_fmt)
    x = jnp.where(jnp.abs(x) < F32_MIN_NORMAL, x * 0.0, x)  # subnormals as XLA reads them
    shape = x.shape
    nblocks = tuple(-(-n // b) for n, b in zip(shape, block, strict=True))
    pad = [(0, nb * b - n) for n, b, nb in zip(shape, block, nblocks, strict=True)]
    xp = jnp.pad(x, pad) if any(p for _, p in pad) else x
    split = []
    for nb, b in zip(nblocks, block, strict=True):
        split += [nb, b]
    inner = tuple(range(1, 2 * len(shape), 2))
    blocks = xp.reshape(split)
    amax = jnp.max(jnp.abs(blocks), axis=inner) if x.size else jnp.zeros(nblocks)
    # XLA:CPU's vectorised max drops NaN from about 4096 elements on: ask for it apart.
    has_nan = jnp.any(jnp.isnan(blocks), axis=inner) if x.size else jnp.zeros(nblocks, bool)
    amax = jnp.where(has_nan, jnp.float32(jnp.nan), amax)
    bad = ~jnp.isfinite(amax)
    tscale = None
    if ts:
        t_amax = jnp.max(jnp.where(bad, 0.0, amax)) if amax.size else jnp.float32(0)
        tscale = t_amax * _reciprocal(float(sf.max) * float(f.max))
        tscale = jnp.where(t_amax == 0, jnp.float32(1), jnp.maximum(tscale, F32_MIN_NORMAL))
    if rule in POW2_RULES:
        e = _pow2_exponent(amax, f, rule, ee)
        lo, hi = _pow2_range(sf)
        e = jnp.where((amax == 0) | bad, lo, jnp.clip(e, lo, hi))
        s_codes = codecs.encode(jnp.where(bad, jnp.nan, pow2(e)), sf.name)
        y = times_pow2(x, broadcast_blocks(-(e + ee), block, shape))
    else:
        # Multiplications by f32 reciprocals, not divisions: XLA rewrites a division by a
        # constant or a broadcast into one anyway, so this is what it would compute.
        s = amax * _reciprocal(float(f.max))
        if tscale is not None:
            s = s * (jnp.float32(1) / tscale)
        s = jnp.clip(s, F32_MIN_NORMAL, float(sf.max))  # zero blocks, f32 underflow
        s_dec = codecs.decode(codecs.encode(s, sf.name), to=jnp.float32)
        s_dec = jnp.where(s_dec == 0, jnp.float32(float(sf.min_subnormal)), s_dec)
        s_codes = codecs.encode(jnp.where(bad, jnp.nan, s_dec), sf.name)
        s_eff = jnp.maximum(s_dec * tscale if tscale is not None else s_dec, F32_MIN_NORMAL)
        y = x * broadcast_blocks(jnp.float32(1) / s_eff, block, shape)
    if saturate:
        y = jnp.clip(y, -float(f.max), float(f.max))
    y = jnp.where(broadcast_blocks(bad, block, shape), 0.0, y)
    return codecs.encode(y, f.name, saturate=saturate), s_codes, tscale


def _reciprocal(v: float) -> jax.Array:
    """``1 / v`` rounded once to f32."""
    return jnp.float32(np.float32(1.0 / v)) if math.isfinite(1.0 / v) else jnp.float32(0)


def _pow2_exponent(amax: jax.Array, f: Format, rule: str, ee: int = 0) -> jax.Array:
    emax, big_m = element_range(f)
    emax += ee  # the elements' range with their implicit scale 2**ee
    m, e = frexp_normal(amax)
    if rule == "ocp_floor":
        return e - emax
    if rule == "ceil":
        return e - emax + (m > 1).astype(jnp.int32)
    if rule == "round_up":
        return e - emax + (m > big_m).astype(jnp.int32)
    mb = f.mantissa_bits if f.is_float else f.bits - 2
    return e - emax + (m >= 2.0 - 2.0 ** -(mb + 1)).astype(jnp.int32)  # "even"


def _pow2_range(sf: Format) -> tuple[int, int]:
    if sf.name == "float8_e8m0fnu":
        return -127, 127
    return sf.emin, math.floor(math.log2(float(sf.max)))


# --- dequantize --------------------------------------------------------------------------


def dequantize(q: QArray, to: DTypeLike | None = None) -> jax.Array:
    """The values of ``q``: ``decode(codes) * (scale * tensor_scale)``, each product rounded
    once to f32 precision (exact for power-of-two scales), values below 2**-126 flushed to
    zero as XLA does, then cast to ``to`` (default ``q.dtype``). A NaN scale makes its
    whole block NaN."""
    if not isinstance(q, QArray):
        raise TypeError(f"q: expected an emulate.QArray, got {type(q).__name__}")
    try:
        dt = q.dtype if to is None else np.dtype(to)
    except TypeError:
        raise TypeError(f"to: expected float32, bfloat16 or float16, got {to!r}") from None
    if dt.name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"to: expected float32, bfloat16 or float16, got {dt.name}")
    return _dequantize(q, dt.name)


@functools.partial(jax.jit, static_argnames=("to",))
def _dequantize(q: QArray, to: str) -> jax.Array:
    v = codecs.decode(q.unpacked_codes(), q.format_name, to=jnp.float32)
    m, e = scale_parts(q)
    # 2**e as two powers of two made per block, then two multiplies per element: the
    # same bits as times_pow2 at a fraction of its elementwise work. Both halves are
    # normal f32 because -252 <= e <= 254 (e8m0: -127..127; normal f32 scales and tensor
    # scales: -126..127 each), and they have e's sign, so a product out of range
    # underflows or overflows in both.
    e1 = e // 2
    v = v * broadcast_blocks(m, q.block_shape, q.shape)
    for half in (e1, e - e1):
        v = v * broadcast_blocks(pow2_normal(half), q.block_shape, q.shape)
    return v.astype(to)
