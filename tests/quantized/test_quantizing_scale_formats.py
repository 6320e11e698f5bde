"""Block scales in any scale format (emulate.numerics.scales.scale_format): the built-in
float8 types, the P3109 formats and registered ones, as quantize makes them and as
QArray.from_parts reads them (uint8 codes for a format without a dtype), checked bit for bit
against emulate.reference (numpy, ml_dtypes and the records' numpy decoders), and through
the matmuls on cpu, tpu_v4 and tpu_v5e."""

from __future__ import annotations

import math
import re

import _record_formats as R
import ml_dtypes
import numpy as np
import pytest
from _pages import section_blocks
from _sweeps import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import emulate
from emulate import formats, reference, testing
from emulate.numerics.scales import is_scale_format
from emulate.quantized.array import QArray

R.register_user_formats()
MATMUL = (((1,), (0,)), ((), ()))

#: Written out by hand from the rule (bf16/f16/f32, or a float format of at most 8 bits
#: with a NaN code and values within [2**-127, 2**128)), not from the code under test.
ACCEPTED = {
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3b11fnuz",
    "float8_e3m4",
    "float8_e8m0fnu",
    "bfloat16",
    "float16",
    "float32",
    "e3m3",  # 7 bits, one NaN per sign
    "u5e3m2",  # 5 bits, unsigned, +Inf and a NaN
    *formats.P3109_BINARY8,  # every one has a NaN; the smallest value, k8p1ue's, is 2**-127
}


def _codes(a) -> np.ndarray:
    """The bits of an array of codes (any 8-bit or narrower dtype, uint8 codes as they are)."""
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.astype(np.uint8)


def _same_values(got, want) -> bool:
    """Equal bits, NaN equal to NaN of either sign."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(
        np.where(np.isnan(got), 0, got).view(np.uint32),
        np.where(np.isnan(want), 0, want).view(np.uint32),
    )


def test_the_scale_format_rule_accepts_exactly_these() -> None:
    # Over the formats this module knows (other tests register more P3109 formats and
    # their own in the same process, so formats.names() depends on the test order).
    known = set(formats.LOW_PRECISION + formats.P3109_BINARY8 + formats.WIDE_FLOATS)
    known |= {"int32", "e3m3", "u5e3m2"}
    got = {n for n in known if is_scale_format(formats.get(n))}
    assert got == ACCEPTED
    # a format whose smallest value is below 2**-127 (bias 126, four trailing bits:
    # 2**(1 - 126 - 4)) is refused
    tiny = formats.float_format("tiny_scales", bits=8, precision=5, bias=126, high_nans=1)
    assert float(tiny.min_subnormal) == 2.0**-129 and not is_scale_format(tiny)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "scale_fmt: float4_e2m1fn is not a scale format; expected bfloat16, float16, "
            "float32 or a float format of at most 8 bits with a NaN code and values within "
            "[2**-127, 2**128)"
        ),
    ):
        emulate.quantize(np.ones((4, 2), np.float32), "int8", axis=0, scale_fmt="float4_e2m1fn")
    with pytest.raises(ValueError, match=r"^scale_fmt: expected a scale format .* got 'e9m9'"):
        emulate.quantize(np.ones((4, 2), np.float32), "int8", axis=0, scale_fmt="e9m9")


def _data() -> np.ndarray:
    """64 x 6 values over 40 binades, a zero block, a NaN block, an Inf block, f32
    subnormals and values beyond every element format's range."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)) * np.exp2(rng.integers(-20, 20, size=(64, 6)))
    x = x.astype(np.float32)
    x[:32, 0] = 0.0
    x[3, 1], x[40, 2] = np.nan, -np.inf
    x[33:36, 3] = [2.0**-130, -(2.0**-149), 3e38]
    x[50:53, 4] = [2.0**-100, 2.0**-99, -(2.0**-98)]  # a block of tiny values
    return x


