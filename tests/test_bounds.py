"""emulate.bounds: gamma_K, and dot_general_bound as a true and not absurdly loose bound.

The exact values come from :func:`emulate.reference.exact_dot_general` (Fractions); the
computed results from XLA's own f32 dot on the CPU and from a sequential float32 loop in
numpy, the worst order the bound allows for.
"""

from __future__ import annotations

import math
from fractions import Fraction

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import emulate
from emulate import bounds, reference

U = Fraction(1, 2**24)
TINY = Fraction(1, 2**125)
MIN_NORMAL = 2.0**-126


@pytest.mark.parametrize("k", [0, 1, 2, 3, 100, 4096, 2**20, 2**23, 2**24 - 1])
def test_gamma_is_ku_over_1_minus_ku(k):
    # k*u and 1 - k*u are exact in float64, so gamma is their correctly rounded quotient.
    assert bounds.gamma(k) == float(Fraction(k, 2**24 - k))


@pytest.mark.parametrize("k", [2**24, 2**24 + 1, 2**30])
def test_gamma_is_inf_once_ku_reaches_1(k):
    assert bounds.gamma(k) == math.inf


def test_gamma_other_unit_roundoff():
    assert bounds.gamma(3, 2.0**-8) == float(Fraction(3, 253))
    assert bounds.gamma(256, 2.0**-8) == math.inf
    assert bounds.U_F32 == 2.0**-24 and bounds.UNDERFLOW_PER_TERM == 2.0**-125


# A fixed pool of layouts (K = 1, odd K, K = 64, batch dims, contracting dims first).
LAYOUTS = [
    ((3, 1), (1, 2), (((1,), (0,)), ((), ()))),
    ((2, 13), (13, 3), (((1,), (0,)), ((), ()))),
    ((64, 2), (3, 64), (((0,), (1,)), ((), ()))),
    ((2, 3, 4), (4, 2, 3), (((1, 2), (2, 0)), ((0,), (1,)))),
    ((1, 64), (64, 1), (((1,), (0,)), ((), ()))),
]


def to_bmk(x: np.ndarray, contract, batch) -> np.ndarray:
    """(batch..., free..., contract...) merged to (B, M, K), as lax orders the result."""
    free = tuple(d for d in range(x.ndim) if d not in contract and d not in batch)
    t = x.transpose(tuple(batch) + free + tuple(contract))
    sizes = [math.prod(x.shape[d] for d in g) for g in (batch, free, contract)]
    return t.reshape(sizes)


def sequential_f32(a: np.ndarray, b: np.ndarray, dn) -> np.ndarray:
    """dot_general as a left-to-right float32 loop: each product and each sum rounded."""
    (lc, rc), (lb, rb) = dn
    lm = to_bmk(a.astype(np.float32), lc, lb)
    rm = to_bmk(b.astype(np.float32), rc, rb)  # (B, N, K)
    acc = np.zeros((lm.shape[0], lm.shape[1], rm.shape[1]), np.float32)
    for k in range(lm.shape[2]):
        acc = acc + lm[:, :, k, None] * rm[:, None, :, k]
    return acc


_xla_dot = jax.jit(
    lambda a, b, dn: lax.dot_general(a, b, dn, preferred_element_type=jnp.float32),
    static_argnums=2,
)

# Values over a wide range of binades, cancelling pairs, subnormals (which XLA on the
# CPU reads as zero) and products that underflow; |products| < 2**120 and |sums| < 2**127.
_SPECIAL = [0.0, 1.0, -1.0, 2.0**-24, 1 + 2.0**-23, 2.0**-126, 2.0**-140, -(3 * 2.0**-135), 2.0**59]
_ELEMENTS = st.one_of(
    st.floats(-(2.0**59), 2.0**59, width=32, allow_nan=False, allow_subnormal=True),
    st.floats(-4, 4, width=32, allow_nan=False, allow_subnormal=True),
    st.sampled_from(_SPECIAL),
)


@st.composite
def f32_problem(draw):
    lshape, rshape, dn = draw(st.sampled_from(LAYOUTS))
    dtype = draw(st.sampled_from([np.float32, ml_dtypes.bfloat16]))
    a = draw(hnp.arrays(np.float32, lshape, elements=_ELEMENTS)).astype(dtype)
    b = draw(hnp.arrays(np.float32, rshape, elements=_ELEMENTS)).astype(dtype)
    if draw(st.booleans()):  # cancellation: the rhs contraction repeats with opposite sign
        b = b.copy()
        flat = np.moveaxis(b, dn[0][1][0], 0)
        half = flat.shape[0] // 2
        flat[half : 2 * half] = -flat[:half]
    return a, b, dn


