"""emulate.group_sizes: the check of a grouped matmul's concrete group sizes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from emulate.group_sizes import check_group_sizes


@pytest.mark.parametrize(
    ("sizes", "rows", "message"),
    [
        (
            [5, 5, 5],
            10,
            "group_sizes: the groups hold 15 rows in all, but lhs has only 10; "
            "group_sizes [5, 5, 5] must sum to at most 10",
        ),
        (
            [[1, 2], [4, 7]],
            10,
            "group_sizes: the groups hold 11 rows in all, but lhs has "
            "only 10; group_sizes [[1, 2], [4, 7]] must sum to at most 10",
        ),
        ([1, -1, 2], 10, "group_sizes: sizes must be >= 0, got [1, -1, 2]"),
    ],
)
def test_concrete_group_sizes_are_checked(sizes, rows, message) -> None:
    with pytest.raises(ValueError) as e:
        check_group_sizes(np.array(sizes, np.int32), rows, "lhs")
    assert str(e.value) == message


def test_fewer_rows_than_the_lhs_and_traced_sizes_pass() -> None:
    check_group_sizes(np.array([0, 3, 0]), 10, "lhs")
    check_group_sizes(np.array([4, 6]), 10, "lhs")
    jax.jit(lambda g: check_group_sizes(g, 1, "lhs") or g)(jnp.array([5, 5]))
