"""The parts of one quantized weight as a file stores them, in logical order: the one
record every importer returns (GGUF's block parsers and the safetensors conventions).

A parser reads a file's bytes or tensors and returns one :class:`StoredParts`: one code
per element (``uint8``), the element format, the block scales, zero points, offsets,
codebook and act-order permutation, exactly as stored (no value is recomputed, so the
bits an element stay those of the file). Element ``i`` of the logical weight stands
for::

    W[i] = (value(codes[i]) - zero_points[block(i)]) * scales[block(i)] * tensor_scale
           + offsets[block(i)]

the formula of emulate's quantized arrays (``emulate.QArray``), where ``value(c)`` is the
element format's decode of ``c`` (``int8`` as two's complement, ``uintN`` unsigned,
float formats by their bits) or ``codebook[c]``. Scales and offsets may themselves be
:class:`StoredParts` (two-level: GGUF's K-quant sub-block scales and mins times an f16
per super-block, bitsandbytes' double-quantized absmax), whose value per block is their
own formula.

Orientation: ``k_axis`` is the contraction axis. The safetensors conventions give the
shape a flax ``Dense`` kernel has, ``(..., K, N)`` (``k_axis = -2``; torch's ``(N, K)``
weights transposed); GGUF tensors keep the file's rows, ``(..., N, K)`` with blocks
along the last axis (``k_axis = -1``). With ``perm`` the codes (and their blocks) are
stored in permuted order along ``perm_axis`` so that groups are contiguous, and
``x @ W == x[..., perm] @ W_stored``.

Pure numpy: nothing here needs JAX. :meth:`StoredParts.dequantize` is the formula above
in float32 (each product rounded once to f32, in the order written), the numpy statement
of what the parts mean; ``emulate.importers.as_qarray.to_qarray`` turns the record into
an ``emulate.QArray``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["ELEMENT_FORMATS", "StoredParts"]

#: Element formats the parsers produce (codes are their bit patterns, one per uint8).
ELEMENT_FORMATS = (
    "uint2",
    "uint3",
    "uint4",
    "uint5",
    "uint6",
    "uint8",
    "int8",
    "float4_e2m1fn",
    "float8_e4m3fn",
)
_FLOAT_CODES = {
    "float4_e2m1fn": ml_dtypes.float4_e2m1fn,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
}


@dataclasses.dataclass(frozen=True, eq=False)
class StoredParts:
    """One quantized weight as stored, in logical order; see the module docstring.

    Attributes:
      codes: uint8, one code per element (rows in ``perm`` order when ``perm`` is given).
      fmt: the element format (one of ``ELEMENT_FORMATS``); with a ``codebook`` the codes
        are unsigned indices (``uint4``, ``uint8``); ``int8`` codes hold two's complement
        bit patterns.
      bits: the stored width of a code in bits.
      block_shape: one block length per logical dimension.
      scales: one scale per block, shape ``ceil(shape / block_shape)``, in the stored
        dtype (float16, bfloat16, float32, float8_e4m3fn, float8_e8m0fnu), or the
        :class:`StoredParts` of quantized scales (two-level scales, double quantization).
      dtype: the dtype the project's own decoder returns (float16, bfloat16, float32).
      source: what was read (convention, tensor names).
      stored_bits: the bits of the file's bytes or tensors read (for bits an element).
      zero_points: integers per block (shape of ``scales``), an int for the whole tensor,
        or None. zero_bits: the stored width of per-block zero points.
      offsets: floats per block (or their :class:`StoredParts`: GGUF's K-quant mins),
        one float added after scaling, or None.
      tensor_scale: a float32 scalar multiplying every scale, or None.
      codebook: the table ``value(c) = codebook[c]`` (``2**bits`` entries), or None.
      perm, perm_axis: the act-order permutation of axis ``perm_axis`` (int32), or None.
      k_axis: the contraction axis (negative): codes pack along it in a QArray.
      name: the tensor's or layer's name, for messages ("" where ``source`` says it).
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
    offsets: np.ndarray | np.floating | float | StoredParts | None = None
    tensor_scale: np.float32 | None = None
    codebook: np.ndarray | None = None
    perm: np.ndarray | None = None
    perm_axis: int | None = None
    k_axis: int = -2
    name: str = ""

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

    @property
    def bits_per_element(self) -> float:
        """:meth:`parts_bits` over the elements (tables and permutations included)."""
        return self.parts_bits() / max(self.size, 1)

    def __repr__(self) -> str:
        return (
            f"StoredParts({self.source!r}, shape={self.shape}, "
            f"{self.bits_per_element:g} bits/element)"
        )

    def values(self) -> np.ndarray:
        """``value(codes)`` as float32 (integers for integer formats)."""
        if self.codebook is not None:
            return self.codebook[self.codes].astype(np.float32)
        if self.fmt in _FLOAT_CODES:
            return self.codes.view(_FLOAT_CODES[self.fmt]).astype(np.float32)
        if self.fmt == "int8":
            return self.codes.view(np.int8).astype(np.float32)
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
            o = self.offsets
            o = o.dequantize() if isinstance(o, StoredParts) else np.asarray(o, np.float32)
            v = v + _expand(o, self.block_shape, v)
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
