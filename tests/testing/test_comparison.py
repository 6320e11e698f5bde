"""emulate.testing's comparison: compare and assert_matches_reference under the contract."""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import emulate
from emulate import bounds
from emulate import testing as et

DN = (((1,), (0,)), ((), ()))


def test_exact_contract_report_names_the_first_mismatch():
    x = np.array([[1, 2, 3]], np.int8)
    y = np.array([[1, 5], [1, 0], [1, 0]], np.int8)
    c = et.compare(
        np.array([[6, 6]], np.int32), x, y, DN, mode="fast", preferred_element_type="int32"
    )
    assert (c.contract, c.size, c.mismatches, c.max_ulps, c.worst_ratio) == (
        "exact",
        2,
        1,
        1.0,
        None,
    )
    assert c.first == et.Mismatch(index=(0, 1), got=6, want=5, exact=Fraction(5))
    assert c.report() == (
        "result differs from emulate.reference in 1 of 2 elements (int8 x int8 -> int32, mode "
        "'fast', contract: bit for bit with the reference)\n"
        "first mismatch at index (0, 1): got 6, want 5; exact value Fraction(5, 1) = 5.0\n"
        "max error: 1 ulp of int32"
    )


def test_assert_matches_reference_raises_with_the_report():
    a = np.array([[1.5, -2.0]], ml_dtypes.float4_e2m1fn)
    b = np.array([[3.0, 1.0], [0.5, 6.0]], ml_dtypes.float4_e2m1fn)
    good = np.array([[3.5, -10.5]], np.float32)
    et.assert_matches_reference(good, a, b, DN, mode="fast", preferred_element_type="float32")
    bad = np.array([[3.5, -10.0]], np.float32)
    with pytest.raises(AssertionError) as exc:
        et.assert_matches_reference(bad, a, b, DN, mode="exact", preferred_element_type="float32")
    assert str(exc.value) == (
        "result differs from emulate.reference in 1 of 2 elements (float4_e2m1fn x "
        "float4_e2m1fn -> float32, mode 'exact', contract: bit for bit with the reference)\n"
        "first mismatch at index (0, 1): got -10.0, want -10.5; exact value "
        "Fraction(-21, 2) = -10.5\n"
        "max error: 524288 ulps of float32"  # 0.5 in steps of 2**-20
    )


def test_bounded_contract_ratio_and_report():
    # exact = 1 + 0.75 ulp of float32; the correct rounding is 1 + 1 ulp.
    a = np.array([[1.0, 6 * 2.0**-26]], np.float32)
    b = np.array([[1.0], [1.0]], np.float32)
    bound = Fraction(float(bounds.dot_general_bound(a, b, DN)[0, 0]))
    # 1.0 is admitted by any bound of at least 2**-25 (1 + 2**-24 rounds to 1.0).
    c = et.compare(np.array([[1.0]], np.float32), a, b, DN, mode="fast")
    assert c.ok and c.contract == "bounded" and c.max_ulps == 1.0
    assert c.worst_ratio == float(Fraction(2**-25) / bound)
    # The correct rounding needs no bound at all.
    c = et.compare(np.array([[1 + 2.0**-23]], np.float32), a, b, DN, mode="fast")
    assert c.ok and c.max_ulps == 0.0 and c.worst_ratio == 0.0
    # 1 + 4 ulps is outside.
    c = et.compare(np.array([[1 + 2.0**-21]], np.float32), a, b, DN, mode="fast")
    assert not c.ok and c.mismatches == 1 and c.max_ulps == 3.0
    assert c.worst_ratio == float(
        (Fraction(1) + Fraction(7, 2**24) - Fraction(33554435, 2**25)) / bound
    )
    assert c.first.allowed == (1 - 2.0**-24, 1 + 2.0**-22)
    assert c.report() == (
        "result differs from emulate.reference in 1 of 1 elements (float32 x float32 -> "
        "float32, mode 'fast', contract: within emulate.bounds.dot_general_bound)\n"
        "first mismatch at index (0, 0): got 1.0000004768371582, want 1.0000001192092896; "
        "exact value Fraction(33554435, 33554432) = 1.0000000894069672\n"
        f"allowed: [0.9999999403953552, 1.000000238418579] (bound {float(bound)!r})\n"
        "max error: 3 ulps of float32"
    )


def test_wrong_dtype_or_shape_is_a_mismatch_of_every_element():
    x = np.ones((2, 3), np.int8)
    c = et.compare(
        np.zeros((2, 2), np.int8), x, x.T, DN, mode="fast", preferred_element_type="int32"
    )
    assert not c.ok and c.mismatches == 4 and c.max_ulps == math.inf
    assert c.report() == (
        "result has dtype int8 and shape (2, 2); the reference has dtype int32 and shape (2, 2) "
        "(int8 x int8 -> int32, mode 'fast', contract: bit for bit with the reference)"
    )


