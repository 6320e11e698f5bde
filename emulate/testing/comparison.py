"""Checking a result against :mod:`emulate.reference` under the numerics contract.

:func:`assert_matches_reference` checks a result bit for bit for the exact classes and mode
"exact", and within :func:`emulate.bounds.dot_general_bound` for the other pairs in mode
"fast"; it names the first mismatching element, its value, the reference's and the exact
sum. :func:`compare` returns the same verdict as a :class:`Comparison`, with the largest
error in ulps of the result type.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from emulate import bounds, reference
from emulate import formats as _formats
from emulate.formats import Format, FormatLike
from emulate.numerics.storage import Packed
from emulate.planning.exactness import exact_class
from emulate.planning.plan import MODES
from emulate.quantized.array import QArray
from emulate.testing.distance import dyadic, same, ulp_distance, within
from emulate.testing.operands import oracle_values

__all__ = [
    "BoundLike",
    "Comparison",
    "Mismatch",
    "assert_matches_reference",
    "check_mode",
    "compare",
    "segment_count",
]


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
      note: why the reference's value is NaN or Inf where the exact sum is finite (a
        QArray's code times scale past float32's range), or None.
    """

    index: tuple[int, ...]
    got: Any
    want: Any
    exact: Any
    allowed: tuple[float, float] | None = None
    bound: float | None = None
    note: str | None = None


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
      bound_name: bounded contract: which bound (``emulate.bounds.dot_general_bound``, the
        segment bound ``gamma_(K+S+4)`` of a QArray operand, or a bound you gave).
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
    bound_name: str = "emulate.bounds.dot_general_bound"

    @property
    def ok(self) -> bool:
        return self.mismatches == 0 and self.problem is None

    def report(self) -> str:
        """A few lines that say what differs, or that nothing does."""
        words = {
            "exact": "bit for bit with the reference",
            "bounded": f"within {self.bound_name}",
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
                f"exact value {_exact_words(m.exact, _formats.get(self.out))}"
            )
            if m.note is not None:
                lines.append(m.note)
            if m.allowed is not None:
                lines.append(f"allowed: [{m.allowed[0]!r}, {m.allowed[1]!r}] (bound {m.bound!r})")
        ulps = _ulps_words(self.max_ulps)
        lines.append(f"max error: {ulps} {'ulp' if ulps == '1' else 'ulps'} of {self.out}")
        return "\n".join(lines)


def _exact_words(e: Fraction | float, out: Format) -> str:
    """The exact sum as a Fraction and a float; past the result type's range, so said."""
    if not isinstance(e, Fraction):
        return repr(float(e))
    try:
        approx = repr(float(e))
    except OverflowError:  # past float64's range
        approx = f"{'-' if e < 0 else ''}inf"
    words = f"Fraction({e.numerator}, {e.denominator}) = {approx}"
    if out.is_float and math.isinf(reference.round_exact(*dyadic(e), out)):
        words += f", which overflows {out.name} (largest finite value {float(out.max)!r})"
    return words


def _ulps_words(u: float) -> str:
    if math.isinf(u):
        return "inf"
    return f"{u:.0f}" if u == int(u) else f"{u:g}"


def check_mode(mode: str) -> str:
    """``mode`` if it is "fast" or "exact": the ``mode`` argument of :func:`compare` and
    :func:`emulate.testing.reproducer`, which name no default.

    Raises:
      ValueError: any other value, None included.
    """
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {', '.join(map(repr, MODES))}, got {mode!r}")
    return mode


BoundLike = float | npt.ArrayLike | Callable[[np.ndarray, np.ndarray, Any], npt.ArrayLike]


@dataclasses.dataclass(frozen=True)
class _Oracle:
    """:func:`compare`'s operands as the oracle reads them, and the contract chosen for
    them: the first stage of a comparison.

    Attributes:
      a, b: the operands' values (:func:`oracle_values`); ``ablock``, ``bblock``: a QArray
        operand's scale blocks, or None.
      lf, rf: the operands' true formats (a format without a dtype, not float32).
      preferred: the result format the reference rounds into (None: lax's rule).
      contract: "exact" or "bounded".
      bound_name: which bound (:attr:`Comparison.bound_name`; "" for "exact").
      extra: the bound's extra gamma terms (bounded, no bound given; else 0).
    """

    a: np.ndarray
    ablock: Any
    b: np.ndarray
    bblock: Any
    lf: Format
    rf: Format
    preferred: FormatLike | None
    contract: str
    bound_name: str
    extra: int


