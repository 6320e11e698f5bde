"""emulate.dot_general / matmul / einsum against the reference, on every target.

By default the hypothesis classes draw 2 examples a case, all in the case's own layout
and result type (the pools' entries taken in turn over the cases: one program a case),
and the per-target sweeps run one target per distinct plan (see INT8_TARGETS);
EMULATE_LONG_TESTS=1 runs 6 examples, each drawing its layout and result type, and every
target."""

from __future__ import annotations

import functools
import itertools
from fractions import Fraction

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _sweeps import LONG, examples
from hypothesis import given, settings
from hypothesis import strategies as st
from jax import lax

import emulate
from emulate import formats, program, reference, targets
from emulate import testing as et

TARGETS = [t.name for t in targets.all_targets()]
EXACT = ["int4", "uint4", "int8", "uint8", "float4_e2m1fn", "float6_e2m3fn"]
BOUNDED = [
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e4m3b11fnuz",
    "float8_e3m4",
    "float6_e3m2fn",
]
INTS = {"int4", "uint4", "int8", "uint8"}


def representative_targets(lhs: str, rhs: str) -> list[str]:
    """One target per distinct way the pair runs: targets with the same plan share code."""
    return sorted(et.representative_targets(lhs, rhs, TARGETS))


EXACT_PAIRS = [(a, b) for a, b in itertools.product(EXACT, EXACT)]


def target_sweep(keep) -> list:
    """TARGETS, those not in ``keep`` marked long."""
    return [t if t in keep else pytest.param(t, marks=pytest.mark.long) for t in TARGETS]


# The per-target sweeps below: by default one target per distinct plan of the pair
# (representative_targets) plus cpu and tpu_v7x, and for the program check the first
# target of each set of native pairs; every target under EMULATE_LONG_TESTS=1.
INT8_TARGETS = target_sweep(
    {*et.representative_targets("int8", "int8", TARGETS, preferred_element_type="int32")}
    | {"cpu", "tpu_v7x"}
)
FP4_TARGETS = target_sweep(
    {*representative_targets("float4_e2m1fn", "float4_e2m1fn")} | {"cpu", "tpu_v7x"}
)
NATIVE_SET_TARGETS = target_sweep(
    {*{(t.kind, t.native_pairs): t.name for t in reversed(targets.all_targets())}.values()}
)


# Every pair by default; a same-format pair on each of its representative targets, a
# mixed pair on one of them, taken in turn (its others under EMULATE_LONG_TESTS=1).
EXACT_CASES = [
    (a, b, t) if a == b or i == n % len(ts) else pytest.param(a, b, t, marks=pytest.mark.long)
    for n, (a, b) in enumerate(EXACT_PAIRS)
    for ts in [representative_targets(a, b)]
    for i, t in enumerate(ts)
]


