"""The quantized-array record, :class:`QArray`: low-precision codes times block scales,
and :func:`dequantize`, its values.

A :class:`QArray` of logical shape ``S`` holds codes of one element format (an array of
that dtype, or :class:`emulate.Packed` for 4- and 6-bit formats), one scale per block of
``block_shape`` elements (``scales.shape[d] == ceil(S[d] / block_shape[d])``), and an
optional float32 ``tensor_scale``. Element ``i`` stands for::

    decode(codes[i]) * (scales[block(i)] * tensor_scale)

One ``block_shape`` covers every case: ``block_shape == S`` is one scale for the tensor,
``(K, 1)`` one scale per column of a ``(K, N)`` weight (per output channel), ``(32, 1)``
an OCP MX block of 32 along K, ``(128, 128)`` a 2-D block. :mod:`emulate.quant` makes
QArrays from float arrays; :meth:`QArray.from_parts` from a checkpoint's stored parts.
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
from emulate.formats import Format, FormatLike
from emulate.numerics import codecs
from emulate.numerics.bits import frexp, pow2_normal
from emulate.numerics.storage import Packed, is_array, to_codes, unpack_codes

__all__ = [
    "QArray",
    "SCALE_FORMATS",
    "broadcast_blocks",
    "dequantize",
    "logical_dtype",
    "scale_parts",
    "transpose",
    "validate_qarray",
]

SCALE_FORMATS = ("float8_e8m0fnu", "float8_e4m3fn", "bfloat16", "float16", "float32")


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
        validate_qarray(self)

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
            logical_dtype(dtype),
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


def validate_qarray(q: QArray, arg: str = "QArray") -> None:
    """Refuse a QArray whose parts disagree (names ``arg`` and the part)."""
    try:
        f = formats.get(q.format_name)
        sf = formats.get(q.scale_format)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{arg}: {str(e).removeprefix('fmt: ')}") from None
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


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _packed_shape(p: Packed) -> tuple[int, ...]:
    s = list(p.data.shape)
    s[p.axis] = p.length
    return tuple(s)


def _as_format_array(raw: jax.Array, f: Format) -> jax.Array:
    return codecs.from_codes(jnp.asarray(raw), f)


def logical_dtype(dtype: DTypeLike) -> np.dtype:
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
