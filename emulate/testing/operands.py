"""Operand specifications and strategies for quantized and packed operands.

:func:`qarrays` draws :class:`emulate.QArray` values of a scheme (any of
:data:`emulate.mx.SCHEMES`, or a :class:`QuantSpec` of your own): codes with the element
format's special values boosted, and scales with the scale format's special values
boosted: NaN, +-Inf, 0, the smallest subnormal and normal, the largest value, 1.

:func:`plain`, :func:`packed` and :func:`quantized` describe one operand of a kernel for
:func:`emulate.testing.check_function`: what to draw for a shape (:meth:`OperandSpec.draw`)
and which values the oracle multiplies (:func:`oracle_values`).

The parts a QArray has are drawn by one function each (:func:`_draw_codes`,
:func:`_draw_scales`, the tensor scale): a new part (zero points, offsets, codebooks) is a
new field of :class:`QuantSpec` and one more draw.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

from emulate import formats as _formats
from emulate import reference
from emulate.formats import FormatLike
from emulate.numerics.storage import Packed, pack, unpack_codes
from emulate.quantized.array import QArray
from emulate.quantized.layout import layout_of
from emulate.quantized.quantizing import Scheme
from emulate.reference.rounding import encode
from emulate.testing.strategies import arrays

__all__ = [
    "QUANTIZER_SCALES",
    "SCALE_ELEMENTS",
    "OperandSpec",
    "QuantSpec",
    "oracle_values",
    "packed",
    "plain",
    "qarrays",
    "quant_spec",
    "quantized",
    "scale_values",
]

SCALE_ELEMENTS = ("all", "finite", "normal", "extreme")

#: The range of the scales ``scales="normal"`` draws (:func:`scale_values`): what a
#: quantizer writes, ``absmax / qmax``, for data whose absmax lies in ``[2**-14, 2**14]``
#: and a largest code from 1 to 57344 (float8_e5m2's).
QUANTIZER_SCALES = (2.0**-30, 2.0**14)


@dataclasses.dataclass(frozen=True)
class QuantSpec:
    """What a drawn QArray looks like: its element format and its scales.

    Attributes:
      format: the element format name.
      block: block lengths along ``axes`` (None: the whole axis is one block).
      axes: the blocked axes (negative counts from the end).
      scale_format: the scales' format name (one of ``emulate.quantized.checks.SCALE_FORMATS``).
      tensor_scale: also draw a float32 tensor scale (NVFP4).
      element_exponent: the codes' implicit power-of-two scale (-6 for MXINT8).
    """

    format: str
    block: tuple[int, ...] | None
    axes: tuple[int, ...]
    scale_format: str
    tensor_scale: bool = False
    element_exponent: int = 0

    def block_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The full block shape for an array of ``shape`` (one length per dimension)."""
        nd = len(shape)
        out = [1] * nd
        lens = self.block if self.block is not None else (None,) * len(self.axes)
        for a, b in zip(self.axes, lens, strict=True):
            d = a % nd
            out[d] = shape[d] if b is None else min(b, shape[d]) if shape[d] else b
        return tuple(out)


def quant_spec(
    scheme: Scheme | QuantSpec | FormatLike,
    *,
    axis: int | tuple[int, ...] | None = None,
    block: int | tuple[int, ...] | None = None,
    scale_format: FormatLike | None = None,
) -> QuantSpec:
    """A :class:`QuantSpec` from a scheme (``emulate.mx.MXFP4``, ``"INT4_G128"``), a spec,
    or an element format with ``block`` and ``scale_format`` (default float32 scales, one
    per whole ``axis``). ``axis`` and ``block`` override the scheme's.

    Raises:
      ValueError: an unknown scheme name or format; a ``block`` of the wrong length.
    """
    from emulate.quantized import mx

    if isinstance(scheme, str) and scheme in mx.SCHEMES:
        scheme = mx.SCHEMES[scheme]
    if isinstance(scheme, Scheme):
        base = QuantSpec(
            scheme.format,
            scheme.block,
            scheme.axes,
            scheme.scale_format,
            scheme.tensor_scale,
            scheme.element_exponent,
        )
    elif isinstance(scheme, QuantSpec):
        base = scheme
    else:
        try:
            f = _formats.get(scheme)
        except (TypeError, ValueError):
            raise ValueError(
                f"scheme: expected an emulate.mx scheme (one of {', '.join(mx.SCHEMES)}), a "
                f"QuantSpec or an element format, got {scheme!r}"
            ) from None
        base = QuantSpec(f.name, None, (-1,), "float32")
    axes = base.axes if axis is None else ((axis,) if isinstance(axis, int) else tuple(axis))
    lens: tuple[int, ...] | None = base.block
    if block is not None:
        lens = (block,) * len(axes) if isinstance(block, int) else tuple(block)
    elif axis is not None and lens is not None and len(lens) != len(axes):
        lens = (lens[0],) * len(axes)
    if lens is not None and len(lens) != len(axes):
        raise ValueError(f"block: {lens} gives {len(lens)} lengths for the axes {axes}")
    sf = base.scale_format if scale_format is None else _formats.get(scale_format).name
    return dataclasses.replace(base, block=lens, axes=axes, scale_format=sf)


