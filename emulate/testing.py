"""Building blocks for numeric-validation suites: hypothesis strategies and assertions.

Strategies
  :func:`formats`, :func:`codes`, :func:`arrays` and :func:`dot_general_problems` draw
  low-precision formats, raw codes, arrays and whole ``dot_general`` problems (operands,
  dimension numbers, result type). Every strategy draws raw codes, so each format's special
  values (NaN, +-Inf, +-0, +-max, the smallest normal and subnormal values, +-1) are
  boosted: they are drawn far more often than a uniform draw over codes would give them.

Assertions
  :func:`assert_matches_reference` checks a result against :mod:`emulate.reference` under
  the numerics contract (bit for bit for the exact classes and mode "exact", within
  :func:`emulate.bounds.dot_general_bound` for the other pairs in mode "fast"), and names
  the first mismatching element, its value, the reference's and the exact sum.
  :func:`compare` returns the same verdict as a :class:`Comparison`, with the largest
  error in ulps of the result type.

Helpers
  :func:`reproducer` writes a problem as a ready-to-run Python script;
  :func:`representative_targets` picks one target per distinct plan, so that a suite
  checks each program once.

This module needs ``hypothesis`` (a dependency of ``emulate``); ``import emulate`` alone
does not import it.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import Any, Literal, NamedTuple

import hypothesis.extra.numpy as hnp
import numpy as np
import numpy.typing as npt
from hypothesis import strategies as st

from emulate import bounds, reference
from emulate import formats as _formats
from emulate import targets as _targets
from emulate.formats import Format, FormatLike
from emulate.planning.exactness import exact_class
from emulate.planning.plan import MODES, Plan
from emulate.planning.plan import plan as _make_plan

__all__ = [
    "DEFAULT_LAYOUTS",
    "LONG_K_LAYOUT",
    "WIDE_RANGE",
    "Comparison",
    "DotProblem",
    "Mismatch",
    "arrays",
    "assert_matches_reference",
    "codes",
    "compare",
    "dot_general_problems",
    "finite_codes",
    "formats",
    "plan_key",
    "representative_targets",
    "reproducer",
    "result_types",
    "special_codes",
]

_Axes = tuple[int, ...]
DimensionNumbers = tuple[tuple[_Axes, _Axes], tuple[_Axes, _Axes]]
Layout = tuple[tuple[int, ...], tuple[int, ...], DimensionNumbers]

_MATMUL: DimensionNumbers = (((1,), (0,)), ((), ()))

#: The shapes and dimension numbers :func:`dot_general_problems` draws from by default: a
#: fixed pool, so that compiled programs are reused across examples. K = 1, odd sizes,
#: contracting dims first, two contracting dims in permuted order with a batch dim, a
#: batch dim that is not first, no free dims, and K = 33.
DEFAULT_LAYOUTS: tuple[Layout, ...] = (
    ((3, 1), (1, 2), _MATMUL),
    ((2, 5), (5, 3), _MATMUL),
    ((5, 2), (3, 5), (((0,), (1,)), ((), ()))),
    ((2, 3, 4), (4, 2, 3), (((1, 2), (2, 0)), ((0,), (1,)))),
    ((4, 2, 3), (3, 2, 4), (((0,), (2,)), ((1,), (1,)))),
    ((7,), (7,), (((0,), (0,)), ((), ()))),
    ((2, 33), (33, 2), _MATMUL),
)

#: K = 1100: with ``fill="extreme"`` operands, int8 x int8 sums pass 2**24, where a naive
#: float32 running sum starts dropping odd units.
LONG_K_LAYOUT: Layout = ((1, 1100), (1100, 2), _MATMUL)

#: Values drawn for the wide float types (bfloat16, float16, float32) lie in
#: ``[-WIDE_RANGE, WIDE_RANGE]``, plus the boosted special values.
WIDE_RANGE = 2.0**14

_ELEMENTS = ("all", "finite", "normal")


# --------------------------------------------------------------------------- strategies


def _all_codes(f: Format) -> np.ndarray:
    return np.arange(1 << f.bits, dtype=np.uint64)


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
    with np.errstate(invalid="ignore", over="ignore"):
        enc = values.astype(f.dtype).view(np.uint8)
    out = sorted({int(c) & f.code_mask for c in enc})
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
        vals = np.array(pool, np.uint8).view(f.dtype).astype(np.float64)
        pool = [c for c, v in zip(pool, vals) if abs(v) >= f.min_normal]
    specials = [c for c in special_codes(f, finite=elements != "all") if c in set(pool)]
    return st.one_of(st.sampled_from(specials or pool), st.sampled_from(pool))


def _extreme_codes(f: Format) -> list[int]:
    """Codes of the largest-magnitude finite values (``max`` and, if as large, ``min``)."""
    big = max(abs(f.max), abs(f.min))
    values = np.array([v for v in (f.max, f.min) if abs(v) == big], np.float64)
    return sorted({int(c) & f.code_mask for c in values.astype(f.dtype).view(np.uint8)})


def _wide_values(f: Format, elements: str) -> st.SearchStrategy[float]:
    """Values of a wide float type, specials boosted (as Python floats, exact in ``f``)."""
    tiny = float(np.finfo(f.dtype).smallest_subnormal)
    normal = float(np.finfo(f.dtype).smallest_normal)
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
) -> st.SearchStrategy[np.ndarray]:
    """A numpy array of ``fmt``'s dtype (ml_dtypes), ``shape`` an int tuple or a strategy.

    Args:
      fmt: a low-precision format, or a wide float type (bfloat16, float16, float32),
        whose values are drawn in ``[-WIDE_RANGE, WIDE_RANGE]`` with 0, +-1, the smallest
        normal and subnormal values (flushed by XLA on CPU and TPU) and Inf/NaN boosted.
      shape: the array shape, or a strategy of shapes.
      elements: "all" (NaN and Inf included), "finite", or "normal" (no zero, no
        subnormals).
      fill: None (hypothesis' default: large arrays are one drawn background value with a
        sparse few elements drawn apart), or "extreme": the background is a
        largest-magnitude finite value (``max`` or ``min``; ``+-WIDE_RANGE`` for the wide
        types), so long contractions have sums that outgrow a naive float32 accumulator.

    Raises:
      ValueError: an unknown ``elements`` or ``fill``, or a format these strategies do not
        draw (int32).
    """
    f = _formats.get(fmt)
    _check_elements(elements)
    if fill not in (None, "extreme"):
        raise ValueError(f"fill: expected None or 'extreme', got {fill!r}")
    if f.name in _formats.WIDE_FLOATS:
        values = _wide_values(f, elements)
        background = None
        if fill == "extreme":
            background = st.sampled_from([WIDE_RANGE, -WIDE_RANGE])
        raw = hnp.arrays(np.float64, shape, elements=values, fill=background)
        return raw.map(lambda a: a.astype(f.dtype))
    if f.bits > 8:
        raise ValueError(
            f"fmt: arrays draws the low-precision formats and {', '.join(_formats.WIDE_FLOATS)}, "
            f"got {f.name}"
        )
    background = st.sampled_from(_extreme_codes(f)) if fill == "extreme" else None
    raw = hnp.arrays(np.uint8, shape, elements=codes(f, elements=elements), fill=background)
    return raw.map(lambda a: a.view(f.dtype))


def formats(*, include_scale: bool = False) -> st.SearchStrategy[Format]:
    """A low-precision :class:`emulate.Format` (float8_e8m0fnu only with ``include_scale``)."""
    names = _formats.LOW_PRECISION if include_scale else _formats.LOW_PRECISION_OPERANDS
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

    lhs: np.ndarray
    rhs: np.ndarray
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


# --------------------------------------------------------------------------- comparison


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """The first element of a result outside the contract.

    Attributes:
      index: its index in the result.
      got: the result's value there (a Python int or float).
      want: the reference's value (:func:`emulate.reference.dot_general`: the exact sum
        rounded once).
      exact: the exact sum, a :class:`fractions.Fraction` (or a float NaN / +-Inf where
        IEEE rules give one).
      allowed: for bounded pairs, the interval ``(lo, hi)`` the contract allows: the
        roundings of ``exact - bound`` and ``exact + bound`` into the result type.
      bound: for bounded pairs, :func:`emulate.bounds.dot_general_bound` there.
    """

    index: tuple[int, ...]
    got: Any
    want: Any
    exact: Any
    allowed: tuple[float, float] | None = None
    bound: float | None = None


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The verdict of :func:`compare`.

    Attributes:
      lhs, rhs, out: the operand and result format names.
      mode: "fast" or "exact".
      contract: "exact" (bit for bit with the reference; NaN matches NaN and the sign of
        a zero is ignored) or "bounded" (within the bound of mode "fast").
      size: the number of result elements.
      mismatches: how many elements break the contract (all of them, ``size``, when the
        result has the wrong dtype or shape).
      max_ulps: the largest distance between the result and the reference, in ulps of
        the result type (steps between neighbouring values; for integers, units); ``inf``
        where one is NaN and the other is not. 0 when bit for bit.
      worst_ratio: bounded pairs: over the finite elements, the largest ratio of the
        smallest bound that admits the element (``r`` between the roundings of
        ``exact - B`` and ``exact + B`` into the result type) to the contract's bound: 0
        where ``r`` is the correctly rounded exact value, at most 1 within the contract;
        None for the exact contract.
      first: the first mismatching element, or None.
      problem: a dtype or shape disagreement, or None.
    """

    lhs: str
    rhs: str
    out: str
    mode: str
    contract: str
    size: int
    mismatches: int
    max_ulps: float
    worst_ratio: float | None
    first: Mismatch | None = None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.mismatches == 0 and self.problem is None

    def report(self) -> str:
        """A few lines that say what differs, or that nothing does."""
        words = {
            "exact": "bit for bit with the reference",
            "bounded": "within emulate.bounds.dot_general_bound",
        }[self.contract]
        what = f"{self.lhs} x {self.rhs} -> {self.out}, mode {self.mode!r}, contract: {words}"
        if self.problem is not None:
            return f"{self.problem} ({what})"
        if self.ok:
            return f"result matches emulate.reference in all {self.size} elements ({what})"
        lines = [
            f"result differs from emulate.reference in {self.mismatches} of {self.size} "
            f"elements ({what})"
        ]
        m = self.first
        if m is not None:
            lines.append(
                f"first mismatch at index {m.index}: got {m.got!r}, want {m.want!r}; "
                f"exact value {_exact_words(m.exact)}"
            )
            if m.allowed is not None:
                lines.append(f"allowed: [{m.allowed[0]!r}, {m.allowed[1]!r}] (bound {m.bound!r})")
        ulps = _ulps_words(self.max_ulps)
        lines.append(f"max error: {ulps} {'ulp' if ulps == '1' else 'ulps'} of {self.out}")
        return "\n".join(lines)


