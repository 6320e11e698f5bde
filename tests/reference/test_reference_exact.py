"""emulate.reference's rounding and dot_general against brute force: exact sums from plain
loops over ``fractions.Fraction``, rounding by picking the nearest of the output format's
enumerated values (tests/reference/_brute.py).

Default vs long: dot_general runs a covering subset of the operand pairs by default (each
format with itself, its neighbour, int8 and float32: :func:`_dot_pairs`), every pair under
EMULATE_LONG_TESTS=1."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from _brute import (
    DOT_FORMATS,
    DTYPES,
    INTEGERS,
    PREFERRED,
    ROUNDING_TARGETS,
    SMALL_FLOATS,
    bits_of,
    codes_strategy,
    from_codes,
    max_code,
    nearest,
    same_float,
    value_of,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from emulate import formats, reference


def test_round_exact_overflow_rules():
    assert reference.round_exact(464, 0, "float8_e4m3fn") == 448.0
    assert math.isnan(reference.round_exact(465, 0, "float8_e4m3fn"))
    assert math.isnan(reference.round_exact(248, 0, "float8_e4m3fnuz"))
    assert reference.round_exact(247, 0, "float8_e4m3fnuz") == 240.0
    assert reference.round_exact(61440, 0, "float8_e5m2") == math.inf
    assert reference.round_exact(61439, 0, "float8_e5m2") == 57344.0
    assert reference.round_exact(-(10**40), 0, "float4_e2m1fn") == -6.0
    assert reference.round_exact(-(2**1000), 5, "float32") == -math.inf
    assert reference.round_exact(2**128 - 2**103, 0, "float32") == math.inf
    assert reference.round_exact(2**128 - 2**103 - 1, 0, "float32") == float(
        ml_dtypes.finfo(np.float32).max
    )


def test_round_exact_underflow_and_ties():
    assert reference.round_exact(1, -150, "float32") == 0.0
    assert reference.round_exact(3, -151, "float32") == 2.0**-149
    assert reference.round_exact(3, -150, "float32") == 2.0**-148
    assert reference.round_exact(1, -10, "float8_e4m3fn") == 0.0
    assert math.copysign(1, reference.round_exact(-1, -10, "float8_e4m3fn")) == -1
    assert math.copysign(1, reference.round_exact(-1, -12, "float8_e4m3fnuz")) == 1
    assert reference.round_exact(17, 0, "e4m3fn") == 16.0
    assert reference.round_exact(19, 0, "e4m3fn") == 20.0
    assert reference.round_exact(0, 10**6, "float4_e2m1fn") == 0.0
    assert reference.round_exact(2**200 + 1, -200, "bfloat16") == 1.0


def test_round_exact_rejects_bad_input():
    with pytest.raises(ValueError, match="fmt: int8 is not a rounding target"):
        reference.round_exact(1, 0, "int8")
    with pytest.raises(ValueError, match="fmt: float8_e8m0fnu"):
        reference.round_exact(1, 0, "e8m0")
    with pytest.raises(TypeError, match="numerator: .*float"):
        reference.round_exact(1.5, 0, "f32")
    with pytest.raises(TypeError, match="exponent: .*str"):
        reference.round_exact(1, "0", "f32")


@st.composite
def near_format_values(draw, name: str) -> float:
    """A value of ``name``, or a point between two adjacent ones (ties and near-ties)."""
    top = max_code(name)
    code = draw(st.integers(0, top))
    lo = value_of(name, code)
    hi = value_of(name, code + 1) if code < top else 2 * lo - value_of(name, code - 1)
    t = draw(st.sampled_from([Fraction(0), Fraction(1, 4), Fraction(1, 2), Fraction(3, 4)]))
    nudge = draw(st.sampled_from([0, 1, -1])) * Fraction(1, 2**20) * (hi - lo)
    v = float(lo + t * (hi - lo) + nudge)
    return -v if draw(st.booleans()) else v


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_round_exact_matches_ml_dtypes_cast(data):
    name = data.draw(st.sampled_from(ROUNDING_TARGETS))
    v = data.draw(
        st.one_of(st.floats(allow_nan=False, allow_infinity=False), near_format_values(name))
    )
    mantissa, exp = math.frexp(v)
    got = reference.round_exact(int(mantissa * 2**53), exp - 53, name)
    with np.errstate(over="ignore", invalid="ignore"):
        expected = float(np.array(v, np.float64).astype(DTYPES[name]).astype(np.float64))
    same_sign = v == 0 or math.copysign(1, got) == math.copysign(1, expected)
    assert (math.isnan(got) and math.isnan(expected)) or (got == expected and same_sign), (
        name,
        v,
        got,
        expected,
    )


@pytest.mark.parametrize("name", SMALL_FLOATS)
def test_round_exact_every_midpoint(name):
    """Every value, midpoint and near-midpoint of a small format against brute force."""
    top = max_code(name)
    values = [value_of(name, c) for c in range(top + 1)]
    values.append(2 * values[-1] - values[-2])
    tiny = values[1] / 2**20
    for lo, hi in itertools.pairwise(values):
        mid = (lo + hi) / 2
        for x in (lo, mid - tiny, mid, mid + tiny, hi + (hi - lo) * 3):
            for signed in (x, -x):
                exponent = 1 - signed.denominator.bit_length()
                got = reference.round_exact(signed.numerator, exponent, name)
                expected = nearest(signed, name)
                assert got == expected or (math.isnan(got) and math.isnan(expected)), (
                    name,
                    signed,
                    got,
                    expected,
                )


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(ROUNDING_TARGETS),
    numerator=st.integers(-(2**40), 2**40),
    exponent=st.integers(-190, 140),
)
def test_round_exact_matches_brute_force(name, numerator, exponent):
    x = Fraction(numerator) * Fraction(2) ** exponent
    got = reference.round_exact(numerator, exponent, name)
    expected = nearest(x, name)
    assert got == expected or (math.isnan(got) and math.isnan(expected)), (name, x, got, expected)


# ------------------------------------------------------------------------ dot_general


def brute_dot_general(lhs, rhs, dimension_numbers, out_name: str) -> np.ndarray:
    """lax.dot_general by nested loops: Python ints for integers, Fractions for floats."""
    (lc, rc), (lb, rb) = dimension_numbers
    lfree = [a for a in range(lhs.ndim) if a not in (*lc, *lb)]
    rfree = [a for a in range(rhs.ndim) if a not in (*rc, *rb)]
    out_shape = [lhs.shape[a] for a in (*lb, *lfree)] + [rhs.shape[a] for a in rfree]
    k_shape = [lhs.shape[a] for a in lc]
    with np.errstate(invalid="ignore"):
        lv, rv = lhs.astype(np.float64), rhs.astype(np.float64)
    out = np.zeros(out_shape, dtype=np.float64)
    for idx in itertools.product(*map(range, out_shape)):
        li, ri = [0] * lhs.ndim, [0] * rhs.ndim
        b, i, j = idx[: len(lb)], idx[len(lb) : len(lb) + len(lfree)], idx[len(lb) + len(lfree) :]
        for axes, pos, vals in ((lb, li, b), (rb, ri, b), (lfree, li, i), (rfree, ri, j)):
            for a, v in zip(axes, vals, strict=True):
                pos[a] = v
        float_sum, exact = 0.0, Fraction(0)
        for k in itertools.product(*map(range, k_shape)):
            for a, v in zip(lc, k, strict=True):
                li[a] = v
            for a, v in zip(rc, k, strict=True):
                ri[a] = v
            x, y = float(lv[tuple(li)]), float(rv[tuple(ri)])
            float_sum += x * y
            if math.isfinite(x) and math.isfinite(y):
                exact += Fraction(x) * Fraction(y)
        if not math.isfinite(float_sum):
            with np.errstate(invalid="ignore", over="ignore"):
                out[idx] = np.array(float_sum).astype(DTYPES[out_name]).astype(np.float64)
        elif out_name in INTEGERS or out_name == "int32":
            bits = bits_of(out_name)
            wrapped = int(exact) % (1 << bits)
            signed = out_name == "int32" or INTEGERS[out_name][1]
            out[idx] = wrapped - (1 << bits) if signed and wrapped >> (bits - 1) else wrapped
        else:
            out[idx] = nearest(exact, out_name)
    return out


@st.composite
def dot_operands(draw, lname: str, rname: str):
    """Operands with permuted batch / free / contracting axes, and their dimension numbers."""
    n_batch, n_contract = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    n_lfree, n_rfree = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    batch = [draw(st.integers(1, 2)) for _ in range(n_batch)]
    contract = [draw(st.sampled_from([0, 1, 1, 2, 3, 5])) for _ in range(n_contract)]
    lfree = [draw(st.integers(0, 3)) for _ in range(n_lfree)]
    rfree = [draw(st.integers(1, 3)) for _ in range(n_rfree)]

    def build(name: str, free: list[int]):
        sizes = batch + free + contract
        perm = draw(st.permutations(range(len(sizes))))
        shape = [0] * len(sizes)
        for logical, physical in enumerate(perm):
            shape[physical] = sizes[logical]
        n = math.prod(shape)
        codes = draw(st.lists(codes_strategy(name), min_size=n, max_size=n))
        arr = from_codes(name, codes).reshape(shape)
        b_axes = tuple(perm[: len(batch)])
        c_axes = tuple(perm[len(batch) + len(free) :])
        return arr, b_axes, c_axes

    lhs, lb, lc = build(lname, lfree)
    rhs, rb, rc = build(rname, rfree)
    return lhs, rhs, ((lc, rc), (lb, rb))


def _dot_pairs() -> list:
    """Every (lhs, rhs) pair of DOT_FORMATS; by default (80 of 225) each format with itself,
    with the next one in DOT_FORMATS' order (int x int of either signedness, int x float,
    float8 x float8 of other kinds, float x int) and with int8 and float32 on either side;
    the other pairs, more of the same decoders and result rules, under
    EMULATE_LONG_TESTS=1."""
    n, partners = len(DOT_FORMATS), ("int8", "float32")
    pairs = []
    for i, lname in enumerate(DOT_FORMATS):
        for j, rname in enumerate(DOT_FORMATS):
            default = lname == rname or j == (i + 1) % n or {lname, rname} & set(partners)
            pairs.append(pytest.param(lname, rname, marks=() if default else pytest.mark.long))
    return pairs


@pytest.mark.parametrize("lname, rname", _dot_pairs())
@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_dot_general_matches_brute_force(lname, rname, data):
    lhs, rhs, dn = data.draw(dot_operands(lname, rname))
    preferred = data.draw(st.one_of(st.none(), st.sampled_from(PREFERRED)))
    try:
        out_fmt = formats.dot_result(lname, rname, preferred)
    except TypeError:
        with pytest.raises(TypeError):
            reference.dot_general(lhs, rhs, dn, preferred)
        return
    if out_fmt.is_integer and (formats.get(lname).is_float or formats.get(rname).is_float):
        with pytest.raises(TypeError, match="^preferred_element_type: an integer result"):
            reference.dot_general(lhs, rhs, dn, preferred)
        return
    got = reference.dot_general(lhs, rhs, dn, preferred)
    expected = brute_dot_general(lhs, rhs, dn, out_fmt.name)
    assert got.dtype == out_fmt.dtype
    assert same_float(got, expected), (lhs, rhs, dn, preferred, got, expected)


def test_dot_general_axis_order_matches_lax():
    import jax

    rng = np.random.default_rng(0)
    lhs = rng.integers(-8, 8, size=(3, 2, 4, 5, 6)).astype(np.float32)
    rhs = rng.integers(-8, 8, size=(5, 3, 2, 7, 6)).astype(np.float32)
    dn = (((3, 1), (0, 2)), ((4, 0), (4, 1)))
    got = reference.dot_general(lhs, rhs, dn)
    expected = np.asarray(jax.lax.dot_general(lhs, rhs, dn))
    assert got.shape == expected.shape == (6, 3, 4, 7)
    assert np.array_equal(got, expected)


def test_integer_sum_needs_int32():
    a = np.full((1, 4096), -128, np.int8)
    dn = (((1,), (1,)), ((), ()))
    got = reference.dot_general(a, a, dn, preferred_element_type=np.int32)
    assert got.dtype == np.int32 and got[0, 0] == 67108864
    wrapped = reference.dot_general(a, a, dn)
    assert wrapped.dtype == np.int8 and wrapped[0, 0] == 0


def test_integer_results_wrap():
    dn = (((0,), (0,)), ((), ()))
    lhs = np.array([65536, 2**31 - 1, 3], np.int32)
    rhs = np.array([32768, 2**31 - 1, -7], np.int32)
    exact = 2**31 + (2**31 - 1) ** 2 - 21
    expected = (exact + 2**31) % 2**32 - 2**31
    assert reference.dot_general(lhs[:1], rhs[:1], dn) == np.int32(-(2**31))
    assert reference.dot_general(lhs, rhs, dn) == np.int32(expected)
    u = np.array([255], np.uint8)
    assert reference.dot_general(u, u, dn) == 1
    i4 = np.array([7, -8], ml_dtypes.int4)
    got = reference.dot_general(i4, i4, dn)
    assert got.dtype == ml_dtypes.int4 and int(got) == 1  # 49 + 64 = 113 = 7 * 16 + 1
    assert reference.exact_dot_general(lhs, rhs, dn) == Fraction(exact)


def test_integer_result_with_float_operand_is_rejected():
    dn = (((0,), (0,)), ((), ()))
    a = np.ones(3, np.int8)
    b = np.ones(3, ml_dtypes.float8_e4m3fn)
    # The plans' rule and type (emulate.formats.result_format): lax.conv_general_dilated
    # refuses it with a TypeError too.
    with pytest.raises(
        TypeError,
        match=r"^preferred_element_type: an integer result \(int32\) needs integer operands, "
        r"got int8 x float8_e4m3fn$",
    ):
        reference.dot_general(a, b, dn, preferred_element_type="int32")


def test_float_result_is_rounded_once():
    dn = (((0,), (0,)), ((), ()))
    f32 = np.float32
    lhs = np.array([2.0**100, 1.0, -(2.0**100)], f32)
    rhs = np.array([1.0, 2.0**-100, 1.0], f32)
    assert reference.dot_general(lhs, rhs, dn) == f32(2.0**-100)
    e4 = ml_dtypes.float8_e4m3fn
    assert reference.dot_general(np.array([448, 16], e4), np.ones(2, e4), dn) == 448
    assert np.isnan(reference.dot_general(np.array([448, 16, 1], e4), np.ones(3, e4), dn))
    assert np.isnan(reference.dot_general(np.array([448, 448], e4), np.ones(2, e4), dn))
    e5 = ml_dtypes.float8_e5m2
    assert reference.dot_general(np.array([57344, 57344], e5), np.ones(2, e5), dn) == np.inf
    fp4 = ml_dtypes.float4_e2m1fn
    assert reference.dot_general(np.array([6, 6], fp4), np.ones(2, fp4), dn) == 6


def test_nan_and_inf_follow_ieee():
    dn = (((1,), (0,)), ((), ()))
    e5 = ml_dtypes.float8_e5m2
    lhs = np.array([[np.inf, 1.0], [np.inf, -np.inf], [np.inf, 2.0], [np.nan, 0.0]], e5)
    rhs = np.array([[0.0, -1.0, 1.0], [1.0, 1.0, 1.0]], e5)
    got = reference.dot_general(lhs, rhs, dn)
    expected = np.array(
        [
            [np.nan, -np.inf, np.inf],  # inf * 0; inf * -1 + 1 * 1; inf * 1 + 1 * 1
            [np.nan, -np.inf, np.nan],  # inf * 0; inf * -1 + -inf * 1; inf - inf
            [np.nan, -np.inf, np.inf],
            [np.nan, np.nan, np.nan],
        ]
    )
    assert same_float(got, expected)
    inf = np.array([np.inf], e5)
    one = np.ones(1, e5)
    d1 = (((0,), (0,)), ((), ()))
    assert np.isnan(reference.dot_general(inf, one, d1, preferred_element_type="e4m3fn"))
    assert reference.dot_general(inf, one, d1, preferred_element_type="e2m1") == 6


def test_empty_contraction_gives_zeros():
    lhs = np.zeros((2, 0), ml_dtypes.float8_e4m3fn)
    rhs = np.zeros((0, 3), ml_dtypes.float6_e2m3fn)
    dn = (((1,), (0,)), ((), ()))
    got = reference.dot_general(lhs, rhs, dn, preferred_element_type="bf16")
    assert got.dtype == ml_dtypes.bfloat16 and got.shape == (2, 3) and not got.astype(float).any()
    assert (reference.exact_dot_general(lhs, rhs, dn) == Fraction(0)).all()


def test_exact_dot_general_values():
    dn = (((1,), (0,)), ((), ()))
    e5 = ml_dtypes.float8_e5m2
    lhs = np.array([[1.0, 1.0, 2.0**-16], [np.inf, 0.0, 1.0]], e5)
    rhs = np.array([[1.0], [0.125], [2.0**-16]], e5)
    got = reference.exact_dot_general(lhs, rhs, dn)
    assert got.dtype == object and got.shape == (2, 1)
    assert got[0, 0] == Fraction(9, 8) + Fraction(1, 2**32)
    assert got[1, 0] == math.inf


def test_numpy_matmul_is_no_reference():
    """np.dot and np.matmul sum ml_dtypes arrays in float32: a double rounding."""
    e5 = ml_dtypes.float8_e5m2
    lhs = np.array([[1.0, 1.0, 2.0**-16]], e5)
    rhs = np.array([[1.0], [0.125], [2.0**-16]], e5)
    got = reference.dot_general(lhs, rhs, (((1,), (0,)), ((), ())))
    assert got.dtype == e5 and float(got[0, 0]) == 1.25
    assert np.dot(lhs, rhs).dtype == e5 and float(np.dot(lhs, rhs)[0, 0]) == 1.0
    assert np.matmul(lhs, rhs).dtype == np.float32 and float(np.matmul(lhs, rhs)[0, 0]) == 1.125


def test_dot_general_validates_arguments():
    a = np.zeros((2, 3), np.float32)
    b = np.zeros((4, 5), np.float32)
    with pytest.raises(ValueError, match=r"lhs axis 1 of shape \(2, 3\) vs rhs axis 0 of shape"):
        reference.dot_general(a, b, (((1,), (0,)), ((), ())))
    with pytest.raises(ValueError, match="lhs_contract: axis 2"):
        reference.dot_general(a, b, (((2,), (0,)), ((), ())))
    with pytest.raises(ValueError, match="dimension_numbers: lhs has 1 contracting"):
        reference.dot_general(a, b, (((1,), ()), ((), ())))
    with pytest.raises(ValueError, match="dimension_numbers: expected"):
        reference.dot_general(a, b, ((1,), (0,)))
    with pytest.raises(ValueError, match="lhs: dtype float64"):
        reference.dot_general(np.zeros((2, 3)), b, (((1,), (0,)), ((), ())))
    square = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match="rhs axes repeat"):
        reference.dot_general(square, square, (((1,), (0,)), ((0,), (0,))))
    e8 = np.ones(2, ml_dtypes.float8_e8m0fnu)
    with pytest.raises(ValueError, match="float8_e8m0fnu is a scale type"):
        reference.dot_general(e8, e8, (((0,), (0,)), ((), ())))
    assert reference.dot_general(e8, e8, (((0,), (0,)), ((), ())), "float32") == 2.0
