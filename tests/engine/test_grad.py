"""Gradients of every emulated path against JAX's: finite differences
(``jax.test_util.check_grads``) and ``jax.grad`` / ``jax.jvp`` of the plain JAX computation
on the same (or the decoded) operands.

Tolerances: every function here is bilinear in its float operands, so central differences
have no truncation error; what remains is the rounding of the two f32 evaluations, about
``2**-24 * |f| / eps``; with ``eps = 2**-4`` and values of order 10 that is below 1e-4, far
inside ``atol = rtol = 1e-3``. Comparisons with ``jax.grad`` of ``lax`` are of two f32
dots with different summation orders: relative 1e-5 (K <= 64, error <= K * 2**-24 of the
magnitude), or one unit in the last place of a float8/bf16 cotangent, which rounds the f32
value once.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.test_util import check_grads

import emulate

DN = (((1,), (0,)), ((), ()))
RNG = np.random.default_rng(0)
A32 = jnp.asarray(RNG.standard_normal((4, 16)), jnp.float32)
B32 = jnp.asarray(RNG.standard_normal((16, 3)), jnp.float32)
CG = dict(order=1, modes=("fwd", "rev"), atol=1e-3, rtol=1e-3, eps=2.0**-4)


def _f64(x) -> np.ndarray:
    return np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)


def _assert_close(got, want, dtype) -> None:
    """Same dtype; values within 1e-5 relative of the largest (f32), or one ulp of a
    narrow dtype (the f32 cotangent is rounded into it once)."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    g, w = _f64(got), _f64(want)
    if np.dtype(dtype) == np.float32:
        tol = 1e-5 * max(1.0, np.max(np.abs(w)))
    else:
        eps = float(ml_dtypes.finfo(dtype).eps)
        tol = eps * np.maximum(np.abs(w), float(ml_dtypes.finfo(dtype).smallest_normal))
    assert np.all(np.abs(g - w) <= tol), np.max(np.abs(g - w) - tol)


# --- dot_general, matmul, einsum -------------------------------------------------------


@pytest.mark.parametrize("mode,target", [("exact", "cpu"), ("fast", "tpu_v4")])
def test_dot_general_f32_check_grads(mode, target):
    # f32 x f32 in mode "exact" is exponent slicing through integers (the sliced route).
    # The exact programs of this file are few and shared (A32 x B32 on the CPU), as each
    # costs seconds to compile.
    def f(a, b):
        return emulate.dot_general(a, b, DN, target=target, mode=mode)

    check_grads(f, (A32, B32), **CG)


@pytest.mark.parametrize(
    "dtype,mode",
    [
        (jnp.bfloat16, "fast"),
        (jnp.float8_e4m3fn, "fast"),
        pytest.param(jnp.float8_e5m2, "fast", marks=pytest.mark.long),
        (jnp.float8_e4m3fn, "exact"),
    ],
    ids=str,
)
def test_dot_general_grad_equals_jax_on_narrow_operands(dtype, mode):
    # e4m3fn's fast path by default, e5m2's (the same decode to bf16) under
    # EMULATE_LONG_TESTS=1.
    # tpu_v4 runs none of these pairs in its matrix unit (fast: decoded to bf16; exact:
    # sliced); JAX's lax.dot_general differentiates them with cotangents of the operand's
    # own dtype.
    a, b = A32.astype(dtype), B32.astype(dtype)

    def ours(x, y):
        out = emulate.dot_general(
            x, y, DN, preferred_element_type=jnp.float32, target="tpu_v4", mode=mode
        )
        return jnp.sum(out * jnp.arange(3.0))

    def theirs(x, y):
        return jnp.sum(
            lax.dot_general(x, y, DN, preferred_element_type=jnp.float32) * jnp.arange(3.0)
        )

    got = jax.grad(ours, argnums=(0, 1))(a, b)
    want = jax.grad(theirs, argnums=(0, 1))(a, b)
    for g, w in zip(got, want, strict=True):
        _assert_close(g, w, dtype)


