"""Stochastic rounding in quantization-aware training: a jitted NNX step with a
stochastically rounding MXFP4 layer, its key from emulate.flax.rounding_key.

The forward uses exactly ``quantize(w, scheme, key=fold_in(key, 0))``; the gradient
reaches the float master kernel straight through (for the linear loss ``sum(y * c)`` it
is ``x.T @ c``, whatever the rounding); the same key gives the same step and another key
another rounding; keys read where they would be baked into a compiled program, or
missing, are errors.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _pages import section_blocks
from flax import nnx

import emulate
import emulate.flax as ef

SCHEME = dataclasses.replace(emulate.mx.MXFP4, rounding="stochastic", random_bits=8)
X = jax.random.normal(jax.random.key(1), (4, 64), jnp.float32)
C = jax.random.normal(jax.random.key(2), (4, 16), jnp.float32)
MATMUL = (((1,), (0,)), ((), ()))


def model() -> nnx.Linear:
    lin = nnx.Linear(64, 16, rngs=nnx.Rngs(0))
    return ef.quantize_model(lin, ef.Rule(".*", SCHEME), qat=True)


def loss(m, x):
    return jnp.sum(m(x) * C)


@nnx.jit
def step(m, x, key):
    with ef.rounding_key(key):
        return nnx.value_and_grad(loss)(m, x)


def test_qat_step_rounds_stochastically_and_passes_the_gradient_straight_through():
    m = model()
    w = m.kernel[...]
    key = jax.random.key(7)
    value, grads = step(m, X, key)
    q = emulate.quantize(w, SCHEME, axis=0, key=jax.random.fold_in(key, 0))
    want = emulate.dot_general(X, q, (((1,), (0,)), ((), ()))) + m.bias[...]
    assert float(value) == pytest.approx(float(jnp.sum(want * C)), rel=1e-6)
    np.testing.assert_allclose(grads["kernel"][...], X.T @ C, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads["bias"][...], C.sum(0), rtol=1e-6)
    again, _ = step(m, X, key)
    other, _ = step(m, X, jax.random.key(8))
    assert float(again) == float(value)
    assert float(other) != float(value)
    nearest = emulate.quantize(w, emulate.mx.MXFP4, axis=0)
    assert (np.asarray(q.unpacked_codes()) != np.asarray(nearest.unpacked_codes())).any()


def test_keys_missing_or_baked_into_a_program_are_errors():
    m = model()
    with pytest.raises(
        ValueError, match=r"^key: the MXFP4 kernel of shape \(64, 16\) rounds stochastically and "
    ):
        m(X)
    with ef.rounding_key(jax.random.key(0)):
        eager = m(X)  # eager: a concrete key is fine
        frozen = ef.quantize_model(model(), ef.Rule(".*", SCHEME))  # one draw, frozen
        with pytest.raises(
            ValueError, match=r"^key: the MXFP4 kernel of shape \(64, 16\) is being traced \(jit\)"
        ):
            nnx.jit(lambda m, x: m(x))(m, X)
    assert eager.shape == (4, 16)
    assert isinstance(frozen.kernel[...], emulate.QArray)
    with pytest.raises(TypeError, match=r"^key: expected a jax.random key"):
        with ef.rounding_key(3):
            pass


def _qat_snippet() -> str:
    """The code block of docs/quantized.md's "Stochastic rounding in quantization-aware
    training" section, as the page shows it."""
    (code,) = section_blocks("quantized.md", "Stochastic rounding in quantization-aware training")
    return code


def _run_snippet(batches: list, root_key: jax.Array) -> dict:
    """Runs the page's snippet on a 64 -> 16 linear layer, plain SGD and the linear loss
    ``sum(model(x) * y)``: the names the page leaves to the reader."""
    names = {
        "jax": jax,
        "model": nnx.Linear(64, 16, rngs=nnx.Rngs(0)),
        "loss_fn": lambda m, x, y: jnp.sum(m(x) * y),
        "batches": batches,
        "root_key": root_key,
    }
    names["optimizer"] = nnx.Optimizer(names["model"], optax.sgd(0.5), wrt=nnx.Param)
    exec(compile(_qat_snippet(), "docs/quantized.md", "exec"), names)
    return names


def test_the_qat_snippet_of_the_quantized_page_trains_with_stochastic_rounding():
    batches = [(X, C), (2 * X, C)]
    kernel0 = np.asarray(nnx.Linear(64, 16, rngs=nnx.Rngs(0)).kernel[...])
    names = _run_snippet(batches, jax.random.key(3))
    model = names["model"]
    # straight through: the float master kernel moved by -0.5 * sum_i x_i.T @ y_i exactly as
    # if quantizing were the identity (the loss is linear), whatever the roundings were
    want = kernel0 - 0.5 * (np.asarray(X).T @ np.asarray(C) + 2 * np.asarray(X).T @ np.asarray(C))
    np.testing.assert_allclose(np.asarray(model.kernel[...]), want, rtol=1e-5, atol=1e-5)
    # the snippet's step forwards the MXFP4 matmul of the kernel rounded stochastically with
    # fold_in(key, 0); the same key gives the same loss, another key another rounding
    w = model.kernel[...]
    key = jax.random.key(11)
    q = emulate.quantize(w, names["SR_MXFP4"], axis=0, key=jax.random.fold_in(key, 0))
    want_y = emulate.dot_general(X, q, MATMUL) + model.bias[...]
    step = names["train_step"]
    opt = names["optimizer"]
    loss = float(step(model, opt, X, C, key))
    assert loss == pytest.approx(float(jnp.sum(want_y * C)), rel=1e-6)
    nearest = emulate.dot_general(X, emulate.quantize(w, emulate.mx.MXFP4, axis=0), MATMUL)
    assert loss != pytest.approx(float(jnp.sum((nearest + model.bias[...]) * C)), rel=1e-6)
    assert names["SR_MXFP4"].rounding == "stochastic" and names["SR_MXFP4"].random_bits == 8
