"""The exact sum of products, rounded once: the oracle's ``dot_general`` and ``ragged_dot``.

Every finite value of every format is an integer times a power of two, so the reference
scales each operand to integers, sums with Python ints (or int64 where a bound proves it
cannot overflow) and rounds that exact sum once (:func:`round_exact`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from fractions import Fraction
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from emulate import formats
from emulate.formats import FormatLike
from emulate.reference.decoding import astype_quiet

__all__ = ["dot_general", "exact_dot_general", "ragged_dot", "round_exact"]


_Axes = tuple[int, ...]


_DimensionNumbers = tuple[tuple[_Axes, _Axes], tuple[_Axes, _Axes]]


#: Dimension numbers as callers pass them: ``((lc, rc), (lb, rb))``, any sequences of ints.
_DimensionNumbersLike: TypeAlias = Sequence[Sequence[Sequence[int]]]


def round_exact(numerator: int, exponent: int, fmt: FormatLike) -> float:
    """Round ``numerator * 2**exponent`` once, to nearest with ties to even, into ``fmt``.

    The value is rounded to ``fmt``'s precision with an unbounded exponent range above and
    the format's subnormals below (gradual underflow). If the rounded magnitude exceeds
    ``fmt.max`` the format's overflow rule applies, as ml_dtypes' casts do: Inf where the
    format has Inf (float32, bfloat16, float16, float8_e5m2, float8_e3m4), NaN where it has
    NaN but no Inf (float8_e4m3fn and the fnuz formats: e4m3fn 464 -> 448, 465 -> NaN) and
    ``+-max`` where it has neither (float6, float4). A tie goes to the even code: for a
    format of precision 1 (P3109 p1, every value a power of two) the even exponent field,
    as gfloat's TiesToEven (``1.5`` into p3109_k8p1se gives ``1.0``, code 64, not 2.0).

    Args:
      numerator: any Python or numpy integer.
      exponent: any Python or numpy integer.
      fmt: a float format with a zero (every registered float format except the scale
        type float8_e8m0fnu). Without subnormals, a value below the smallest positive one
        rounds to it or to 0 (a tie to 0, code 0 being even).

    Returns:
      A Python float exactly representable in ``fmt`` (or Inf/NaN per the overflow rule).
      A zero numerator gives +0.0; a negative value that underflows gives -0.0 where the
      format has a negative zero and +0.0 otherwise.

    Raises:
      TypeError: a non-integer ``numerator`` or ``exponent``.
      ValueError: an integer format or float8_e8m0fnu as ``fmt``.
    """
    for arg, val in (("numerator", numerator), ("exponent", exponent)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)):
            raise TypeError(f"{arg}: expected an integer, got {type(val).__name__} {val!r}")
    return _round(int(numerator), int(exponent), _rounding_target(fmt, "fmt"))


def _round(numerator: int, exponent: int, f: formats.Format) -> float:
    """:func:`round_exact` for Python ints and a validated rounding target."""
    if numerator == 0:
        return 0.0
    magnitude = abs(numerator)
    top = magnitude.bit_length() - 1 + exponent
    if not f.has_subnormals and Fraction(magnitude) * Fraction(2) ** exponent < f.min_subnormal:
        up = Fraction(magnitude) * Fraction(2) ** (exponent + 1) > f.min_subnormal
        value = f.min_subnormal if up else 0.0
        if numerator > 0 or (value == 0 and not f.signed_zero):
            return value
        return -value
    quantum = max(top, f.emin) - f.mantissa_bits
    shift = quantum - exponent
    if shift <= 0:
        rounded = magnitude << -shift
    else:
        rounded = magnitude >> shift
        remainder = magnitude - (rounded << shift)
        half = 1 << (shift - 1)
        if remainder > half or (remainder == half and _odd_code(rounded, quantum, f)):
            rounded += 1
    negative = numerator < 0
    if rounded.bit_length() - 1 + quantum > _emax(f) or math.ldexp(rounded, quantum) > f.max:
        return _overflow(f, negative)
    value = math.ldexp(rounded, quantum)
    if value == 0:
        return -0.0 if negative and f.signed_zero else 0.0
    return -value if negative else value


def _odd_code(rounded: int, quantum: int, f: formats.Format) -> bool:
    """Whether ``rounded * 2**quantum`` (``rounded >= 0``, ``quantum >= f.emin - t``, ``t``
    the trailing significand bits) has an odd code, the code of ties to even.

    With trailing bits the code's last bit is ``rounded``'s. Without them (precision 1:
    P3109 p1, user formats) ``rounded`` is 0 (code 0) or 1, and ``2**quantum`` has code
    ``quantum - emin + 1``: the even code is the even exponent field, not the even quantum.
    """
    if f.mantissa_bits:
        return bool(rounded & 1)
    return rounded != 0 and (quantum - f.emin + 1) % 2 == 1


def exact_dot_general(
    lhs: npt.ArrayLike, rhs: npt.ArrayLike, dimension_numbers: _DimensionNumbersLike
) -> np.ndarray:
    """The exact value of ``lax.dot_general(lhs, rhs, dimension_numbers)`` before rounding.

    Args:
      lhs, rhs: arrays of any registered formats (they may differ); JAX arrays are accepted.
      dimension_numbers: ``((lhs_contract, rhs_contract), (lhs_batch, rhs_batch))``.

    Returns:
      A numpy object array with the shape of the dot_general result (batch dims, then lhs
      free dims, then rhs free dims). Finite results are :class:`fractions.Fraction`; a
      result that is NaN or +-Inf under IEEE rules (a NaN operand in the contraction,
      ``0 * Inf``, ``Inf - Inf``) is the Python float NaN or +-Inf. An empty contraction
      gives ``Fraction(0)``.

    Raises:
      ValueError: operands of unregistered dtypes, or malformed or mismatched
        dimension numbers.
    """
    sums, quantum, specials, shape = _exact(lhs, rhs, dimension_numbers)
    scale = Fraction(2) ** quantum
    out = np.empty(sums.shape, dtype=object)
    for i, s in enumerate(sums.flat):
        out.flat[i] = Fraction(int(s)) * scale
    if specials is not None:
        nonfinite = ~np.isfinite(specials)
        out[nonfinite] = specials[nonfinite].astype(object)
    return out.reshape(shape)


def dot_general(
    lhs: npt.ArrayLike,
    rhs: npt.ArrayLike,
    dimension_numbers: _DimensionNumbersLike,
    preferred_element_type: FormatLike | None = None,
) -> np.ndarray:
    """``jax.lax.dot_general`` computed exactly and rounded once.

    Args:
      lhs, rhs: arrays of any registered formats (low-precision, bfloat16, float16, float32,
        int32, ...); they may differ. JAX arrays are accepted through ``np.asarray``.
      dimension_numbers: ``((lhs_contract, rhs_contract), (lhs_batch, rhs_batch))``, each a
        sequence of distinct non-negative axis indices; paired axes must have equal sizes.
      preferred_element_type: optional result format, as for ``lax.dot_general``.

    Returns:
      An array of dtype ``formats.dot_result(lhs.dtype, rhs.dtype, preferred).dtype``, with
      axes: batch dims, then lhs free dims, then rhs free dims, each group in axis order.

      * Integer result: the exact integer sum wrapped two's-complement into the result's
        width (int32 mod 2**32, int8 mod 2**8, uint8 into [0, 256), ...).
      * Float result: the exact sum of products rounded once, to nearest with ties to even,
        into the result format with its overflow rule (see :func:`round_exact`).
      * NaN and Inf follow IEEE: a NaN operand in the contraction, ``0 * Inf`` or
        ``+Inf + -Inf`` give NaN; otherwise an infinite product gives that infinity. They
        are then cast into the result format as ml_dtypes (and XLA) cast: Inf becomes NaN
        in float8_e4m3fn and the fnuz formats and +-max in float6/float4, and NaN becomes
        -0 in float6/float4, which have no NaN.
      * An empty contraction gives zeros.
      * Zero results are +0. The sign of a zero result is not part of the numerics
        contract: accumulators start at +0, and an exact zero sum has no sign to keep.

    ``np.dot`` / ``np.matmul`` on ml_dtypes arrays are no reference: both sum in float32,
    so the sum is rounded twice (``np.dot``) or left in float32 (``np.matmul``).

    Raises:
      TypeError: operand types JAX rejects together, or an integer result with a float
        operand (both :func:`formats.result_format`'s rules, as for the plans).
      ValueError: unregistered dtypes, malformed or mismatched dimension numbers, or
        float8_e8m0fnu as the result format (the oracle does not round into a scale type).
    """
    out_fmt = _result_format(lhs, rhs, preferred_element_type)
    sums, quantum, specials, shape = _exact(lhs, rhs, dimension_numbers)
    if out_fmt.is_integer:
        return _wrap(sums, out_fmt).reshape(shape)
    rounded = np.array(
        [_positive_zero(_round(int(s), quantum, out_fmt)) for s in sums.flat],
        dtype=np.float64,
    ).reshape(sums.shape)
    if specials is not None:
        rounded = np.where(np.isfinite(specials), rounded, specials)
    with np.errstate(invalid="ignore", over="ignore"):
        return rounded.astype(out_fmt.dtype).reshape(shape)


def ragged_dot(
    lhs: npt.ArrayLike,
    rhs: npt.ArrayLike,
    group_sizes: npt.ArrayLike,
    preferred_element_type: FormatLike | None = None,
) -> np.ndarray:
    """``jax.lax.ragged_dot`` computed exactly and rounded once, per group.

    Args:
      lhs: (m, k); rhs: (g, k, n), g >= 1; any registered formats, as :func:`dot_general`.
      group_sizes: (g,) non-negative integers summing to at most m.

    Returns:
      (m, n) of :func:`dot_general`'s result type: rows ``start_j .. start_j +
      group_sizes[j] - 1`` are :func:`dot_general` of those rows with ``rhs[j]``; rows
      after the last group are zeros.

    Raises:
      ValueError: shapes that do not fit, negative sizes or sizes summing to more than m;
        :func:`dot_general`'s refusals.
    """
    a, b = np.asarray(lhs), np.asarray(rhs)
    sizes = [int(s) for s in np.asarray(group_sizes).reshape(-1)]
    if a.ndim != 2 or b.ndim != 3 or not 1 <= len(sizes) == b.shape[0] or a.shape[1] != b.shape[1]:
        raise ValueError(
            f"ragged_dot: expected lhs (m, k), rhs (g, k, n), group_sizes (g,), got "
            f"{a.shape}, {b.shape}, {np.shape(group_sizes)}"
        )
    if min(sizes, default=0) < 0 or sum(sizes) > a.shape[0]:
        raise ValueError(f"ragged_dot: group_sizes {sizes} for {a.shape[0]} rows")
    dn = (((1,), (0,)), ((), ()))
    dtype = dot_general(a[:0], b[0], dn, preferred_element_type).dtype
    out = np.zeros((a.shape[0], b.shape[2]), dtype=dtype)
    start = 0
    for j, size in enumerate(sizes):
        rows = a[start : start + size]
        out[start : start + size] = dot_general(rows, b[j], dn, preferred_element_type)
        start += size
    return out


def _rounding_target(fmt: FormatLike, arg: str) -> formats.Format:
    f = formats.get(fmt, arg=arg)
    if f.is_integer or not f.has_zero:
        raise ValueError(
            f"{arg}: {f.name} is not a rounding target; accepted: float formats with a zero "
            "(every registered float format except float8_e8m0fnu)"
        )
    return f


def _emax(f: formats.Format) -> int:
    return math.frexp(f.max)[1] - 1


def _overflow(f: formats.Format, negative: bool) -> float:
    """+-Inf where the format has infinities, else NaN where it has a NaN, else +-max.

    Read off ml_dtypes' casts of Inf and NaN rather than the Format's code sets, which are
    only enumerated for formats of at most 16 bits; a format without an ml_dtypes type
    (built from parameters: its uint8 codes are no values) by its record.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        inf, nan = np.array([np.inf, np.nan]).astype(f.dtype).astype(np.float64)
    if not f.has_dtype:
        inf, nan = (math.inf if f.has_inf else 0.0), (math.nan if f.has_nan else 0.0)
    if math.isinf(inf):
        return -math.inf if negative else math.inf
    if math.isnan(nan):
        return math.nan
    return -f.max if negative else f.max


def _quantum_exponent(f: formats.Format) -> int:
    """``q`` with every finite value of ``f`` an integer multiple of ``2**q``."""
    return math.frexp(f.quantum)[1] - 1


def _positive_zero(value: float) -> float:
    return 0.0 if value == 0 else value


def _operand(x: npt.ArrayLike, arg: str) -> tuple[np.ndarray, formats.Format]:
    arr = np.asarray(x)
    try:
        f = formats.get(arr.dtype)
    except ValueError:
        raise ValueError(
            f"{arg}: dtype {arr.dtype.name} is not a registered format; accepted: "
            f"{', '.join(formats.names())}"
        ) from None
    return arr, f


def _result_format(
    lhs: npt.ArrayLike, rhs: npt.ArrayLike, preferred: FormatLike | None
) -> formats.Format:
    lf = _operand(lhs, "lhs")[1]
    rf = _operand(rhs, "rhs")[1]
    out = formats.result_format(lf, rf, preferred)
    if not out.has_zero:
        raise ValueError(f"preferred_element_type: {out.name} is a scale type, not a result type")
    return out


def _axes(value: Iterable[int], arg: str, ndim: int) -> tuple[int, ...]:
    try:
        axes = tuple(value)
    except TypeError:
        raise ValueError(f"{arg}: expected a sequence of axis indices, got {value!r}") from None
    for a in axes:
        if isinstance(a, bool) or not isinstance(a, (int, np.integer)) or not 0 <= a < ndim:
            raise ValueError(
                f"{arg}: axis {a!r} is not an integer in [0, {ndim}) for an operand of rank {ndim}"
            )
    return tuple(int(a) for a in axes)


def _dimension_numbers(
    dn: _DimensionNumbersLike, lshape: tuple, rshape: tuple
) -> _DimensionNumbers:
    try:
        (lc, rc), (lb, rb) = dn
    except (TypeError, ValueError):
        raise ValueError(
            "dimension_numbers: expected ((lhs_contract, rhs_contract), (lhs_batch, rhs_batch)),"
            f" got {dn!r}"
        ) from None
    lc = _axes(lc, "dimension_numbers lhs_contract", len(lshape))
    rc = _axes(rc, "dimension_numbers rhs_contract", len(rshape))
    lb = _axes(lb, "dimension_numbers lhs_batch", len(lshape))
    rb = _axes(rb, "dimension_numbers rhs_batch", len(rshape))
    for kind, la, ra in (("contracting", lc, rc), ("batch", lb, rb)):
        if len(la) != len(ra):
            raise ValueError(
                f"dimension_numbers: lhs has {len(la)} {kind} dims {la}, rhs has {len(ra)} {ra}"
            )
        for i, j in zip(la, ra, strict=True):
            if lshape[i] != rshape[j]:
                raise ValueError(
                    f"dimension_numbers: {kind} dims differ in size: lhs axis {i} of shape "
                    f"{lshape} vs rhs axis {j} of shape {rshape}"
                )
    for side, axes in (("lhs", lc + lb), ("rhs", rc + rb)):
        if len(set(axes)) != len(axes):
            raise ValueError(f"dimension_numbers: {side} axes repeat in contracting+batch {axes}")
    return (lc, rc), (lb, rb)


def _to_bmk(x: np.ndarray, contract: tuple, batch: tuple) -> tuple[np.ndarray, tuple]:
    """Transpose to (batch..., free..., contract...) and reshape to (B, M, K)."""
    free = tuple(a for a in range(x.ndim) if a not in contract + batch)
    t = x.transpose(batch + free + contract)
    sizes = [math.prod(x.shape[a] for a in axes) for axes in (batch, free, contract)]
    return t.reshape(sizes), tuple(x.shape[a] for a in free)


def _scaled(values: np.ndarray, f: formats.Format) -> tuple[np.ndarray, int]:
    """Finite values as integer-valued float64 multiples of ``2**q`` (exact); non-finite -> 0."""
    q = _quantum_exponent(f)
    finite = np.where(np.isfinite(values), values, 0.0)
    return np.ldexp(finite, -q), q


def _integer_matmul(lm: np.ndarray, rm: np.ndarray) -> np.ndarray:
    """Exact (B, M, K) x (B, K, N) matmul of integer-valued float64 arrays."""
    lmax, rmax = int(np.abs(lm).max(initial=0)), int(np.abs(rm).max(initial=0))
    if max(lmax, rmax, lmax * rmax * lm.shape[2]) < 2**63:
        return np.matmul(lm.astype(np.int64), rm.astype(np.int64))
    to_int = np.frompyfunc(int, 1, 1)
    return np.matmul(to_int(lm).astype(object), to_int(rm).astype(object))


def _specials(lv: np.ndarray, rv: np.ndarray) -> np.ndarray | None:
    """NaN / +-Inf where the IEEE result is not finite, 0 elsewhere; None if all finite."""
    if np.isfinite(lv).all() and np.isfinite(rv).all():
        return None

    def any_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.matmul(a.astype(np.int64), b.astype(np.int64)) > 0

    linf, rinf = np.isinf(lv), np.isinf(rv)
    lpos, lneg, rpos, rneg = lv > 0, lv < 0, rv > 0, rv < 0
    nan = np.isnan(lv).any(axis=2)[:, :, None] | np.isnan(rv).any(axis=1)[:, None, :]
    nan |= any_pair(linf, rv == 0) | any_pair(lv == 0, rinf)
    pos = (
        any_pair(linf & lpos, rpos)
        | any_pair(linf & lneg, rneg)
        | any_pair(lpos, rinf & rpos)
        | any_pair(lneg, rinf & rneg)
    )
    neg = (
        any_pair(linf & lpos, rneg)
        | any_pair(linf & lneg, rpos)
        | any_pair(lpos, rinf & rneg)
        | any_pair(lneg, rinf & rpos)
    )
    nan |= pos & neg
    return np.select([nan, pos, neg], [np.nan, np.inf, -np.inf], 0.0)


def _exact(
    lhs: npt.ArrayLike, rhs: npt.ArrayLike, dimension_numbers: _DimensionNumbersLike
) -> tuple[np.ndarray, int, np.ndarray | None, tuple]:
    """(B, M, N) integer sums, their exponent q, the specials array, and the result shape."""
    larr, lf = _operand(lhs, "lhs")
    rarr, rf = _operand(rhs, "rhs")
    (lc, rc), (lb, rb) = _dimension_numbers(dimension_numbers, larr.shape, rarr.shape)
    lv, lfree = _to_bmk(astype_quiet(larr, np.float64), lc, lb)
    rv_t, rfree = _to_bmk(astype_quiet(rarr, np.float64), rc, rb)
    rv = rv_t.transpose(0, 2, 1)
    lm, lq = _scaled(lv, lf)
    rm, rq = _scaled(rv, rf)
    shape = tuple(larr.shape[a] for a in lb) + lfree + rfree
    return _integer_matmul(lm, rm), lq + rq, _specials(lv, rv), shape


def _wrap(sums: np.ndarray, f: formats.Format) -> np.ndarray:
    """Integer sums (int64 or Python ints) wrapped two's-complement into ``f``'s width."""
    wrapped = sums & f.code_mask
    if f.signed:
        wrapped = np.where(wrapped >= 1 << (f.bits - 1), wrapped - (1 << f.bits), wrapped)
    return wrapped.astype(np.int64).astype(f.dtype)
