"""The current target and mode are part of the traced program: jit retraces when they change,
and ``polyfill(fn, target=T, mode=M)`` makes T and M hold for every emulate call in ``fn``.

Programs are compared by their matmul sites (``emulate.program.sites``: primitive, operand
dtypes and shapes) against the same call made directly with ``target=`` / ``mode=``, the
oracle being emulate's own direct call; each case also checks that the host's program
differs, so that a test cannot pass by every path planning for the host.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import emulate
from emulate import program, reference, targets

RNG = np.random.default_rng(7)
A8 = jnp.asarray(RNG.integers(-128, 128, (4, 64)), jnp.int8)
B8 = jnp.asarray(RNG.integers(-128, 128, (64, 8)), jnp.int8)
WANT8 = np.asarray(A8).astype(np.int64) @ np.asarray(B8).astype(np.int64)
# int4 in two blocks along K: the fast route is planned per target (f32 values on the
# host, bf16 on a TPU). fp8 in one block: cheap to trace and compile in mode "exact"
# (exponent slices, five dots), one bf16 dot in mode "fast".
X4 = jnp.asarray(RNG.standard_normal((4, 256)), jnp.bfloat16)
Q4 = emulate.quantize(
    jnp.asarray(RNG.standard_normal((256, 8)), jnp.float32), emulate.mx.INT4_G128, axis=0
)
X = jnp.asarray(RNG.standard_normal((4, 32)), jnp.bfloat16)
Q = emulate.quantize(
    jnp.asarray(RNG.standard_normal((32, 8)), jnp.float32), emulate.mx.MXFP8_E4M3, axis=0
)
DN = (((1,), (0,)), ((), ()))
# float8 operands whose exact sums need more than f32's 24 bits (values 2**7 apart).
F8A = jnp.asarray(
    RNG.standard_normal((4, 32)) * 2.0 ** RNG.integers(-6, 7, (4, 32)), jnp.float8_e4m3fn
)
F8B = jnp.asarray(
    RNG.standard_normal((32, 8)) * 2.0 ** RNG.integers(-6, 7, (32, 8)), jnp.float8_e4m3fn
)
EXACT_F8 = reference.dot_general(F8A, F8B, DN, "float32")


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv("EMULATE_TARGET", raising=False)


def sites(fn, *args):
    return [
        (s.primitive, s.lhs_dtype, s.rhs_dtype, s.lhs_shape, s.rhs_shape)
        for s in program.sites(jax.make_jaxpr(fn)(*args))
    ]


def idot(a, b, **kw):
    return emulate.dot_general(a, b, DN, preferred_element_type=jnp.int32, **kw)


# --- the mode context ------------------------------------------------------------------


def test_use_mode_nests_restores_and_explicit_wins():
    assert targets.current_mode() == "fast"
    with emulate.use_mode("exact") as m:
        assert m == "exact" and emulate.current_mode() == "exact"
        assert emulate.current_mode("fast") == "fast"
        with emulate.use_mode("fast"):
            assert emulate.current_mode() == "fast"
        with pytest.raises(RuntimeError), emulate.use_mode("fast"):
            raise RuntimeError
        assert emulate.current_mode() == "exact"
        with emulate.target("tpu_v4"):  # a target block keeps the mode, and the reverse
            assert emulate.current_mode() == "exact"
            with emulate.use_mode("fast"):
                assert emulate.current_target().name == "tpu_v4"
    assert emulate.current_mode() == "fast"


@pytest.mark.parametrize("bad", ["slow", "", None, 1])
def test_use_mode_rejects_bad_modes_before_entering(bad):
    with pytest.raises(ValueError, match=rf"^mode: expected one of 'fast', 'exact', got {bad!r}$"):
        with emulate.use_mode(bad):
            pass
    assert emulate.current_mode() == "fast"


def test_mode_block_is_thread_local():
    seen = {}
    with emulate.use_mode("exact"):
        thread = threading.Thread(target=lambda: seen.setdefault("other", emulate.current_mode()))
        thread.start()
        thread.join()
        seen["here"] = emulate.current_mode()
    assert seen == {"other": "fast", "here": "exact"}


def test_mode_block_reaches_plans_and_front_ends():
    f8 = "float8_e4m3fn"
    with emulate.use_mode("exact"):
        assert emulate.plan(f8, f8, target="tpu_v4").mode == "exact"
        assert emulate.plan(f8, f8, target="tpu_v4", mode="fast").mode == "fast"
        inside = sites(lambda x: emulate.matmul(x, Q, target="tpu_v4"), X)
    assert inside == sites(lambda x: emulate.matmul(x, Q, target="tpu_v4", mode="exact"), X)
    assert inside != sites(lambda x: emulate.matmul(x, Q, target="tpu_v4"), X)


# --- jit keys on the target and the mode -------------------------------------------------


def test_jit_retraces_for_each_target():
    f = jax.jit(idot)
    got = {}
    for name in ("tpu_v5e", "tpu_v4", "tpu_v5e"):
        with emulate.target(name):
            got[name] = sites(f, A8, B8)
            np.testing.assert_array_equal(np.asarray(f(A8, B8)), WANT8)
    assert f._cache_size() == 2  # one program per target, reused on the way back
    for name in ("tpu_v5e", "tpu_v4"):
        assert got[name] == sites(lambda a, b, n=name: idot(a, b, target=n), A8, B8)
    assert got["tpu_v5e"][0][1:3] == ("int8", "int8")  # v5e's MXU takes int8
    assert got["tpu_v4"][0][1:3] == ("bfloat16", "bfloat16")  # v4's does not


def test_jit_of_polyfill_retraces_for_each_target():
    def f8dot(a, b):
        e4 = jnp.float8_e4m3fn
        return jnp.dot(a.astype(e4), b.astype(e4), preferred_element_type=jnp.float32)

    g = jax.jit(emulate.polyfill(f8dot))
    got = {}
    for name in ("tpu_v7x", "tpu_v4"):
        with emulate.target(name):
            got[name] = sites(g, A8, B8)
            direct = sites(emulate.polyfill(f8dot, target=name), A8, B8)
            assert got[name] == direct
    assert {s[1] for s in got["tpu_v7x"]} == {"float8_e4m3fn"}
    assert {s[1] for s in got["tpu_v4"]} == {"bfloat16"}


def fdot(a, b, **kw):
    return emulate.dot_general(a, b, DN, preferred_element_type=jnp.float32, **kw)


def test_jit_retraces_for_each_mode():
    f = jax.jit(lambda a, b: fdot(a, b, target="tpu_v4"))
    with emulate.use_mode("exact"):
        exact = sites(f, F8A, F8B)
        got = f(F8A, F8B)
    fast = sites(f, F8A, F8B)
    assert f._cache_size() == 1  # only the exact program was run
    assert exact == sites(lambda a, b: fdot(a, b, target="tpu_v4", mode="exact"), F8A, F8B)
    assert fast == sites(lambda a, b: fdot(a, b, target="tpu_v4", mode="fast"), F8A, F8B)
    assert exact != fast
    np.testing.assert_array_equal(np.asarray(got), EXACT_F8)


# --- polyfill's target and mode reach every emulate call inside ---------------------------


def qmatmul(x, q, **kw):
    return x @ q if not kw else emulate.matmul(x, q, **kw)


def qeinsum(x, q, **kw):
    return emulate.einsum("bk,kn->bn", x, q, **kw)


CASES = [
    ("qarray @", qmatmul, (X4, Q4), "tpu_v4", "fast"),
    ("qarray @", qmatmul, (X, Q), "tpu_v4", "exact"),
    ("einsum", qeinsum, (X4, Q4), "tpu_v7x", "fast"),
    ("einsum", qeinsum, (X, Q), "tpu_v7x", "exact"),
    ("dot_general int8", idot, (A8, B8), "tpu_v4", "fast"),
    ("dot_general int8", idot, (A8, B8), "tpu_v4", "exact"),
]
#: Under EMULATE_LONG_TESTS=1 only: einsum in mode "exact" (6 s: its exact program), as
#: mode "exact" reaches the calls inside by default through "qarray @" and the int8
#: dot_general, and einsum's front end in mode "fast".
LONG_CASES = {("einsum", "exact")}


@pytest.mark.parametrize(
    "fn,args,target,mode",
    [
        pytest.param(*c[1:], marks=pytest.mark.long if (c[0], c[4]) in LONG_CASES else ())
        for c in CASES
    ],
    ids=[f"{c[0]}-{c[3]}-{c[4]}" for c in CASES],
)
def test_polyfill_target_and_mode_reach_inner_calls(fn, args, target, mode):
    inside = sites(emulate.polyfill(fn, target=target, mode=mode), *args)
    direct = sites(lambda *a: fn(*a, target=target, mode=mode), *args)
    assert inside == direct
    assert inside != sites(lambda *a: fn(*a, target="cpu", mode="fast"), *args)


def test_polyfill_mode_exact_gives_the_exact_numbers():
    got = emulate.polyfill(fdot, target="tpu_v4", mode="exact")(F8A, F8B)
    np.testing.assert_array_equal(np.asarray(got), EXACT_F8)


def test_nested_polyfills_innermost_explicit_wins():
    inner_default = emulate.polyfill(lambda x, q: x @ q)
    inner_v7x = emulate.polyfill(lambda x, q: x @ q, target="tpu_v7x")
    inner_fast = emulate.polyfill(lambda x, q: x @ q, mode="fast")
    outer = dict(target="tpu_v4", mode="exact")

    def direct(**kw):
        return sites(lambda x, q: emulate.matmul(x, q, **kw), X, Q)

    assert sites(emulate.polyfill(inner_default, **outer), X, Q) == direct(**outer)
    assert sites(emulate.polyfill(inner_v7x, **outer), X, Q) == direct(
        target="tpu_v7x", mode="exact"
    )
    assert sites(emulate.polyfill(inner_fast, **outer), X, Q) == direct(
        target="tpu_v4", mode="fast"
    )
    explicit = emulate.polyfill(
        lambda x, q: emulate.matmul(x, q, target="tpu_v7x", mode="fast"), **outer
    )
    assert sites(explicit, X, Q) == direct(target="tpu_v7x", mode="fast")


def test_polyfill_rejects_a_bad_mode_when_wrapping():
    with pytest.raises(ValueError, match=r"^mode: expected one of 'fast', 'exact', got 'slow'$"):
        emulate.polyfill(lambda x: x, mode="slow")
