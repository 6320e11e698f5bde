"""Mode "exact" by exponent slicing: bit-identical to the reference, whatever the tiling.

Each slice type (int8 on tpu_v5e, bf16 on tpu_v4, f32 on tpu_v2), each layout and each
format class runs by default, each once; the further formats and targets of a sweep run under
EMULATE_LONG_TESTS=1 (the comment by each parametrization says which)."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _sweeps import LONG, examples
from hypothesis import given, settings
from hypothesis import strategies as st

import emulate
from emulate import formats, reference
from emulate import testing as et
from emulate.engine import exact
from emulate.engine.slices import static_slices
from emulate.planning import slicing

DN = (((1,), (0,)), ((), ()))
SLICED = [
    ("float8_e4m3fn", "float8_e4m3fn"),
    ("float8_e5m2", "float8_e5m2"),
    ("float8_e4m3fnuz", "float8_e4m3fnuz"),
    ("float8_e5m2fnuz", "float8_e5m2fnuz"),
    ("float8_e4m3b11fnuz", "float8_e4m3b11fnuz"),
    ("float8_e3m4", "float8_e3m4"),
    ("float6_e3m2fn", "float6_e3m2fn"),
    ("float8_e4m3fn", "float8_e5m2"),
    ("int8", "float8_e4m3fn"),
    ("float4_e2m1fn", "float8_e5m2"),
]
# One target per slice compute type: int8 (v5e), bf16 (v4), f32 (v2).
TARGETS = ["tpu_v5e", "tpu_v4", "tpu_v2"]
LAYOUTS = [
    ((2, 37), (37, 3), DN),
    ((5, 2, 3), (4, 2, 5), (((0,), (2,)), ((1,), (1,)))),
]


def same_bits(got, want) -> bool:
    g = np.asarray(got).astype(np.float32)
    w = np.asarray(want).astype(np.float32)
    if np.asarray(got).dtype != np.asarray(want).dtype or g.shape != w.shape:
        return False
    return bool(np.all((np.isnan(g) & np.isnan(w)) | (g == w)))


#: The result types of the property tests: by default each case takes one (its ``out``:
#: float32 and bfloat16 alternate over the default cases, each result type a program of
#: its own); under EMULATE_LONG_TESTS=1 each example of every case draws either.
OUTS = [jnp.float32, jnp.bfloat16]


def _check_correctly_rounded(lhs, rhs, target, layout, data, out):
    lshape, rshape, dn = LAYOUTS[layout]
    a = data.draw(et.arrays(lhs, lshape))
    b = data.draw(et.arrays(rhs, rshape))
    if LONG:
        out = data.draw(st.sampled_from(OUTS))
    got = emulate.dot_general(a, b, dn, preferred_element_type=out, target=target, mode="exact")
    want = reference.dot_general(a, b, dn, preferred_element_type=out)
    assert same_bits(got, want), (got, want)


# Every pair once, the targets and layouts taken in turn (each new combination compiles a
# program of some seconds), and e4m3fn x e4m3fn on every target.
CASES = [(a, b, TARGETS[i % 3], i % 2) for i, (a, b) in enumerate(SLICED)] + [
    ("float8_e4m3fn", "float8_e4m3fn", t, 1) for t in TARGETS[1:]
]
# e5m2 on int8 digits, alone and against per-row bfloat16 (the pairs of issue 16)
CASES += [("float8_e5m2", "float8_e5m2", "tpu_v5e", 1), ("bfloat16", "float8_e5m2", "tpu_v5e", 0)]
# By default e4m3fn and e5m2 (each slice type, both layouts), the mixed float8 pair, int8,
# float4 and issue 16's pairs; the other float8 and float6 formats (the same static slicing
# of another exponent range) and e4m3fn's second and third targets under
# EMULATE_LONG_TESTS=1.
LONG_FORMATS = {
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3b11fnuz",
    "float8_e3m4",
    "float6_e3m2fn",
}
# Also long: the mixed float8 pair (int8 x e4m3fn is the default mixed pair), and issue
# 16's pairs, which test_e5m2_digits_over_the_whole_exponent_range[tpu_v5e] checks by
# default (e5m2 x e5m2 and bfloat16 rows x e5m2 on int8 digits, every finite code).
LONG_PAIRS = {
    ("float8_e4m3fn", "float8_e5m2", "tpu_v4", 1),
    ("float8_e5m2", "float8_e5m2", "tpu_v5e", 1),
    ("bfloat16", "float8_e5m2", "tpu_v5e", 0),
}
CASES = [
    pytest.param(*c, marks=pytest.mark.long)
    if c[0] in LONG_FORMATS
    or (c[:2] == ("float8_e4m3fn",) * 2 and c[2] != "tpu_v5e")
    or c in LONG_PAIRS
    else c
    for c in CASES
]


def _with_outs(cases: list) -> list:
    """Each case with its result type (:data:`OUTS`): float32 and bfloat16 in turn over the
    default cases, None (drawn by each example) for the long ones."""
    done, default = [], 0
    for c in cases:
        if hasattr(c, "marks"):  # a pytest.param: a long case
            done.append(pytest.param(*c.values, None, marks=c.marks))
        else:
            done.append((*c, OUTS[default % 2]))
            default += 1
    return done


@pytest.mark.parametrize("lhs,rhs,target,layout,out", _with_outs(CASES))
@settings(max_examples=examples(3, 5))
@given(data=st.data())
def test_exact_mode_is_the_correctly_rounded_sum(lhs, rhs, target, layout, out, data):
    _check_correctly_rounded(lhs, rhs, target, layout, data, out)


E5 = ml_dtypes.float8_e5m2
#: The operands' shapes of test_e5m2_digits_over_the_whole_exponent_range (6 rows, every
#: finite e5m2 code along K, 5 columns): the small e5m2 checks on tpu_v5e pad theirs with
#: zeros into these (:func:`_e5m2_dot`), so that they run its program rather than each
#: building one of their own.
E5_SHAPES = ((6, len(et.finite_codes(formats.get("float8_e5m2")))), (5,))


def _e5m2_dot(a, b, target, mode="exact") -> np.ndarray:
    """``a @ b`` (float32 result) of e5m2 operands zero-padded into :data:`E5_SHAPES`,
    cut back to ``a @ b``'s shape. The padding adds exact zeros to every sum (where an
    Inf or NaN meets a zero, only in the rows and columns cut away)."""
    (m, k), (n,) = E5_SHAPES
    pa = np.zeros((m, k), E5)
    pb = np.zeros((k, n), E5)
    pa[: a.shape[0], : a.shape[1]] = a
    pb[: b.shape[0], : b.shape[1]] = b
    r = emulate.dot_general(
        pa, pb, DN, preferred_element_type=jnp.float32, target=target, mode=mode
    )
    return np.asarray(r)[: a.shape[0], : b.shape[1]]


# One target each by default (the property test above runs each slice type); the others
# under EMULATE_LONG_TESTS=1.
@pytest.mark.parametrize(
    "target", [TARGETS[0]] + [pytest.param(t, marks=pytest.mark.long) for t in TARGETS[1:]]
)
def test_halfway_and_sticky_cases(target):
    # 1 + 2**-24 is halfway between the f32 neighbours 1 and 1 + 2**-23: ties to even (1);
    # 2**-32 more (a product of two e5m2 subnormals) tips it up.
    a = np.array([[1.0, 2.0**-12, 2.0**-16]], E5)
    tie = np.array([[1.0], [2.0**-12], [0.0]], E5)
    above = np.array([[1.0], [2.0**-12], [2.0**-16]], E5)

    def run(b, mode):
        return float(_e5m2_dot(a, b, target, mode)[0, 0])

    assert run(tie, "exact") == 1.0
    assert run(above, "exact") == 1.0 + 2.0**-23
    assert run(above, "fast") == 1.0  # the f32 accumulator drops the 2**-32


# tpu_v5e's int8 digits into float32 by default (in the program of the e5m2 test below);
# into bfloat16 too, and on the other slice types, under EMULATE_LONG_TESTS=1 (the
# property tests' default cases run each slice type and both result types).
@pytest.mark.parametrize(
    "target", [TARGETS[0]] + [pytest.param(t, marks=pytest.mark.long) for t in TARGETS[1:]]
)
def test_catastrophic_cancellation(target):
    # 57344 * 57344 - 57344 * 57344 + 2**-16 * 2**-16: only the tiny product survives.
    a = np.array([[57344.0, -57344.0, 2.0**-16]], E5)
    b = np.array([[57344.0], [57344.0], [2.0**-16]], E5)
    assert _e5m2_dot(a, b, target)[0, 0] == 2.0**-32
    if LONG:
        r = emulate.dot_general(
            a, b, DN, preferred_element_type=jnp.bfloat16, target=target, mode="exact"
        )
        assert float(r[0, 0]) == 2.0**-32


def test_nan_and_inf_follow_ieee():
    # on tpu_v5e's int8 digits (in the program of the e5m2 test below); bf16 slices on
    # tpu_v4: test_wide_nan_and_inf_follow_ieee
    a = np.array([[np.inf, 1.0], [np.inf, 1.0], [np.nan, 1.0], [1.0, 1.0]], E5)
    b = np.array([[1.0, -1.0, 0.0], [2.0, 2.0, 1.0]], E5)
    got = _e5m2_dot(a, b, "tpu_v5e")
    want = reference.dot_general(a, b, DN, preferred_element_type=np.float32)
    assert same_bits(got, want)
    assert np.isnan(got[2]).all()  # a NaN row stays NaN
    inf_minus_inf = np.array([[np.inf, np.inf]], E5)
    sign = np.array([[1.0], [-1.0]], E5)
    assert np.isnan(_e5m2_dot(inf_minus_inf, sign, "tpu_v5e")[0, 0])


def test_long_contraction_k65536():
    rng = np.random.default_rng(65536)
    codes_a = rng.integers(0, 256, (1, 65536)).astype(np.uint8)
    codes_b = rng.integers(0, 256, (65536, 2)).astype(np.uint8)
    for c in (codes_a, codes_b):
        c[(c & 0x7F) >= 0x7C] = 0  # no NaN or Inf
    a, b = codes_a.view(E5), codes_b.view(E5)
    got = emulate.dot_general(
        a, b, DN, preferred_element_type=jnp.float32, target="tpu_v5e", mode="exact"
    )
    assert same_bits(got, reference.dot_general(a, b, DN, preferred_element_type=np.float32))


# Long: by default test_e5m2_digits_over_the_whole_exponent_range checks the static
# slicing's bits with short chunks, without jit and row by row, the property test gives
# the reference's bits on each slice type and both layouts (so the same bits across
# targets), and test_wide_same_bits_across_chunks_rows_layouts_and_targets the rest.
@pytest.mark.long
def test_same_bits_across_chunks_batches_and_layouts():
    rng = np.random.default_rng(7)
    codes_a = rng.integers(0, 126, (4, 300)).astype(np.uint8)
    codes_b = rng.integers(0, 126, (300, 3)).astype(np.uint8)
    codes_a[:, ::2] |= 0x80  # both signs, so sums cancel
    a = codes_a.view(ml_dtypes.float8_e4m3fn)
    b = codes_b.view(ml_dtypes.float8_e4m3fn)
    base = emulate.dot_general(
        a, b, DN, preferred_element_type=jnp.float32, target="tpu_v4", mode="exact"
    )
    # Other K-chunk lengths: the plan's chunk and two shorter ones.
    p = emulate.plan("float8_e4m3fn", "float8_e4m3fn", target="tpu_v4", mode="exact")
    av = emulate.decode(a, to=jnp.float32)
    bv = emulate.decode(b, to=jnp.float32)
    for chunk in (p.k_chunk, 64, 7):
        q = dataclasses.replace(p, k_chunk=chunk, out="float32")
        run = jax.jit(lambda x, y, q=q: exact.contract(q, x, y, DN, None))
        np.testing.assert_array_equal(run(av, bv), base)
    # Row by row (batch of 1) and with vmap.
    rows = jnp.concatenate(
        [
            emulate.dot_general(
                a[i : i + 1],
                b,
                DN,
                preferred_element_type=jnp.float32,
                target="tpu_v4",
                mode="exact",
            )
            for i in range(4)
        ]
    )
    np.testing.assert_array_equal(rows, base)
    # Transposed dimension numbers: contract lhs dim 0 with rhs dim 1.
    t = emulate.dot_general(
        np.ascontiguousarray(a.T),
        np.ascontiguousarray(b.T),
        (((0,), (1,)), ((), ())),
        preferred_element_type=jnp.float32,
        target="tpu_v4",
        mode="exact",
    )
    np.testing.assert_array_equal(t, base)
    # Other targets (int8 and f32 slices) give the same bits too.
    for target in ("tpu_v5e", "tpu_v2"):
        r = emulate.dot_general(
            a, b, DN, preferred_element_type=jnp.float32, target=target, mode="exact"
        )
        np.testing.assert_array_equal(r, base)


def test_plan_reports_the_slicing():
    p = emulate.plan("float8_e4m3fn", "float8_e4m3fn", target="tpu_v5e", mode="exact")
    assert p.method == "sliced-int8" and p.exact
    sa, sb = p.slicings()
    # e4m3fn: quanta 2**-9 .. 2**5 (15 exponents); int8 exponent windows hold 4 each (4
    # slices), but every |v| / 2**-9 is an integer up to 448 * 2**9 < 2**18, which three
    # balanced 7-bit digits (each in [-64, 64]) cover: 3 slices.
    windows = slicing.slicing("float8_e4m3fn", 4)
    assert (windows.q_min, windows.q_max, windows.width, windows.count) == (-9, 5, 4, 4)
    assert windows.max_int == 15 * 8 <= 127
    assert sa == sb and sa.digits and (sa.width, sa.count, sa.max_int) == (7, 3, 64)
    assert p.k_chunk == (2**31 - 1) // (64 * 64)
    text = p.explain()
    assert "exponent slicing: lhs 3 slices of 7-bit digits, rhs 3 of 7-bit digits: 9 passes" in text
    assert "numerics: exact" in text
    assert "result: the exact sum (16-bit limbs) rounded once into float8_e4m3fn" in text
    assert "from int32" not in text


def test_route_choice_counts_the_chunk_sums():
    # The CPU states no rates: the route with the least passes-plus-combination cost wins,
    # int8 digits (9 passes, one chunk of 524287) over bf16 slices (8 passes: 4 digits of
    # 5 bits, at most 16, times 2 exponent windows of 8, at most 15 * 2**7, but chunks of
    # 2**24 // (16 * 1920) = 546).
    cpu = emulate.plan("float8_e4m3fn", "float8_e4m3fn", target="cpu", mode="exact")
    assert cpu.method == "sliced-int8" and cpu.k_chunk == 524287
    sa = slicing.slicing("float8_e4m3fn", 5, digits=True)
    sb = slicing.slicing("float8_e4m3fn", 8)
    assert (sa.count, sa.max_int, sb.count, sb.max_int) == (4, 16, 2, 1920)
    assert (
        slicing.cost(sa, sb, 546)
        == 8 * (1 + slicing.CHUNK_COST / 546)
        > 9 * (1 + slicing.CHUNK_COST / 524287)
    )
    v4 = emulate.plan("float8_e4m3fn", "float8_e4m3fn", target="tpu_v4", mode="exact")
    assert v4.method == "sliced-bf16" and v4.k_chunk == 546
    assert v4.slicing == (5, 8) and v4.slice_digits == (True, False)


def test_every_slicing_keeps_chunk_sums_exact():
    cover = []  # each slicing's cover is checked once (formats recur among the pairs)
    for lhs, rhs in SLICED:
        for compute, bound in (("int8", 2**31 - 1), ("bfloat16", 2**24), ("float32", 2**24)):
            chosen = slicing.fewest_passes(formats.get(lhs), formats.get(rhs), compute)
            if chosen is None:
                assert compute == "int8" and "int8" in (lhs, rhs)
                continue
            sa, sb, chunk = chosen
            assert chunk * sa.max_int * sb.max_int <= bound
            if compute == "int8":
                assert sa.max_int <= 127 and sb.max_int <= 127
            cover += [s for s in (sa, sb) if s not in cover]
    # Every finite value is covered by some slice as an integer below max_int. Jitted as
    # emulate's programs run it, every slicing in one program (not one per slicing or per
    # operation).
    values = []
    for s in cover:
        f = formats.get(s.format)
        values.append(np.array(et.finite_codes(f), np.uint8).view(f.dtype).astype(np.float64))
    every = jax.jit(
        lambda vs, ss: [static_slices(v, s, "float32") for v, s in zip(vs, ss, strict=True)],
        static_argnums=1,
    )
    sliced = every([jnp.asarray(v, jnp.float32) for v in values], tuple(cover))
    for s, v, parts in zip(cover, values, sliced, strict=True):
        parts = [np.asarray(x, np.float64) for x in parts]
        total = sum(p * 2.0 ** (s.q_min + i * s.width) for i, p in enumerate(parts))
        np.testing.assert_array_equal(total, v)
        for p in parts:
            assert np.all(p == np.round(p)) and np.abs(p).max() <= s.max_int


# e5m2 on the int8 route (7-bit digits) and the bf16 route (9-bit digits), against every
# finite code at once: each digit slice holds elements of some rows and not of others.
# The int8 route by default; the bf16 route under EMULATE_LONG_TESTS=1.
@pytest.mark.parametrize("target", ["tpu_v5e", pytest.param("tpu_v4", marks=pytest.mark.long)])
def test_e5m2_digits_over_the_whole_exponent_range(target):
    f = formats.get("float8_e5m2")
    finite = np.array(et.finite_codes(f), np.uint8)
    rng = np.random.default_rng(5)
    k = finite.size
    rows = [
        finite,  # every finite code: every digit of every width occupied
        rng.permutation(finite),
        np.full(k, finite[np.argmax(finite.view(E5).astype(np.float32))]),  # +max only
        np.where(np.arange(k) % 2 == 0, 0x01, 0x81).astype(np.uint8),  # +-min subnormal
        np.zeros(k, np.uint8),
        np.where(np.arange(k) < 3, finite[-1], 0x00).astype(np.uint8),  # a few elements
    ]
    a = np.stack(rows).view(E5)
    cols = [rng.permutation(finite) for _ in range(3)]
    cols.append(np.full(k, 0x7B, np.uint8))  # 57344, e5m2's max
    cols.append(np.where(np.arange(k) % 3 == 0, 0x01, 0x00).astype(np.uint8))
    b = np.stack(cols, axis=1).view(E5)
    want = reference.dot_general(a, b, DN, preferred_element_type=np.float32)
    got = _exact_f32(a, b, target)
    assert same_bits(got, want)
    # the same bits with short chunks, without jit, and row by row
    p = emulate.plan("float8_e5m2", "float8_e5m2", target=target, mode="exact")
    assert p.slice_digits == (True, True)
    av, bv = (emulate.decode(x, to=jnp.float32) for x in (a, b))
    q = dataclasses.replace(p, k_chunk=37, out="float32")
    np.testing.assert_array_equal(
        jax.jit(lambda x, y: exact.contract(q, x, y, DN, None))(av, bv), got
    )
    with jax.disable_jit():
        np.testing.assert_array_equal(exact.contract(q, av[:2], bv, DN, None), got[:2])
    bf = np.asarray(a.astype(np.float32) * np.float32(2.0**-20)).astype(BF)
    want_bf = reference.dot_general(bf, b, DN, preferred_element_type=np.float32)
    assert same_bits(_exact_f32(bf, b, target), want_bf)


def test_int32_operands_in_exact_mode_are_not_built():
    with pytest.raises(NotImplementedError, match=r"^mode='exact' for int32 x int32 is not built"):
        emulate.plan("int32", "int32", mode="exact")


def test_polyfill_in_exact_mode():
    rng = np.random.default_rng(3)
    a = jnp.asarray(rng.integers(0, 120, (2, 40)).astype(np.uint8).view(ml_dtypes.float8_e4m3fn))
    b = jnp.asarray(rng.integers(0, 120, (40, 3)).astype(np.uint8).view(ml_dtypes.float8_e4m3fn))

    def f(a, b):
        return jax.lax.dot_general(a, b, DN, preferred_element_type=jnp.float32)

    got = emulate.polyfill(f, target="tpu_v4", mode="exact")(a, b)
    want = reference.dot_general(
        np.asarray(a), np.asarray(b), DN, preferred_element_type=np.float32
    )
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------ wide operands, per row

# By default each wide format (bfloat16, float16, float32) on each side, each slice type
# (int8 on v5e, bf16 on v4, f32 on v2) and each layout once; the pairs whose formats, slice
# types and layouts those cover are long sweeps (EMULATE_LONG_TESTS=1, 8-13 s each).
# bfloat16 rows x float8 on int8 slices: test_e5m2_digits_over_the_whole_exponent_range
# (bfloat16 x e5m2 on tpu_v5e) by default.
WIDE_CASES = [
    pytest.param("bfloat16", "float8_e4m3fn", "tpu_v5e", 0, marks=pytest.mark.long),
    ("float8_e5m2", "bfloat16", "tpu_v4", 1),
    ("float16", "float8_e4m3fn", "tpu_v2", 0),
    pytest.param("bfloat16", "bfloat16", "tpu_v4", 1, marks=pytest.mark.long),
    ("float32", "float32", "tpu_v5e", 0),
    pytest.param("float32", "float8_e5m2", "tpu_v4", 0, marks=pytest.mark.long),
]


# 2 examples by default, 6 under EMULATE_LONG_TESTS=1 (the first compiles).
@pytest.mark.parametrize("lhs,rhs,target,layout,out", _with_outs(WIDE_CASES))
@settings(max_examples=examples(2, 6))
@given(data=st.data())
def test_wide_operands_give_the_correctly_rounded_sum(lhs, rhs, target, layout, out, data):
    _check_correctly_rounded(lhs, rhs, target, layout, data, out)


BF = ml_dtypes.bfloat16
E4 = ml_dtypes.float8_e4m3fn
# int8 and bf16 slices: int8 by default, bf16 under EMULATE_LONG_TESTS=1
WIDE_TARGETS = ["tpu_v5e", pytest.param("tpu_v4", marks=pytest.mark.long)]


def _exact_f32(a, b, target, out=jnp.float32):
    r = emulate.dot_general(a, b, DN, preferred_element_type=out, target=target, mode="exact")
    return np.asarray(r)


@pytest.mark.parametrize("target", WIDE_TARGETS)
def test_wide_rows_far_below_their_maximum(target):
    # Row 0: a tie (1 + 2**-24) tipped up by a product 2**-129 whose bf16 operand lies
    # 120 bits below the row's maximum (a further block of slices). Row 1: the same tie
    # without it stays at 1. Row 2: huge terms cancel exactly and leave 2**-129, an f32
    # subnormal. Row 3: a bf16 subnormal times 448.
    a = np.array(
        [
            [1.0, 2.0**-24, 2.0**-120],
            [1.0, 2.0**-24, 0.0],
            [2.0**100, -(2.0**100), 2.0**-120],
            [2.0**-133, 0.0, 0.0],
        ],
        BF,
    )
    b = np.array([[1.0], [1.0], [2.0**-9]], E4)
    got = _exact_f32(a, b, target)[:, 0]
    want = reference.dot_general(a, b, DN, preferred_element_type=np.float32)[:, 0]
    assert got.tolist() == want.tolist()
    assert got[0] == np.float32(1.0 + 2.0**-23) and got[1] == 1.0
    assert got[2] == np.float32(2.0**-129) and got[2] != 0  # subnormal, not flushed
    assert got[3] == np.float32(2.0**-133) and got[3] != 0
    # rows of a's shape, so that the program above runs them
    a3 = np.zeros(a.shape, BF)
    a3[0] = [2.0**-133, 2.0**-133, 0.0]
    b3 = np.array([[448.0], [-0.5], [0.0]], E4)
    r = _exact_f32(a3, b3, target)[0, 0]
    assert r == np.float32(447.5 * 2.0**-133)


def test_wide_overflow_and_cancellation_of_huge_products():
    big = float(ml_dtypes.finfo(BF).max)
    a = np.array([[big, -big], [big, big]], BF)
    b = np.array([[448.0], [448.0]], E4)
    # zero-padded into the shapes of _wide_operands_spanning_blocks (its program)
    pa, pb = np.zeros((4, 300), BF), np.zeros((300, 3), E4)
    pa[:2, :2], pb[:2, :1] = a, b
    got = _exact_f32(pa, pb, "tpu_v4")[:2, 0]
    assert got[0] == 0.0  # mode "fast" overflows here
    assert got[1] == np.inf  # beyond float32: Inf, as the reference rounds
    want = reference.dot_general(a, b, DN, preferred_element_type=np.float32)[:, 0]
    assert same_bits(got, want)
    fast = emulate.dot_general(a, b, DN, preferred_element_type=jnp.float32, target="tpu_v4")
    assert not np.isfinite(np.asarray(fast)[0, 0])


def test_wide_nan_and_inf_follow_ieee():
    a = np.array([[np.inf, 1.0], [np.nan, 1.0], [2.0**-133, 1.0], [1.0, 1.0]], BF)
    b = np.array([[np.inf, 0.0, 1.0], [1.0, 1.0, -np.inf]], BF)
    got = _exact_f32(a, b, "tpu_v4")
    want = reference.dot_general(a, b, DN, preferred_element_type=np.float32)
    assert same_bits(got, want)
    # A subnormal times Inf is Inf (a flushing f32 dot would give 0 * Inf = NaN).
    assert got[2, 0] == np.inf


def _wide_operands_spanning_blocks():
    rng = np.random.default_rng(11)
    a = rng.standard_normal((4, 300)).astype(np.float32)
    a[1, 7] = 3e-30  # row 1 needs a second block of slices; the others do not
    a = a.astype(BF)
    codes = rng.integers(0, 126, (300, 3)).astype(np.uint8)
    codes[::2] |= 0x80
    b = codes.view(E4)
    base = _exact_f32(a, b, "tpu_v4")
    want = reference.dot_general(a, b, DN, preferred_element_type=np.float32)
    np.testing.assert_array_equal(base, want)
    return a, b, base


def _contract_in_chunks(a, b, chunk):
    """tpu_v4's plan for bfloat16 x float8_e4m3fn with K-chunks of ``chunk`` (None: the
    plan's own), contracted by emulate.engine.exact under jit."""
    p = emulate.plan("bfloat16", "float8_e4m3fn", target="tpu_v4", mode="exact")
    q = dataclasses.replace(p, k_chunk=chunk or p.k_chunk, out="float32")
    av = jnp.asarray(a).astype(jnp.float32)
    bv = emulate.decode(b, to=jnp.float32)
    return jax.jit(lambda x, y: exact.contract(q, x, y, DN, None))(av, bv)