def _oracle(
    lhs: Any,
    rhs: Any,
    dimension_numbers: Sequence[Sequence[Sequence[int]]],
    mode: str,
    preferred_element_type: FormatLike | None,
    bound: BoundLike | None,
    extra_roundings: int,
) -> _Oracle:
    """The operands' values and true formats, and the contract: with ``bound``, within
    it; bit for bit in mode "exact" and for exact-class pairs of plain or packed operands;
    else the segment bound (a QArray operand) or :func:`bounds.dot_general_bound`."""
    (a, ablock), (b, bblock) = oracle_values(lhs, "lhs"), oracle_values(rhs, "rhs")
    lf, rf = _formats.get(a.dtype), _formats.get(b.dtype)
    undecoded = [_undecoded(x, f) for x, f in ((lhs, lf), (rhs, rf))]
    if undecoded != [lf, rf]:  # a format without a dtype, handed over as float32 values
        lf, rf = undecoded
        if preferred_element_type is None:  # lax's result type of the true formats
            preferred_element_type = _formats.dot_result(lf, rf).name
    quant = ablock is not None or bblock is not None
    extra = 0
    if bound is not None:
        contract, bound_name = "bounded", "the bound given"
    elif mode == "exact" or (exact_class(lf, rf) and not quant):
        contract, bound_name = "exact", ""
    elif quant:
        segs = segment_count(a.shape, b.shape, dimension_numbers, ablock, bblock)
        extra = segs + 4 + extra_roundings
        contract, bound_name = "bounded", f"the segment bound gamma_(K+S+4), S = {segs}"
    else:
        extra = extra_roundings
        contract, bound_name = "bounded", "emulate.bounds.dot_general_bound"
    if extra_roundings and bound is None and contract == "bounded":
        bound_name += f" with {extra_roundings} extra roundings"
    return _Oracle(
        a, ablock, b, bblock, lf, rf, preferred_element_type, contract, bound_name, extra
    )


def _verdict(
    got: np.ndarray,
    want: np.ndarray,
    o: _Oracle,
    operands: tuple[Any, Any],
    dimension_numbers: Sequence[Sequence[Sequence[int]]],
    bound: BoundLike | None,
) -> tuple[int, float, float | None, Mismatch | None]:
    """``got`` against the reference's ``want`` under ``o``'s contract: the mismatches,
    the largest error in ulps, the worst bound ratio (bounded; else None) and the first
    mismatch with its exact sum (or None)."""
    out = _formats.get(want.dtype)
    ulps = ulp_distance(got, want, out)
    max_ulps = float(ulps.max(initial=0.0))
    exact = ratio = allowed = bnd = None
    if o.contract == "exact":
        bad = ~same(got, want)
    else:
        exact = reference.exact_dot_general(o.a, o.b, dimension_numbers)
        if bound is None:
            bnd = bounds.dot_general_bound(o.a, o.b, dimension_numbers, extra_terms=o.extra)
        else:
            bnd = _given_bound(bound, o.a, o.b, dimension_numbers, want.shape)
        flushed = _flushed_nan(o.a, o.b, dimension_numbers)
        bad, ratios, allowed = within(got, exact, bnd, out, flushed)
        ratio = float(max(ratios, default=0.0))
        # A NaN that the flushing rule allows is not an error of any number of ulps.
        waived = flushed & np.isnan(got.astype(np.float64)) & ~bad
        max_ulps = float(np.where(waived, 0.0, ulps).max(initial=0.0))
    if not bad.any():
        return 0, max_ulps, ratio, None
    flat = int(np.flatnonzero(bad.reshape(-1))[0])
    if exact is None:
        exact = reference.exact_dot_general(o.a, o.b, dimension_numbers)
    e = np.asarray(exact, dtype=object).reshape(-1)[flat]
    note = None
    if (o.ablock is not None or o.bblock is not None) and not isinstance(e, Fraction):
        e, note = _unrounded_exact(e, *operands, dimension_numbers, flat)
    first = Mismatch(
        index=tuple(int(i) for i in np.unravel_index(flat, got.shape)),
        got=_py(got.reshape(-1)[flat]),
        want=_py(want.reshape(-1)[flat]),
        exact=e,
        allowed=None if allowed is None else allowed[flat],
        bound=None if bnd is None else float(bnd.reshape(-1)[flat]),
        note=note,
    )
    return int(bad.sum()), max_ulps, ratio, first