CASES = [
    # (scale format, rule, tensor scale)
    ("float8_e5m2", "ocp_floor", False),
    ("float8_e5m2", "absmax", True),
    ("float8_e4m3fnuz", "round_up", False),
    ("float8_e3m4", "absmax", False),
    ("p3109_k8p3se", "ocp_floor", False),
    ("p3109_k8p3se", "absmax", True),
    ("p3109_k8p4ue", "absmax", False),
    ("p3109_k8p1ue", "even", False),  # powers of two down to 2**-127, as e8m0
    ("p3109_k8p1se", "absmax", False),
    ("u5e3m2", "ceil", False),
    ("u5e3m2", "absmax", True),
]


#: Each case runs with one element format by default, alternating; the other under
#: EMULATE_LONG_TESTS=1 (the whole cross, 22 cases, about 25 s).
PARAMS = [
    pytest.param(fmt, *case, marks=() if (i + j) % 2 == 0 else pytest.mark.long)
    for i, case in enumerate(CASES)
    for j, fmt in enumerate(["float4_e2m1fn", "e3m3"])
]


@pytest.mark.parametrize("fmt, sf, rule, ts", PARAMS)
def test_quantize_with_any_scale_format_matches_the_oracle(fmt, sf, rule, ts) -> None:
    x = _data()
    q = emulate.quantize(
        x, fmt, block_shape=32, axis=0, scale_fmt=sf, scale_rule=rule, tensor_scale=ts
    )
    codes, scales, t = reference.quantize(
        x, fmt, (32, 1), scale_fmt=sf, scale_rule=rule, tensor_scale=ts
    )
    assert q.scale_format == sf
    held = formats.get(sf).dtype if formats.get(sf).has_dtype else np.dtype(np.uint8)
    assert np.asarray(q.scales).dtype == held
    assert np.array_equal(_codes(q.unpacked_codes()), _codes(codes))
    assert np.array_equal(_codes(q.scales), _codes(scales))
    assert (q.tensor_scale is None) == (t is None)
    if ts:
        assert float(q.tensor_scale) == t
    f_arg = None if formats.get(fmt).has_dtype else fmt
    sf_arg = None if formats.get(sf).has_dtype else sf
    want = reference.dequantize(codes, scales, (32, 1), t, fmt=f_arg, scale_fmt=sf_arg)
    assert _same_values(q.dequantize(), want)
    assert np.isnan(want[:32, 1]).all() and np.isnan(want[32:, 2]).all()  # NaN, Inf blocks


# 2 examples by default, 8 under EMULATE_LONG_TESTS=1
@settings(max_examples=examples(2, 8), deadline=None)
@given(
    x=testing.arrays("float32", st.tuples(st.integers(1, 40), st.integers(1, 3))),
    sf=st.sampled_from(["p3109_k8p3se", "p3109_k8p4uf", "u5e3m2", "float8_e5m2fnuz"]),
    rule=st.sampled_from(["ocp_floor", "round_up", "absmax"]),
)
def test_quantize_into_scale_formats_on_awkward_shapes(x, sf, rule) -> None:
    """Ragged blocks of 16 along axis 0, special values boosted by emulate.testing."""
    x = np.asarray(x)
    q = emulate.quantize(
        x, "e3m3", block_shape=16, axis=0, scale_fmt=sf, scale_rule=rule, ragged=True
    )
    block = (min(16, x.shape[0]), 1)
    codes, scales, _ = reference.quantize(x, "e3m3", block, scale_fmt=sf, scale_rule=rule)
    assert np.array_equal(_codes(q.unpacked_codes()), _codes(codes))
    assert np.array_equal(_codes(q.scales), _codes(scales))
    sf_arg = None if formats.get(sf).has_dtype else sf
    want = reference.dequantize(codes, scales, block, fmt="e3m3", scale_fmt=sf_arg)
    assert _same_values(q.dequantize(), want)