def test_wide_same_bits_across_chunks():
    a, b, base = _wide_operands_spanning_blocks()
    np.testing.assert_array_equal(_contract_in_chunks(a, b, 37), base)


# Long: the plan's own chunk (the one dot_general ran above), row by row (a row without
# far-below elements takes the one-block path alone, as the padded rows of
# test_wide_rows_far_below_their_maximum[tpu_v5e] and the rows of
# test_wide_overflow_and_cancellation_of_huge_products on tpu_v4 do by default), and the
# operands swapped on int8 slices (the wide operand on the right, sliced per column, as
# float32's columns in test_further_blocks_on_both_sides_give_the_correctly_rounded_sum
# on the default target's int8 slices by default).
@pytest.mark.long
def test_wide_same_bits_across_rows_layouts_and_targets():
    a, b, base = _wide_operands_spanning_blocks()
    np.testing.assert_array_equal(_contract_in_chunks(a, b, None), base)
    # Row by row: rows without far-below elements take the one-block path alone.
    rows = np.concatenate([_exact_f32(a[i : i + 1], b, "tpu_v4") for i in range(4)])
    np.testing.assert_array_equal(rows, base)
    # Operands swapped (the wide one on the right, sliced per column), on int8 slices.
    t = emulate.dot_general(
        np.ascontiguousarray(b.T),
        np.ascontiguousarray(a.T),
        DN,
        preferred_element_type=jnp.float32,
        target="tpu_v5e",
        mode="exact",
    )
    np.testing.assert_array_equal(np.asarray(t).T, base)