def flushed_sum(a, b, dn) -> np.ndarray:
    """Exact sum of |a_k b_k| over terms with a subnormal operand (Fractions)."""
    af = np.abs(np.asarray(a).astype(np.float64))
    bf = np.abs(np.asarray(b).astype(np.float64))
    a_sub = np.where(af < MIN_NORMAL, af, 0).astype(np.float32)
    b_sub = np.where(bf < MIN_NORMAL, bf, 0).astype(np.float32)
    ex = reference.exact_dot_general
    return ex(a_sub, bf.astype(np.float32), dn) + ex(af.astype(np.float32), b_sub, dn)


def check_bound(r, a, b, dn) -> None:
    """|r - exact| <= bound, and bound <= 2*K*u*S + flushed + K*2**-125 (all exact)."""
    (lc, _), _ = dn
    k = math.prod(np.shape(a)[d] for d in lc)
    exact = reference.exact_dot_general(a, b, dn)
    s = reference.exact_dot_general(np.abs(a), np.abs(b), dn)
    flushed = flushed_sum(a, b, dn)
    bound = bounds.dot_general_bound(a, b, dn)
    r = np.asarray(r, np.float64).reshape(exact.shape)
    assert bound.shape == exact.shape
    for e, sv, fl, bd, rv in zip(exact.flat, s.flat, flushed.flat, bound.flat, r.flat, strict=True):
        err = abs(Fraction(float(rv)) - e)
        assert err <= Fraction(float(bd)), (float(rv), float(e), float(err), bd)
        assert Fraction(float(bd)) <= 2 * k * U * sv + fl + k * TINY, (bd, float(sv))


@settings(max_examples=40)
@given(f32_problem())
def test_bound_holds_for_xla_f32_dot(problem):
    a, b, dn = problem
    r = _xla_dot(jnp.asarray(a), jnp.asarray(b), dn)
    assert r.dtype == jnp.float32
    check_bound(r, a, b, dn)


@settings(max_examples=40)
@given(f32_problem())
def test_bound_holds_for_sequential_f32_loop(problem):
    a, b, dn = problem
    r = sequential_f32(a, b, dn)
    check_bound(r, a, b, dn)


def test_bound_is_nearly_attained_by_sequential_summation():
    # 1 + 2**-24 + 2**-24 + ...: every addition is a tie that rounds back down to 1, so
    # the sequential sum loses (K - 1) * 2**-24, about K*u*S: the bound is within 2x.
    k = 64
    a = np.full((1, k), 2.0**-24, np.float32)
    a[0, 0] = 1.0
    b = np.ones((k, 1), np.float32)
    dn = (((1,), (0,)), ((), ()))
    r = sequential_f32(a, b, dn)
    assert float(r[0, 0, 0]) == 1.0
    err = Fraction(k - 1, 2**24)
    bound = Fraction(float(bounds.dot_general_bound(a, b, dn)[0, 0]))
    assert err <= bound <= 2 * err
    check_bound(r, a, b, dn)


def test_subnormal_operand_flushed_by_xla_is_covered():
    # XLA on the CPU reads a subnormal operand as zero: the product 2**-40 is lost whole,
    # far more than gamma_K * sum|ab| + K * 2**-125 of the remaining terms would allow.
    a = np.array([[2.0**-140, 2.0**-100]], np.float32)
    b = np.array([[2.0**100], [1.0]], np.float32)
    dn = (((1,), (0,)), ((), ()))
    r = _xla_dot(jnp.asarray(a), jnp.asarray(b), dn)
    assert float(r[0, 0]) == 2.0**-100  # the 2**-40 term is gone
    check_bound(r, a, b, dn)
    # The same through emulate: bf16 activations x float8_e4m3fn weights on tpu_v4.
    x = np.array([[2.0**-130, 0.0]], ml_dtypes.bfloat16)
    w = np.array([[448.0], [1.0]], ml_dtypes.float8_e4m3fn)
    got = emulate.dot_general(x, w, dn, preferred_element_type=jnp.float32, target="tpu_v4")
    assert float(got[0, 0]) == 0.0
    check_bound(got, x, w, dn)


def close_above(got: float, want: Fraction) -> bool:
    """``want <= got <= want * (1 + 2**-40)``: the formula, up to float64 rounding slack."""
    return want <= Fraction(got) <= want * (1 + Fraction(1, 2**40))


def gamma_exact(k: int) -> Fraction:
    return Fraction(k, 2**24 - k)


