"""emulate.testing: strategies, compare / assert_matches_reference, reproducer, targets."""

from __future__ import annotations

import math
from fractions import Fraction

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import emulate
from emulate import bounds, formats, reference, targets
from emulate import testing as et

DN = (((1,), (0,)), ((), ()))
LOW = [f for f in formats.LOW_PRECISION if f != "float8_e8m0fnu"]


# --------------------------------------------------------------------------- strategies


@settings(max_examples=40)
@given(data=st.data())
def test_arrays_have_the_format_dtype_and_shape(data):
    name = data.draw(st.sampled_from([*LOW, "bfloat16", "float16", "float32"]))
    elements = data.draw(st.sampled_from(["all", "finite", "normal"]))
    x = data.draw(et.arrays(name, (3, 4), elements=elements))
    assert x.dtype == formats.get(name).dtype and x.shape == (3, 4)
    v = x.astype(np.float64)
    if elements != "all":
        assert np.isfinite(v).all()
    if elements == "normal" and formats.get(name).is_float:
        assert (np.abs(v) >= formats.get(name).min_normal).all()


def test_arrays_boost_special_values():
    # Over a few hundred draws every special code of e4m3fn shows up.
    seen: set[int] = set()

    @settings(max_examples=300, derandomize=True, database=None)
    @given(et.arrays("float8_e4m3fn", (8,)))
    def draw(x):
        seen.update(int(c) for c in x.view(np.uint8))

    draw()
    assert set(et.special_codes("float8_e4m3fn")) <= seen
    assert et.special_codes("float8_e4m3fn") == [
        0x00, 0x01, 0x08, 0x38, 0x7E, 0x7F, 0x80, 0x81, 0x88, 0xB8, 0xFE, 0xFF
    ]  # fmt: skip


@settings(max_examples=20)
@given(x=et.arrays("int8", et.LONG_K_LAYOUT[0], fill="extreme"))
def test_extreme_fill_is_mostly_the_largest_magnitudes(x):
    assert np.isin(x, [127, -128]).mean() > 0.5


@settings(max_examples=20)
@given(x=et.arrays("bfloat16", (2, 600), fill="extreme"))
def test_extreme_fill_of_a_wide_type(x):
    assert np.isin(x.astype(np.float32), [et.WIDE_RANGE, -et.WIDE_RANGE]).mean() > 0.5


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"elements": "some"}, "elements: expected 'all', 'finite' or 'normal', got 'some'"),
        ({"fill": "max"}, "fill: expected None or 'extreme', got 'max'"),
    ],
)
def test_arrays_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        et.arrays("int8", (2,), **kwargs)


def test_arrays_refuse_int32():
    with pytest.raises(
        ValueError,
        match=r"^fmt: arrays draws the low-precision formats and bfloat16, float16, float32, "
        r"got int32$",
    ):
        et.arrays("int32", (2,))


def test_result_types():
    assert et.result_types("int8", "int4") == [None, "int32", "float32", "bfloat16"]
    assert et.result_types("float8_e4m3fn", "float8_e4m3fn") == [None, "float32", "bfloat16"]
    # float6 results cannot live in XLA: a result type must be given.
    assert et.result_types("float6_e3m2fn", "float6_e3m2fn") == ["float32", "bfloat16"]
    assert et.result_types("bfloat16", "int4") == [None, "float32", "bfloat16"]


@settings(max_examples=40)
@given(p=et.dot_general_problems())
def test_dot_general_problems_are_valid_calls(p):
    lhs, rhs, dn, pet = p
    assert (lhs.shape, rhs.shape, dn) in et.DEFAULT_LAYOUTS
    assert pet in et.result_types(lhs.dtype, rhs.dtype)
    want = reference.dot_general(lhs, rhs, dn, preferred_element_type=pet)
    assert want.dtype == formats.dot_result(lhs.dtype, rhs.dtype, pet).dtype


@settings(max_examples=10)
@given(
    p=et.dot_general_problems(
        "int4", jnp.bfloat16, layouts=[et.LONG_K_LAYOUT], preferred_element_types=["float32"]
    )
)
def test_dot_general_problems_fixed_formats_layouts_and_result(p):
    assert p.lhs.dtype == ml_dtypes.int4 and p.rhs.dtype == ml_dtypes.bfloat16
    assert p.lhs.shape == (1, 1100) and p.rhs.shape == (1100, 2)
    assert p.dimension_numbers == DN and p.preferred_element_type == "float32"


# --------------------------------------------------------------------------- compare


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


# --------------------------------------------------------------------------- helpers


def test_reproducer_runs_and_checks():
    a = np.array([[0x01, 0x38]], np.uint8).view(ml_dtypes.float8_e4m3fn)
    b = np.array([[0x3F80], [0xC000]], np.uint16).view(ml_dtypes.bfloat16)
    problem = et.DotProblem(b.T, a.T, DN, "float32")
    script = et.reproducer(problem, target="v4", mode="fast")
    assert script.splitlines()[6:11] == [
        "lhs = np.array([[0x3f80, 0xc000]], dtype=np.uint16).view(ml_dtypes.bfloat16)",
        "# lhs values: [[1.0, -2.0]]",
        "rhs = np.array([[0x01],",
        "                [0x38]], dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)",
        "# rhs values: [[0.001953125], [1.0]]",
    ]
    assert "target='tpu_v4', mode='fast'" in script
    exec(compile(script, "<reproducer>", "exec"), {})


def test_reproducer_of_every_operand_dtype_round_trips():
    for name in [*LOW, "bfloat16", "float16", "float32"]:
        f = formats.get(name)
        x = np.arange(4).astype(np.uint8).view(f.dtype) if f.bits <= 8 else np.ones(4, f.dtype)
        scope: dict = {}
        line = et._array_expr("x", x).splitlines()[0]
        exec("import numpy as np\nimport ml_dtypes\n" + line, scope)
        assert scope["x"].dtype == x.dtype
        assert scope["x"].tobytes() == x.tobytes()


def test_representative_targets_one_per_program():
    assert et.representative_targets("int8", "int8") == ["tpu_v2", "tpu_v4", "tpu_v5e"]
    for lhs, rhs in [("int4", "int4"), ("bfloat16", "float8_e4m3fn")]:
        reps = et.representative_targets(lhs, rhs)
        keys = {
            t.name: et.plan_key(emulate.plan(lhs, rhs, target=t, preferred_element_type="float32"))
            for t in targets.all_targets()
        }
        assert sorted(keys[t] for t in reps) == sorted(set(keys.values()))
