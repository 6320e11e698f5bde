"""polyfill(fn): every unsupported matmul in a program is rewritten; the rest stays."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import emulate
from emulate import bounds, program, reference, targets
from emulate.rewrite import polyfill

DN = (((1,), (0,)), ((), ()))
RNG = np.random.default_rng(0)
# K = 1500 > 1024: int8 x int8 in f32 needs chunking on tpu_v4 to stay exact.
X = jnp.asarray(RNG.integers(-128, 128, (4, 1500)), jnp.int8)
W = jnp.asarray(RNG.integers(-128, 128, (1500, 3)), jnp.int8)
WANT = np.asarray(X).astype(np.int64) @ np.asarray(W).astype(np.int64)


def idot(x, w):
    return jax.lax.dot_general(x, w, DN, preferred_element_type=jnp.int32)


def only_native(fn, *args, target):
    t = targets.get(target)
    sites = program.sites(jax.make_jaxpr(fn)(*args))
    return bool(sites) and all(t.supports(s.lhs_dtype, s.rhs_dtype) for s in sites)


def test_rewrites_inside_every_higher_order_primitive():
    @jax.custom_jvp
    def twice(x):
        return idot(x, W) * 2

    twice.defjvp(lambda p, t: (twice(p[0]), t[0]))

    @jax.custom_vjp
    def thrice(x):
        return idot(x, W) * 3

    thrice.defvjp(lambda x: (thrice(x), None), lambda _, g: (g,))

    def f(x, w):
        y = jax.jit(idot)(x, w)
        z = jax.checkpoint(lambda x: idot(x, w))(x)
        s = jax.lax.scan(
            lambda c, _: (c + idot(x, w), None), jnp.zeros((4, 3), jnp.int32), None, length=2
        )[0]
        c = jax.lax.cond(x[0, 0] > 0, lambda: idot(x, w), lambda: -idot(x, w))
        wl = jax.lax.while_loop(
            lambda c: c[1] < 2,
            lambda c: (c[0] + idot(x, w), c[1] + 1),
            (jnp.zeros((4, 3), jnp.int32), 0),
        )[0]
        return y, z, s, c, wl, twice(x), thrice(x)

    g = polyfill(f, target="tpu_v4")
    y, z, s, c, wl, tw, th = g(X, W)
    sign = 1 if int(X[0, 0]) > 0 else -1
    for got, want in [
        (y, WANT),
        (z, WANT),
        (s, 2 * WANT),
        (c, sign * WANT),
        (wl, 2 * WANT),
        (tw, 2 * WANT),
        (th, 3 * WANT),
    ]:
        assert got.dtype == jnp.int32
        np.testing.assert_array_equal(got, want)
    assert not only_native(f, X, W, target="tpu_v4")
    assert only_native(g, X, W, target="tpu_v4")
    assert jax.eval_shape(g, X, W) == jax.eval_shape(f, X, W)


def test_native_sites_are_left_alone():
    a = jnp.ones((2, 8), jnp.bfloat16)
    b = jnp.ones((8, 3), jnp.bfloat16)

    def f(a, b, x, w):
        return a @ b, idot(x, w)

    g = polyfill(f, target="tpu_v4")
    sites = program.sites(jax.make_jaxpr(g)(a, b, X, W))
    native = [s for s in sites if s.lhs_shape == (2, 8)]
    assert [(s.lhs_dtype, s.rhs_dtype) for s in native] == [("bfloat16", "bfloat16")]


def test_compositions_jit_grad_vmap():
    f = polyfill(idot, target="tpu_v4")
    np.testing.assert_array_equal(jax.jit(f)(X, W), WANT)
    np.testing.assert_array_equal(polyfill(jax.jit(idot), target="tpu_v4")(X, W), WANT)
    xb = X.reshape(2, 2, 1500)
    np.testing.assert_array_equal(jax.vmap(f, in_axes=(0, None))(xb, W), WANT.reshape(2, 2, 3))
    vf = polyfill(jax.vmap(idot, in_axes=(0, None)), target="tpu_v4")
    np.testing.assert_array_equal(vf(xb, W), WANT.reshape(2, 2, 3))
    # grad with respect to a bf16 activation against a float8 weight (a mixed pair)
    act = jnp.asarray(RNG.standard_normal((3, 8)), jnp.float32)
    codes = RNG.integers(0, 126, (8, 4)).astype(np.uint8)
    w8 = jnp.asarray(codes.view(ml_dtypes.float8_e4m3fn))

    def loss(a, w):
        y = jax.lax.dot_general(a.astype(jnp.bfloat16), w, DN, preferred_element_type=jnp.float32)
        return jnp.sum(y * y)

    def plain(a):
        wd = emulate.decode(w8, to=jnp.bfloat16)
        y = jax.lax.dot_general(a.astype(jnp.bfloat16), wd, DN, preferred_element_type=jnp.float32)
        return jnp.sum(y * y)

    got = jax.grad(polyfill(loss, target="tpu_v4"))(act, w8)
    np.testing.assert_allclose(got, jax.grad(plain)(act), rtol=1e-6)


def test_bounded_pair_through_polyfill_is_within_bound():
    a = RNG.standard_normal((3, 40)).astype(ml_dtypes.bfloat16)
    codes = RNG.integers(0, 256, (40, 5)).astype(np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0
    w = codes.view(ml_dtypes.float8_e4m3fn)

    def f(a, w):
        return jax.lax.dot_general(a, w, DN, preferred_element_type=jnp.float32)

    got = np.asarray(polyfill(f, target="tpu_v4")(jnp.asarray(a), jnp.asarray(w)), np.float64)
    exact = reference.exact_dot_general(a, w, DN).astype(np.float64)
    assert np.all(np.abs(got - exact) <= bounds.dot_general_bound(a, w, DN))


def test_convolution_is_rewritten():
    x = jnp.asarray(RNG.integers(-128, 128, (1, 3, 9)), jnp.int8)
    k = jnp.asarray(RNG.integers(-128, 128, (2, 3, 4)), jnp.int8)

    def f(x, k):
        return jax.lax.conv_general_dilated(x, k, (1,), "VALID", preferred_element_type=jnp.int32)

    got = polyfill(f, target="tpu_v4")(x, k)
    xi, ki = np.asarray(x).astype(np.int64), np.asarray(k).astype(np.int64)
    want = [[int((xi[0, :, i : i + 4] * ki[o]).sum()) for i in range(6)] for o in range(2)]
    assert got.dtype == jnp.int32 and np.asarray(got[0]).tolist() == want
    assert only_native(polyfill(f, target="tpu_v4"), x, k, target="tpu_v4")


def test_program_is_cached_per_signature():
    traces = []

    def f(x, w):
        traces.append(1)
        return idot(x, w)

    g = polyfill(f, target="tpu_v4")
    for _ in range(3):
        g(X, W)
    assert len(traces) == 1 and g.cache_size() == 1
    g(X[:2], W)
    assert len(traces) == 2 and g.cache_size() == 2


def test_decorator_and_current_target():
    @polyfill
    def f(x, w):
        return idot(x, w)

    with emulate.target("tpu_v4"):
        assert only_native(f, X, W, target="tpu_v4")
    assert polyfill(target="tpu_v5e")(idot)(X, W).dtype == jnp.int32


class TestBadInput:
    def test_on_unsupported(self):
        with pytest.raises(
            ValueError, match=r"^on_unsupported: expected one of 'error', 'ignore', got 'warn'$"
        ):
            polyfill(idot, on_unsupported="warn")

    def test_not_callable(self):
        with pytest.raises(TypeError, match=r"^fn: expected a callable, got int$"):
            polyfill(3)

    def test_unknown_target_at_call(self):
        with pytest.raises(ValueError, match=r"unknown target 'tpu_v99'"):
            polyfill(idot, target="tpu_v99")(X, W)


def test_pallas_call_is_left_alone_and_reported():
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_ref, w_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.int32)

    def f(x, w):
        out = jax.ShapeDtypeStruct((8, 128), jnp.int32)
        y = pl.pallas_call(kernel, out_shape=out, interpret=pltpu.InterpretParams())(x, w)
        return y + idot(x, w)

    x = jnp.asarray(RNG.integers(-128, 128, (8, 128)), jnp.int8)
    w = jnp.asarray(RNG.integers(-128, 128, (128, 128)), jnp.int8)
    g = polyfill(f, target="tpu_v4")
    want = 2 * (np.asarray(x).astype(np.int64) @ np.asarray(w).astype(np.int64))
    np.testing.assert_array_equal(g(x, w), want)
    closed = jax.make_jaxpr(g)(x, w)
    kernels = [e for e in program.walk(closed.jaxpr) if e.primitive.name == "pallas_call"]
    assert len(kernels) == 1
    inner = [e.primitive.name for e in kernels[0].params["jaxpr"].eqns]
    assert "dot_general" in inner  # the kernel's own int8 dot is untouched
    report = emulate.inspect(f, x, w, target="tpu_v4")
    assert [(r.primitive, r.status) for r in report.rows] == [
        ("pallas_call", "left alone (pallas_call)"),
        ("dot_general", "emulated"),
    ]


A8 = jnp.asarray(RNG.integers(-128, 128, (3, 5)), jnp.int8)
B8 = jnp.asarray(RNG.integers(-128, 128, (5, 4)), jnp.int8)


@pytest.mark.parametrize(
    "name,fn",
    [
        ("@", lambda a, b: a @ b),
        ("jnp.matmul", jnp.matmul),
        ("jnp.dot", jnp.dot),
        ("jnp.einsum", lambda a, b: jnp.einsum("ij,jk->ik", a, b)),
        ("lax.dot", jax.lax.dot),
        ("lax.dot_general", lambda a, b: jax.lax.dot_general(a, b, DN)),
    ],
)
def test_every_matmul_spelling_is_caught(name, fn):
    g = polyfill(fn, target="tpu_v4")
    got = g(A8, B8)
    # jnp/lax return int8 for int8 x int8: the exact sum wrapped, as the reference does.
    want = reference.dot_general(np.asarray(A8), np.asarray(B8), DN)
    assert got.dtype == jnp.int8
    np.testing.assert_array_equal(got, want)
    assert only_native(g, A8, B8, target="tpu_v4")


def test_lax_conv_spellings_are_caught():
    x = jnp.asarray(RNG.integers(-128, 128, (1, 2, 7)), jnp.int8)
    k = jnp.asarray(RNG.integers(-128, 128, (3, 2, 2)), jnp.int8)
    for fn in (
        lambda x, k: jax.lax.conv(x, k, (1,), "VALID"),
        lambda x, k: jax.lax.conv_general_dilated(x, k, (1,), "VALID"),
    ):
        g = polyfill(fn, target="tpu_v4")
        assert g(x, k).dtype == jnp.int8
        assert only_native(g, x, k, target="tpu_v4")


def test_flax_nnx_layers_with_low_precision_params():
    from flax import nnx

    def fp8(shape):
        codes = RNG.integers(0, 126, shape).astype(np.uint8)
        return jnp.asarray(codes.view(ml_dtypes.float8_e4m3fn))

    x = fp8((2, 16))
    lin = nnx.Linear(16, 4, use_bias=False, rngs=nnx.Rngs(0))
    lin.kernel = nnx.Param(fp8((16, 4)))
    ein = nnx.Einsum("ab,bc->ac", (16, 4), bias_shape=None, rngs=nnx.Rngs(0))
    ein.kernel = nnx.Param(fp8((16, 4)))
    conv = nnx.Conv(16, 3, kernel_size=(2,), use_bias=False, padding="VALID", rngs=nnx.Rngs(0))
    conv.kernel = nnx.Param(fp8((2, 16, 3)))
    xc = fp8((1, 5, 16))
    for layer, arg in ((lin, x), (ein, x), (conv, xc)):
        assert not only_native(layer, arg, target="tpu_v4")
        g = polyfill(layer, target="tpu_v4")
        assert only_native(g, arg, target="tpu_v4")
        assert g(arg).dtype == jnp.float8_e4m3fn
    # bf16 activations against an int4 kernel: flax's own promote_dtype would refuse the
    # mixed pair, so the layer is built without promotion, as a quantized model would be.
    mixed = nnx.Linear(16, 4, use_bias=False, rngs=nnx.Rngs(0), promote_dtype=lambda a, **_: a)
    mixed.kernel = nnx.Param(jnp.asarray(RNG.integers(-8, 8, (16, 4)), jnp.int4))
    xb = jnp.asarray(RNG.standard_normal((2, 16)), jnp.bfloat16)
    got = polyfill(mixed, target="tpu_v4")(xb)
    want = jnp.dot(xb, emulate.decode(mixed.kernel[...]), preferred_element_type=jnp.float32)
    np.testing.assert_array_equal(got, want.astype(jnp.bfloat16))


@pytest.mark.parametrize("dtype", [np.int32, np.int16, np.complex64, np.bool_])
def test_jax_types_are_left_as_they_are(dtype):
    # int32 x int32 (and any pair of JAX's own types) is no site to emulate on any target.
    def f(x, w):
        conv = jax.lax.conv_general_dilated(x[None], w.T[:, :3, None], (1,), "VALID")
        return jax.lax.dot_general(x, w, DN), conv

    x = (np.arange(12).reshape(3, 4) % 3).astype(dtype)
    w = (np.arange(8).reshape(4, 2) % 2).astype(dtype)
    want = f(x, w)
    for target in ("cpu", "tpu_v2", "tpu_v5e"):
        assert not program.unsupported_sites(f, x, w, target=target)
        got = polyfill(f, target=target)(x, w)
        for g, w_ in zip(got, want, strict=True):
            assert g.dtype == w_.dtype
            assert np.asarray(g).tobytes() == np.asarray(w_).tobytes()


def test_on_unsupported_ignore_leaves_a_refused_site():
    # float8_e8m0fnu is a scale type: emulate refuses it as an operand; "ignore" keeps JAX's.
    def f(x, w):
        return jax.lax.dot_general(x, w, DN, preferred_element_type=jnp.float32)

    x = jnp.ones((2, 3), jnp.float8_e8m0fnu)
    w = jnp.ones((3, 2), jnp.float8_e8m0fnu)
    with pytest.raises(ValueError, match=r"^lhs: float8_e8m0fnu is a scale type"):
        polyfill(f, target="tpu_v4")(x, w)
    got = polyfill(f, target="tpu_v4", on_unsupported="ignore")(x, w)
    assert np.asarray(got).tobytes() == np.asarray(f(x, w)).tobytes()


def test_typed_prng_keys_pass_through():
    from flax import nnx

    x = jnp.asarray(RNG.standard_normal((2, 16)), jnp.float32)
    # the case: an NNX layer holding nnx.Rngs (typed key<fry> leaves)
    drop = nnx.Dropout(0.1, rngs=nnx.Rngs(0))
    got = polyfill(lambda m, x: m(x, deterministic=True), target="tpu_v4")(drop, x)
    np.testing.assert_array_equal(got, x)

    def noisy(key, x):
        k1, k2 = jax.random.split(key)
        return k2, x * jax.random.uniform(k1, x.shape)

    key = jax.random.key(3)
    g = polyfill(noisy, target="tpu_v4")
    (k_got, y_got), (k_want, y_want) = g(key, x), jax.jit(noisy)(key, x)
    assert k_got.dtype == key.dtype
    np.testing.assert_array_equal(jax.random.key_data(k_got), jax.random.key_data(k_want))
    np.testing.assert_array_equal(y_got, y_want)
    g(jax.random.key(4), x)
    assert g.cache_size() == 1  # the key's dtype and shape are the cache key, not its value

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.linear = nnx.Linear(16, 4, rngs=rngs)
            self.drop = nnx.Dropout(0.5, rngs=rngs)

        def __call__(self, x):
            return self.drop(self.linear(x))

    block = Block(nnx.Rngs(0, dropout=1))
    fwd = lambda m, x: m(x)  # noqa: E731
    np.testing.assert_array_equal(polyfill(fwd, target="tpu_v4")(block, x), jax.jit(fwd)(block, x))
