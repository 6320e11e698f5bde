"""Block scales: which formats may hold them, and the scale a block of values gets from
its largest magnitude.

Scale formats (:func:`scale_format`, the one rule): bfloat16, float16, float32, and every
float format of at most 8 bits that has a NaN code (a block holding NaN or Inf gets a NaN
scale) and whose values lie within ``[2**-127, 2**128)`` (so that a scale and its
exponent are f32 quantities): float8_e8m0fnu, float8_e4m3fn and the other float8 types,
the P3109 formats and registered ones. float6 and float4 types have no NaN and are not
scale formats. A format without a numpy dtype holds its scales as uint8 codes.

With ``amax`` a block's largest magnitude and ``emax``, ``M`` the element format's largest
value written as ``M * 2**emax`` (``1 <= M < 2``; integers: ``emax = floor(log2(max))``,
so int8 gives 6 and int4 2), the rules (``SCALE_RULES``) are:

- ``ocp_floor``: ``2**(floor(log2 amax) - emax)`` (OCP MX v1.0, microxcaling, torchao FLOOR).
- ``round_up``: ``2**ceil(log2(amax / max))``, the smallest power of two at which nothing
  saturates (cuBLAS, JAX's scaled_dot_general quantizer, torchao RCEIL).
- ``ceil``: ``2**(ceil(log2 amax) - emax)`` (torchao CEIL).
- ``even``: ``2**(floor(log2 r) - emax)``, ``r`` = ``amax`` rounded to the element's
  mantissa width, carrying into the next binade (torchao EVEN).
- ``absmax``: ``amax * fl(1/max)`` rounded into the scale format, not a power of two.

Power-of-two exponents are clamped into the scale format's range (:func:`pow2_range`); an
all-zero block, or one holding NaN or Inf (``bad``), gets the smallest, and its scale
code is NaN for a bad block. Everything here works on f32 arrays of per-block values.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from emulate import formats
from emulate.formats import F32_MIN_NORMAL, Format, FormatLike
from emulate.numerics import codecs
from emulate.numerics.bits import f32_bits, frexp_bits, frexp_normal, pow2
from emulate.numerics.storage import to_codes

__all__ = [
    "POW2_RULES",
    "SCALE_FORMATS",
    "SCALE_RULES",
    "absmax_scales",
    "element_range",
    "is_scale_format",
    "pow2_exponent",
    "pow2_range",
    "pow2_scales",
    "reciprocal",
    "scale_frexp",
    "scale_format",
    "tensor_scale",
]

SCALE_RULES = ("ocp_floor", "round_up", "ceil", "even", "absmax")

#: The scale formats that have a numpy dtype (built in); :func:`scale_format` also accepts
#: the P3109 formats and registered ones, whose scales travel as uint8 codes.
SCALE_FORMATS = (
    "float8_e8m0fnu",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3b11fnuz",
    "float8_e3m4",
    "bfloat16",
    "float16",
    "float32",
)

_WIDE_SCALES = ("bfloat16", "float16", "float32")


def is_scale_format(f: Format) -> bool:
    """Whether block scales may be of format ``f`` (module docstring)."""
    if f.name in _WIDE_SCALES:
        return True
    return (
        f.is_float
        and f.bits <= 8
        and f.has_nan
        and float(f.min_subnormal) >= 2.0**-127
        and float(f.max) < 2.0**128
    )


def scale_format(fmt: FormatLike, arg: str = "scale_fmt") -> Format:
    """The record of scale format ``fmt``; ValueError naming ``arg`` for an unknown format
    or one that is not a scale format (:func:`is_scale_format`)."""
    try:
        f = formats.get(fmt, arg=arg)
    except (TypeError, ValueError):
        raise ValueError(
            f"{arg}: expected a scale format (one of {SCALE_FORMATS}, a P3109 or a registered "
            f"float format with a NaN code), got {fmt!r}"
        ) from None
    if not is_scale_format(f):
        raise ValueError(
            f"{arg}: {f.name} is not a scale format; expected bfloat16, float16, float32 or a "
            "float format of at most 8 bits with a NaN code and values within "
            f"[2**-127, 2**128) (such as {', '.join(SCALE_FORMATS[:3])} or a P3109 format)"
        )
    return f


POW2_RULES = ("ocp_floor", "round_up", "ceil", "even")


def element_range(fmt: FormatLike) -> tuple[int, float]:
    """``(emax, M)`` with the format's largest value ``max == M * 2**emax``, ``1 <= M < 2``."""
    f = formats.get(fmt)
    emax = math.floor(math.log2(float(f.max)))
    return emax, float(f.max) / 2.0**emax


