"""Block-scaled quantization in the oracle: :func:`quantize` and :func:`dequantize`, in
numpy float64 with the rounding of :mod:`emulate.reference.rounding`."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from emulate import formats
from emulate.formats import F32_MIN_NORMAL, FormatLike
from emulate.reference.decoding import decode
from emulate.reference.rounding import encode

__all__ = ["dequantize", "quantize"]


def _blockwise_max(a: np.ndarray, block: tuple[int, ...]) -> np.ndarray:
    """Max of ``a`` (float64, >= 0 or NaN) over each block; ragged last blocks allowed."""
    out = a
    for d, b in enumerate(block):
        n = out.shape[d]
        starts = np.arange(0, n, b) if n else np.zeros(0, int)
        if len(starts):
            out = np.maximum.reduceat(out, starts, axis=d)
    return out


def _repeat_blocks(s: np.ndarray, block: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    for d, b in enumerate(block):
        s = np.repeat(s, b, axis=d)
    return s[tuple(slice(0, n) for n in shape)]


def _scale_exponent(amax: float, f: formats.Format, rule: str) -> int:
    """The power-of-two scale exponent of one block, by the rule's definition."""
    emax = math.floor(math.log2(float(f.max)))
    m, e = math.frexp(amax)  # amax = m * 2**e, 0.5 <= m < 1
    floor_log2 = e - 1
    if rule == "ocp_floor":
        return floor_log2 - emax
    if rule == "ceil":
        return floor_log2 - emax + (amax != 2.0**floor_log2)
    if rule == "round_up":  # smallest E with amax <= max * 2**E
        e0 = floor_log2 - emax
        return e0 if amax <= math.ldexp(float(f.max), e0) else e0 + 1
    if rule == "even":
        mb = f.mantissa_bits if f.is_float else f.bits - 2
        r = round(math.ldexp(amax, mb - floor_log2)) * 2.0 ** (floor_log2 - mb)
        return math.floor(math.log2(r)) - emax
    raise ValueError(f"scale_rule: unknown rule {rule!r}")


def _scale_range(sf: formats.Format) -> tuple[int, int]:
    if sf.name == "float8_e8m0fnu":
        return -127, 127
    # the smallest normal power of two (without subnormals, 2**emin has no code)
    return math.ceil(math.log2(float(sf.min_normal))), math.floor(math.log2(float(sf.max)))


def quantize(
    x: npt.ArrayLike,
    fmt: FormatLike,
    block_shape: tuple[int, ...],
    *,
    scale_fmt: FormatLike = "float8_e8m0fnu",
    scale_rule: str = "ocp_floor",
    saturate: bool = True,
    tensor_scale: bool = False,
    element_exponent: int = 0,
    rounding: str = "nearest_even",
    random_values: npt.ArrayLike | None = None,
    random_bits: int | None = None,
) -> tuple[np.ndarray, np.ndarray, float | None]:
    """Block-scaled quantization by the rules of :func:`emulate.quantize`, in float64 numpy.
    The elements are rounded by :func:`emulate.reference_rounding.encode` (``rounding``,
    ``random_values`` of ``x``'s shape, ``random_bits``) after scaled values below
    ``2**-126`` are made zero, as XLA flushes them.

    ``element_exponent``: each element stands for ``code * 2**element_exponent`` (OCP
    MXINT8: -6, int8 as fixed point with six fraction bits), and the power-of-two rules
    take the element's largest exponent as ``floor(log2 max) + element_exponent``.

    Returns ``(codes, scales, tensor_scale)``: ``codes`` an ml_dtypes array of ``fmt``
    (int8 / int4 for integers; uint8 codes for a format without a type), ``scales`` of
    ``scale_fmt``, shape
    ``ceil(x.shape / block_shape)``; ``tensor_scale`` a float (or None).
    """
    f, sf = formats.get(fmt), formats.get(scale_fmt)
    x = np.asarray(x, np.float32).astype(np.float64)
    with np.errstate(invalid="ignore"):
        x = np.where(np.abs(x) < F32_MIN_NORMAL, 0.0 * x, x)
    shape = x.shape
    block = tuple(block_shape)
    with np.errstate(invalid="ignore"):
        amax = _blockwise_max(np.abs(x), block)
    bad = ~np.isfinite(amax)
    ts = None
    if tensor_scale:
        t_amax = float(np.max(np.where(bad, 0.0, amax), initial=0.0))
        inv = np.float32(1.0 / (float(sf.max) * float(f.max)))
        ts = 1.0 if t_amax == 0 else max(float(np.float32(t_amax) * inv), F32_MIN_NORMAL)
    if scale_rule == "absmax":
        with np.errstate(invalid="ignore", over="ignore"):
            s = np.float32(amax) * np.float32(1.0 / float(f.max))
            if ts is not None:
                s = s * (np.float32(1) / np.float32(ts))
        clipped = np.asarray(np.clip(s, np.float32(F32_MIN_NORMAL), np.float32(sf.max)))
        s_dec = decode(_scale_codes(clipped, sf), sf.name, to=np.float64)
        scale = np.where(s_dec == 0, float(sf.min_subnormal), s_dec)
        eff = scale if ts is None else np.float32(scale) * np.float32(ts)
        eff = np.maximum(np.asarray(eff, np.float32), np.float32(F32_MIN_NORMAL))
        inv_eff = np.float32(1) / eff
        with np.errstate(invalid="ignore", over="ignore"):
            y = (np.float32(x) * _repeat_blocks(inv_eff, block, shape)).astype(np.float64)
    else:
        lo, hi = _scale_range(sf)
        exps = np.zeros(amax.shape, np.int64)
        for idx in np.ndindex(amax.shape):
            a = float(amax[idx])
            if bad[idx] or a == 0:
                exps[idx] = lo
            else:
                e = _scale_exponent(a, f, scale_rule) - element_exponent
                exps[idx] = min(max(e, lo), hi)
        scale = np.ldexp(1.0, exps)
        y = np.ldexp(x, -_repeat_blocks(exps + element_exponent, block, shape))
    if saturate:
        y = np.clip(y, -float(f.max), float(f.max))
    y = np.where(_repeat_blocks(bad, block, shape), 0.0, y)
    y = np.where(np.abs(y) < F32_MIN_NORMAL, 0.0 * y, y)
    rv, n = random_values, random_bits
    codes = encode(y, f, saturate=saturate, rounding=rounding, random_values=rv, random_bits=n)
    scale = np.where(bad, np.nan, scale)
    return codes, _scale_codes(scale, sf), ts