def test_from_parts_reads_scale_codes_of_a_format_without_a_dtype() -> None:
    # p3109_k8p3se (P3109: k=8, p=3, bias 2**(k-p-1) = 16, extended): code 0x01 is its
    # smallest subnormal 2**(1 - 16 - 2) = 2**-17, 0x40 (exponent field 16) is 1, 0x80 its
    # NaN, 0x7f +Inf.
    codes = np.array([[448.0, -2.0], [0.5, 1.0], [448.0, 6.0], [-0.25, 0.0]], np.float32)
    codes = codes.astype(ml_dtypes.float8_e4m3fn)
    scale_codes = np.array([[0x01, 0x40], [0x80, 0x7F]], np.uint8)
    q = QArray.from_parts(codes, scale_codes, block_shape=(2, 1), scale_fmt="p3109_k8p3se")
    assert q.scale_format == "p3109_k8p3se"
    got = np.asarray(q.dequantize())
    assert got[0, 0] == 448 * 2.0**-17 and got[1, 0] == 0.5 * 2.0**-17
    assert got[0, 1] == -2.0 and got[1, 1] == 1.0
    assert np.isnan(got[2:, 0]).all()
    assert got[2, 1] == math.inf and np.isnan(got[3, 1])  # 6 * Inf; 0 * Inf
    want = reference.dequantize(codes, scale_codes, (2, 1), scale_fmt="p3109_k8p3se")
    assert _same_values(got, want)


def test_scales_below_2_pow_minus_126_are_read_exactly() -> None:
    """e8m0's 2**-127, p3109_k8p1ue's 2**-127 and f32 subnormal scales survive dequantize
    (their values are taken from the bits, not from flushing float arithmetic)."""
    codes = np.full((2, 3), 448.0, np.float32).astype(ml_dtypes.float8_e4m3fn)  # 1.75 * 2**8
    f32_scales = np.array([[2**-127, 2**-130, 2**-119]], np.float64).astype(np.float32)
    e8m0 = np.array([[0, 3, 16]], np.uint8).view(ml_dtypes.float8_e8m0fnu)
    e8m0_values = np.float32([[2.0**-127, 2.0**-124, 2.0**-111]])
    k8p1ue = np.array([[1, 3, 17]], np.uint8)  # p=1, unsigned, bias 128: code c is 2**(c-128)
    k8p1ue_values = np.float32([[2.0**-127, 2.0**-125, 2.0**-111]])
    cases = [(f32_scales, None, np.float32([[2.0**-127, 2.0**-130, 2.0**-119]]))]
    cases += [(e8m0, None, e8m0_values), (k8p1ue, "p3109_k8p1ue", k8p1ue_values)]
    for scales, sf, values in cases:
        q = QArray.from_parts(codes, scales, block_shape=(2, 1), scale_fmt=sf)
        expect = np.float32(448.0) * values.astype(np.float64)
        expect = np.where(np.abs(expect) < 2.0**-126, 0.0, expect).astype(np.float32)
        got = np.asarray(q.dequantize())
        assert np.array_equal(got, np.broadcast_to(expect, (2, 3))), (sf, got)
        assert _same_values(got, reference.dequantize(codes, scales, (2, 1), scale_fmt=sf))


def test_from_parts_refuses_scales_that_do_not_name_their_format() -> None:
    codes = np.zeros((4, 2), np.float32).astype(ml_dtypes.float8_e4m3fn)
    u8 = np.zeros((2, 2), np.uint8)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "scales: dtype uint8 is not a scale format; accepted: ('float8_e8m0fnu', "
            "'float8_e4m3fn', 'float8_e5m2', 'float8_e4m3fnuz', 'float8_e5m2fnuz', "
            "'float8_e4m3b11fnuz', 'float8_e3m4', 'bfloat16', 'float16', 'float32'); pass "
            "scale_fmt= for the codes of a scale format without a dtype"
        ),
    ):
        QArray.from_parts(codes, u8, block_shape=(2, 1))
    with pytest.raises(
        ValueError,
        match=r"^scales: dtype float32 does not hold p3109_k8p3se scales; expected "
        r"uint8 codes$",
    ):
        QArray.from_parts(
            codes, u8.astype(np.float32), block_shape=(2, 1), scale_fmt="p3109_k8p3se"
        )
    with pytest.raises(ValueError, match=r"^scale_fmt: int8 is not a scale format"):
        QArray.from_parts(codes, u8, block_shape=(2, 1), scale_fmt="int8")
    two_level = emulate.quantize(np.ones((2, 2), np.float32), "int8", axis=0)
    with pytest.raises(ValueError, match=r"^scale_fmt: a QArray of scales is read in float32"):
        QArray.from_parts(codes, two_level, block_shape=(2, 1), scale_fmt="float8_e5m2")