def reciprocal(v: float) -> jax.Array:
    """``1 / v`` rounded once to f32 (0 where it overflows)."""
    return jnp.float32(np.float32(1.0 / v)) if math.isfinite(1.0 / v) else jnp.float32(0)


def scale_frexp(scales: jax.Array, scale_format: FormatLike) -> tuple[jax.Array, jax.Array]:
    """Each scale of ``scale_format`` (an array of its dtype, or its uint8 codes) as
    ``(m, e)``, ``scale == m * 2**e`` with ``1 <= |m| < 2`` (NaN and Inf: ``(themselves,
    0)``), taken from its bits by integer operations: nothing flushed, so e8m0's
    ``2**-127`` and f32 subnormal scales keep their value
    (:func:`emulate.numerics.bits.frexp_bits`)."""
    f = formats.get(scale_format)
    if f.is_low_precision:
        return _frexp_of_codes(to_codes(scales, f)[0], f.name)
    return _frexp_of_wide(jnp.asarray(scales))


# One program each (per shape) for a call outside a trace, not one per operation.
@functools.partial(jax.jit, static_argnames=("name",))
def _frexp_of_codes(codes: jax.Array, name: str) -> tuple[jax.Array, jax.Array]:
    return frexp_bits(codecs.decode_float_bits(codes, formats.get(name)))


@jax.jit
def _frexp_of_wide(scales: jax.Array) -> tuple[jax.Array, jax.Array]:
    return frexp_bits(f32_bits(scales))


def pow2_exponent(amax: jax.Array, f: Format, rule: str, ee: int = 0) -> jax.Array:
    """The unclamped int32 exponent of a power-of-two ``rule`` for blocks of largest
    magnitude ``amax`` (normal f32), elements of format ``f`` with implicit scale ``2**ee``."""
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


def pow2_range(sf: Format) -> tuple[int, int]:
    """The exponents a power-of-two scale of format ``sf`` can hold (normal values only:
    from ``log2(min_normal)``, rounded up for a format without subnormals, whose
    ``2**emin`` has no code)."""
    return max(math.ceil(math.log2(sf.min_normal)), -127), math.floor(math.log2(float(sf.max)))


def pow2_scales(
    amax: jax.Array, bad: jax.Array, f: Format, sf: Format, rule: str, ee: int
) -> tuple[jax.Array, jax.Array]:
    """Power-of-two block scales: ``(codes, e)``, the scales encoded in ``sf`` (NaN for a
    ``bad`` block) and their int32 exponents, clamped into :func:`pow2_range`."""
    lo, hi = pow2_range(sf)
    e = pow2_exponent(amax, f, rule, ee)
    e = jnp.where((amax == 0) | bad, lo, jnp.clip(e, lo, hi))
    return codecs.encode(jnp.where(bad, jnp.nan, pow2(e)), sf.name), e


def tensor_scale(amax: jax.Array, bad: jax.Array, f: Format, sf: Format) -> jax.Array:
    """The f32 scale of a whole tensor (NVFP4's second level): ``amax / (max(sf) * max(f))``
    over the finite blocks, 1 for an all-zero tensor, at least ``2**-126``."""
    t_amax = jnp.max(jnp.where(bad, 0.0, amax)) if amax.size else jnp.float32(0)
    t = t_amax * reciprocal(float(sf.max) * float(f.max))
    return jnp.where(t_amax == 0, jnp.float32(1), jnp.maximum(t, F32_MIN_NORMAL))


def absmax_scales(
    amax: jax.Array, bad: jax.Array, f: Format, sf: Format, tscale: jax.Array | None
) -> tuple[jax.Array, jax.Array]:
    """``absmax`` block scales: ``(codes, s_eff)``, the scales ``amax * fl(1/max(f))``
    (divided by ``tscale`` when given) encoded in ``sf`` (NaN for a ``bad`` block), and the
    f32 value each block's elements are divided by (the decoded scale times ``tscale``).

    Multiplications by f32 reciprocals, not divisions: XLA rewrites a division by a
    constant or a broadcast into one anyway, so this is what it would compute."""
    s = amax * reciprocal(float(f.max))
    if tscale is not None:
        s = s * (jnp.float32(1) / tscale)
    s = jnp.clip(s, F32_MIN_NORMAL, float(sf.max))  # zero blocks, f32 underflow
    # the format named: uint8 codes of a format without a dtype would read as uint8
    s_dec = codecs.decode(codecs.encode(s, sf.name), sf.name, to=jnp.float32)
    s_dec = jnp.where(s_dec == 0, jnp.float32(float(sf.min_subnormal)), s_dec)
    codes = codecs.encode(jnp.where(bad, jnp.nan, s_dec), sf.name)
    s_eff = jnp.maximum(s_dec * tscale if tscale is not None else s_dec, F32_MIN_NORMAL)
    return codes, s_eff