def _exact_words(e: Fraction | float) -> str:
    if isinstance(e, Fraction):
        return f"Fraction({e.numerator}, {e.denominator}) = {float(e)!r}"
    return repr(float(e))


def _ulps_words(u: float) -> str:
    if math.isinf(u):
        return "inf"
    return f"{u:.0f}" if u == int(u) else f"{u:g}"


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(map(repr, MODES))}, got {mode!r}")


def compare(
    result: npt.ArrayLike,
    lhs: npt.ArrayLike,
    rhs: npt.ArrayLike,
    dimension_numbers: Sequence[Sequence[Sequence[int]]],
    *,
    mode: str,
    preferred_element_type: FormatLike | None = None,
) -> Comparison:
    """Compare ``result`` of a ``dot_general(lhs, rhs, ...)`` with :mod:`emulate.reference`.

    Args:
      result: the result to check (a jax or numpy array).
      lhs, rhs: the operands, as arrays of their formats' dtypes (numpy or jax; float6 as
        numpy arrays).
      dimension_numbers, preferred_element_type: as passed to ``dot_general``.
      mode: the mode the result was computed in, "fast" or "exact".

    The contract: bit for bit with :func:`emulate.reference.dot_general` in mode "exact"
    and for exact-class pairs (:func:`emulate.plan.exact_class`); otherwise within
    :func:`emulate.bounds.dot_general_bound` (see :class:`Comparison`).

    Raises:
      ValueError: an unknown ``mode``, or operands the reference rejects.
    """
    _check_mode(mode)
    got = np.asarray(result)
    a, b = np.asarray(lhs), np.asarray(rhs)
    lf, rf = _formats.get(a.dtype), _formats.get(b.dtype)
    contract = "exact" if mode == "exact" or exact_class(lf, rf) else "bounded"
    want = reference.dot_general(a, b, dimension_numbers, preferred_element_type)
    out = _formats.get(want.dtype)
    base: dict[str, Any] = dict(
        lhs=lf.name, rhs=rf.name, out=out.name, mode=mode, contract=contract
    )
    if got.dtype != want.dtype or got.shape != want.shape:
        return Comparison(
            **base,
            size=want.size,
            mismatches=want.size,
            max_ulps=math.inf,
            worst_ratio=None,
            problem=(
                f"result has dtype {got.dtype.name} and shape {got.shape}; the reference has "
                f"dtype {want.dtype.name} and shape {want.shape}"
            ),
        )
    ulps = _ulps(got, want, out)
    max_ulps = float(ulps.max(initial=0.0))
    exact = None
    if contract == "exact":
        bad = ~_same(got, want)
        ratio = None
        allowed = bnd = None
    else:
        exact = reference.exact_dot_general(a, b, dimension_numbers)
        bnd = bounds.dot_general_bound(a, b, dimension_numbers)
        flushed = _flushed_nan(a, b, dimension_numbers)
        bad, ratios, allowed = _within(got, exact, bnd, out, flushed)
        ratio = float(max(ratios, default=0.0))
        # A NaN that the flushing rule allows is not an error of any number of ulps.
        waived = flushed & np.isnan(got.astype(np.float64)) & ~bad
        max_ulps = float(np.where(waived, 0.0, ulps).max(initial=0.0))
    first = None
    if bad.any():
        flat = int(np.flatnonzero(bad.reshape(-1))[0])
        idx = tuple(int(i) for i in np.unravel_index(flat, got.shape))
        if exact is None:
            exact = reference.exact_dot_general(a, b, dimension_numbers)
        first = Mismatch(
            index=idx,
            got=_py(got.reshape(-1)[flat]),
            want=_py(want.reshape(-1)[flat]),
            exact=np.asarray(exact, dtype=object).reshape(-1)[flat],
            allowed=None if allowed is None else allowed[flat],
            bound=None if bnd is None else float(bnd.reshape(-1)[flat]),
        )
    return Comparison(
        **base,
        size=want.size,
        mismatches=int(bad.sum()),
        max_ulps=max_ulps,
        worst_ratio=ratio,
        first=first,
    )