def test_tensor_scale_refuses_a_scale_format_whose_reciprocal_range_underflows() -> None:
    x = np.ones((4, 2), np.float32)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "tensor_scale: max(scale_fmt) * max(fmt) = 1.021e+40 (p3109_k8p1ue, float8_e4m3fnuz) "
            "must be below 2**126"
        ),
    ):
        emulate.quantize(
            x,
            "float8_e4m3fnuz",
            axis=0,
            scale_fmt="p3109_k8p1ue",
            scale_rule="absmax",
            tensor_scale=True,
        )


@pytest.mark.parametrize("target", ["cpu", "tpu_v4", "tpu_v5e"])
def test_matmuls_of_qarrays_with_p3109_scales_keep_the_contract(target) -> None:
    rng = np.random.default_rng(2)
    w = rng.normal(size=(64, 8)).astype(np.float32)
    x = rng.normal(size=(3, 64)).astype(np.float32)
    q = emulate.quantize(
        w, "float4_e2m1fn", block_shape=32, axis=0, scale_fmt="p3109_k8p3se", scale_rule="absmax"
    )
    got = emulate.dot_general(x, q, MATMUL, target=target)
    c = testing.compare(got, x, q, MATMUL, mode="fast")
    assert c.ok, c.report()


def test_the_scale_formats_example_of_the_quantized_page_runs() -> None:
    (code,) = section_blocks("quantized.md", "Scale formats")
    w = np.random.default_rng(3).normal(size=(64, 4)).astype(np.float32)
    names = {"emulate": emulate, "QArray": QArray, "w": w}
    exec(compile(code, "docs/quantized.md", "exec"), names)
    q, same = names["q"], names["same"]
    assert np.asarray(q.scales).dtype == np.uint8 and same.scale_format == "p3109_k8p3se"
    codes, scales, _ = reference.quantize(
        w, "float4_e2m1fn", (32, 1), scale_fmt="p3109_k8p3se", scale_rule="absmax"
    )
    want = reference.dequantize(codes, scales, (32, 1), scale_fmt="p3109_k8p3se")
    assert _same_values(same.dequantize(), want) and _same_values(q.dequantize(), want)


# 2 examples by default (each compiles its matmul), 12 under EMULATE_LONG_TESTS=1
@settings(max_examples=examples(2, 12), deadline=None)
@given(
    data=st.data(),
    sf=st.sampled_from(["p3109_k8p3se", "p3109_k8p4ue", "u5e3m2", "float8_e5m2"]),
)
def test_testing_draws_qarrays_with_any_scale_format(data, sf) -> None:
    """emulate.testing.qarrays with a P3109, registered or float8 scale format: scales
    drawn with 0, subnormals, the largest and negatives boosted, the matmul within its
    contract. (Finite scales: an Inf scale over a block holding a zero code gives Inf
    instead of NaN in the scaled tpu_v5e plan, for float16 scales on main too: a known
    gap, not of this feature.)"""
    spec = testing.quant_spec("float4_e2m1fn", axis=0, block=16, scale_format=sf)
    q = data.draw(testing.qarrays(spec, (32, 3), scales="finite"), label="q")
    x = data.draw(testing.arrays("float32", (2, 32), elements="finite"), label="x")
    assert q.scale_format == sf
    held = formats.get(sf).dtype if formats.get(sf).has_dtype else np.dtype(np.uint8)
    assert np.asarray(q.scales).dtype == held
    got = emulate.dot_general(x, q, MATMUL, target="tpu_v5e")
    c = testing.compare(got, x, q, MATMUL, mode="fast")
    assert c.ok, c.report()