def _problems(cases: list, lhs: str, rhs: str, target: str, **kw):
    """``et.dot_general_problems`` of the pair. By default every example of a case is in
    the case's own layout and result type (each new pair of them compiles a program): the
    i-th default case takes the i-th layout of ``et.DEFAULT_LAYOUTS`` and the
    ``i // len(layouts)``-th result type of the pair, cyclically, so that the default cases
    together meet every layout and result type. Under EMULATE_LONG_TESTS=1 every example
    draws both."""
    if LONG:
        return et.dot_general_problems(lhs, rhs, **kw)
    i = [c for c in cases if not hasattr(c, "marks")].index((lhs, rhs, target))
    layouts = et.DEFAULT_LAYOUTS
    pets = et.result_types(lhs, rhs)
    return et.dot_general_problems(
        lhs,
        rhs,
        layouts=[layouts[i % len(layouts)]],
        preferred_element_types=[pets[(i // len(layouts)) % len(pets)]],
        **kw,
    )


# 2 examples of each case by default, 6 under EMULATE_LONG_TESTS=1 (each new shape compiles).
@pytest.mark.parametrize("lhs,rhs,target", EXACT_CASES)
@settings(max_examples=examples(2, 6))
@given(data=st.data())
def test_exact_classes_are_bit_identical_to_reference(lhs, rhs, target, data):
    problems = _problems(EXACT_CASES, lhs, rhs, target, elements="finite")
    a, b, dn, pet = data.draw(problems)
    got = emulate.dot_general(a, b, dn, preferred_element_type=pet, target=target)
    et.assert_matches_reference(got, a, b, dn, mode="fast", preferred_element_type=pet)


BOUNDED_PAIRS = [(f, f) for f in BOUNDED] + [
    ("bfloat16", "float8_e4m3fn"),
    ("bfloat16", "float8_e5m2"),
    ("float32", "float8_e4m3fn"),
    ("float8_e4m3fn", "float8_e5m2"),
    ("bfloat16", "int4"),
    ("bfloat16", "float4_e2m1fn"),
]


BOUNDED_CASES = [(a, b, t) for a, b in BOUNDED_PAIRS for t in representative_targets(a, b)]


# 2 examples of each case by default, 6 under EMULATE_LONG_TESTS=1.
@pytest.mark.parametrize("lhs,rhs,target", BOUNDED_CASES)
@settings(max_examples=examples(2, 6))
@given(data=st.data())
def test_bounded_classes_are_within_the_bound(lhs, rhs, target, data):
    a, b, dn, pet = data.draw(_problems(BOUNDED_CASES, lhs, rhs, target))
    # HIGHEST: the bound's precondition for a float32 operand the caller passes (on a TPU
    # the default precision rounds it to bf16, as for jnp.dot; docs/quantized.md). The
    # same on the CPU; this keeps the test true when the suite runs on a chip.
    hi = lax.Precision.HIGHEST
    got = emulate.dot_general(a, b, dn, precision=hi, preferred_element_type=pet, target=target)
    assert np.asarray(got).dtype == formats.dot_result(lhs, rhs, pet).dtype
    et.assert_matches_reference(got, a, b, dn, mode="fast", preferred_element_type=pet)


DN = (((1,), (0,)), ((), ()))


@pytest.mark.parametrize("target", INT8_TARGETS)
def test_int8_all_minus_128_k4096_is_exact(target):
    a = np.full((2, 4096), -128, np.int8)
    b = np.full((4096, 3), -128, np.int8)
    got = emulate.dot_general(a, b, DN, preferred_element_type=jnp.int32, target=target)
    assert got.dtype == jnp.int32
    assert np.asarray(got).tolist() == [[4096 * 16384] * 3] * 2
    # f32 result: 2**26 is exact in f32 as well.
    got32 = emulate.dot_general(a, b, DN, preferred_element_type=jnp.float32, target=target)
    assert np.asarray(got32).tolist() == [[2.0**26] * 3] * 2


@pytest.mark.parametrize("target", ["cpu", "tpu_v5e", "tpu_v4"])
def test_integer_pairs_with_a_float_result_do_not_wrap_or_round_twice(target):
    # 2**18 products of (-128)**2 sum to 2**32: past int32, exact in f32.
    a = np.full((1, 2**18), -128, np.int8)
    got = emulate.dot_general(a, a.T, DN, preferred_element_type=jnp.float32, target=target)
    assert float(got[0, 0]) == 2.0**32
    # 2**25 + 2**17 + 1 rounds up to 2**25 + 2**18 in bf16; via f32 it would tie to 2**25.
    v = np.array([[-128] * 2056 + [1]], np.int8)
    got = emulate.dot_general(v, v.T, DN, preferred_element_type=jnp.bfloat16, target=target)
    assert float(got[0, 0]) == 2.0**25 + 2.0**18


def test_too_long_exact_contraction_is_refused():
    p = emulate.plan("int8", "int8", target="tpu_v4", preferred_element_type=jnp.float32)
    assert p.k_limit == 2**15 * 1024
    a = jax.ShapeDtypeStruct((1, p.k_limit + 1), jnp.int8)
    b = jax.ShapeDtypeStruct((p.k_limit + 1, 1), jnp.int8)
    f = functools.partial(emulate.dot_general, dimension_numbers=DN, target="tpu_v4")
    with pytest.raises(
        ValueError, match=r"^lhs, rhs: a contraction of K = 33554433 exceeds the 33554432"
    ):
        jax.eval_shape(lambda x, y: f(x, y, preferred_element_type=jnp.float32), a, b)


def test_naive_f32_accumulation_is_wrong_where_emulate_is_exact():
    # Past 2**24 an f32 running sum of int8 products drops odd units; int32 does not.
    k = 1100
    a = np.full((1, k), 127, np.int8)
    b = np.full((k, 1), 127, np.int8)
    a[0, -1] = b[-1, 0] = 1
    exact = (k - 1) * 127 * 127 + 1
    naive = np.float32(0)
    for x, y in zip(a[0], b[:, 0], strict=True):
        naive = np.float32(naive + np.float32(int(x) * int(y)))
    assert int(naive) != exact
    for target in ("tpu_v4", "tpu_v5e", "cpu"):
        got = emulate.dot_general(a, b, DN, preferred_element_type=jnp.int32, target=target)
        assert int(got[0, 0]) == exact


@pytest.mark.parametrize("target", FP4_TARGETS)
def test_fp4_k8192_bit_identical(target):
    rng = np.random.default_rng(8192)
    a = rng.integers(0, 16, (3, 8192)).astype(np.uint8).view(ml_dtypes.float4_e2m1fn)
    b = rng.integers(0, 16, (8192, 4)).astype(np.uint8).view(ml_dtypes.float4_e2m1fn)
    for pet in (jnp.float32, jnp.bfloat16):
        got = emulate.dot_general(a, b, DN, preferred_element_type=pet, target=target)
        et.assert_matches_reference(got, a, b, DN, mode="fast", preferred_element_type=pet)


@pytest.mark.parametrize("target", ["tpu_v4", "tpu_v2", "cpu"])
def test_chunked_exact_path_with_ragged_last_chunk(target):
    # e2m3 x e2m3 in f32 is exact for K <= 4660: K = 5003 takes two chunks, one ragged.
    rng = np.random.default_rng(1)
    codes_a = rng.integers(0, 64, (2, 5003)).astype(np.uint8)
    codes_b = rng.integers(0, 64, (5003, 3)).astype(np.uint8)
    codes_a[:, :2000] = 0x1F  # 7.5: big products so partial sums grow
    codes_b[:2000, :] = 0x1F
    a = codes_a.view(ml_dtypes.float6_e2m3fn)
    b = codes_b.view(ml_dtypes.float6_e2m3fn)
    for pet in (jnp.float32, jnp.bfloat16):
        got = emulate.dot_general(a, b, DN, preferred_element_type=pet, target=target)
        et.assert_matches_reference(got, a, b, DN, mode="fast", preferred_element_type=pet)


def test_int8_output_wraps_and_fp8_output_rounds_once():
    a = np.full((1, 3), 100, np.int8)
    b = np.full((3, 1), 100, np.int8)
    got = emulate.dot_general(a, b, DN, target="tpu_v4")
    assert got.dtype == jnp.int8
    assert int(got[0, 0]) == (30000 + 128) % 256 - 128
    x = np.array([[448.0, 448.0, -0.5]], ml_dtypes.float8_e4m3fn)
    y = np.array([[1.0], [-1.0], [1.0]], ml_dtypes.float8_e4m3fn)
    r = emulate.dot_general(x, y, DN, target="tpu_v4")
    assert r.dtype == jnp.float8_e4m3fn and float(r[0, 0]) == -0.5


@pytest.mark.parametrize("target", NATIVE_SET_TARGETS)
def test_program_holds_only_native_pairs(target):
    t = targets.get(target)
    cases = [(l_, r) for l_, r in EXACT_PAIRS] + BOUNDED_PAIRS
    for lhs, rhs in cases:
        a = np.zeros((4, 2000), formats.get(lhs).dtype)
        b = np.zeros((2000, 3), formats.get(rhs).dtype)
        codes_a = a.view(np.uint8) if formats.get(lhs).bits < 16 else a
        codes_b = b.view(np.uint8) if formats.get(rhs).bits < 16 else b

        def f(x, y, lhs=lhs, rhs=rhs):
            fa = lhs if x.dtype == np.uint8 and lhs != "uint8" else None
            fb = rhs if y.dtype == np.uint8 and rhs != "uint8" else None
            return emulate.dot_general(
                x, y, DN, preferred_element_type=jnp.float32, target=t, lhs_format=fa, rhs_format=fb
            )

        sites = program.sites(jax.make_jaxpr(f)(codes_a, codes_b))
        assert sites, (lhs, rhs)
        for s in sites:
            assert t.supports(s.lhs_dtype, s.rhs_dtype), (target, lhs, rhs, s)


def test_packed_and_code_operands():
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 16, (6, 5)).astype(np.uint8)
    w = emulate.pack(codes, "int4", axis=0)
    x = rng.integers(-5, 5, (2, 6)).astype(np.int8)
    want = reference.dot_general(x, codes.view(ml_dtypes.int4), DN, preferred_element_type=np.int32)
    got = emulate.dot_general(x, w, DN, preferred_element_type=jnp.int32, target="tpu_v5e")
    np.testing.assert_array_equal(got, want)
    got2 = emulate.dot_general(x, codes, DN, preferred_element_type=jnp.int32, rhs_format="int4")
    np.testing.assert_array_equal(got2, want)


def test_jit_vmap_and_no_retrace():
    rng = np.random.default_rng(4)
    a = jnp.asarray(rng.standard_normal((5, 2, 7)), jnp.bfloat16)
    w = emulate.pack(rng.integers(0, 16, (7, 3)).astype(np.uint8), "float4_e2m1fn", axis=0)

    def f(x, w):
        return emulate.dot_general(x, w, DN, preferred_element_type=jnp.float32, target="tpu_v4")

    eager = jnp.stack([f(a[i], w) for i in range(5)])
    np.testing.assert_array_equal(jax.vmap(f, in_axes=(0, None))(a, w), eager)
    np.testing.assert_array_equal(jax.jit(jax.vmap(f, in_axes=(0, None)))(a, w), eager)
    from emulate.engine import run

    before = run.cache_size()
    for _ in range(3):
        f(a[0], w)
    assert run.cache_size() == before


def test_grad_through_bf16_activation_matches_decoded_computation():
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((3, 8)), jnp.float32)
    wc = rng.integers(0, 256, (8, 4)).astype(np.uint8)
    wc[(wc & 0x7F) == 0x7F] = 0  # no NaN codes
    w = wc.view(ml_dtypes.float8_e4m3fn)

    def loss(x):
        y = emulate.dot_general(x, w, DN, preferred_element_type=jnp.float32, target="tpu_v4")
        return jnp.sum(y * y)

    def plain(x):
        wd = emulate.decode(w, to=jnp.float32)
        y = jax.lax.dot_general(x, wd, DN, preferred_element_type=jnp.float32)
        return jnp.sum(y * y)

    np.testing.assert_allclose(jax.grad(loss)(x), jax.grad(plain)(x), rtol=1e-6)


def test_exact_mode():
    a = np.array([[1.5, -2.0]], ml_dtypes.float4_e2m1fn)
    b = np.array([[3.0], [0.5]], ml_dtypes.float4_e2m1fn)
    got = emulate.dot_general(a, b, DN, preferred_element_type=jnp.float32, mode="exact")
    assert float(got[0, 0]) == 3.5
    with pytest.raises(NotImplementedError, match=r"^mode='exact' for int32 x int32 is not built"):
        emulate.dot_general(
            np.zeros((1, 2), np.int32), np.zeros((2, 1), np.int32), DN, mode="exact"
        )


class TestMatmulEinsum:
    def test_matmul_rules_match_reference(self):
        rng = np.random.default_rng(6)
        a = rng.integers(-8, 8, (2, 1, 3, 5)).astype(ml_dtypes.int4)
        b = rng.integers(-8, 8, (4, 5, 2)).astype(ml_dtypes.int4)
        got = emulate.matmul(a, b, preferred_element_type=jnp.int32, target="tpu_v4")
        assert got.shape == (2, 4, 3, 2)
        ab = np.broadcast_to(a, (2, 4, 3, 5))
        bb = np.broadcast_to(b, (2, 4, 5, 2))
        want = reference.dot_general(
            ab, bb, (((3,), (2,)), ((0, 1), (0, 1))), preferred_element_type=np.int32
        )
        np.testing.assert_array_equal(got, want)
        v = rng.integers(-8, 8, (5,)).astype(ml_dtypes.int4)
        mv = emulate.matmul(a[0, 0], v, preferred_element_type=jnp.int32)
        vm = emulate.matmul(v, b[0], preferred_element_type=jnp.int32)
        vv = emulate.matmul(v, v, preferred_element_type=jnp.int32)
        ai = a[0, 0].astype(np.int64)
        vi = v.astype(np.int64)
        assert mv.shape == (3,) and np.asarray(mv).tolist() == (ai @ vi).tolist()
        assert vm.shape == (2,) and np.asarray(vm).tolist() == (vi @ b[0].astype(np.int64)).tolist()
        assert vv.shape == () and int(vv) == int(vi @ vi)

    @pytest.mark.parametrize(
        "subscripts,sa,sb",
        [
            ("ij,jk->ik", (3, 4), (4, 2)),
            ("ij,kj", (3, 4), (2, 4)),
            ("bij,bjk->bki", (2, 3, 4), (2, 4, 5)),
            ("...ij,jk->...ik", (2, 3, 4), (4, 5)),
            ("ij,jk->k", (3, 4), (4, 2)),
            ("i,i->", (7,), (7,)),
        ],
    )
    def test_einsum_matches_numpy_on_integers(self, subscripts, sa, sb):
        rng = np.random.default_rng(7)
        a = rng.integers(-128, 128, sa).astype(np.int8)
        b = rng.integers(-128, 128, sb).astype(np.int8)
        got = emulate.einsum(subscripts, a, b, preferred_element_type=jnp.int32, target="tpu_v4")
        want = np.einsum(subscripts, a.astype(np.int64), b.astype(np.int64))
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


class TestBadInput:
    def test_contracting_size_mismatch(self):
        # emulate's message, with the exception type lax.dot_general raises (TypeError).
        with pytest.raises(
            TypeError,
            match=r"^dimension_numbers: lhs contracting dimension 1 has size 3 but rhs contracting "
            r"dimension 0 has size 4; lhs int8\[2, 3\], rhs int8\[4, 5\], target tpu_v4$",
        ):
            emulate.dot_general(
                np.zeros((2, 3), np.int8), np.zeros((4, 5), np.int8), DN, target="tpu_v4"
            )

    def test_unknown_target(self):
        with pytest.raises(ValueError, match=r"unknown target 'tpu_v9'"):
            emulate.dot_general(
                np.zeros((2, 3), np.int8), np.zeros((3, 5), np.int8), DN, target="tpu_v9"
            )

    @pytest.mark.parametrize("lhs,rhs", [(np.complex64, np.int8), (np.int8, bool)])
    def test_jax_types_pass_through(self, lhs, rhs):
        # A pair with a type emulate does not plan for goes to lax.dot_general as it is.
        a = np.arange(6).reshape(2, 3).astype(lhs)
        b = (np.arange(15).reshape(3, 5) % 2).astype(rhs)
        got = emulate.dot_general(a, b, DN)
        want = jax.lax.dot_general(a, b, DN)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))

    def test_not_an_array(self):
        # A list goes to JAX, which refuses it; with a format, emulate refuses it itself.
        with pytest.raises(TypeError, match=r"^Error interpreting argument to dot_general"):
            emulate.dot_general([[1, 2]], np.zeros((2, 5), np.int8), DN)
        with pytest.raises(
            TypeError, match=r"^lhs: expected an array \(jax or numpy\), a Packed array"
        ):
            emulate.dot_general([[1, 2]], np.zeros((2, 5), np.uint8), DN, rhs_format="int4")

    def test_float6_result_needs_preferred_type(self):
        a = np.zeros((1, 2), ml_dtypes.float6_e3m2fn)
        with pytest.raises(
            ValueError, match=r"^preferred_element_type: the result type would be float6_e3m2fn"
        ):
            emulate.dot_general(a, a.T, DN)

    def test_scale_type_is_not_an_operand(self):
        a = np.ones((1, 2), ml_dtypes.float8_e8m0fnu)
        with pytest.raises(ValueError, match=r"^lhs: float8_e8m0fnu is a scale type"):
            emulate.dot_general(a, a.T, DN, preferred_element_type=jnp.float32)

    def test_bad_mode(self):
        with pytest.raises(
            ValueError, match=r"^mode: expected one of 'fast', 'exact', got 'quick'$"
        ):
            emulate.dot_general(
                np.zeros((1, 2), np.int8), np.zeros((2, 1), np.int8), DN, mode="quick"
            )

    def test_corrupt_packed(self):
        p = emulate.pack(np.zeros((4, 6), np.uint8), "int4")
        with pytest.raises(
            ValueError, match=r"^length: 11 int4 elements need 6 bytes along axis -1"
        ):
            emulate.Packed(p.data, "int4", -1, 11)

    def test_einsum_three_operands_of_a_qarray(self):
        x = np.zeros((2, 32), np.float32)
        wq = emulate.quantize(np.ones((32, 32), np.float32), emulate.mx.MXFP4)
        with pytest.raises(
            ValueError,
            match=r"^operands: with a QArray, a Packed array or float6 codes emulate.einsum "
            r"contracts exactly two operands named by a subscripts string, got 3 operands$",
        ):
            emulate.einsum("ij,jk,kl->il", x, wq, wq)