def test_dot_general_jvp_vjp_and_vmap_of_grad_exact():
    f = functools.partial(emulate.dot_general, dimension_numbers=DN, target="cpu", mode="exact")
    g = functools.partial(lax.dot_general, dimension_numbers=DN)
    ta, tb = A32[::-1], B32 * 2
    _, t_ours = jax.jvp(f, (A32, B32), (ta, tb))
    _, t_jax = jax.jvp(g, (A32, B32), (ta, tb))
    _assert_close(t_ours, t_jax, jnp.float32)
    ct = jnp.ones((4, 3), jnp.float32)
    for x, y in zip(jax.vjp(f, A32, B32)[1](ct), jax.vjp(g, A32, B32)[1](ct), strict=True):
        _assert_close(x, y, jnp.float32)


def test_vmap_of_grad_fp8():
    f = functools.partial(
        emulate.dot_general,
        dimension_numbers=DN,
        preferred_element_type=jnp.float32,
        target="tpu_v4",
    )
    g = functools.partial(lax.dot_general, dimension_numbers=DN, preferred_element_type=jnp.float32)
    b = B32.astype(jnp.float8_e4m3fn)
    stack = jnp.stack([A32, 2 * A32, -A32]).astype(jnp.float8_e4m3fn)
    ours = jax.grad(lambda a: jnp.sum(f(a, b) ** 2))
    theirs = jax.grad(lambda a: jnp.sum(g(a, b) ** 2))
    batched = jax.vmap(ours)(stack)
    for i in range(3):
        _assert_close(batched[i], theirs(stack[i]), jnp.float8_e4m3fn)


# Mode "exact" under EMULATE_LONG_TESTS=1: its backward is the same rule, which
# test_dot_general_grad_equals_jax_on_narrow_operands[float8_e4m3fn-exact] checks by default.
@pytest.mark.parametrize("mode", ["fast", pytest.param("exact", marks=pytest.mark.long)])
def test_matmul_and_einsum_grads_equal_jnp(mode):
    dt = jnp.bfloat16 if mode == "fast" else jnp.float8_e4m3fn
    a = jnp.asarray(RNG.standard_normal((2, 4, 16)), jnp.float32).astype(dt)
    b = jnp.asarray(RNG.standard_normal((2, 16, 3)), jnp.float32).astype(dt)
    kw = dict(preferred_element_type=jnp.float32, target="tpu_v4", mode=mode)
    cases = [
        (
            lambda x, y: emulate.matmul(x, y, **kw),
            lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32),
        ),
        (
            lambda x, y: emulate.einsum("bij,bjk->bki", x, y, **kw),
            lambda x, y: jnp.einsum("bij,bjk->bki", x, y, preferred_element_type=jnp.float32),
        ),
    ]
    for ours, theirs in cases:
        got = jax.grad(lambda x, y, h=ours: jnp.sum(h(x, y) ** 2), argnums=(0, 1))(a, b)
        want = jax.grad(lambda x, y, h=theirs: jnp.sum(h(x, y) ** 2), argnums=(0, 1))(a, b)
        for g, w in zip(got, want, strict=True):
            _assert_close(g, w, dt)


def test_integer_operands_give_jaxs_error_and_float0():
    a = jnp.asarray(RNG.integers(-8, 8, (4, 16)), jnp.int8)
    b = jnp.asarray(RNG.standard_normal((16, 3)), jnp.bfloat16)
    ours = lambda x, y: jnp.sum(emulate.dot_general(x, y, DN, target="tpu_v4"))  # noqa: E731
    theirs = lambda x, y: jnp.sum(lax.dot_general(x, y, DN))  # noqa: E731
    for f in (ours, theirs):
        with pytest.raises(TypeError, match="grad requires real- or complex-valued inputs"):
            jax.grad(f)(a, b)
    got = jax.grad(ours, argnums=(0, 1), allow_int=True)(a, b)
    want = jax.grad(theirs, argnums=(0, 1), allow_int=True)(a, b)
    assert got[0].dtype == want[0].dtype == jax.dtypes.float0
    _assert_close(got[1], want[1], jnp.bfloat16)
    # int8 x int8: an integer result, float0 tangents as JAX gives them
    _, t = jax.jvp(
        lambda x: emulate.dot_general(x, a.T, DN, target="tpu_v4"),
        (a,),
        (np.zeros(a.shape, jax.dtypes.float0),),
    )
    assert t.dtype == jax.dtypes.float0 and t.shape == (4, 4)


# --- conv --------------------------------------------------------------------------------

