"""Hypothesis strategies for low-precision operands, for this project's tests and users' suites.

Every strategy draws raw codes, so each format's special values (NaN, +-Inf, +-0, +-max,
the smallest normal and subnormal values) can be boosted: they are drawn far more often
than a uniform draw over codes would give them.
"""

from __future__ import annotations

from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import strategies as st

from emulate import formats as _formats
from emulate.formats import Format

__all__ = ["formats", "codes", "arrays", "special_codes", "finite_codes"]


def _all_codes(f: Format) -> np.ndarray:
    return np.arange(1 << f.bits, dtype=np.uint64)


def finite_codes(fmt: Any) -> list[int]:
    """Every code of ``fmt`` whose value is finite."""
    f = _formats.get(fmt)
    bad = set(f.nan_codes) | set(f.inf_codes)
    return [int(c) for c in _all_codes(f) if int(c) not in bad]


def special_codes(fmt: Any, *, finite: bool = False) -> list[int]:
    """Codes of the edge values: zeros, +-max, +-min normal, +-min subnormal, NaN, Inf."""
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


def codes(fmt: Any, *, elements: str = "all") -> st.SearchStrategy[int]:
    """One code of ``fmt``: ``elements`` is "all", "finite" or "normal" (no subnormals, no zero)."""
    f = _formats.get(fmt)
    if elements not in ("all", "finite", "normal"):
        raise ValueError(f"elements: expected 'all', 'finite' or 'normal', got {elements!r}")
    pool = list(range(1 << f.bits)) if elements == "all" else finite_codes(f)
    if elements == "normal" and f.is_float:
        vals = np.array(pool, np.uint8).view(f.dtype).astype(np.float64)
        pool = [c for c, v in zip(pool, vals) if abs(v) >= f.min_normal]
    specials = [c for c in special_codes(f, finite=elements != "all") if c in set(pool)]
    return st.one_of(st.sampled_from(specials or pool), st.sampled_from(pool))


def arrays(fmt: Any, shape: Any, *, elements: str = "all") -> st.SearchStrategy[np.ndarray]:
    """A numpy array of ``fmt``'s dtype (ml_dtypes), shape an int tuple or a strategy of them."""
    f = _formats.get(fmt)
    if f.bits > 8:
        raise ValueError(f"fmt: arrays draws low-precision formats, got {f.name}")
    raw = hnp.arrays(np.uint8, shape, elements=codes(f, elements=elements))
    return raw.map(lambda a: a.view(f.dtype))


def formats(*, include_scale: bool = False) -> st.SearchStrategy[Format]:
    """A low-precision :class:`emulate.Format` (float8_e8m0fnu only with ``include_scale``)."""
    names = [n for n in _formats.LOW_PRECISION if include_scale or n != "float8_e8m0fnu"]
    return st.sampled_from([_formats.get(n) for n in names])
