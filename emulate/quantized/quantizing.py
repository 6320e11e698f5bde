"""Quantization: :func:`quantize` turns a float array into a :class:`QArray` (the record
lives in :mod:`emulate.quantized.array`, re-exported here with :func:`dequantize`), by a recipe
(:class:`Recipe`, resolved from the arguments or a named :class:`Scheme`).

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
``round(x / scale)`` into the element format, to nearest even (or by ``rounding``:
docs/numerics.md, "Rounding modes"), saturating to ``+-max`` (``saturate=True``). For
power-of-two scales the division is exact (one rounding in all); for ``absmax`` it is an
f32 division followed by the rounding into the element format. A block holding NaN or
+-Inf gets a NaN scale and zero codes: the whole block dequantizes to NaN (the OCP rule
for a NaN scale). Inputs below ``2**-126`` in magnitude (f32 subnormals) are read as
zero, as XLA does on CPU and TPU.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from emulate import formats
from emulate.formats import F32_MIN_NORMAL, Format, FormatLike
from emulate.numerics import codecs
from emulate.numerics.bits import times_pow2
from emulate.numerics.rounding import ROUNDINGS, STOCHASTIC, check_rounding
from emulate.numerics.scales import (
    POW2_RULES,
    SCALE_RULES,
    absmax_scales,
    element_range,
    pow2_scales,
    scale_format,
    tensor_scale,
)
from emulate.numerics.storage import is_array, pack
from emulate.quantized.array import QArray
from emulate.quantized.checks import SCALE_FORMATS, logical_dtype
from emulate.quantized.values import broadcast_blocks, dequantize

__all__ = [
    "QArray",
    "Recipe",
    "Scheme",
    "quantize",
    "dequantize",
    "resolve_recipe",
    "round_scaled",
    "SCALE_RULES",
    "SCALE_FORMATS",
    "element_range",
    "ROUNDINGS",
]


@dataclasses.dataclass(frozen=True)
class Scheme:
    """A named quantization recipe: element format, block, scale format and rule.

    ``block`` gives block lengths along ``axes`` (None: the whole axis). Pass a Scheme as
    ``fmt`` to :func:`quantize`; keyword arguments given there override its fields.
    ``element_exponent``: the elements' implicit power-of-two scale (see
    :class:`QArray`; -6 for MXINT8), which the scale rule counts in the element's range.
    ``rounding``, ``random_bits``: how elements round (``quantize``'s arguments of those
    names default to them), e.g. ``dataclasses.replace(mx.MXFP4, rounding="stochastic",
    random_bits=8)`` for stochastic MXFP4 (``quantize`` then needs ``key=``).
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
    rounding: str = "nearest_even"
    random_bits: int | None = None

    def __repr__(self) -> str:
        return f"Scheme({self.name!r})"


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How to quantize, checked: what :func:`quantize` does once the arguments and the
    :class:`Scheme` they name are resolved (:func:`resolve_recipe`).

    Attributes:
      format, scale_format: the element and scale formats.
      block_shape, axis: as given to :func:`quantize` (resolved into a block per shape
        by :func:`block_shape_for`).
      scale_rule: one of ``SCALE_RULES``.
      tensor_scale: whether an f32 scale for the whole tensor is computed (NVFP4).
      element_exponent: the elements' implicit power-of-two scale (-6 for MXINT8).
    """

    format: Format
    block_shape: int | Sequence[int] | None
    axis: int | Sequence[int] | None
    scale_format: Format
    scale_rule: str
    tensor_scale: bool
    element_exponent: int


def resolve_recipe(
    fmt: FormatLike | Scheme,
    block_shape: int | Sequence[int] | None,
    axis: int | Sequence[int] | None,
    scale_fmt: FormatLike | None,
    scale_rule: str | None,
    tensor_scale: bool | None,
) -> Recipe:
    """The :class:`Recipe` of :func:`quantize`'s arguments (a Scheme's fields fill the
    ones not given). Raises ValueError naming the argument for an unknown format or rule,
    or a rule the scale format cannot hold."""
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
    sf = scale_format("float8_e8m0fnu" if scale_fmt is None else scale_fmt, "scale_fmt")
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
    return Recipe(f, block_shape, axis, sf, scale_rule, bool(tensor_scale), ee)


# --- blocks: which elements share a scale ---------------------------------------------------


def _check_block_types(block_shape: object, axis: object) -> None:
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


def _named_axes(shape: tuple[int, ...], axis: int | Sequence[int]) -> tuple[int, ...]:
    """``axis`` as distinct non-negative axes of ``shape``."""
    nd = len(shape)
    axes_in = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    axes = []
    for a in axes_in:
        if not isinstance(a, (int, np.integer)) or not -nd <= a < nd:
            raise ValueError(f"axis: {axis!r} is not an axis of x with shape {shape}")
        axes.append(int(a) % nd)
    if len(set(axes)) != len(axes):
        raise ValueError(f"axis: repeated axes in {axis!r}")
    return tuple(axes)


def _axis_lengths(
    shape: tuple[int, ...],
    block_shape: int | Sequence[int] | None,
    axis: int | Sequence[int] | None,
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The blocked axes and their block lengths; None for one scale for the tensor."""
    nd = len(shape)
    if axis is None:
        if block_shape is None:
            return None
        if isinstance(block_shape, (int, np.integer)):
            raise ValueError(
                f"axis: block_shape={block_shape} needs axis= (the dimension it runs along)"
            )
        full = tuple(block_shape)
        if len(full) != nd:
            raise ValueError(
                f"block_shape: {full} has {len(full)} lengths for a {nd}-dimensional x; "
                "give one per dimension, or name the blocked axes with axis="
            )
        return tuple(range(nd)), full
    axes = _named_axes(shape, axis)
    if block_shape is None:  # the whole axis (an empty axis: empty blocks of length 1)
        return axes, tuple(shape[a] or 1 for a in axes)
    if isinstance(block_shape, (int, np.integer)):
        return axes, (int(block_shape),) * len(axes)
    lens = tuple(block_shape)
    if len(lens) != len(axes):
        n_in = 1 if isinstance(axis, (int, np.integer)) else len(tuple(axis))
        given = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
        raise ValueError(
            f"block_shape: {block_shape} gives {len(lens)} lengths for the {n_in} axes {given}"
        )
    return axes, lens