class TestPassThrough:
    """What needs no emulation goes to JAX as it is (see tests/test_jax_cases.py for JAX's
    own cases); these pin the rule's edges."""

    @pytest.mark.parametrize("dtype", [np.int32, np.int16, np.uint32, np.float64])
    def test_jax_types_are_jax_results(self, dtype):
        a = np.arange(6).reshape(2, 3).astype(dtype)
        b = np.arange(12).reshape(3, 4).astype(dtype)
        for target in ("cpu", "tpu_v2"):
            got = emulate.dot_general(a, b, DN, target=target)
            want = jax.lax.dot_general(a, b, DN)
            assert got.dtype == want.dtype
            assert np.asarray(got).tobytes() == np.asarray(want).tobytes()

    def test_int32_plan_has_no_chunk(self):
        p = emulate.plan("int32", "int32", preferred_element_type="float32", target="tpu_v5e")
        assert (p.method, p.k_chunk, p.out) == ("native", None, "float32")

    def test_runs_as_is(self):
        assert emulate.runs_as_is("complex64", "int8", target="tpu_v5e")
        assert emulate.runs_as_is("bfloat16", "float16", target="tpu_v2")
        assert emulate.runs_as_is("int8", "int8", target="tpu_v5e")
        assert not emulate.runs_as_is("int8", "int8", target="tpu_v4")
        assert not emulate.runs_as_is("int8", "bfloat16", target="tpu_v5e")

    def test_native_pair_with_exact_chunks_is_emulated(self):
        # int8 x int8 -> float32 on the CPU: XLA's dot would round partial sums past 2**24;
        # emulate's plan chunks the int32 sums, so it does not pass the call through.
        a = np.full((1, 1 << 11), 127, np.int8)
        b = np.full((1 << 11, 1), 127, np.int8)
        b[0, 0] = 1
        got = emulate.dot_general(a, b, DN, preferred_element_type=jnp.float32, target="cpu")
        exact = 127 * 127 * ((1 << 11) - 1) + 127
        assert float(got[0, 0]) == float(np.float32(exact))

    def test_matmul_promotes_as_jnp(self):
        x = jnp.asarray([[1.5, 2.0]], jnp.bfloat16)
        y = jnp.asarray([[3.0], [0.25]], jnp.float16)
        assert emulate.matmul(x, y).dtype == jnp.matmul(x, y).dtype == jnp.float32
        i8 = np.array([[100, -3]], np.int8)
        u8 = np.array([[200], [7]], np.uint8)
        got = emulate.matmul(i8, u8, target="tpu_v4")  # emulated: no int8 unit on v4
        want = jnp.matmul(i8, u8)
        assert got.dtype == want.dtype == jnp.int16
        assert np.asarray(got).tolist() == np.asarray(want).tolist() == [[19979]]
        # No jnp rule for int4 x int8: lax's rule (int8), where jnp.matmul raises.
        i4 = np.array([[3, -2]], ml_dtypes.int4)
        assert emulate.matmul(i4, np.array([[5], [4]], np.int8)).dtype == jnp.int8

    def test_shape_errors_have_jax_types(self):
        a = np.zeros((2, 3), ml_dtypes.int4)
        b = np.zeros((4, 2), ml_dtypes.int4)
        with pytest.raises(TypeError, match=r"^a, b: matmul contracts a's last dimension \(3\)"):
            emulate.matmul(a, b)
        with pytest.raises(ValueError, match=r"^a, b: matmul needs operands of at least one"):
            emulate.matmul(np.zeros((), ml_dtypes.int4), b)

    @pytest.mark.parametrize(
        "subscripts,shapes",
        [
            ("ij,jk,kl->il", [(3, 4), (4, 2), (2, 5)]),
            ("iji,i->j", [(3, 4, 3), (3,)]),
            ("cij,cjk->cik", [(1, 4, 5), (3, 5, 6)]),
            ("ijj,k->ik", [(2, 3, 3), (4,)]),
            ("ab,ab,c->c", [(2, 3), (2, 3), (4,)]),
        ],
    )
    def test_einsum_surface_matches_numpy_on_integers(self, subscripts, shapes):
        rng = np.random.default_rng(8)
        ops = [rng.integers(-128, 128, s).astype(np.int8) for s in shapes]
        got = emulate.einsum(subscripts, *ops, preferred_element_type=jnp.int32, target="tpu_v4")
        want = np.einsum(subscripts, *(o.astype(np.int64) for o in ops))
        assert got.dtype == jnp.int32 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)

    def test_einsum_sublists_codes_and_optimize(self):
        rng = np.random.default_rng(9)
        x = rng.integers(-8, 8, (3, 4)).astype(ml_dtypes.int4)
        y = rng.integers(-8, 8, (4, 2)).astype(ml_dtypes.int4)
        want = x.astype(np.int64) @ y.astype(np.int64)
        pet = jnp.int32
        for got in (
            emulate.einsum(x, [0, 1], y, [1, 2], [0, 2], preferred_element_type=pet),
            emulate.einsum("ij,jk", x, y, optimize="greedy", preferred_element_type=pet),
            emulate.einsum(
                "ij,jk",
                x.view(np.uint8) & 0xF,
                y,
                operand_formats=["int4", None],
                preferred_element_type=pet,
            ),
        ):
            assert got.dtype == jnp.int32
            np.testing.assert_array_equal(got, want)

    def test_out_sharding(self):
        from jax.sharding import AxisType
        from jax.sharding import PartitionSpec as P

        mesh = jax.make_mesh((1,), ("x",), axis_types=(AxisType.Explicit,))
        a = jnp.ones((4, 3), jnp.int4)
        b = jnp.ones((3, 2), jnp.int4)
        spec = P("x", None)
        with jax.set_mesh(mesh):
            want = jax.lax.dot_general(jnp.ones((4, 3)), jnp.ones((3, 2)), DN, out_sharding=spec)
            for got in (
                emulate.dot_general(a, b, DN, out_sharding=spec, target="tpu_v4"),
                emulate.matmul(a, b, out_sharding=spec, target="tpu_v4"),
                emulate.einsum("ij,jk", a, b, out_sharding=spec, target="tpu_v4"),
            ):
                assert got.sharding == want.sharding


