"""The oracle of the CPU kernel's special factors (tests/cpu): a result as the dequantized
product gives it."""

from __future__ import annotations

import numpy as np

import emulate.bounds

KN = (((1,), (0,)), ((), ()))


def as_dequantized(got: np.ndarray, x: np.ndarray, w: np.ndarray, segments: int) -> None:
    """``got`` is ``x @ w`` as the dequantized product gives it: NaN and Inf where the
    float64 product of ``x`` and the dequantized ``w`` (K, N) has them (IEEE: ``0 * Inf``
    is NaN; each product summed apart, no BLAS), the finite elements within the bound of
    ``segments`` K segments."""
    with np.errstate(invalid="ignore", over="ignore"):
        want = (x.astype(np.float64)[:, :, None] * w[None]).sum(axis=1)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isposinf(got), np.isposinf(want))
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    bound = emulate.bounds.qarray_bound(x, np.where(np.isfinite(w), w, 0), KN, segments=segments)
    assert (np.abs(got - want)[finite] <= bound[finite]).all()