X = jnp.asarray(RNG.standard_normal((2, 3, 6, 6)), jnp.float32)
W = jnp.asarray(RNG.standard_normal((4, 3, 3, 3)), jnp.float32)
CONV = dict(window_strides=(2, 1), padding="SAME", rhs_dilation=(1, 2))


def test_conv_f32_check_grads():
    # bf16 x bf16 passes in mode "fast" on tpu_v4 as f32 x f32 is native; a chunked exact
    # f32 convolution compiles slowly, so mode "exact" is checked on fp8 below.
    def f(x, w):
        return emulate.conv_general_dilated(x, w, **CONV, target="tpu_v4", mode="fast")

    check_grads(f, (X, W), **CG)


# Mode "exact" under EMULATE_LONG_TESTS=1 (the exact backward: as above).
@pytest.mark.parametrize("mode", ["fast", pytest.param("exact", marks=pytest.mark.long)])
def test_conv_fp8_grad_equals_jax(mode):
    x, w = X.astype(jnp.float8_e4m3fn), W.astype(jnp.float8_e4m3fn)

    def ours(x, w):
        out = emulate.conv_general_dilated(
            x, w, **CONV, preferred_element_type=jnp.float32, target="tpu_v4", mode=mode
        )
        return jnp.sum(out**2)

    def theirs(x, w):
        return jnp.sum(
            lax.conv_general_dilated(x, w, **CONV, preferred_element_type=jnp.float32) ** 2
        )

    got = jax.grad(ours, argnums=(0, 1))(x, w)
    want = jax.grad(theirs, argnums=(0, 1))(x, w)
    for g, v in zip(got, want, strict=True):
        _assert_close(g, v, jnp.float8_e4m3fn)


# --- QArray, scaled_matmul, scaled_dot_general --------------------------------------------

# A (16, 3) weight in blocks of 8 along K: in mode "exact" its dequantized values meet A32
# in the same f32 x f32 program as test_dot_general_f32_check_grads.
CODES = jnp.asarray(RNG.standard_normal((16, 3)) * 4, jnp.float32).astype(jnp.float8_e4m3fn)
SCALES = jnp.asarray(np.exp2(RNG.integers(-3, 3, (2, 3))) * 1.5, jnp.float32)


# tpu_v5e's fast plan (the same decode, another dot dtype) under EMULATE_LONG_TESTS=1.
@pytest.mark.parametrize(
    "mode,target",
    [("fast", "cpu"), pytest.param("fast", "tpu_v5e", marks=pytest.mark.long), ("exact", "cpu")],
)
def test_qarray_matmul_grads_wrt_activations_and_scales(mode, target):
    # Codes given to from_parts are read as bits (no gradient reaches them there).
    def ours(x, scales):
        q = emulate.QArray.from_parts(CODES, scales, block_shape=(8, 1))
        return jnp.sum(jnp.sin(emulate.matmul(x, q, target=target, mode=mode)))

    def theirs(x, scales):
        return jnp.sum(jnp.sin(x @ (CODES.astype(jnp.float32) * jnp.repeat(scales, 8, axis=0))))

    got = jax.grad(ours, argnums=(0, 1))(A32, SCALES)
    want = jax.grad(theirs, argnums=(0, 1))(A32, SCALES)
    for g, w in zip(got, want, strict=True):
        _assert_close(g, w, jnp.float32)

    def bilinear(x, scales):  # central differences are exact for it
        q = emulate.QArray.from_parts(CODES, scales, block_shape=(8, 1))
        return emulate.matmul(x, q, target=target, mode=mode)

    check_grads(bilinear, (A32, SCALES), **CG)


def test_qarray_int_codes_and_tensor_scale():
    # int8 codes carry no tangent; the scales and the tensor scale do.
    codes = jnp.asarray(RNG.integers(-127, 128, (16, 3)), jnp.int8)

    def ours(x, scales, ts):
        q = emulate.QArray.from_parts(codes, scales, block_shape=(8, 1), tensor_scale=ts)
        return jnp.sum(jnp.cos(x @ q))

    def theirs(x, scales, ts):
        w = codes.astype(jnp.float32) * jnp.repeat(scales, 8, axis=0) * ts
        return jnp.sum(jnp.cos(x @ w))

    args = (A32, SCALES, jnp.float32(0.75))
    for g, w in zip(
        jax.grad(ours, argnums=(0, 1, 2))(*args),
        jax.grad(theirs, argnums=(0, 1, 2))(*args),
        strict=True,
    ):
        _assert_close(g, w, jnp.float32)


