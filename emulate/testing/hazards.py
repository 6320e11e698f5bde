"""Hazard-seeking generation: contraction lengths at the exactness thresholds of a pair.

A sum of K products is exact in an accumulator only while its partial sums stay within
the accumulator's exact range (:mod:`emulate.planning.exactness`): ``2**24`` quanta for
float32, ``2**31 - 1`` for int32. A kernel that sums int8 products in float32 is right for
K up to 1024 and wrong past 1040 for operands of +-127; a plan that chunks K is at risk
exactly at its chunk length. :func:`exactness_thresholds` names these K for a pair (and
a target's plan); :func:`threshold_layouts` draws matmul layouts with K just below, at and
just past each of them, which with ``fill="odd_extreme"`` operands
(:func:`emulate.testing.arrays`) make every such bug visible.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from emulate import formats as _formats
from emulate import reference
from emulate.formats import FormatLike
from emulate.planning.exactness import F32_EXACT, I32_EXACT, exact_scale, max_quanta
from emulate.planning.plan import plan as _make_plan
from emulate.testing.strategies import Layout, odd_extreme_codes

__all__ = ["DEFAULT_MAX_K", "exactness_thresholds", "threshold_layouts"]

DEFAULT_MAX_K = 1 << 17

_MATMUL = (((1,), (0,)), ((), ()))


def _odd_quanta(fmt: FormatLike, scale: int) -> int:
    f = _formats.get(fmt)
    c = np.array(odd_extreme_codes(f)[:1], np.uint8)
    return int(abs(float(reference.decode(c, f, to=np.float64)[0])) * 2**scale)


def exactness_thresholds(
    lhs: FormatLike,
    rhs: FormatLike,
    *,
    target: str | None = None,
    mode: str = "fast",
) -> dict[str, int]:
    """The contraction lengths K past which a sum of ``lhs x rhs`` products stops being exact.

    Each entry is the first K at which a sum of K products can leave the exact range:

    - ``"float32 sum"``: ``2**24 // p + 1``, ``p`` the largest product in quanta (int8:
      ``2**14``, so 1025); an exact-class pair only;
    - ``"float32 sum, odd products"``: the same for the largest odd products (int8:
      ``127 * 127``, so 1041), whose sums past ``2**24`` lose units;
    - ``"int32 sum"``: ``(2**31 - 1) // p + 1`` (int8: 131072);
    - ``"chunk of the <target> plan"``: ``k_chunk + 1`` where :func:`emulate.plan` for the
      pair on ``target`` chunks K.

    Args:
      lhs, rhs: operand formats (names, dtypes or Formats).
      target: a target whose plan's chunk length is added; None leaves it out.
      mode: the plan's mode, "fast" or "exact".

    Returns:
      A dict from the threshold's name to K, in increasing K; empty for a pair with no
      threshold (a float8 pair without a chunked plan).
    """
    a, b = _formats.get(lhs), _formats.get(rhs)
    out: dict[str, int] = {}
    ka, kb = exact_scale(a), exact_scale(b)
    if ka is not None and kb is not None:
        largest = max_quanta(a, ka) * max_quanta(b, kb)
        odd = _odd_quanta(a, ka) * _odd_quanta(b, kb)
        out["float32 sum"] = F32_EXACT // largest + 1
        if odd != largest:
            out["float32 sum, odd products"] = F32_EXACT // odd + 1
        out["int32 sum"] = I32_EXACT // largest + 1
    if target is not None:
        p = _make_plan(a, b, target=target, preferred_element_type="float32", mode=mode)
        if p.k_chunk is not None:
            out[f"chunk of the {p.target} plan"] = p.k_chunk + 1
    return dict(sorted(out.items(), key=lambda kv: kv[1]))


def threshold_layouts(
    lhs: FormatLike,
    rhs: FormatLike,
    *,
    target: str | None = None,
    mode: str = "fast",
    max_k: int = DEFAULT_MAX_K,
    rows: int = 1,
    cols: int = 2,
    below: bool = True,
) -> st.SearchStrategy[Layout]:
    """Matmul layouts ``(rows, K) x (K, cols)`` with K at the pair's exactness thresholds.

    K is drawn from ``t - 1`` (left out with ``below=False``), ``t``, ``t + 1`` and
    ``2 t + 1`` for each threshold ``t`` of :func:`exactness_thresholds` (with ``target``
    and ``mode``), those at most ``max_k``:
    a short, fixed pool, so that a kernel compiles a few programs only. Use it as
    ``layouts=`` of :func:`emulate.testing.dot_general_problems` or
    :func:`emulate.testing.check_function`, with ``fill="odd_extreme"``.

    Raises:
      ValueError: the pair has no threshold at most ``max_k``.
    """
    ts = exactness_thresholds(lhs, rhs, target=target, mode=mode)
    steps = (-1, 0, 1) if below else (0, 1)
    ks = sorted({k for t in ts.values() for k in (*(t + s for s in steps), 2 * t + 1)})
    ks = [k for k in ks if 1 <= k <= max_k]
    if not ks:
        raise ValueError(
            f"lhs, rhs: {_formats.get(lhs).name} x {_formats.get(rhs).name} has no exactness "
            f"threshold at most max_k={max_k} (thresholds: {ts or 'none'}); pass a larger "
            "max_k, a target whose plan chunks K, or layouts of your own"
        )
    if not (isinstance(rows, int) and isinstance(cols, int) and rows >= 1 and cols >= 1):
        raise ValueError(f"rows, cols: expected positive ints, got {rows!r}, {cols!r}")
    return st.sampled_from([((rows, k), (k, cols), _MATMUL) for k in ks])
