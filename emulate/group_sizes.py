"""The ``group_sizes`` of a grouped matmul (``lax.ragged_dot``): the check every front end
and kernel makes of concrete sizes.

Rows are sorted by group; group ``j`` holds rows ``start_j .. start_j + group_sizes[j] - 1``
with ``start_j`` the sum of the sizes before it. Sizes that sum to fewer rows than there
are leave the last rows in no group (JAX's own tests do so; their results are zero).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

__all__ = ["check_group_sizes"]


def check_group_sizes(group_sizes: Any, rows: int, dim: str) -> None:
    """Refuse concrete group sizes that are negative or hold more than ``rows`` rows (per
    row of a ``group_sizes`` of rank > 1). Fewer is accepted: as in JAX, the rows after
    the last group belong to none (their results are zero). Traced sizes are not checked
    (JAX's semantics: a row belongs to group ``j`` where ``start_j <= row < end_j``).

    Raises:
      ValueError: naming group_sizes, its total and ``rows``.
    """
    if isinstance(group_sizes, jax.core.Tracer):
        return
    sizes = np.asarray(group_sizes).astype(np.int64)
    if (sizes < 0).any():
        raise ValueError(f"group_sizes: sizes must be >= 0, got {sizes.tolist()}")
    totals = sizes.sum(axis=-1)
    if (totals > rows).any():
        raise ValueError(
            f"group_sizes: the groups hold {int(totals.max())} rows in all, but {dim} has "
            f"only {rows}; group_sizes {sizes.tolist()} must sum to at most {rows}"
        )