def test_scaled_matmul_grads_are_the_dequantized_math():
    # jax.nn.scaled_matmul has no differentiation rule (NotImplementedError, any backend);
    # emulate's gives the gradient of the math it computes (mode "exact" runs the same
    # QArray contraction as test_qarray_matmul_grads_wrt_activations_and_scales).
    lhs = jnp.asarray(RNG.standard_normal((1, 4, 64)), jnp.float32).astype(jnp.float8_e4m3fn)
    rhs = jnp.asarray(RNG.standard_normal((1, 3, 64)), jnp.float32)
    ls = jnp.asarray(np.exp2(RNG.integers(-2, 2, (1, 4, 2))) * 1.25, jnp.float32)
    rs = jnp.asarray(np.exp2(RNG.integers(-2, 2, (1, 3, 2))), jnp.float32)
    # A linear loss: the float8 cotangent of lhs stays far inside e4m3fn's range (a
    # squared loss can overflow it to NaN, as JAX's own float8 cotangents would).
    ct = jnp.asarray(np.random.default_rng(7).uniform(-1, 1, (1, 4, 3)), jnp.float32)
    with pytest.raises(NotImplementedError, match="scaled_matmul_wrapper"):
        jax.grad(lambda a: jnp.sum(jax.nn.scaled_matmul(a, rhs, ls, rs)))(lhs)

    def ours(a, b, sa, sb):
        return jnp.sum(emulate.scaled_matmul(a, b, sa, sb, target="tpu_v5e") * ct)

    def theirs(a, b, sa, sb):
        av = a.astype(jnp.float32) * jnp.repeat(sa, 32, axis=-1)
        bv = b.astype(jnp.float32) * jnp.repeat(sb, 32, axis=-1)
        return jnp.sum(jnp.einsum("bmk,bnk->bmn", av, bv, precision="highest") * ct)

    args = (lhs, rhs, ls, rs)
    got = jax.grad(ours, argnums=(0, 1, 2, 3))(*args)
    want = jax.grad(theirs, argnums=(0, 1, 2, 3))(*args)
    for g, w, dt in zip(got, want, (jnp.float8_e4m3fn,) + (jnp.float32,) * 3, strict=True):
        _assert_close(g, w, dt)


def test_scaled_dot_general_grad_is_jaxs_quantized_backward():
    # JAX's rule (a custom_vjp) quantizes the cotangent and the other operand to mxfp8 and
    # runs scaled_matmul again, which polyfill must rewrite too. Each mxfp8 operand is
    # within 2**-4 relative of its input (3 mantissa bits, round to nearest), so the
    # gradient is within (1 + 2**-4)**2 - 1 < 2**-3 of sum|g| |y| from the exact one.
    x = jnp.asarray(RNG.standard_normal((1, 32, 64)), jnp.float32)
    y = jnp.asarray(RNG.standard_normal((1, 32, 64)), jnp.float32)
    dn = (((2,), (2,)), ((0,), (0,)))
    cfg = [jax.nn.get_scaled_dot_general_config("mxfp8")] * 3
    ct = jnp.asarray(RNG.standard_normal((1, 32, 32)), jnp.float32)

    def f(a, b):
        return jnp.sum(emulate.scaled_dot_general(a, b, dn, configs=cfg, target="cpu") * ct)

    gx, gy = jax.grad(f, argnums=(0, 1))(x, y)
    c, xv, yv = (np.asarray(v, np.float64) for v in (ct, x, y))
    want_x, want_y = np.einsum("bmn,bnk->bmk", c, yv), np.einsum("bmn,bmk->bnk", c, xv)
    mag_x = np.einsum("bmn,bnk->bmk", np.abs(c), np.abs(yv))
    mag_y = np.einsum("bmn,bmk->bnk", np.abs(c), np.abs(xv))
    assert np.all(np.abs(np.asarray(gx) - want_x) <= 2.0**-3 * mag_x)
    assert np.all(np.abs(np.asarray(gy) - want_y) <= 2.0**-3 * mag_y)
    assert not np.array_equal(np.asarray(gx), want_x.astype(np.float32))  # it was quantized
    # configs=None is a plain dot: JAX's own gradient
    plain = jax.grad(lambda a: jnp.sum(emulate.scaled_dot_general(a, y, dn) * ct))(x)
    _assert_close(
        plain, jax.grad(lambda a: jnp.sum(lax.dot_general(a, y, dn) * ct))(x), jnp.float32
    )