def test_plan_reports_the_per_row_slicing():
    p = emulate.plan("bfloat16", "float8_e4m3fn", target="tpu_v5e", mode="exact")
    sa = slicing.slicing("bfloat16", p.slicing[0])
    assert p.method == "sliced-int8" and sa.dynamic and sa.width == 7
    assert sa.count * sa.width >= 8 + slicing.WIDE_EXTRA_BITS
    text = p.explain()
    assert f"lhs bfloat16 is sliced per row: {sa.count} slices of 7 bits" in text
    assert "further blocks" in text
    q = emulate.plan("float8_e4m3fn", "float32", target="tpu_v4", mode="exact")
    assert "rhs float32 is sliced per column" in q.explain()


def _fraction_round(a: np.ndarray, b: np.ndarray, out: str) -> np.ndarray:
    """``a @ b`` summed in Fractions and rounded once into ``out`` (brute force)."""
    m, k = a.shape
    n = b.shape[1]
    want = np.zeros((m, n), np.float64)
    for i, j in np.ndindex(m, n):
        s = sum(Fraction(float(a[i, t])) * Fraction(float(b[t, j])) for t in range(k))
        s = Fraction(s)
        shift = s.denominator.bit_length() - 1  # a power of two
        want[i, j] = reference.round_exact(s.numerator, -shift, out)
    return want


