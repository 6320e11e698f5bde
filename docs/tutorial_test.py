"""A user's numeric-validation suite built on ``emulate.testing``.

docs/testing.md walks through it. Run it with ``python -m pytest docs/tutorial_test.py``;
the project's own suite runs it through tests/test_tutorial.py.
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings

import emulate
from emulate import testing

DN = (((1,), (0,)), ((), ()))  # contract lhs axis 1 with rhs axis 0


# 1. One operand pair over emulate's pool of layouts (K = 1, permuted dimension numbers,
#    batch dims, ...), special values boosted, every result type worth checking.
@settings(max_examples=10, deadline=None)
@given(problem=testing.dot_general_problems("bfloat16", "float8_e4m3fn"))
def test_bf16_activations_times_fp8_weights_on_tpu_v4(problem):
    lhs, rhs, dn, pet = problem
    got = emulate.dot_general(lhs, rhs, dn, preferred_element_type=pet, target="tpu_v4")
    # bfloat16 x float8 is a bounded pair: within emulate.bounds.dot_general_bound.
    testing.assert_matches_reference(got, lhs, rhs, dn, mode="fast", preferred_element_type=pet)


# 2. Your own shapes: a projection with packed int4 weights.
@settings(max_examples=5, deadline=None)
@given(
    x=testing.arrays("bfloat16", (4, 64), elements="finite"),
    w=testing.arrays("int4", (64, 16)),
)
def test_int4_projection(x, w):
    packed = emulate.pack(w, axis=0)  # two codes per byte along the contraction
    y = emulate.dot_general(x, packed, DN, preferred_element_type=jnp.float32, target="tpu_v5e")
    testing.assert_matches_reference(y, x, w, DN, mode="fast", preferred_element_type="float32")


# 3. Every target you deploy to, but each distinct program once: targets whose plans agree
#    run the same computation.
DEPLOYED = ["tpu_v4", "tpu_v5e", "tpu_v6e", "tpu_v7x", "cpu"]


@pytest.mark.parametrize(
    "target", testing.representative_targets("float4_e2m1fn", "float4_e2m1fn", DEPLOYED)
)
@settings(max_examples=5, deadline=None)
@given(problem=testing.dot_general_problems("float4_e2m1fn", "float4_e2m1fn"))
def test_fp4_is_exact_on_every_deployed_target(target, problem):
    lhs, rhs, dn, pet = problem
    got = emulate.dot_general(lhs, rhs, dn, preferred_element_type=pet, target=target)
    # fp4 x fp4 is in the exact class: the result must be the reference's, bit for bit.
    testing.assert_matches_reference(got, lhs, rhs, dn, mode="fast", preferred_element_type=pet)


# 4. What a broken result looks like: the first mismatching element, got, want, and the
#    exact sum as a Fraction.
def test_a_wrong_result_is_reported_element_by_element():
    x = np.array([[1.5, -2.0]], ml_dtypes.float4_e2m1fn)
    w = np.array([[3.0, 1.0], [0.5, 6.0]], ml_dtypes.float4_e2m1fn)
    wrong = np.array([[3.5, -10.0]], np.float32)  # the exact sums are 3.5 and -10.5
    with pytest.raises(AssertionError) as failure:
        testing.assert_matches_reference(
            wrong, x, w, DN, mode="fast", preferred_element_type="float32"
        )
    assert str(failure.value).splitlines()[1] == (
        "first mismatch at index (0, 1): got -10.0, want -10.5; "
        "exact value Fraction(-21, 2) = -10.5"
    )
