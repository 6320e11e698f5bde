"""emulate.group_sizes: the check of a grouped matmul's concrete group sizes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from emulate.group_sizes import check_group_sizes


@pytest.mark.parametrize("sizes", [[1, -1, 2], [[1, 2], [4, -7]]])
def test_a_negative_size_is_refused_by_name(sizes) -> None:
    with pytest.raises(ValueError) as e:
        check_group_sizes(np.array(sizes, np.int32))
    assert str(e.value) == (
        f"group_sizes: sizes must be >= 0 (the rows of each group), got {sizes}"
    )


def test_any_total_and_traced_sizes_pass_as_in_jax() -> None:
    # jax 0.10.2's lax.ragged_dot accepts totals below and above the rows (tests/test_ragged)
    for sizes in ([0, 3, 0], [4, 6], [5, 5, 5], [[1, 2], [4, 7]]):
        check_group_sizes(np.array(sizes))
    jax.jit(lambda g: check_group_sizes(g) or g)(jnp.array([-5, 5]))