def compare(
    result: npt.ArrayLike,
    lhs: Any,
    rhs: Any,
    dimension_numbers: Sequence[Sequence[Sequence[int]]],
    *,
    mode: str,
    preferred_element_type: FormatLike | None = None,
    bound: BoundLike | None = None,
    extra_roundings: int = 0,
) -> Comparison:
    """Compare ``result`` of a ``dot_general(lhs, rhs, ...)`` with :mod:`emulate.reference`.

    Args:
      result: the result to check (a jax or numpy array).
      lhs, rhs: the operands: arrays of their formats' dtypes (numpy or jax; float6 as
        numpy arrays), :class:`emulate.Packed` arrays (compared as their codes), or
        :class:`emulate.QArray` values (compared as their values,
        :func:`emulate.reference.dequantize`).
      dimension_numbers, preferred_element_type: as passed to ``dot_general``.
      mode: the mode the result was computed in, "fast" or "exact".
      bound: your own bounded contract: a number (the largest ``|r - exact|`` allowed
        for every element), an array of the result's shape, or a function
        ``bound(lhs_values, rhs_values, dimension_numbers)`` returning one (the values
        as float64-castable numpy arrays). Overrides the contract below.
      extra_roundings: further float32 roundings your kernel makes on the way (a scale
        applied per block, a conversion): the bound of mode "fast" uses
        ``gamma_(K + extra_roundings)`` (exact-class pairs stay bit for bit).

    The contract: with ``bound``, within it. Otherwise bit for bit with
    :func:`emulate.reference.dot_general` in mode "exact" and for exact-class pairs
    (:func:`emulate.plan.exact_class`) of plain or packed operands; else within
    :func:`emulate.bounds.dot_general_bound` with ``gamma_(K + extra_roundings)``, and with
    a QArray operand the segment bound ``gamma_(K + S + 4 + extra_roundings)``, ``S`` the
    number of segments along K over which neither operand's scale changes
    (docs/numerics.md).

    Raises:
      ValueError: an unknown ``mode``, or operands the reference rejects.
    """
    check_mode(mode)
    if (
        isinstance(extra_roundings, bool)
        or not isinstance(extra_roundings, int)
        or (extra_roundings < 0)
    ):
        raise ValueError(f"extra_roundings: expected a non-negative int, got {extra_roundings!r}")
    got = np.asarray(result)
    o = _oracle(lhs, rhs, dimension_numbers, mode, preferred_element_type, bound, extra_roundings)
    want = reference.dot_general(o.a, o.b, dimension_numbers, o.preferred)
    out = _formats.get(want.dtype)
    names = [_operand_name(x, f) for x, f in ((lhs, o.lf), (rhs, o.rf))]  # true formats
    base: dict[str, Any] = dict(
        lhs=names[0],
        rhs=names[1],
        out=out.name,
        mode=mode,
        contract=o.contract,
        bound_name=o.bound_name,
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
    bad, ulps, ratio, first = _verdict(got, want, o, (lhs, rhs), dimension_numbers, bound)
    return Comparison(
        **base, size=want.size, mismatches=bad, max_ulps=ulps, worst_ratio=ratio, first=first
    )


def assert_matches_reference(
    result: npt.ArrayLike,
    lhs: Any,
    rhs: Any,
    dimension_numbers: Sequence[Sequence[Sequence[int]]],
    *,
    mode: str,
    preferred_element_type: FormatLike | None = None,
    bound: BoundLike | None = None,
    extra_roundings: int = 0,
) -> None:
    """Assert that ``result`` keeps the numerics contract against :mod:`emulate.reference`.

    Bit for bit (NaN matches NaN; the sign of a zero result is not part of the contract)
    for exact-class pairs and in mode "exact"; within
    :func:`emulate.bounds.dot_general_bound` for the other pairs in mode "fast", and
    within the segment bound ``gamma_(K+S+4)`` for QArray operands. ``lhs`` and ``rhs``
    may be arrays, :class:`emulate.Packed` or :class:`emulate.QArray`; ``bound`` and
    ``extra_roundings`` as for :func:`compare`. The result's dtype and shape must be the
    reference's.

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
        bound=bound,
        extra_roundings=extra_roundings,
    )
    if not c.ok:
        raise AssertionError(c.report())


def _unrounded_exact(
    e: float, lhs: Any, rhs: Any, dn: Sequence[Sequence[Sequence[int]]], flat: int
) -> tuple[Fraction | float, str | None]:
    """The exact sum at ``flat`` from QArray values not rounded to float32 (each code
    times its scale), where the float32 values' sum ``e`` is NaN or Inf; ``e`` itself,
    and no note, where the unrounded values are not all finite either."""
    a, b = (oracle_values(x, exact=True)[0] for x in (lhs, rhs))
    if not (np.isfinite(a.astype(np.float64)).all() and np.isfinite(b.astype(np.float64)).all()):
        return e, None
    to_fraction = np.frompyfunc(Fraction, 1, 1)
    subs = bounds.einsum_subscripts(a.ndim, b.ndim, dn)
    fa, fb = (np.asarray(to_fraction(v.astype(np.float64)), dtype=object) for v in (a, b))
    true = np.einsum(subs, fa, fb).reshape(-1)[flat]
    note = (
        f"the reference's value is {float(e)!r} because emulate.reference.dequantize rounds "
        "each QArray value (code times scale) to float32, and some are past float32's "
        "range: a kernel that scales each product overflows with it"
    )
    return Fraction(true), note


def _undecoded(x: Any, f: Format) -> Format:
    """The format of operand ``x`` before :func:`oracle_values` decoded it: a Packed array
    of a format without a dtype is handed to the oracle as float32 values (``f``)."""
    if isinstance(x, Packed) and not x.format.has_dtype:
        return x.format
    return f


def _operand_name(x: Any, f: Format) -> str:
    if isinstance(x, QArray):
        return f"QArray({x.format_name}, {x.scale_format} scales)"
    if isinstance(x, Packed):
        return f"Packed({x.format_name})"
    return f.name


def segment_count(
    lshape: tuple[int, ...],
    rshape: tuple[int, ...],
    dimension_numbers: Sequence[Sequence[Sequence[int]]],
    lblock: tuple[int, ...] | None,
    rblock: tuple[int, ...] | None,
) -> int:
    """The number of segments of a contraction: runs of K over which neither operand's
    block (scale) changes, counted over every contracting dimension (a product over them).
    An operand without blocks (``None``) never changes scale along K."""
    (lc, rc), _ = dimension_numbers
    total = 1
    for ld, rd in zip(lc, rc, strict=True):
        n = lshape[ld]
        cuts = {0, n}
        for block, d in ((lblock, ld), (rblock, rd)):
            if block is not None and block[d] >= 1:
                cuts.update(range(0, n, block[d]))
        total *= max(len(cuts) - 1, 1)
    return total


def _given_bound(
    bound: Any, a: np.ndarray, b: np.ndarray, dn: Any, shape: tuple[int, ...]
) -> np.ndarray:
    """The user's ``bound`` as a float64 array of the result's shape."""
    value = bound(a, b, dn) if callable(bound) else bound
    try:
        arr = np.broadcast_to(np.asarray(value, np.float64), shape)
    except (TypeError, ValueError):
        raise ValueError(
            f"bound: expected a number, an array broadcastable to the result's shape {shape} "
            f"or a function returning one, got {type(value).__name__}"
        ) from None
    if np.isnan(arr).any() or (arr < 0).any():
        raise ValueError("bound: expected non-negative bounds, got a negative value or NaN")
    return arr


def _py(v: Any) -> Any:
    return int(v) if np.asarray(v).dtype.kind in "iu" else float(v)


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
