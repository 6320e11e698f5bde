"""Hypothesis strategies for low-precision matmul problems.

:func:`formats`, :func:`codes`, :func:`arrays` and :func:`dot_general_problems` draw
low-precision formats, raw codes, arrays and whole ``dot_general`` problems (operands,
dimension numbers, result type). Every strategy draws raw codes, so each format's special
values (NaN, +-Inf, +-0, +-max, the smallest normal and subnormal values, +-1) are boosted:
they are drawn far more often than a uniform draw over codes would give them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

import hypothesis.extra.numpy as hnp
import ml_dtypes
import numpy as np
from hypothesis import strategies as st

from emulate import formats as _formats
from emulate.formats import Format, FormatLike
from emulate.numerics.storage import Packed, pack
from emulate.reference.codes import decode_codes, encode_values

__all__ = [
    "DEFAULT_LAYOUTS",
    "LONG_K_LAYOUT",
    "WIDE_RANGE",
    "DimensionNumbers",
    "DotProblem",
    "Layout",
    "arrays",
    "codes",
    "dot_general_problems",
    "finite_codes",
    "formats",
    "odd_extreme_codes",
    "result_types",
    "special_codes",
]

_Axes = tuple[int, ...]
DimensionNumbers = tuple[tuple[_Axes, _Axes], tuple[_Axes, _Axes]]
Layout = tuple[tuple[int, ...], tuple[int, ...], DimensionNumbers]

_MATMUL: DimensionNumbers = (((1,), (0,)), ((), ()))

# The three constants below are documented where emulate.testing re-exports them.
DEFAULT_LAYOUTS: tuple[Layout, ...] = (
    ((3, 1), (1, 2), _MATMUL),
    ((2, 5), (5, 3), _MATMUL),
    ((5, 2), (3, 5), (((0,), (1,)), ((), ()))),
    ((2, 3, 4), (4, 2, 3), (((1, 2), (2, 0)), ((0,), (1,)))),
    ((4, 2, 3), (3, 2, 4), (((0,), (2,)), ((1,), (1,)))),
    ((7,), (7,), (((0,), (0,)), ((), ()))),
    ((2, 33), (33, 2), _MATMUL),
)

LONG_K_LAYOUT: Layout = ((1, 1100), (1100, 2), _MATMUL)

WIDE_RANGE = 2.0**14

_ELEMENTS = ("all", "finite", "normal")


def _all_codes(f: Format) -> np.ndarray:
    return np.arange(1 << f.bits, dtype=np.uint64)


def _values(codes: list[int] | np.ndarray, f: Format) -> np.ndarray:
    """float64 values of codes of a low-precision format (ml_dtypes or the record's oracle)."""
    c = np.asarray(codes, np.uint8)
    return c.view(f.dtype).astype(np.float64) if f.has_dtype else decode_codes(c, f)


def _codes(values: np.ndarray, f: Format) -> np.ndarray:
    """uint8 codes of float64 values (each held by the format), as its cast gives them."""
    with np.errstate(invalid="ignore", over="ignore"):
        if not f.has_dtype:
            return encode_values(values, f)
        return values.astype(f.dtype).view(np.uint8) & np.uint8(f.code_mask)


def finite_codes(fmt: FormatLike) -> list[int]:
    """Every code of the low-precision format ``fmt`` whose value is finite."""
    f = _formats.get(fmt)
    bad = set(f.nan_codes) | set(f.inf_codes)
    return [int(c) for c in _all_codes(f) if int(c) not in bad]


def special_codes(fmt: FormatLike, *, finite: bool = False) -> list[int]:
    """Codes of the edge values: zeros, +-max, +-min normal, +-min subnormal, +-1, NaN, Inf.

    Empty for formats wider than 8 bits. With ``finite``, NaN and Inf codes are left out.
    """
    f = _formats.get(fmt)
    if f.bits > 8:
        return []
    values = np.array(
        [0.0, -0.0, f.max, f.min, f.min_normal, -f.min_normal, f.min_subnormal, -f.min_subnormal]
        + [1.0, -1.0],
        np.float64,
    )
    out = sorted({int(c) for c in _codes(values, f)})
    if not finite:
        out += list(f.nan_codes) + list(f.inf_codes)
    keep = set(finite_codes(f)) if finite else set(range(1 << f.bits))
    return sorted(set(c for c in out if c in keep))


def _check_elements(elements: str) -> None:
    if elements not in _ELEMENTS:
        raise ValueError(f"elements: expected 'all', 'finite' or 'normal', got {elements!r}")


def codes(fmt: FormatLike, *, elements: str = "all") -> st.SearchStrategy[int]:
    """One code of ``fmt``: ``elements`` is "all", "finite" or "normal" (no subnormals, no zero).

    Half of the draws come from :func:`special_codes`, half from all the allowed codes.
    """
    f = _formats.get(fmt)
    _check_elements(elements)
    pool = list(range(1 << f.bits)) if elements == "all" else finite_codes(f)
    if elements == "normal" and f.is_float:
        pool = [c for c, v in zip(pool, _values(pool, f)) if abs(v) >= f.min_normal]
    specials = [c for c in special_codes(f, finite=elements != "all") if c in set(pool)]
    return st.one_of(st.sampled_from(specials or pool), st.sampled_from(pool))


def _extreme_codes(f: Format) -> list[int]:
    """Codes of the largest-magnitude finite values (``max`` and, if as large, ``min``)."""
    big = max(abs(f.max), abs(f.min))
    values = np.array([v for v in (f.max, f.min) if abs(v) == big], np.float64)
    return sorted({int(c) for c in _codes(values, f)})


def _wide_values(f: Format, elements: str) -> st.SearchStrategy[float]:
    """Values of a wide float type, specials boosted (as Python floats, exact in ``f``)."""
    tiny = float(ml_dtypes.finfo(f.dtype).smallest_subnormal)
    normal = float(ml_dtypes.finfo(f.dtype).smallest_normal)
    specials = [1.0, -1.0, normal, -normal, WIDE_RANGE, -WIDE_RANGE]
    if elements != "normal":
        specials += [0.0, -0.0, tiny, -tiny]
    if elements == "all":
        specials += [math.inf, -math.inf, math.nan]
    width: Literal[16, 32] = 16 if f.name == "float16" else 32
    spread = st.floats(-WIDE_RANGE, WIDE_RANGE, width=width, allow_subnormal=False)
    if elements == "normal":
        spread = spread.filter(lambda v: abs(v) >= 2.0**-14)  # normal in float16 too
    return st.one_of(st.sampled_from(specials), spread)


def arrays(
    fmt: FormatLike,
    shape: tuple[int, ...] | st.SearchStrategy[tuple[int, ...]],
    *,
    elements: str = "all",
    fill: str | None = None,
) -> st.SearchStrategy[np.ndarray | Packed]:
    """A numpy array of ``fmt``'s dtype (ml_dtypes), ``shape`` an int tuple or a strategy;
    for a format without a dtype (P3109, yours: :func:`emulate.formats.register`) a
    :class:`emulate.Packed` array packed along its last axis (shapes need one).

    Args:
      fmt: a low-precision format, or a wide float type (bfloat16, float16, float32),
        whose values are drawn in ``[-WIDE_RANGE, WIDE_RANGE]`` with 0, +-1, the smallest
        normal and subnormal values (flushed by XLA on CPU and TPU) and Inf/NaN boosted.
      shape: the array shape, or a strategy of shapes.
      elements: "all" (NaN and Inf included), "finite", or "normal" (no zero, no
        subnormals).
      fill: the background of the array (hypothesis draws large arrays as one background
        value with a sparse few elements drawn apart):

        - None: hypothesis' default, a background drawn like the elements;
        - "extreme": a largest-magnitude finite value (``max`` or ``min``;
          ``+-WIDE_RANGE`` for the wide types), so that long contractions have sums that
          outgrow a naive float32 accumulator;
        - "odd_extreme": the largest-magnitude finite values whose last significand bit
          is set (int8: +-127, not -128; int4: +-7; float8_e4m3fn: +-416; bfloat16: the
          largest value below ``WIDE_RANGE``), so that products are odd multiples of
          their quantum and a float32 running sum past ``2**24`` quanta must drop units
          (products of -128, ``2**14``, add exactly far beyond ``2**24``). Half of the
          arrays are the background alone, with no element drawn apart;
        - a number: that value as the background (it must be a value of ``fmt``).

    Raises:
      ValueError: an unknown ``elements`` or ``fill``, a ``fill`` value ``fmt`` cannot
        hold, or a format these strategies do not draw (int32).
    """
    f = _formats.get(fmt)
    _check_elements(elements)
    wide = f.name in _formats.WIDE_FLOATS
    if not wide and f.bits > 8:
        raise ValueError(
            f"fmt: arrays draws the low-precision formats and {', '.join(_formats.WIDE_FLOATS)}, "
            f"got {f.name}"
        )
    background = _background(f, fill)
    if wide:
        values = _wide_values(f, elements)
        raw = hnp.arrays(np.float64, shape, elements=values, fill=background)
    else:
        raw = hnp.arrays(np.uint8, shape, elements=codes(f, elements=elements), fill=background)
    if fill == "odd_extreme" and background is not None:
        shapes = shape if isinstance(shape, st.SearchStrategy) else st.just(shape)
        dtype = np.float64 if wide else np.uint8
        bare = st.builds(np.full, shapes, background, st.just(dtype))
        raw = st.one_of(bare, raw)
    if wide:
        return raw.map(lambda a: a.astype(f.dtype))
    if not f.has_dtype:  # no array type names the format: a Packed array does
        return raw.map(lambda a: pack(a, f, axis=-1))
    return raw.map(lambda a: a.view(f.dtype))


def _background(f: Format, fill: object) -> st.SearchStrategy | None:
    """The strategy of an array's background value (float64 values for the wide types,
    uint8 codes otherwise) for :func:`arrays`' ``fill``."""
    wide = f.name in _formats.WIDE_FLOATS
    if fill is None:
        return None
    if fill == "extreme":
        return st.sampled_from([WIDE_RANGE, -WIDE_RANGE] if wide else _extreme_codes(f))
    if fill == "odd_extreme":
        if wide:
            below = float(np.nextafter(f.dtype.type(WIDE_RANGE), f.dtype.type(0)))
            return st.sampled_from([below, -below])
        return st.sampled_from(odd_extreme_codes(f))
    if isinstance(fill, (int, float, np.integer, np.floating)) and not isinstance(fill, bool):
        v = float(fill)
        if wide:
            with np.errstate(invalid="ignore", over="ignore"):
                back = float(np.asarray([v]).astype(f.dtype).astype(np.float64)[0])
        else:
            code = int(_codes(np.asarray([v]), f)[0])
            back = float(_values([code], f)[0])
        if not (back == v or (math.isnan(v) and math.isnan(back))):
            raise ValueError(
                f"fill: {fill!r} is not a value of {f.name} (it would be stored as {back!r}); "
                f"give a value {f.name} holds"
            )
        if wide:
            return st.just(v)
        return st.just(code)
    raise ValueError(
        f"fill: expected None, 'extreme', 'odd_extreme' or a value of {f.name}, got {fill!r}"
    )


def odd_extreme_codes(fmt: FormatLike) -> list[int]:
    """Codes of the largest-magnitude finite values of ``fmt`` whose last significand bit is
    set (odd integers; floats with an odd mantissa): both signs where the format has them.

    int8: 127 and -127 (codes 0x7f, 0x81); int4: +-7; uint8: 255; float8_e4m3fn: +-416;
    float4_e2m1fn: +-6. Their products are odd multiples of the products' quantum.
    """
    f = _formats.get(fmt)
    finite = np.array([c for c in finite_codes(f) if c & 1], np.uint8)
    values = np.abs(_values(finite, f))
    return sorted(int(c) for c in finite[values == values.max()])


def formats(
    *, include_scale: bool = False, include_registered: bool = False
) -> st.SearchStrategy[Format]:
    """A low-precision :class:`emulate.Format` (float8_e8m0fnu only with ``include_scale``;
    the P3109 formats and yours of at most 8 bits, :func:`emulate.formats.registered`, with
    ``include_registered``, the scale-only p3109_k8p1ue again only with ``include_scale``;
    the wide P3109 formats, whose uint16 codes :func:`arrays` does not draw, never)."""
    names = _formats.LOW_PRECISION if include_scale else _formats.LOW_PRECISION_OPERANDS
    if include_registered:
        more = [
            n
            for n in _formats.registered()
            if (include_scale or not _formats.get(n).is_scale_only) and _formats.get(n).bits <= 8
        ]
        names = names + tuple(more)
    return st.sampled_from([_formats.get(n) for n in names])


def result_types(lhs: FormatLike, rhs: FormatLike) -> list[str | None]:
    """The ``preferred_element_type`` values worth checking for an operand pair.

    Integer pairs: None (the sum wraps into the operand type), int32, float32 and bfloat16
    (the exact sum rounded once). Other pairs: None where the result type
    ``lax.dot_general`` gives is one XLA can hold and JAX accepts, then float32 and
    bfloat16.
    """
    a, b = _formats.get(lhs), _formats.get(rhs)
    if a.is_integer and b.is_integer:
        return [None, "int32", "float32", "bfloat16"]
    try:
        storable = _formats.dot_result(a, b).xla_storable
    except TypeError:
        storable = False
    return ([None] if storable else []) + ["float32", "bfloat16"]


class DotProblem(NamedTuple):
    """One ``dot_general`` call: ``lhs, rhs, dimension_numbers, preferred_element_type``.

    ``preferred_element_type`` is a format name (``"float32"``) or None.
    """

    lhs: np.ndarray | Packed
    rhs: np.ndarray | Packed
    dimension_numbers: DimensionNumbers
    preferred_element_type: str | None


def dot_general_problems(
    lhs_fmt: FormatLike | None = None,
    rhs_fmt: FormatLike | None = None,
    *,
    layouts: Sequence[Layout] | st.SearchStrategy[Layout] | None = None,
    preferred_element_types: Sequence[FormatLike | None] | None = None,
    elements: str = "all",
    fill: str | None = None,
) -> st.SearchStrategy[DotProblem]:
    """A :class:`DotProblem`: operands of two formats, dimension numbers and a result type.

    Args:
      lhs_fmt, rhs_fmt: operand formats (names, dtypes or Formats; low-precision or
        bfloat16/float16/float32). None draws one from :func:`formats`.
      layouts: ``(lhs_shape, rhs_shape, dimension_numbers)`` triples to draw from, or a
        strategy of them; default :data:`DEFAULT_LAYOUTS`. A fixed pool keeps the number
        of compiled programs small.
      preferred_element_types: the result types to draw from (None among them for lax's
        own rule); default :func:`result_types` of the pair.
      elements, fill: as for :func:`arrays`.

    The drawn problem unpacks as ``lhs, rhs, dimension_numbers, preferred_element_type``.
    """
    _check_elements(elements)
    if layouts is None:
        layouts = DEFAULT_LAYOUTS
    layout_st = layouts if isinstance(layouts, st.SearchStrategy) else st.sampled_from(layouts)
    fixed = [None if f is None else _formats.get(f) for f in (lhs_fmt, rhs_fmt)]

    @st.composite
    def problem(draw: st.DrawFn) -> DotProblem:
        lf = fixed[0] if fixed[0] is not None else draw(formats(), label="lhs format")
        rf = fixed[1] if fixed[1] is not None else draw(formats(), label="rhs format")
        pets = preferred_element_types
        if pets is None:
            pets = result_types(lf, rf)
        pet = draw(st.sampled_from(list(pets)), label="preferred_element_type")
        pet = None if pet is None else _formats.get(pet).name
        lshape, rshape, dn = draw(layout_st, label="layout")
        lhs = draw(arrays(lf, lshape, elements=elements, fill=fill), label="lhs")
        rhs = draw(arrays(rf, rshape, elements=elements, fill=fill), label="rhs")
        return DotProblem(lhs, rhs, dn, pet)

    return problem()
