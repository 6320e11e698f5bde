"""The rigorous error bound of mode "fast", as a function the tests and users can call.

For a dot product of K terms accumulated in f32 (unit roundoff ``u = 2**-24``) in any
order, with products rounded or exact::

    |r - exact| <= gamma_K * sum_k |a_k * b_k| + K * 2**-125
    gamma_K = K * u / (1 - K * u)

The second term covers underflow: each of the K products and K - 1 additions may lose
up to 2**-126 where the backend flushes denormals (XLA on CPU and TPU), 2**-149 otherwise.
Those backends also read a subnormal f32 or bf16 *operand* as zero, so a product with
such an operand may be lost whole: :func:`dot_general_bound` adds ``sum_k |a_k * b_k|``
over the terms with an operand below 2**-126 (zero when no operand is subnormal, which
is always the case for values decoded from the low-precision formats).
This is the accumulator's bound; rounding the accumulator into a narrower result type is
monotone, so a result ``q`` of that type is within the contract when it lies between the
roundings of ``exact - bound`` and ``exact + bound``.

numpy + ml_dtypes only, like :mod:`emulate.reference`.
"""

from __future__ import annotations

import math
import string
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from emulate.formats import F32_MIN_NORMAL

__all__ = [
    "F32_MIN_NORMAL",
    "QARRAY_ROUTE_TERMS",
    "U_F32",
    "UNDERFLOW_PER_TERM",
    "dot_general_bound",
    "einsum_subscripts",
    "gamma",
    "qarray_bound",
]

U_F32 = 2.0**-24
UNDERFLOW_PER_TERM = 2.0**-125


def gamma(k: int, u: float = U_F32) -> float:
    """``k*u / (1 - k*u)``; ``inf`` once ``k*u >= 1``."""
    if k * u >= 1:
        return math.inf
    return k * u / (1 - k * u)


def _abs64(x: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """``|x|`` as float64 with non-finite values replaced by 0, and where they were."""
    with np.errstate(invalid="ignore", over="ignore"):
        v = np.abs(np.asarray(x).astype(np.float64))
    finite = np.isfinite(v)
    return np.where(finite, v, 0.0), ~finite


def dot_general_bound(
    lhs: npt.ArrayLike,
    rhs: npt.ArrayLike,
    dimension_numbers: Sequence[Sequence[Sequence[int]]],
    *,
    extra_terms: int = 0,
) -> np.ndarray:
    """Per-element bound on ``|r - exact|`` for an f32-accumulated ``dot_general``.

    Args:
      lhs, rhs: numpy arrays of any float format dtype (ml_dtypes included); integer
        arrays are accepted too.
      dimension_numbers: as in ``lax.dot_general``.
      extra_terms: further f32 roundings on the way, counted into gamma: the bound uses
        ``gamma_(K + extra_terms)`` (a QArray matmul with S segments: ``S + 4``).

    Returns:
      float64 array of the result's shape. Elements whose exact value is not finite
      (an Inf or NaN operand) get ``inf``: the bound says nothing there, IEEE rules do.
    """
    (lc, rc), _ = dimension_numbers
    (a, a_bad), (b, b_bad) = _abs64(lhs), _abs64(rhs)
    k = math.prod(a.shape[d] for d in lc)
    subs = einsum_subscripts(a.ndim, b.ndim, dimension_numbers)
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.einsum(subs, a, b)
        # Products with a subnormal operand, which a flushing backend drops whole.
        flushed = np.einsum(subs, _subnormal(a), b) + np.einsum(subs, a, _subnormal(b))
    nonfinite = (
        np.einsum(subs, a_bad, np.ones_like(b)) + np.einsum(subs, np.ones_like(a), b_bad)
    ) > 0
    # float64 rounding of a sum of K non-negative terms: relative 2K * 2**-53 at most.
    s = s * (1 + 2 * max(k, 1) * 2.0**-53)
    flushed = flushed * (1 + 2 * max(k, 1) * 2.0**-53)
    g = gamma(k + extra_terms)
    return np.where(nonfinite, np.inf, g * s + flushed + (k + extra_terms) * UNDERFLOW_PER_TERM)


#: ``c`` of the QArray bound ``gamma_(K + S + c)`` per route (docs/numerics.md,
#: "Block-scaled operands"): "xla" (``emulate.dot_general`` / ``matmul`` / ``einsum`` on
#: every plan, CPU and TPU, mode "fast"), "pallas" (``emulate.pallas.matmul`` with a
#: QArray weight).
QARRAY_ROUTE_TERMS = {"xla": 5, "pallas": 5}


def qarray_bound(
    lhs: npt.ArrayLike,
    rhs: npt.ArrayLike,
    dimension_numbers: Sequence[Sequence[Sequence[int]]],
    *,
    segments: int,
    route: str = "xla",
) -> np.ndarray:
    """Per-element bound on ``|r - exact|`` for a mode "fast" contraction with QArray
    operands: :func:`dot_general_bound` with ``gamma_(K + S + c)``, ``S = segments`` (the
    number of K segments: runs over which neither operand's scale changes) and ``c =
    QARRAY_ROUTE_TERMS[route]``.

    Args:
      lhs, rhs: the operands' exact values in float64 (or any float dtype): a QArray's
        *exactly dequantized* values ``(v - z) * s * tensor_scale``, its zero points
        subtracted as integers (the plain weight's bound: the routes contract ``v - z`` as
        an exact integer, so nothing depends on ``|v s|`` or ``|z s|`` apart). With offsets
        ``o``, pass ``|(v - z) s| + |o|`` as the weight (the offset term is summed apart;
        the bound takes absolute values, so magnitudes are what it needs).
      dimension_numbers: as in ``lax.dot_general``.
      segments: S, at least 1.
      route: "xla" or "pallas".

    Raises:
      ValueError: an unknown route or ``segments`` below 1.
    """
    if route not in QARRAY_ROUTE_TERMS:
        raise ValueError(f"route: expected one of {sorted(QARRAY_ROUTE_TERMS)}, got {route!r}")
    if segments < 1:
        raise ValueError(f"segments: expected at least 1, got {segments}")
    extra = segments + QARRAY_ROUTE_TERMS[route]
    return dot_general_bound(lhs, rhs, dimension_numbers, extra_terms=extra)


def _subnormal(v: np.ndarray) -> np.ndarray:
    """``v`` where it is below the smallest normal f32 (2**-126), 0 elsewhere."""
    return np.where(v < F32_MIN_NORMAL, v, 0.0)


def einsum_subscripts(
    lhs_ndim: int, rhs_ndim: int, dimension_numbers: Sequence[Sequence[Sequence[int]]]
) -> str:
    """The ``np.einsum`` subscripts of a ``dot_general`` (output: batch, lhs free, rhs free)."""
    (lc, rc), (lb, rb) = dimension_numbers
    la = list(string.ascii_letters[:lhs_ndim])
    spare = iter(string.ascii_letters[lhs_ndim:])
    shared = {r: la[l_] for l_, r in zip(lc, rc)} | {r: la[l_] for l_, r in zip(lb, rb)}
    ra = [shared.get(d) or next(spare) for d in range(rhs_ndim)]
    out = [la[d] for d in lb]
    out += [la[d] for d in range(lhs_ndim) if d not in lc and d not in lb]
    out += [ra[d] for d in range(rhs_ndim) if d not in rc and d not in rb]
    return f"{''.join(la)},{''.join(ra)}->{''.join(out)}"
