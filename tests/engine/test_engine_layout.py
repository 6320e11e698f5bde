"""emulate.engine.layout.dot_general: emulate's XLA-level dot in a layout every backend runs."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import emulate
from emulate import reference

# XLA:CPU (jax 0.10.2) cannot run a bf16 x bf16 -> f32 dot whose lhs is stored (K, M) and
# whose rhs it rearranges ("Unsupported element type for DotThunk::Execute: BF16 x BF16 =
# F32"): emulate's own decoded dots met it for every low-precision rhs in mode "fast".
DN = (((0,), (1,)), ((), ()))


@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "int8"])
def test_a_k_major_lhs_against_stacked_experts_runs_with_the_exact_value(fmt) -> None:
    rng = np.random.default_rng(0)
    x = (rng.integers(-4, 5, (32, 6)) / 2).astype(ml_dtypes.bfloat16)
    w = rng.integers(-3, 4, (2, 32, 8)).astype(np.dtype(getattr(ml_dtypes, fmt, fmt)))
    got = emulate.dot_general(jnp.asarray(x), jnp.asarray(w), DN, target="cpu")
    want = reference.exact_dot_general(x, w, DN).astype(np.float32)  # exact in bf16
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got, np.float32), want)
