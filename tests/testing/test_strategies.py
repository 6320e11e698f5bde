"""emulate.testing's strategies: formats, codes, arrays and dot_general problems."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulate import formats, reference
from emulate import testing as et

DN = (((1,), (0,)), ((), ()))
LOW = [f for f in formats.LOW_PRECISION if f != "float8_e8m0fnu"]


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
        (
            {"fill": "max"},
            "fill: expected None, 'extreme', 'odd_extreme' or a value of int8, got 'max'",
        ),
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