# The default target's int8 slices into float32 by default; bfloat16 results (the same
# exact sum rounded once into another type, as the default cases of
# test_wide_operands_give_the_correctly_rounded_sum do) and tpu_v4's bf16 slices as a long
# sweep.
@pytest.mark.parametrize(
    "target,out",
    [
        (None, "float32"),
        pytest.param(None, "bfloat16", marks=pytest.mark.long),
        pytest.param("tpu_v4", "float32", marks=pytest.mark.long),
        pytest.param("tpu_v4", "bfloat16", marks=pytest.mark.long),
    ],
)
def test_further_blocks_on_both_sides_give_the_correctly_rounded_sum(target, out):
    # Both operands sliced per row (column), each with rows (columns) spanning far more
    # than the S*w bits of a first block, so that the loop over pairs of further blocks
    # runs on both sides, several blocks deep; against a Fraction oracle.
    rng = np.random.default_rng(23)
    a = rng.standard_normal((5, 7)) * 2.0 ** rng.integers(-110, 40, (5, 7))
    b = rng.standard_normal((7, 4)) * 2.0 ** rng.integers(-120, 60, (7, 4))
    # Row 0 x column 0: the tie 1 + 2**-24 tipped up only by 2**-100 * 2**-60, which lies
    # in the third lhs block and the second rhs block.
    a[0] = [1.0, 2.0**-24, 2.0**-60, 2.0**-100, 0.0, 0.0, 0.0]
    b[:, 0] = [1.0, 1.0, 0.0, 2.0**-60, 0.0, 0.0, 0.0]
    # Row 1 x column 1: huge terms cancel; what is left is a sum of far-below products.
    a[1] = [2.0**30, -(2.0**30), 2.0**-40, -(2.0**-90), 3.0, 2.0**-133, 0.0]
    b[:, 1] = [2.0**50, 2.0**50, 2.0**-30, 2.0**-70, 0.0, 2.0**-10, 1.0]
    a = a.astype(BF)
    b = b.astype(np.float32)
    got = emulate.dot_general(a, b, DN, preferred_element_type=out, target=target, mode="exact")
    want = _fraction_round(a, b, out)
    np.testing.assert_array_equal(np.asarray(got).astype(np.float64), want)
    if out == "float32":
        assert want[0, 0] == np.float32(1.0 + 2.0**-23)


@pytest.mark.parametrize(
    "lshape, rshape, dn",
    [
        ((4, 8), (8, 0), DN),  # N = 0
        ((0, 8), (8, 3), DN),  # M = 0
        ((0, 4, 8), (0, 8, 3), (((2,), (1,)), ((0,), (0,)))),  # a batch of 0
    ],
)
@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_an_empty_result_is_jaxs(lshape, rshape, dn, mode):
    """No sum to take: JAX's empty result (its type and shape), no ZeroDivisionError from the
    slicing of mode "exact"."""
    a = jnp.ones(lshape, jnp.float8_e4m3fn)
    b = jnp.ones(rshape, jnp.float8_e4m3fn)
    want = jax.lax.dot_general(a, b, dn)
    got = emulate.dot_general(a, b, dn, mode=mode, target="tpu_v5e")
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    got32 = emulate.dot_general(a, b, dn, preferred_element_type=jnp.float32, mode=mode)
    assert (got32.dtype, got32.shape) == (jnp.float32, want.shape)