def block_shape_for(
    shape: tuple[int, ...],
    block_shape: int | Sequence[int] | None,
    axis: int | Sequence[int] | None,
    ragged: bool,
) -> tuple[int, ...]:
    """The block, one length per dimension of ``shape``, that :func:`quantize`'s
    ``block_shape`` and ``axis`` name (see there); ValueError or TypeError naming the
    argument otherwise."""
    _check_block_types(block_shape, axis)
    named = _axis_lengths(shape, block_shape, axis)
    if named is None:
        return tuple(shape)  # one scale for the tensor
    block = [1] * len(shape)  # one scale per index of the axes not named
    for a, b in zip(*named, strict=True):
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
    rounding: str | None = None,
    saturate: bool = True,
    tensor_scale: bool | None = None,
    ragged: bool = False,
    packed: bool = True,
    key: jax.Array | None = None,
    random_bits: int | None = None,
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
      scale_fmt: the scales' format; default float8_e8m0fnu. One of ``SCALE_FORMATS``,
        or a P3109 or registered float format of at most 8 bits with a NaN code (its
        scales are then uint8 codes; :func:`emulate.numerics.scales.scale_format`).
      scale_rule: one of ``SCALE_RULES`` (module docstring); default "ocp_floor".
      rounding: how the scaled values are rounded into ``fmt``, one of ``ROUNDINGS``:
        "nearest_even" (the default, or the Scheme's ``rounding``), "nearest_away",
        "toward_zero", "toward_positive", "toward_negative", "stochastic" or gfloat's
        variants "stochastic_odd", "stochastic_fast", "stochastic_fastest" (as
        :func:`emulate.encode`; the scales do not depend on it). Scaled values below
        ``2**-126`` in magnitude are zero first.
      key, random_bits: for the stochastic modes (and only there): a ``jax.random``
        key and the random bits per element, 1 to 32 (default: the Scheme's
        ``random_bits``). Element ``i`` of ``x`` uses the top bits of
        ``jax.random.bits(key, x.shape, jnp.uint32)[i]``.
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
    r = resolve_recipe(fmt, block_shape, axis, scale_fmt, scale_rule, tensor_scale)
    f, sf, rule, ts, ee = r.format, r.scale_format, r.scale_rule, r.tensor_scale, r.element_exponent
    for name, flag in (("saturate", saturate), ("ragged", ragged), ("packed", packed)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name}: expected True or False, got {type(flag).__name__} {flag!r}")
    if tensor_scale is not None and not isinstance(tensor_scale, (bool, np.bool_)):
        raise TypeError(f"tensor_scale: expected None, True or False, got {tensor_scale!r}")
    if isinstance(fmt, Scheme):
        rounding = fmt.rounding if rounding is None else rounding
        if random_bits is None and rounding in STOCHASTIC:
            random_bits = fmt.random_bits
    rounding = "nearest_even" if rounding is None else rounding
    nbits = check_rounding(rounding, key, random_bits)
    if not saturate and not (f.has_inf or f.has_nan):
        raise ValueError(
            f"saturate: {f.name} has neither Inf nor NaN, so values beyond its range must "
            "saturate; pass saturate=True"
        )
    if ts and rule != "absmax":
        raise ValueError(f"tensor_scale: needs scale_rule='absmax', got {rule!r}")
    if ts and ((sf.bits > 8 and sf.name != "float16") or sf.name == "float8_e8m0fnu"):
        raise ValueError(
            f"tensor_scale: needs a narrow scale format (float8_e4m3fn as NVFP4, another "
            f"scale format of at most 8 bits, or float16), got scale_fmt={sf.name}"
        )
    if ts and float(sf.max) * float(f.max) >= 2.0**126:
        raise ValueError(
            f"tensor_scale: max(scale_fmt) * max(fmt) = {float(sf.max) * float(f.max):.4g} "
            f"({sf.name}, {f.name}) must be below 2**126, so that its reciprocal is a normal "
            "float32 (XLA flushes smaller ones to zero)"
        )
    shape = tuple(x.shape)
    block = block_shape_for(shape, r.block_shape, r.axis, ragged)
    logical = np.dtype(jnp.float32) if dt.name == "float64" else logical_dtype(dt)
    xf = jnp.asarray(np.asarray(x, np.float32) if isinstance(x, np.ndarray) else x)
    codes, scales, tscale = _quantize(
        xf.astype(jnp.float32),
        f.name,
        sf.name,
        rule,
        block,
        bool(saturate),
        ts,
        ee,
        _Rounding(rounding, nbits),
        key,
    )
    if packed and f.packable and codes.ndim:
        along = [d for d in range(len(shape)) if block[d] > 1]
        codes = pack(codes, f.name, axis=along[0] if along else -1)
    return QArray(codes, scales, tscale, f.name, sf.name, block, shape, logical, ee)


class _Rounding(NamedTuple):
    """The elements' rounding mode and random bits per element (0 unless stochastic)."""

    mode: str
    nbits: int


@functools.partial(
    jax.jit,
    static_argnames=("fmt", "scale_fmt", "rule", "block", "saturate", "ts", "ee", "rounding"),
)
def _quantize(x, fmt, scale_fmt, rule, block, saturate, ts, ee, rounding, key):
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
    tscale = tensor_scale(amax, bad, f, sf) if ts else None
    if rule in POW2_RULES:
        s_codes, e = pow2_scales(amax, bad, f, sf, rule, ee)
        y = times_pow2(x, broadcast_blocks(-(e + ee), block, shape))
    else:
        s_codes, s_eff = absmax_scales(amax, bad, f, sf, tscale)
        y = x * broadcast_blocks(jnp.float32(1) / s_eff, block, shape)
    y = jnp.where(broadcast_blocks(bad, block, shape), 0.0, y)
    codes = round_scaled(y, f, saturate, rounding.mode, key, rounding.nbits or None)
    return codes, s_codes, tscale


def round_scaled(
    y: jax.Array,
    fmt: FormatLike,
    saturate: bool = True,
    rounding: str = "nearest_even",
    key: jax.Array | None = None,
    random_bits: int | None = None,
) -> jax.Array:
    """The element codes of values already divided by their scales (f32): what
    :func:`quantize` does after the division, and what a caller with its own scales (a KV
    cache's fixed per-head scales) does the same way. With ``saturate`` the values are
    clamped to ``+-max(fmt)`` first; magnitudes below ``2**-126`` become zero (as XLA
    flushes them on CPU and TPU, not everywhere); then :func:`emulate.encode` rounds
    (``rounding``, ``key``, ``random_bits``: as there)."""
    f = formats.get(fmt)
    if saturate:
        y = jnp.clip(y, -float(f.max), float(f.max))
    y = jnp.where(jnp.abs(y) < F32_MIN_NORMAL, y * 0.0, y)
    return codecs.encode(
        y, f.name, saturate=saturate, rounding=rounding, key=key, random_bits=random_bits
    )