def scale_values(scale_format: FormatLike, *, elements: str = "all") -> st.SearchStrategy[float]:
    """One scale value of ``scale_format`` (any scale format: a P3109 or registered one's
    values are rounded into it when :func:`qarrays` encodes them), special values boosted.

    ``elements``:

    - "all": NaN, +-Inf where the format has them, 0, the smallest subnormal and normal
      values, the largest value, 1, negatives;
    - "finite": the same without NaN and Inf;
    - "normal": what a quantizer writes, ``absmax / qmax`` of finite normal data: positive
      normal values in :data:`QUANTIZER_SCALES` (``[2**-30, 2**14]``: an absmax in
      ``[2**-14, 2**14]``, the range :func:`emulate.testing.arrays` draws, over a largest
      code from 1 to 57344, float8_e5m2's), 1, ``2**-10`` and the ends boosted. A kernel
      that scales its block sums rather than each product (``s * sum(x * q)``) stays far
      from float32's overflow and underflow there;
    - "extreme": positive normal values up to the format's largest (float32: about
      ``3.4e38``), the largest and the smallest normal boosted: scales no quantizer writes
      from normal data, where ``s * sum(x * q)`` overflows (or underflows) while the
      reference, which scales each product, may not.
    """
    f = _formats.get(scale_format)
    if elements not in SCALE_ELEMENTS:
        raise ValueError(
            f"scales: expected 'all', 'finite', 'normal' or 'extreme', got {elements!r}"
        )
    lo_q, hi_q = QUANTIZER_SCALES
    if f.name == "float8_e8m0fnu":
        codes = list(range(255)) + ([255] if elements == "all" else [])
        vals = [float(v) for v in np.array(codes, np.uint8).view(f.dtype).astype(np.float64)]
        special = [2.0**-127, 1.0, 2.0**127] + ([math.nan] if elements == "all" else [])
        if elements == "normal":
            vals = [v for v in vals if lo_q <= v <= hi_q]
            special = [lo_q, 1.0, hi_q]
        return st.one_of(st.sampled_from(special), st.sampled_from(vals))
    big, tiny, normal = float(f.max), float(f.min_subnormal), float(f.min_normal)
    lo, hi = normal, min(big, 2.0**20)
    special = [1.0, normal, big, 2.0**-10]
    if elements == "normal":
        lo, hi = max(normal, lo_q), min(big, hi_q)
        special = [v for v in (1.0, lo, hi, 2.0**-10) if lo <= v <= hi]
    if elements in ("all", "finite"):
        special += [0.0, tiny] + ([-1.0] if f.signed else [])
    if elements == "all":
        special += [math.nan, math.inf] + ([-math.inf] if f.signed else [])
    width = {2: 16, 4: 32}.get(f.dtype.itemsize, 32)
    spread = st.floats(lo, hi, width=width)  # type: ignore[arg-type]
    if f.name in ("bfloat16", "float8_e4m3fn"):
        spread = st.floats(lo, hi).map(
            lambda v: float(np.float64(v).astype(f.dtype).astype(np.float64))
        )
    return st.one_of(st.sampled_from(special), spread)