# --- polyfill ----------------------------------------------------------------------------


def _model(x, w1, w2):
    h = jnp.tanh(jnp.dot(x, w1, preferred_element_type=jnp.float32))
    return jnp.sum(
        lax.dot_general(h.astype(jnp.bfloat16), w2, DN, preferred_element_type=jnp.float32)
    )


def test_polyfill_exact_grad_equals_grad_of_the_function():
    a, b = A32.astype(jnp.float8_e4m3fn), B32.astype(jnp.float8_e4m3fn)

    def f(x, y):
        return jnp.sum(jnp.tanh(lax.dot_general(x, y, DN, preferred_element_type=jnp.float32)))

    fn = emulate.polyfill(f, target="tpu_v4", mode="exact")
    assert len(emulate.program.unsupported_sites(f, a, b, target="tpu_v4")) == 1
    assert emulate.program.unsupported_sites(fn, a, b, target="tpu_v4") == []
    got = jax.grad(fn, argnums=(0, 1))(a, b)
    want = jax.grad(f, argnums=(0, 1))(a, b)
    for g, w in zip(got, want, strict=True):
        _assert_close(g, w, jnp.float8_e4m3fn)


@pytest.mark.parametrize("mode", ["fast"])
def test_polyfill_grad_equals_grad_of_the_function(mode):
    x = jnp.asarray(RNG.standard_normal((4, 16)), jnp.bfloat16)
    w1 = jnp.asarray(RNG.standard_normal((16, 8)) * 0.3, jnp.float32).astype(jnp.float8_e4m3fn)
    w2 = jnp.asarray(RNG.standard_normal((8, 3)), jnp.bfloat16)
    fn = emulate.polyfill(_model, target="tpu_v4", mode=mode)
    assert emulate.program.unsupported_sites(fn, x, w1, w2, target="tpu_v4") == []
    got = jax.grad(fn, argnums=(0, 1, 2))(x, w1, w2)
    want = jax.grad(_model, argnums=(0, 1, 2))(x, w1, w2)
    for g, w, dt in zip(got, want, (jnp.bfloat16, jnp.float8_e4m3fn, jnp.bfloat16), strict=True):
        _assert_close(g, w, dt)
    # forward mode through the rewritten program
    tx = jnp.ones_like(x)
    _, t_ours = jax.jvp(lambda a: fn(a, w1, w2), (x,), (tx,))
    _, t_jax = jax.jvp(lambda a: _model(a, w1, w2), (x,), (tx,))
    _assert_close(t_ours, t_jax, jnp.float32)


@jax.custom_jvp
def _layer(x, w):
    return lax.dot_general(x, w, DN, preferred_element_type=jnp.float32)


@_layer.defjvp
def _layer_jvp(primals, tangents):
    (x, w), (tx, tw) = primals, tangents
    dot = functools.partial(
        lax.dot_general, dimension_numbers=DN, preferred_element_type=jnp.float32
    )
    return _layer(x, w), dot(tx, w) + dot(x, tw)


def test_polyfill_keeps_custom_rules_and_rewrites_them():
    # A custom_jvp (a user's layer) and a custom_vjp (jax.nn.scaled_dot_general, above)
    # holding an emulated site: the gradient is the rule's, and the gradient's program
    # holds no pair the target lacks (the rule's tangent dots run as f32 x f32).
    a, b = A32.astype(jnp.float8_e4m3fn), B32.astype(jnp.float8_e4m3fn)

    def f(x, w):
        return jnp.sum(jnp.tanh(_layer(x, w)))

    fn = emulate.polyfill(f, target="tpu_v4")
    grad = jax.grad(fn, argnums=(0, 1))
    assert emulate.program.unsupported_sites(grad, a, b, target="tpu_v4") == []
    assert emulate.program.unsupported_sites(jax.grad(f, argnums=(0, 1)), a, b, target="tpu_v4")
    for g, w in zip(grad(a, b), jax.grad(f, argnums=(0, 1))(a, b), strict=True):
        _assert_close(g, w, jnp.float8_e4m3fn)
