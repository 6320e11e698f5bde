"""The parts of one quantized weight as a checkpoint stores them, in logical order.

A convention's parser (the sibling modules) reads a checkpoint's tensors and returns one
:class:`StoredParts`: one code per element (``uint8``), the element format, the block
scales, zero points, offsets, codebook and act-order permutation, exactly as stored (no
value is recomputed, so the bits an element stay those of the file). Element ``i`` of the
logical weight stands for::

    W[i] = (value(codes[i]) - zero_points[block(i)]) * scales[block(i)] * tensor_scale
           + offsets[block(i)]

the formula of emulate's quantized arrays (``emulate.QArray``), where ``value(c)`` is the
element format's decode of ``c`` or ``codebook[c]``. The logical shape is the one a flax
``Dense`` kernel has: ``(..., K, N)``, the contraction axis (input features) second to
last, output features last; the torch checkpoints' ``(N, K)`` weights are transposed.
With ``perm`` the codes (and their blocks) are stored in permuted order along ``K`` so
that groups are contiguous, and ``x @ W == x[..., perm] @ W_stored``.

Pure numpy: nothing here needs JAX. :meth:`StoredParts.dequantize` is the formula above
in float32 (each product rounded once to f32, in the order written), the numpy statement
of what the parts mean.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "StoredParts",
    "bad",
    "tensor",
    "unpack_stream",
    "nibbles",
    "flat_block",
    "group_permutation",
]

#: Element formats the parsers produce (codes are their bit patterns, one per uint8).
ELEMENT_FORMATS = (
    "uint2",
    "uint3",
    "uint4",
    "uint8",
    "float4_e2m1fn",
    "float8_e4m3fn",
)
_FLOAT_CODES = {
    "float4_e2m1fn": ml_dtypes.float4_e2m1fn,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
}


def bad(name: str, field: str, got: object, expected: str) -> ValueError:
    """The error for metadata the importer does not understand: names the tensor (or
    config entry), the field, what it got and what it expected."""
    return ValueError(f"{name}: {field} is {got}; expected {expected}")


def tensor(
    tensors: Mapping[str, np.ndarray],
    name: str,
    dtypes: Sequence[np.dtype | type],
    ndim: int | Sequence[int],
) -> np.ndarray:
    """``tensors[name]``, checked for presence, dtype and rank (a ValueError naming it)."""
    if name not in tensors:
        raise ValueError(f"{name}: tensor is missing; the checkpoint has no tensor of that name")
    t = np.asarray(tensors[name])
    allowed = [np.dtype(d) for d in dtypes]
    if t.dtype not in allowed:
        raise bad(name, "dtype", t.dtype.name, " or ".join(d.name for d in allowed))
    ranks = (ndim,) if isinstance(ndim, int) else tuple(ndim)
    if t.ndim not in ranks:
        raise bad(name, "rank", f"{t.ndim} (shape {t.shape})", " or ".join(map(str, ranks)))
    return t


def unpack_stream(words: np.ndarray, bits: int, count: int, axis: int) -> np.ndarray:
    """Codes of ``bits`` bits read from a little-endian, least-significant-bit-first bit
    stream along ``axis`` of ``words`` (any unsigned or signed integer dtype; each word's
    bytes in little-endian order): code ``j`` is stream bits ``[bits*j, bits*(j+1))``.
    Returns ``count`` uint8 codes along ``axis``. This is GPTQ's and compressed-tensors'
    int32 packing (also for 3 bits, where codes straddle words) and gguf's nibble order."""
    w = np.moveaxis(np.asarray(words), axis, -1)
    width = w.dtype.itemsize * 8
    u = np.ascontiguousarray(w).view(np.dtype(f"<u{w.dtype.itemsize}"))
    if width % bits == 0:  # whole codes per word: shifts and a mask
        shifts = np.arange(0, width, bits, dtype=u.dtype)
        mask = u.dtype.type((1 << bits) - 1)
        codes = ((u[..., None] >> shifts) & mask).reshape(*u.shape[:-1], -1)
    else:
        stream = np.unpackbits(u.view(np.uint8), axis=-1, bitorder="little")
        n = stream.shape[-1] // bits
        planes = stream[..., : n * bits].reshape(*stream.shape[:-1], n, bits)
        codes = (planes.astype(np.uint32) << np.arange(bits, dtype=np.uint32)).sum(-1)
    if codes.shape[-1] < count:
        raise ValueError(
            f"words: {codes.shape[-1]} codes of {bits} bits along axis {axis}; expected at "
            f"least {count}"
        )
    return np.moveaxis(codes[..., :count].astype(np.uint8), -1, axis)


