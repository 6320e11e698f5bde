"""The ``group_sizes`` of a grouped matmul (``lax.ragged_dot``): the check every front end
and kernel makes of concrete sizes.

Rows are sorted by group; group ``j`` holds the rows ``start_j <= row < end_j`` with
``end_j`` the sum of the sizes up to ``j`` and ``start_j = end_{j-1}`` (JAX's definition).
What JAX accepts is accepted, with JAX's result (jax 0.10.2, measured):

- sizes that sum to fewer rows than there are: the rows after the last group belong to
  none, and their results are zero (JAX's own tests do so);
- sizes that sum to more: the groups are cut at the last row (``[3, 3]`` over 4 rows puts
  rows 0-2 in group 0 and row 3 in group 1); nothing is read past the rows.

Refused: sizes that are not integers (float, bool) or a scalar, as JAX refuses them (a
TypeError, :func:`as_group_sizes`: every front end and the grouped kernel); and a
negative size. JAX computes something for it (``[-1, 3]`` over 4 rows gives rows 0-1
group 1's product), but that is no grouping a router makes, and the grouped
kernel's schedule (``emulate.pallas.gmm_kernel``) counts such a group as empty, so the
routes would disagree: a silent wrong number on one of them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["as_group_sizes", "check_group_sizes"]


def as_group_sizes(group_sizes: Any) -> Any:
    """``group_sizes`` as an integer array of rank >= 1: an array as given, a Python list
    or tuple as a numpy array (so every route accepts what ``lax.ragged_dot`` accepts).

    Raises:
      TypeError: None, or sizes that are not integers (float, bool) or a scalar, as JAX
        raises, naming group_sizes, what it got and what is accepted.
    """
    if group_sizes is None:
        raise TypeError(
            "group_sizes: expected an array of integers (the number of rows in each group), "
            "got None"
        )
    dtype = getattr(group_sizes, "dtype", None)
    if dtype is None:
        if not isinstance(group_sizes, (list, tuple, int)):
            raise TypeError(
                "group_sizes: expected an array of integers (the number of rows in each "
                f"group), got {type(group_sizes).__name__}"
            )
        group_sizes = np.asarray(group_sizes)
        dtype = group_sizes.dtype
    if not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(
            "group_sizes: expected an array of integers (the number of rows in each group), "
            f"got {np.dtype(dtype).name}{list(np.shape(group_sizes))}"
        )
    if np.ndim(group_sizes) == 0:
        raise TypeError(
            "group_sizes: expected an array of rank >= 1 (one size per group, shape (g,)), "
            f"got a scalar {np.dtype(dtype).name}"
        )
    return group_sizes


def check_group_sizes(group_sizes: Any) -> None:
    """Refuse concrete group sizes that are negative (the module docstring says why; any
    total is accepted, as in JAX). Traced sizes are not checked.

    Args:
      group_sizes: the sizes, any integer array (``(g,)`` or JAX's ``[b..., x..., g]``).

    Raises:
      ValueError: naming group_sizes, the sizes it got and what is accepted.
    """
    if isinstance(group_sizes, jax.core.Tracer):
        return
    sizes = np.asarray(group_sizes).astype(np.int64)
    if (sizes < 0).any():
        raise ValueError(
            f"group_sizes: sizes must be >= 0 (the rows of each group), got {sizes.tolist()}"
        )