def assert_matches_reference(
    result: npt.ArrayLike,
    lhs: npt.ArrayLike,
    rhs: npt.ArrayLike,
    dimension_numbers: Sequence[Sequence[Sequence[int]]],
    *,
    mode: str,
    preferred_element_type: FormatLike | None = None,
) -> None:
    """Assert that ``result`` keeps the numerics contract against :mod:`emulate.reference`.

    Bit for bit (NaN matches NaN; the sign of a zero result is not part of the contract)
    for exact-class pairs and in mode "exact"; within
    :func:`emulate.bounds.dot_general_bound` for the other pairs in mode "fast". The
    result's dtype and shape must be the reference's.

    Raises:
      AssertionError: with :meth:`Comparison.report`: the first mismatching element's
        index, the value got, the value wanted, the exact sum as a Fraction and, for
        bounded pairs, the allowed interval.
    """
    c = compare(
        result,
        lhs,
        rhs,
        dimension_numbers,
        mode=mode,
        preferred_element_type=preferred_element_type,
    )
    if not c.ok:
        raise AssertionError(c.report())


def _py(v: Any) -> Any:
    return int(v) if np.asarray(v).dtype.kind in "iu" else float(v)


def _same(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Element-wise: equal integers, or equal floats (+0 == -0), or both NaN."""
    if got.dtype.kind in "iu":
        return got == want
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    return (np.isnan(g) & np.isnan(w)) | (g == w)


def _ordinal(x: np.ndarray, f: Format) -> np.ndarray:
    """Float codes mapped to integers that count representable values (-0 and +0 both 0)."""
    raw = x.view(np.dtype(f"u{x.dtype.itemsize}")).astype(np.int64) & f.code_mask
    sign = 1 << (f.bits - 1)
    mag = raw & (sign - 1)
    return np.where(raw & sign, -mag, mag)


def _ulps(got: np.ndarray, want: np.ndarray, f: Format) -> np.ndarray:
    if f.is_integer:
        return np.abs(got.astype(np.int64) - want.astype(np.int64)).astype(np.float64)
    gn, wn = np.isnan(got.astype(np.float64)), np.isnan(want.astype(np.float64))
    dist = np.abs(_ordinal(got, f) - _ordinal(want, f)).astype(np.float64)
    return np.where(gn & wn, 0.0, np.where(gn | wn, math.inf, dist))


def _dyadic(x: Fraction) -> tuple[int, int]:
    """``numerator * 2**exponent`` for a fraction whose denominator is a power of two."""
    den = x.denominator
    assert den & (den - 1) == 0, x
    return x.numerator, -(den.bit_length() - 1)


def _from_ordinal(o: int, f: Format, dtype: np.dtype) -> float:
    """The value whose :func:`_ordinal` is ``o`` (NaN past the format's codes)."""
    sign = 1 << (f.bits - 1)
    mag = abs(o)
    if mag >= sign:
        return math.nan
    code = mag | (sign if o < 0 else 0)
    uint = np.dtype(f"u{dtype.itemsize}")
    return float(np.asarray(code, uint).reshape(1).view(dtype).astype(np.float64)[0])


def _needed_bound(v: npt.ArrayLike, e: Fraction, f: Format) -> Fraction:
    """The smallest bound ``B`` with ``v`` between the roundings of ``e - B`` and ``e + B``.

    ``v`` is a finite value of format ``f``; the values that round to it reach halfway to
    its neighbours (ties ignored), so ``B`` is the distance from ``e`` to the near end of
    that interval, 0 when ``v`` is the rounding of ``e`` itself.
    """
    x = np.asarray(v)
    value = Fraction(float(x))
    if value == e:
        return Fraction(0)
    o = int(_ordinal(x.reshape(1), f)[0])
    step = -1 if value > e else 1
    neighbour = _from_ordinal(o + step, f, x.dtype)
    if not math.isfinite(neighbour):  # past max: mirror the neighbour on the other side
        neighbour = 2 * float(value) - _from_ordinal(o - step, f, x.dtype)
    edge = (value + Fraction(neighbour)) / 2
    return max(Fraction(0), edge - e if value > e else e - edge)


def _flushed_nan(
    a: np.ndarray, b: np.ndarray, dimension_numbers: Sequence[Sequence[Sequence[int]]]
) -> np.ndarray:
    """Where the sum is NaN once operands below 2**-126 read as zero, as a flushing backend
    (XLA on the CPU and the TPU) reads them: a subnormal f32 or bf16 operand times Inf."""
    subs = bounds.einsum_subscripts(a.ndim, b.ndim, dimension_numbers)
    with np.errstate(invalid="ignore", over="ignore"):
        va, vb = (np.asarray(v).astype(np.float64) for v in (a, b))
        va, vb = (np.where(np.abs(v) < bounds.F32_MIN_NORMAL, 0.0, v) for v in (va, vb))
        return np.isnan(np.einsum(subs, va, vb))


def _within(
    got: np.ndarray, exact: np.ndarray, bnd: np.ndarray, f: Format, flushed_nan: np.ndarray
) -> tuple[np.ndarray, list[float], list[tuple[float, float] | None]]:
    """Per element: outside [round(exact - bound), round(exact + bound)]? and the ratios.
    Where the exact sum is +-Inf and ``flushed_nan`` holds, NaN is allowed too."""
    g = got.astype(np.float64).reshape(-1)
    nan_ok = flushed_nan.reshape(-1)
    bad = np.zeros(g.shape, bool)
    ratios: list[float] = []
    allowed: list[tuple[float, float] | None] = []
    for i, (e, bd, v) in enumerate(
        zip(np.asarray(exact, dtype=object).reshape(-1), bnd.reshape(-1), g, strict=True)
    ):
        if not isinstance(e, Fraction):  # NaN / Inf follow IEEE: compare as they are
            bad[i] = not (np.isnan(e) and np.isnan(v) or e == v or nan_ok[i] and np.isnan(v))
            allowed.append(None)
            continue
        if not np.isfinite(bd):
            allowed.append((-math.inf, math.inf))
            continue
        lo = reference.round_exact(*_dyadic(e - Fraction(bd)), f)
        hi = reference.round_exact(*_dyadic(e + Fraction(bd)), f)
        allowed.append((lo, hi))
        if not np.isfinite(v):
            # Past the format's range the rounding overflows to Inf or (fn/fnuz) NaN.
            bad[i] = np.isfinite(lo) and np.isfinite(hi)
            continue
        lo_ok = lo if np.isfinite(lo) else -math.inf
        hi_ok = hi if np.isfinite(hi) else math.inf
        bad[i] = not lo_ok <= v <= hi_ok
        ratios.append(float(_needed_bound(got.reshape(-1)[i], e, f) / Fraction(bd)))
    return bad.reshape(got.shape), ratios, allowed


# --------------------------------------------------------------------------- helpers


def plan_key(p: Plan) -> tuple:
    """What decides the program a plan runs: two plans with equal keys (on different
    targets) run the same computation, with the same result bits."""
    fallback = p.fallback.method if p.fallback is not None else None
    return (p.method, p.lhs_compute, p.rhs_compute, p.accumulator, p.k_chunk, fallback)


def representative_targets(
    lhs: FormatLike,
    rhs: FormatLike,
    targets: Iterable[str | _targets.Target] | None = None,
    *,
    mode: str = "fast",
    preferred_element_type: FormatLike | None = "float32",
) -> list[str]:
    """One target name per distinct :func:`plan_key` among ``targets`` (default: all).

    Targets whose plans for ``lhs x rhs`` share a key run the same program, so a suite
    that checks one of them has checked them all. The first target of each group is
    returned, in the order given.

    Raises:
      What :func:`emulate.plan` raises for the pair (``NotImplementedError`` where
      ``mode="exact"`` is not built for it).
    """
    names = [t.name for t in _targets.all_targets()] if targets is None else targets
    seen: dict[tuple, str] = {}
    for t in names:
        p = _make_plan(lhs, rhs, target=t, preferred_element_type=preferred_element_type, mode=mode)
        seen.setdefault(plan_key(p), p.target)
    return list(seen.values())


def _dtype_expr(f: Format) -> str:
    module = "np" if f.dtype.name in ("int8", "uint8", "float16", "float32") else "ml_dtypes"
    return f"{module}.{f.name}"


def _array_expr(name: str, x: np.ndarray) -> str:
    """``name = np.array(<hex codes>, dtype=np.uintN).view(<dtype>)`` and a values comment."""
    x = np.asarray(x)
    f = _formats.get(x.dtype)
    uint = np.dtype(f"u{x.dtype.itemsize}")
    raw = x.view(uint) & np.asarray(f.code_mask, uint)
    digits = max(2, 2 * x.dtype.itemsize)
    prefix = f"{name} = np.array("
    body = np.array2string(
        raw,
        separator=", ",
        threshold=sys.maxsize,
        max_line_width=96,
        prefix=prefix,
        formatter={"int": lambda c: f"0x{int(c):0{digits}x}"},
    )
    view = "" if f.dtype == uint else f".view({_dtype_expr(f)})"
    with np.errstate(invalid="ignore"):
        values = str((x.astype(np.float64) if f.is_float else x.astype(np.int64)).tolist())
    if len(values) > 200:
        values = values[:200] + " ..."
    return f"{prefix}{body}, dtype=np.{uint.name}){view}\n# {name} values: {values}"


def reproducer(problem: DotProblem, *, target: str | _targets.Target, mode: str) -> str:
    """``problem`` as a ready-to-run Python script.

    The operands are written as ``np.array`` literals of their codes, viewed as their
    dtypes; the script calls :func:`emulate.dot_general` and
    :func:`emulate.reference.dot_general` and ends with :func:`assert_matches_reference`,
    which raises where the contract is broken.
    """
    _check_mode(mode)
    t = _targets.get(target).name
    lhs, rhs, dn, pet = problem
    pet_s = repr(None if pet is None else _formats.get(pet).name)
    return "\n".join(
        [
            "import ml_dtypes",
            "import numpy as np",
            "",
            "import emulate",
            "from emulate import reference, testing",
            "",
            _array_expr("lhs", lhs),
            _array_expr("rhs", rhs),
            f"dimension_numbers = {dn!r}",
            "got = emulate.dot_general(",
            f"    lhs, rhs, dimension_numbers, preferred_element_type={pet_s}, "
            f"target={t!r}, mode={mode!r}",
            ")",
            f"want = reference.dot_general(lhs, rhs, dimension_numbers, "
            f"preferred_element_type={pet_s})",
            'print("got: ", repr(np.asarray(got)))',
            'print("want:", repr(want))',
            "testing.assert_matches_reference(",
            f"    got, lhs, rhs, dimension_numbers, mode={mode!r}, preferred_element_type={pet_s}",
            ")",
        ]
    )