def nibbles(data: np.ndarray, *, high_first: bool) -> np.ndarray:
    """The two 4-bit codes of each byte along the last axis, in element order: low nibble
    first (gpt-oss, NVFP4, compressed-tensors) or high nibble first (bitsandbytes)."""
    lo, hi = data & 0x0F, data >> 4
    pair = (hi, lo) if high_first else (lo, hi)
    return np.stack(pair, axis=-1).reshape(*data.shape[:-1], -1).astype(np.uint8)


def flat_block(rows: int, cols: int, size: int, name: str) -> tuple[int, int]:
    """The rectangular block of a ``(rows, cols)`` row-major tensor cut into consecutive
    runs of ``size`` elements (bitsandbytes' blocks): ``(1, size)`` when ``size`` divides
    ``cols``, ``(size // cols, cols)`` when ``cols`` divides ``size``; other cases are not
    rectangular and are refused (naming ``name``)."""
    if cols % size == 0:
        return (1, size)
    if size % cols == 0:
        return (size // cols, cols)
    raise bad(
        name,
        "blocksize",
        f"{size} over rows of {cols} elements",
        "a blocksize that divides the row length or a multiple of it (blocks spanning "
        "part of a row are not rectangular)",
    )


def group_permutation(g_idx: np.ndarray, group: int, name: str) -> np.ndarray | None:
    """The act-order permutation for a group index ``g_idx`` (the group of each of the K
    input rows): None when the groups are already contiguous (``g_idx[k] == k // group``),
    else the stable argsort that makes them so. Refuses an index whose groups do not each
    hold ``group`` rows (the last one may hold fewer)."""
    k = g_idx.shape[0]
    expected = np.arange(k) // group
    if np.array_equal(g_idx, expected):
        return None
    perm = np.argsort(g_idx, kind="stable").astype(np.int32)
    if not np.array_equal(g_idx[perm], expected):
        raise bad(
            name,
            "groups",
            f"of sizes {np.bincount(g_idx.astype(np.int64)).tolist()}",
            f"each group to hold {group} rows (the last one may hold fewer)",
        )
    return perm


@dataclasses.dataclass(frozen=True, eq=False)
class StoredParts:
    """One quantized weight as stored, in logical order; see the module docstring.

    Attributes:
      codes: uint8, one code per element, logical shape ``(..., K, N)`` (rows in ``perm``
        order when ``perm`` is given).
      fmt: the element format (one of ``ELEMENT_FORMATS``); with a ``codebook`` the codes
        are unsigned indices (``uint4``, ``uint8``).
      bits: the stored width of a code in bits.
      block_shape: one block length per logical dimension.
      scales: one scale per block, shape ``ceil(shape / block_shape)``, in the stored
        dtype (float16, bfloat16, float32, float8_e4m3fn, float8_e8m0fnu), or the
        :class:`StoredParts` of quantized scales (bitsandbytes' double quantization).
      zero_points: integers per block (shape of ``scales``), an int for the whole tensor,
        or None. zero_bits: their stored width.
      offsets: floats per block or one float added after scaling, or None.
      tensor_scale: a float32 scalar multiplying every scale, or None.
      codebook: the table ``value(c) = codebook[c]`` (``2**bits`` entries), or None.
      perm, perm_axis: the act-order permutation of axis ``perm_axis`` (int32), or None.
      dtype: the dtype the project's own decoder returns (float16, bfloat16, float32).
      source: what was read (convention, tensor names, file).
      stored_bits: the bits of the checkpoint tensors read (for bits an element).
    """

    codes: np.ndarray
    fmt: str
    bits: int
    block_shape: tuple[int, ...]
    scales: np.ndarray | StoredParts
    dtype: str
    source: str
    stored_bits: int
    zero_points: np.ndarray | int | None = None
    zero_bits: int = 0
    offsets: np.ndarray | np.floating | float | None = None
    tensor_scale: np.float32 | None = None
    codebook: np.ndarray | None = None
    perm: np.ndarray | None = None
    perm_axis: int | None = None

    def __post_init__(self) -> None:
        if self.codes.dtype != np.uint8:
            raise ValueError(f"codes: dtype is {self.codes.dtype}; expected uint8")
        if self.fmt not in ELEMENT_FORMATS:
            raise ValueError(f"fmt: {self.fmt!r}; expected one of {ELEMENT_FORMATS}")
        grid = tuple(-(-n // b) for n, b in zip(self.codes.shape, self.block_shape))
        if len(self.block_shape) != self.codes.ndim or tuple(self.scales.shape) != grid:
            raise ValueError(
                f"scales: shape {tuple(self.scales.shape)} with block {self.block_shape} "
                f"over codes {self.codes.shape}; expected {grid}"
            )
        if self.codebook is not None and self.codebook.shape != (1 << self.bits,):
            raise ValueError(f"codebook: shape {self.codebook.shape}; expected ({1 << self.bits},)")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.codes.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def parts_bits(self) -> int:
        """The bits these parts take when kept as stored: codes at ``bits`` each, scales,
        zero points, offsets, codebook and permutation at their stored widths."""

        def width(x: object) -> int:
            if isinstance(x, StoredParts):
                return x.parts_bits()
            if isinstance(x, np.ndarray):
                return x.size * x.dtype.itemsize * 8
            return 32 if x is not None else 0

        z = self.zero_points
        zbits = z.size * self.zero_bits if isinstance(z, np.ndarray) else 0
        extra = (self.scales, self.offsets, self.codebook, self.perm, self.tensor_scale)
        return self.size * self.bits + zbits + sum(width(x) for x in extra)

    def bits_per_element(self) -> float:
        return self.parts_bits() / max(self.size, 1)

    def values(self) -> np.ndarray:
        """``value(codes)`` as float32 (integers for integer formats)."""
        if self.codebook is not None:
            return self.codebook[self.codes].astype(np.float32)
        if self.fmt in _FLOAT_CODES:
            return self.codes.view(_FLOAT_CODES[self.fmt]).astype(np.float32)
        return self.codes.astype(np.float32)

    def dequantize(self) -> np.ndarray:
        """The logical weight as float32 (before the cast to ``dtype``), ``perm`` undone:
        ``((value - z) * (s * tensor_scale)) + offset``, each operation rounded to f32.
        NaN and Inf follow IEEE (without numpy's warnings)."""
        with np.errstate(invalid="ignore", over="ignore"):
            return self._dequantize()

    def _dequantize(self) -> np.ndarray:
        v = self.values()
        s = self.scales.dequantize() if isinstance(self.scales, StoredParts) else self.scales
        s = np.asarray(s).astype(np.float32)
        if self.tensor_scale is not None:
            s = s * np.float32(self.tensor_scale)
        if self.zero_points is not None:
            v = v - _expand(np.asarray(self.zero_points, np.float32), self.block_shape, v)
        v = v * _expand(s, self.block_shape, v)
        if self.offsets is not None:
            v = v + _expand(np.asarray(self.offsets, np.float32), self.block_shape, v)
        if self.perm is not None:
            axis = self.perm_axis if self.perm_axis is not None else -2
            out = np.empty_like(v)
            index: list[Any] = [slice(None)] * v.ndim
            index[axis] = self.perm
            out[tuple(index)] = v
            v = out
        return v


def _expand(per_block: np.ndarray, block: tuple[int, ...], like: np.ndarray) -> np.ndarray:
    """A per-block array (or a scalar) repeated over its blocks, cut to ``like``'s shape."""
    if per_block.ndim == 0:
        return per_block
    out = per_block
    for axis, b in enumerate(block):
        out = np.repeat(out, b, axis=axis)
    return out[tuple(slice(0, n) for n in like.shape)]