def test_nonfinite_elements_get_inf():
    # Inf * 0, Inf * 2 and a NaN operand: the bound says nothing there (IEEE rules do).
    dn = (((1,), (0,)), ((), ()))
    a = np.array([[np.inf, 1.0], [1.0, 1.0], [np.nan, 0.0]], np.float32)
    b = np.array([[0.0, 2.0], [1.0, 1.0]], np.float32)
    got = bounds.dot_general_bound(a, b, dn)
    assert np.isinf(got).tolist() == [[True, True], [False, False], [True, True]]
    assert close_above(got[1, 0], gamma_exact(2) * 1 + 2 * TINY)
    assert close_above(got[1, 1], gamma_exact(2) * 3 + 2 * TINY)


def test_integer_and_low_precision_operands():
    dn = (((1,), (0,)), ((), ()))
    a = np.array([[-8, 7, 3]], ml_dtypes.int4)
    b = np.array([[2.0], [-0.5], [448.0]], ml_dtypes.float8_e4m3fn)
    got = bounds.dot_general_bound(a, b, dn)
    assert got.dtype == np.float64 and got.shape == (1, 1)
    s = Fraction(16) + Fraction(7, 2) + 1344
    assert close_above(got[0, 0], gamma_exact(3) * s + 3 * TINY)


def test_no_contraction_and_empty_contraction():
    a = np.array([[3.0, -2.0]], np.float32)
    b = np.array([5.0], np.float32)
    got = bounds.dot_general_bound(a, b, (((), ()), ((), ())))
    assert got.shape == (1, 2, 1)
    assert close_above(got[0, 0, 0], gamma_exact(1) * 15 + TINY)
    assert close_above(got[0, 1, 0], gamma_exact(1) * 10 + TINY)
    empty = bounds.dot_general_bound(
        np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32), (((1,), (0,)), ((), ()))
    )
    assert empty.tolist() == [[0.0] * 3] * 2


# Permuted dimension numbers: contracting and batch dims in every position.
SUBSCRIPT_CASES = [
    ((2, 3), (3, 4), (((1,), (0,)), ((), ())), "ab,bc->ac"),
    ((3, 2), (4, 3), (((0,), (1,)), ((), ())), "ab,ca->bc"),
    ((5, 2, 3), (3, 5, 4), (((2,), (0,)), ((0,), (1,))), "abc,cad->abd"),
    ((2, 3, 4), (4, 2, 3), (((1, 2), (2, 0)), ((0,), (1,))), "abc,cab->a"),
    ((4, 2, 3), (3, 2, 4), (((0,), (2,)), ((1,), (1,))), "abc,dba->bcd"),
    ((3, 2, 5, 2), (2, 5, 3, 4), (((2,), (1,)), ((3, 0), (0, 2))), "abcd,dcae->dabe"),
    ((7,), (7,), (((0,), (0,)), ((), ())), "a,a->"),
    ((2, 3), (4,), (((), ()), ((), ())), "ab,c->abc"),
]


@pytest.mark.parametrize("lshape,rshape,dn,subs", SUBSCRIPT_CASES)
def test_einsum_subscripts_match_dot_general(lshape, rshape, dn, subs):
    got = bounds.einsum_subscripts(len(lshape), len(rshape), dn)
    assert got == subs
    rng = np.random.default_rng(len(subs))
    a = rng.integers(-128, 128, lshape).astype(np.int8)
    b = rng.integers(-128, 128, rshape).astype(np.int8)
    want_shape = jax.eval_shape(
        lambda x, y: lax.dot_general(x, y, dn, preferred_element_type=jnp.int32), a, b
    ).shape
    out = np.einsum(got, a.astype(np.int64), b.astype(np.int64))
    assert out.shape == want_shape
    want = reference.dot_general(a, b, dn, preferred_element_type=np.int32)
    assert out.tolist() == want.astype(np.int64).tolist()


def test_qarray_bound_is_gamma_k_plus_s_plus_c():
    x = np.array([[1.0, -2.0, 3.0, 0.5]])
    w = np.array([[1.0], [0.25], [-1.0], [4.0]])
    dn = (((1,), (0,)), ((), ()))
    total = 1 * 1 + 2 * 0.25 + 3 * 1 + 0.5 * 4
    for route, c in (("xla", 5), ("pallas", 5)):
        got = bounds.qarray_bound(x, w, dn, segments=2, route=route)
        n = 4 + 2 + c
        assert got[0, 0] == pytest.approx(bounds.gamma(n) * total + n * 2.0**-125, rel=1e-12)
    with pytest.raises(ValueError, match=r"^route: expected one of \['pallas', 'xla'\], got 'gpu"):
        bounds.qarray_bound(x, w, dn, segments=1, route="gpu")
    with pytest.raises(ValueError, match=r"^segments: expected at least 1, got 0$"):
        bounds.qarray_bound(x, w, dn, segments=0)