FLOAT8 = [f for f in BOUNDED if f.startswith("float8_")]


def _midpoint_product(dt: np.dtype) -> tuple[float, float, float]:
    """Positive values ``x, y`` of ``dt`` in [1, 4) whose product is exactly halfway between
    two neighbours of ``dt``, the lower one even (a tie rounds down), and that midpoint
    (brute force over the codes)."""
    values = np.arange(256, dtype=np.uint8).view(dt).astype(float)
    grid = sorted({float(v) for v in values if np.isfinite(v) and v > 0})
    for x, y in itertools.product([v for v in grid if 1 <= v < 4], repeat=2):
        p = Fraction(x) * Fraction(y)
        above = [v for v in grid if v > p]
        below = [v for v in grid if v < p]
        tie = above and below and p not in grid
        if tie and 2 * p == Fraction(above[0]) + Fraction(below[-1]):
            if float(np.float32(p).astype(dt)) == below[-1]:
                return x, y, float(p)
    raise AssertionError(f"no midpoint product in {dt}")


# Every float8 format once by default, the two targets in turn (each case compiles two
# programs of its own); every format on both targets under EMULATE_LONG_TESTS=1.
@pytest.mark.parametrize(
    "name,target",
    [
        (name, target)
        if target == ("cpu", "tpu_v6e")[i % 2]
        else pytest.param(name, target, marks=pytest.mark.long)
        for target in ("cpu", "tpu_v6e")
        for i, name in enumerate(FLOAT8)
    ],
)
def test_a_float8_result_is_rounded_once_from_the_float32_sum(name, target):
    # x * y is halfway between two float8 values and t * t tips it up by less than half a
    # float16 ulp (and more than a float32 one): the f32 sum rounded once gives the upper
    # neighbour; rounded through float16 first (as XLA:CPU lowers a dot with a float8
    # result), t * t is lost and the tie goes to even.
    dt = np.dtype(getattr(ml_dtypes, name))
    x, y, mid = _midpoint_product(dt)
    t = 2.0**-8 if float(np.float32(2.0**-8).astype(dt)) == 2.0**-8 else 2.0**-6
    exact = np.float32(Fraction(x) * Fraction(y) + Fraction(t) * Fraction(t))
    assert exact > mid and float(exact.astype(np.float16)) == mid
    a = np.array([[x, t]], dt)
    b = np.array([[y], [t]], dt)
    want = reference.dot_general(a, b, DN)
    assert want.dtype == dt and float(want[0, 0]) > mid
    got = emulate.dot_general(a, b, DN, target=target)
    assert got.dtype == dt and np.asarray(got).tobytes() == want.tobytes()
    got = jax.jit(lambda a, b: emulate.matmul(a, b, target=target))(a, b)
    assert got.dtype == dt and np.asarray(got).tobytes() == want.tobytes()