def _scale_codes(s: np.ndarray, sf: formats.Format) -> np.ndarray:
    """Scales rounded to nearest even into ``sf``: ml_dtypes' cast where ``sf`` has a dtype,
    else the record's codes (uint8, :mod:`emulate.reference.codes`)."""
    if sf.has_dtype:
        return np.asarray(s).astype(sf.dtype)
    return encode(np.asarray(s, np.float64), sf)


def _round24(v: np.ndarray) -> np.ndarray:
    """Round float64 values to 24 significant bits (f32 precision, unbounded exponent)."""
    with np.errstate(invalid="ignore"):
        m, e = np.frexp(v)
        r = np.ldexp(np.round(np.ldexp(m, 24)), e - 24)
    return np.where(np.isfinite(v), r, v)


def dequantize(
    codes: npt.ArrayLike,
    scales: npt.ArrayLike,
    block_shape: tuple[int, ...],
    tensor_scale: float | None = None,
    element_exponent: int = 0,
    fmt: FormatLike | None = None,
    scale_fmt: FormatLike | None = None,
    *,
    exact: bool = False,
) -> np.ndarray:
    """``decode(codes) * 2**element_exponent * (scale * tensor_scale)`` as float32: each
    product rounded to 24 significant bits, results below ``2**-126`` in magnitude flushed
    to (signed) zero. ``fmt`` and ``scale_fmt`` name the formats of uint8 ``codes`` and
    ``scales`` (as :func:`quantize` returns them for a format without an ml_dtypes type);
    scales are read exactly, f32 subnormals and e8m0's ``2**-127`` included. With
    ``exact``, the products unrounded, as float64 (exact: a code has at most 16
    significant bits, a scale 24), none flushed, none past float32's range made Inf."""
    v = np.asarray(codes) if fmt is None else decode(codes, fmt, to=np.float64)
    v = np.ldexp(v.astype(np.float64), element_exponent)
    s = np.asarray(scales) if scale_fmt is None else decode(scales, scale_fmt, to=np.float64)
    s = s.astype(np.float64)
    if tensor_scale is not None:
        s = _round24(s * tensor_scale)
    with np.errstate(invalid="ignore", over="ignore"):
        r = v * _repeat_blocks(s, tuple(block_shape), v.shape)
        if exact:
            return r
        r = _round24(r)
        r = np.where(np.abs(r) < F32_MIN_NORMAL, 0.0 * r, r)
        return r.astype(np.float32)