def qarrays(
    scheme: Scheme | QuantSpec | FormatLike,
    shape: tuple[int, ...],
    *,
    axis: int | tuple[int, ...] | None = None,
    block: int | tuple[int, ...] | None = None,
    elements: str = "all",
    scales: str = "all",
    fill: Any = None,
    packed: bool = True,
) -> st.SearchStrategy[QArray]:
    """A :class:`emulate.QArray` of logical ``shape`` in ``scheme``'s layout.

    Args:
      scheme: an :data:`emulate.mx.SCHEMES` scheme or its name, a :class:`QuantSpec`, or
        an element format (one float32 scale per whole ``axis``).
      shape: the logical shape.
      axis, block: override the scheme's blocked axes and block lengths (as in
        :func:`emulate.quantize`); blocks need not divide the axis (the last is shorter).
      elements, fill: the codes, as for :func:`emulate.testing.arrays`; with ``fill=None``
        half of the arrays take the background ``fill="extreme"`` (the largest-magnitude
        code: int4 -8, int8 -128, float8_e4m3fn +-448), so that a kernel that misreads it
        (a sign-extension bug reading int4 code 8 as +8) is wrong in most elements.
      scales: the scales, as for :func:`scale_values`: "all" (NaN, Inf, 0, subnormal,
        max boosted), "finite", "normal" (what a quantizer writes: positive normal values
        in :data:`QUANTIZER_SCALES`) or "extreme" (positive normal values up to the
        scale format's largest).
      packed: hold 4- and 6-bit codes as :class:`emulate.Packed` (along the first axis cut
        into blocks of more than one element, as :func:`emulate.quantize` does).

    Tensor scales (NVFP4) are drawn from positive normal float32 values, 1 boosted.
    """
    spec = quant_spec(scheme, axis=axis, block=block)
    f = _formats.get(spec.format)
    sf = _formats.get(spec.scale_format)
    blocks = spec.block_shape(tuple(shape))
    nblocks = tuple(-(-n // b) for n, b in zip(shape, blocks, strict=True))

    code_arrays = arrays(f, tuple(shape), elements=elements, fill=fill)
    if fill is None:  # half of the arrays: the extreme code as background (int4: -8)
        code_arrays = st.one_of(
            code_arrays, arrays(f, tuple(shape), elements=elements, fill="extreme")
        )

    @st.composite
    def draw(d: st.DrawFn) -> QArray:
        codes = d(code_arrays, label="codes")
        codes = _codes_of(codes)  # a format without a dtype: re-packed as asked below
        svals = d(_draw_scales(sf, nblocks, scales), label="scales")
        ts = None
        if spec.tensor_scale:
            ts = d(st.one_of(st.just(1.0), st.floats(2.0**-20, 2.0**20, width=32)))
        c: Any = codes
        if packed and f.packable and codes.ndim:
            along = [i for i in range(codes.ndim) if blocks[i] > 1]
            c = pack(codes, f.name, axis=along[0] if along else -1)
        elif not f.xla_storable:
            c = jnp.asarray(codes.view(np.uint8))
        return QArray.from_parts(
            c,
            svals,
            block_shape=blocks,
            fmt=f.name,
            tensor_scale=ts,
            element_exponent=spec.element_exponent,
            scale_fmt=None if sf.has_dtype else sf.name,
        )

    return draw()


def _codes_of(x: np.ndarray | Packed) -> np.ndarray:
    """An array of a format's dtype as it is; a Packed one (a format without a dtype) as its
    uint8 codes."""
    return np.asarray(unpack_codes(x)) if isinstance(x, Packed) else x


def _draw_scales(sf: _formats.Format, nblocks: tuple[int, ...], elements: str):
    values = scale_values(sf, elements=elements)
    n = math.prod(nblocks)
    if not sf.has_dtype:  # a P3109 or registered scale format: its uint8 codes
        return st.lists(values, min_size=n, max_size=n).map(
            lambda v: encode(np.array(v, np.float64).reshape(nblocks), sf)
        )
    return st.lists(values, min_size=n, max_size=n).map(
        lambda v: np.array(v, np.float64).reshape(nblocks).astype(sf.dtype)
    )


@dataclasses.dataclass(frozen=True)
class OperandSpec:
    """One operand of a kernel: plain codes, packed codes, or a QArray.

    Build one with :func:`plain`, :func:`packed` or :func:`quantized`.
    """

    kind: str
    format: str
    axis: int = -1
    quant: QuantSpec | None = None
    scales: str = "all"

    def draw(self, shape: tuple[int, ...], *, elements: str = "all", fill: Any = None):
        """The strategy of this operand at ``shape``."""
        if self.kind == "quantized":
            assert self.quant is not None
            return qarrays(self.quant, shape, elements=elements, scales=self.scales, fill=fill)
        plain_st = arrays(self.format, shape, elements=elements, fill=fill)
        if self.kind == "packed":
            return plain_st.map(lambda x: pack(_codes_of(x), self.format, axis=self.axis))
        return plain_st

    def describe(self) -> str:
        if self.kind == "quantized":
            assert self.quant is not None
            q = self.quant
            return f"QArray {q.format} blocks {q.block} on axes {q.axes}, {q.scale_format} scales"
        return self.format if self.kind == "plain" else f"Packed {self.format} (axis {self.axis})"


def plain(fmt: FormatLike, *, arg: str = "fmt") -> OperandSpec:
    """An operand passed as an array of ``fmt``'s dtype (numpy; ml_dtypes for the
    low-precision formats). ``arg`` names the argument in errors."""
    f = _formats.get(fmt, arg=arg)
    if f.bits > 32 or f.name == "int32":
        raise ValueError(f"{arg}: expected a matmul operand format, got {f.name}")
    return OperandSpec("plain", f.name)


def packed(fmt: FormatLike, *, axis: int = -1) -> OperandSpec:
    """An operand passed as :class:`emulate.Packed` codes of a 4- or 6-bit ``fmt`` packed
    along ``axis`` (see docs/quantized.md for the nibble order)."""
    f = _formats.get(fmt)
    if not f.packable:
        raise ValueError(f"fmt: {f.name} is not a 4- or 6-bit format that Packed holds")
    return OperandSpec("packed", f.name, axis=axis)


def quantized(
    scheme: Scheme | QuantSpec | FormatLike,
    *,
    axis: int | tuple[int, ...] | None = None,
    block: int | tuple[int, ...] | None = None,
    scale_format: FormatLike | None = None,
    scales: str = "all",
) -> OperandSpec:
    """An operand passed as an :class:`emulate.QArray` (see :func:`qarrays`)."""
    if scales not in SCALE_ELEMENTS:
        raise ValueError(f"scales: expected 'all', 'finite', 'normal' or 'extreme', got {scales!r}")
    spec = quant_spec(scheme, axis=axis, block=block, scale_format=scale_format)
    return OperandSpec("quantized", spec.format, quant=spec, scales=scales)


def as_spec(x: OperandSpec | Scheme | FormatLike, arg: str) -> OperandSpec:
    """An :class:`OperandSpec` from a spec, a scheme (quantized) or a format (plain)."""
    if isinstance(x, OperandSpec):
        return x
    if isinstance(x, (Scheme, QuantSpec)):
        return quantized(x)
    try:
        return plain(x, arg=arg)
    except (TypeError, ValueError) as e:
        raise type(e)(
            f"{e}; {arg} takes a format, an emulate.mx scheme or "
            "testing.plain/packed/quantized(...)"
        ) from None


def oracle_values(
    x: Any, arg: str = "operand", *, exact: bool = False
) -> tuple[np.ndarray, tuple[int, ...] | None]:
    """What :mod:`emulate.reference` multiplies for an operand, and its block shape.

    A :class:`emulate.QArray`: its values by :func:`emulate.reference.dequantize` (float32,
    each code times its scale rounded once, NaN blocks where a scale is NaN; with
    ``exact``, float64 values of each code times its scale, unrounded), and its block
    shape. A :class:`emulate.Packed` array: its codes unpacked, as an array of the
    format (uint8 codes viewed as float6), or its values in float32 for a format without a
    dtype (P3109, yours), which float32 holds exactly. Anything else: ``np.asarray(x)``, block None.
    """
    if isinstance(x, QArray):
        f = x.format
        codes = np.asarray(x.unpacked_codes())
        if codes.dtype == np.uint8 and f.dtype != np.uint8:
            codes = codes.view(f.dtype)
        lay = layout_of(x)
        ts = None if lay.tensor is None else float(np.asarray(lay.tensor.array))
        values = reference.dequantize(
            codes,
            np.asarray(x.scales),
            x.block_shape,
            ts,
            lay.exponent,
            fmt=None if f.has_dtype else f,
            scale_fmt=None if _formats.get(x.scale_format).has_dtype else x.scale_format,
            exact=exact,
        )
        return values, tuple(x.block_shape)
    if isinstance(x, Packed):
        f = x.format
        codes = np.asarray(unpack_codes(x))
        if not f.has_dtype:  # float32 holds every value of such an operand exactly
            return reference.decode(codes, f, to=np.float32), None
        return (codes.view(f.dtype) if codes.dtype != f.dtype else codes), None
    try:
        return np.asarray(x), None
    except Exception as e:  # noqa: BLE001 - named in the message
        raise TypeError(
            f"{arg}: expected an array, a Packed or a QArray, got {type(x).__name__}"
        ) from e