def test_nan_matches_nan_and_zero_signs_are_ignored():
    a = np.array([[np.nan, 0.0], [-0.0, 0.0]], ml_dtypes.float8_e5m2)
    b = np.array([[1.0], [1.0]], ml_dtypes.float8_e5m2)
    got = np.array([[np.nan], [-0.0]], np.float32)
    c = et.compare(got, a, b, DN, mode="fast", preferred_element_type="float32")
    assert c.ok and c.max_ulps == 0.0
    c = et.compare(np.array([[1.0], [0.0]], np.float32), a, b, DN, mode="fast",
                   preferred_element_type="float32")  # fmt: skip
    assert c.mismatches == 1 and c.max_ulps == math.inf and c.first.index == (0, 0)


def test_subnormal_times_inf_may_be_nan_in_mode_fast_only():
    # XLA on the CPU and the TPU reads a subnormal bf16 / f32 operand as zero, so its
    # product with Inf is NaN there; mode "fast" may give that, mode "exact" may not.
    a = np.array([[2.0**-133, 1.0], [1.0, 1.0], [2.0**-126, 1.0]], ml_dtypes.bfloat16)
    b = np.array([[np.inf], [1.0]], ml_dtypes.float8_e5m2)
    nan_first = np.array([[np.nan], [np.inf], [np.inf]], np.float32)
    c = et.compare(nan_first, a, b, DN, mode="fast", preferred_element_type="float32")
    assert c.ok and c.mismatches == 0 and c.max_ulps == 0.0
    c = et.compare(nan_first, a, b, DN, mode="exact", preferred_element_type="float32")
    assert c.mismatches == 1 and c.first.index == (0, 0)
    nan_last = np.array([[np.inf], [np.inf], [np.nan]], np.float32)  # 2**-126 is normal
    c = et.compare(nan_last, a, b, DN, mode="fast", preferred_element_type="float32")
    assert c.mismatches == 1 and c.first.index == (2, 0) and c.first.exact == math.inf
    got = emulate.dot_general(a, b, DN, preferred_element_type="float32", mode="fast")
    et.assert_matches_reference(got, a, b, DN, mode="fast", preferred_element_type="float32")
    got = emulate.dot_general(a, b, DN, preferred_element_type="float32", mode="exact")
    assert np.asarray(got).ravel().tolist() == [math.inf] * 3


def test_bad_mode():
    x = np.ones((1, 1), np.int8)
    with pytest.raises(ValueError, match=r"^mode: expected one of 'fast', 'exact', got 'quick'$"):
        et.compare(x, x, x, DN, mode="quick")


def test_an_exact_sum_past_float32_is_named_as_overflowing():
    # Code 448 times a scale of 2**127 is past float32: the reference's dequantized values
    # are +Inf and its sum -2*Inf + Inf is NaN, while the exact sum is -448 * 2**127.
    codes = np.array([[448.0], [448.0]], ml_dtypes.float8_e4m3fn)
    q = emulate.QArray.from_parts(codes, np.array([[2.0**127]], np.float32), block_shape=(2, 1))
    x = np.array([[-2.0, 1.0]], np.float32)
    c = et.compare(np.array([[-np.inf]], np.float32), x, q, DN, mode="fast")
    assert c.first is not None and c.first.exact == Fraction(-448 * 2**127)
    lines = c.report().splitlines()
    assert lines[1] == (
        f"first mismatch at index (0, 0): got -inf, want nan; exact value Fraction({-448 * 2**127}"
        ", 1) = -7.622325019029022e+40, which overflows float32 (largest finite value "
        "3.4028234663852886e+38)"
    )
    assert lines[2] == (
        "the reference's value is nan because emulate.reference.dequantize rounds each QArray "
        "value (code times scale) to float32, and some are past float32's range: a kernel "
        "that scales each product overflows with it"
    )
    # A plain sum past the result type: the Fraction, and that it overflows.
    big = np.array([[2.0**127, 2.0**127]], np.float32)
    ones = np.ones((2, 1), np.float32)
    c = et.compare(np.array([[0.0]], np.float32), big, ones, DN, mode="exact")
    assert c.report().splitlines()[1] == (
        f"first mismatch at index (0, 0): got 0.0, want inf; exact value Fraction({2**128}, 1) = "
        "3.402823669209385e+38, which overflows float32 (largest finite value "
        "3.4028234663852886e+38)"
    )
