"""emulate.flax: a flax NNX decoder and a linen CNN ported in one call each.

Every quantized site, on the operands the model really feeds it, lies within the
documented bound of the exact product of its input with the dequantized kernel (a float64
numpy oracle on reference.dequantize's values); the whole model agrees with the float
model that holds the dequantized weights; gradients (frozen kernels: to the inputs and the
other parameters; QAT: straight through to the float kernels) and vmap work.
"""

from __future__ import annotations

import importlib.util
import math
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen, nnx
from jax import lax

import emulate
import emulate.flax as ef
import emulate.flax.layers as efl
from emulate import bounds, reference

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
# Two targets: tpu_v4 emulates the int8/float8 pairs tpu_v7x runs natively. Each
# target-parametrized test runs one of them by default, the other as a long sweep
# (EMULATE_LONG_TESTS=1); test_cnn_gradients_and_vmap runs tpu_v4.
V4_LONG = [pytest.param("tpu_v4", marks=pytest.mark.long), "tpu_v7x"]
V7X_LONG = ["tpu_v4", pytest.param("tpu_v7x", marks=pytest.mark.long)]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # linen's dataclasses read their module's namespace
    spec.loader.exec_module(module)
    return module


dec = _load("flax_decoder")
cnn = _load("linen_cnn")


# --------------------------------------------------------------------------- the oracle


def _values(q: emulate.QArray) -> np.ndarray:
    ts = None if q.tensor_scale is None else float(q.tensor_scale)
    codes = np.asarray(q.unpacked_codes())
    return reference.dequantize(codes, np.asarray(q.scales), q.block_shape, ts).astype(np.float64)


def _exact_and_bound(kind, head, x, q, rest, kw):
    """float64 exact result over the dequantized kernel, and gamma_(2K + 4) * sum|a*b|
    (S <= K segments) plus the underflow term."""
    a = np.asarray(x, np.float64)
    b = _values(q)
    if kind == "dot":
        subs = bounds.einsum_subscripts(a.ndim, b.ndim, rest[0])
        k = math.prod(a.shape[d] for d in rest[0][0][0])
    elif kind == "einsum":
        subs = head[0]
        ins, out = subs.split("->")
        lhs, rhs = ins.split(",")
        k = math.prod(b.shape[i] for i, c in enumerate(rhs) if c in lhs and c not in out)
    else:  # conv, flax's NHWC / HWIO layout: patches (exact moves) times the kernel
        strides, padding = rest[0], rest[1]
        dn = kw["dimension_numbers"]
        assert tuple(dn.lhs_spec) == (0, 3, 1, 2) and tuple(dn.rhs_spec) == (3, 2, 0, 1)
        g = kw.get("feature_group_count", 1)
        window = q.shape[:-2]
        cg, o = q.shape[-2], q.shape[-1]
        parts_a, parts_e = [], []
        for i in range(g):
            xi = x[..., i * cg : (i + 1) * cg]
            p = lax.conv_general_dilated_patches(
                xi,
                window,
                strides,
                padding,
                lhs_dilation=kw.get("lhs_dilation"),
                rhs_dilation=kw.get("rhs_dilation"),
                dimension_numbers=("NHWC", "HWIO", "NHWC"),
                precision=lax.Precision.HIGHEST,
            )
            wi = b[..., i * (o // g) : (i + 1) * (o // g)]
            wi = np.moveaxis(wi, -2, 0).reshape(-1, o // g)
            p = np.asarray(p, np.float64)
            parts_e.append(np.einsum("...k,ko->...o", p, wi))
            parts_a.append(np.einsum("...k,ko->...o", np.abs(p), np.abs(wi)))
        k = cg * math.prod(window)
        exact, mag = np.concatenate(parts_e, -1), np.concatenate(parts_a, -1)
        return exact, bounds.gamma(2 * k + 4) * mag + k * bounds.UNDERFLOW_PER_TERM
    exact = np.einsum(subs, a, b)
    mag = np.einsum(subs, np.abs(a), np.abs(b))
    return exact, bounds.gamma(2 * k + 4) * mag + k * bounds.UNDERFLOW_PER_TERM


@pytest.fixture
def sites(monkeypatch):
    """Record every emulated call of a quantized layer: (kind, args, result)."""
    records = []
    for kind, (emulated, plain) in list(efl.FUNCTIONS.items()):

        def record(*args, _kind=kind, _f=emulated, **kw):
            out = _f(*args, **kw)
            records.append((_kind, args, kw, out))
            return out

        monkeypatch.setitem(efl.FUNCTIONS, kind, (record, plain))
    return records


def _recorded(records, fn, *args):
    """``nnx.jit(fn)(*args)`` with the sites it records: the arrays of each site come out of
    the jitted program as results, its other arguments as they were traced (one compile,
    where an eager call compiles each operation of each site)."""
    traced = {}

    def run(*a):
        records.clear()
        out = fn(*a)
        flat, traced["tree"] = jax.tree.flatten(list(records))
        traced["flat"] = flat
        return out, [x for x in flat if isinstance(x, jax.Array)]

    out, arrays = nnx.jit(run)(*args)
    it = iter(arrays)
    flat = [next(it) if isinstance(x, jax.Array) else x for x in traced["flat"]]
    records[:] = jax.tree.unflatten(traced["tree"], flat)
    return out


def _check_sites(records, expected: int):
    assert len(records) == expected
    for kind, args, kw, out in records:
        pos = 2 if kind == "einsum" else 1
        head, x, q, rest = args[: pos - 1], args[pos - 1], args[pos], args[pos + 1 :]
        assert isinstance(q, emulate.QArray)
        exact, bound = _exact_and_bound(kind, head, x, q, rest, kw)
        got = np.asarray(out, np.float64)
        assert got.shape == exact.shape
        excess = np.abs(got - exact) - bound
        assert np.all(excess <= 0), (kind, q, float(excess.max()))


# --------------------------------------------------------------------------- NNX decoder

PROMPT = jnp.array([[1, 2, 3, 4, 5], [7, 8, 9, 10, 11]], jnp.int32)


def _twin(quantized: nnx.Module, fresh: nnx.Module) -> nnx.Module:
    """``fresh`` with each quantized kernel of ``quantized`` as its dequantized values."""
    mods = dict(nnx.iter_modules(fresh))
    for path, m in nnx.iter_modules(quantized):
        name = "embedding" if isinstance(m, nnx.Embed) else "kernel"
        var = getattr(m, name, None)
        if var is not None and isinstance(var[...], emulate.QArray):
            getattr(mods[path], name)[...] = emulate.dequantize(var[...])
    return fresh


@pytest.fixture(scope="module")
def decoder():
    """The ported decoder and its float twin, each built in one program."""
    model = nnx.jit(lambda: dec.port(dec.Decoder(nnx.Rngs(0))))()
    return model, nnx.jit(lambda m: _twin(m, dec.Decoder(nnx.Rngs(0))))(model)


@pytest.mark.parametrize("target", V4_LONG)
def test_decoder_sites_are_within_the_bound(decoder, sites, target):
    model, _ = decoder
    with emulate.target(target):
        _recorded(sites, lambda m, t: m(t, 0, dec.empty_cache(2)), model, PROMPT)
    _check_sites(sites, expected=6)  # q, kv, o, up, down, attend


@pytest.mark.parametrize("target", V7X_LONG)
def test_decoder_agrees_with_the_dequantized_model(decoder, target):
    model, twin = decoder

    def run(m, prompt):  # one program: the logits, 4 greedy tokens, and under vmap
        logits, _ = m(prompt, 0, dec.empty_cache(2))
        tokens = dec.generate(m, prompt, 4)
        # vmap over the batch: each row alone gives the same logits
        rows = jax.vmap(lambda t: m(t[None], 0, dec.empty_cache(1))[0][0])(prompt)
        return logits, tokens, rows

    with emulate.target(target):
        logits, tokens, rows = nnx.jit(run)(model, PROMPT)
    want, want_tokens = nnx.jit(
        lambda m, p: (m(p, 0, dec.empty_cache(2))[0], dec.generate(m, p, 4))
    )(twin, PROMPT)
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(rows, logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(tokens, want_tokens)


def _loss(model):
    logits, _ = model(PROMPT, 0, dec.empty_cache(2))
    return jnp.mean(jax.nn.log_softmax(logits)[..., 0])


def test_decoder_gradients(decoder):
    frozen, twin = decoder
    qat = nnx.jit(lambda: dec.port(dec.Decoder(nnx.Rngs(0)), qat=True))()
    with emulate.target("tpu_v4"):
        g_frozen = nnx.state(nnx.jit(nnx.grad(_loss))(frozen))
        g_qat = nnx.state(nnx.jit(nnx.grad(_loss))(qat))
    g_twin = nnx.state(nnx.jit(nnx.grad(_loss))(twin))

    def paths(state):
        return {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(state)}

    # frozen kernels: no gradient for the codes; the norms still train
    assert paths(g_frozen) == {"norm1/scale", "norm2/scale", "final/scale", "up/bias", "down/bias"}
    for p in paths(g_frozen):
        np.testing.assert_allclose(
            _at(g_frozen, p), _at(g_twin, p), rtol=2e-3, atol=1e-6, err_msg=p
        )
    # QAT: every float parameter, kernels included, gets the float model's gradient at
    # the dequantized weights (straight through the quantizer)
    assert paths(g_qat) == paths(g_twin)
    for p in paths(g_twin):
        np.testing.assert_allclose(_at(g_qat, p), _at(g_twin, p), rtol=2e-3, atol=1e-6, err_msg=p)


def _at(state, path: str):
    node = state
    for part in path.split("/"):
        node = node[int(part) if part.isdigit() else part]
    return np.asarray(node[...])


def test_decoder_state_carries_codes_and_scales(decoder):
    model, _ = decoder
    assert model.up.kernel.shape == (dec.D, dec.HIDDEN)
    assert model.attn.kv.kernel.shape == (2, dec.D, dec.KV_HEADS, dec.HEAD_DIM)
    graph, state = nnx.split(model)
    flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(state)[0]}
    assert np.asarray(flat["['up']['kernel'].value.codes.data"]).dtype == np.uint8
    assert flat["['up']['kernel'].value.scales"].dtype == jnp.float8_e8m0fnu
    assert flat["['embed']['embedding'].value.codes"].dtype == jnp.int8
    assert flat["['attn']['q']['kernel'].value.codes"].dtype == jnp.float8_e4m3fn
    restored = nnx.merge(graph, jax.tree.map(np.asarray, state))  # a checkpoint's arrays
    forward = nnx.jit(lambda m, t: m(t, 0, dec.empty_cache(2)))
    with emulate.target("tpu_v7x"):
        a, _ = forward(model, PROMPT)
        b, _ = forward(restored, PROMPT)
    np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------- linen CNN


@pytest.fixture(scope="module")
def convnet():
    model, variables, images = cnn.make()
    qmodel, qvars = cnn.port(model, variables, images)
    twin_vars = jax.tree.map(
        lambda v: emulate.dequantize(v) if isinstance(v, emulate.QArray) else v,
        qvars,
        is_leaf=lambda v: isinstance(v, emulate.QArray),
    )
    return model, variables, images, qmodel, qvars, twin_vars


@pytest.mark.parametrize("target", V4_LONG)
def test_cnn_sites_and_logits(convnet, sites, target):
    model, _, images, qmodel, qvars, twin_vars = convnet
    assert [p for p, _ in qmodel.sites] == ["stem", "conv", "grouped", "head"]
    assert qvars["params"]["head"]["kernel"].format_name == "float4_e2m1fn"
    with emulate.target(target):
        logits = qmodel.apply(qvars, images)
    _check_sites(sites, expected=4)
    want = model.apply(twin_vars, images)
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)


# long: the decoder's gradients run by default (test_decoder_gradients), vmap of emulate's
# routes in tests/engine/ and tests/test_scaled.py
@pytest.mark.long
def test_cnn_gradients_and_vmap(convnet):
    model, variables, images, qmodel, qvars, twin_vars = convnet

    def loss(apply, v, x):
        return jnp.sum(jax.nn.log_softmax(apply(v, x))[:, 0])

    with emulate.target("tpu_v4"):
        gx = jax.jit(jax.grad(lambda x: loss(qmodel.apply, qvars, x)))(images)
        rows = jax.vmap(lambda x: qmodel.apply(qvars, x[None])[0])(images)
        whole = qmodel.apply(qvars, images)
        qat_model, qat_vars = cnn.port(model, twin_vars, images, qat=True)
        g_qat = jax.grad(lambda v: loss(qat_model.apply, v, images))(qat_vars)
    np.testing.assert_allclose(rows, whole, rtol=1e-5, atol=1e-6)
    gx_twin = jax.grad(lambda x: loss(model.apply, twin_vars, x))(images)
    np.testing.assert_allclose(gx, gx_twin, rtol=2e-3, atol=1e-5)
    g_twin = jax.grad(lambda v: loss(model.apply, v, images))(twin_vars)
    flat_q = jax.tree_util.tree_flatten_with_path(g_qat)[0]
    flat_t = dict(jax.tree_util.tree_flatten_with_path(g_twin)[0])
    assert len(flat_q) == len(flat_t) == 8
    for p, g in flat_q:
        np.testing.assert_allclose(g, flat_t[p], rtol=2e-3, atol=1e-5, err_msg=str(p))


# --------------------------------------------------------------------------- rules, errors


def test_rules_by_callable_and_skips():
    model = dec.Decoder(nnx.Rngs(0))
    seen = []

    def rule(path, module):
        seen.append((path, type(module).__name__))
        return None if path.startswith("attn") else "float8_e4m3fn"

    ef.quantize_model(model, rule)
    assert ("up", "Linear") in seen and ("attn/kv", "Einsum") in seen
    assert not isinstance(model.attn.q.kernel[...], emulate.QArray)
    q = model.up.kernel[...]
    assert q.format_name == "float8_e4m3fn" and q.block_shape == (dec.D, 1)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"^rules: expected an emulate.mx Scheme"):
        ef.quantize_model(dec.Decoder(nnx.Rngs(0)), "float32")
    with pytest.raises(TypeError, match=r"^rules: expected a Rule"):
        ef.quantize_model(dec.Decoder(nnx.Rngs(0)), 3)
    with pytest.raises(ValueError, match=r"^rules: path '\(' is not a regular expression"):
        ef.quantize_model(dec.Decoder(nnx.Rngs(0)), ef.Rule("(", "int8"))
    masked = nnx.Conv(4, 3, (3,), mask=jnp.ones((3, 4, 3)), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"^rules: the Conv at '' has a mask"):
        ef.quantize_model(masked, "int8")
    lin = ef.quantize_model(nnx.Linear(4, 3, rngs=nnx.Rngs(0)), "int8")
    with pytest.raises(ValueError, match=r"^out_sharding: emulate.flax's quantized layers"):
        lin(jnp.ones((2, 4)), out_sharding=jax.P())
    with pytest.raises(TypeError, match=r"^variables: a linen model needs"):
        ef.quantize_model(cnn.CNN(), "int8")
    with pytest.raises(TypeError, match=r"^model: expected a flax NNX or linen Module"):
        ef.quantize_model(object(), "int8")


# ``import emulate`` alone imports no flax: checked first thing in the subprocess of
# tests/flax/test_flax_load.py::test_sharded_along_n_on_eight_devices_equals_unsharded (one
# fresh process for both)


# ------------------------------------------------ layers by what they are, bare, again


class _MyLinear(nnx.Linear):
    pass


class _MyDense(linen.Dense):
    pass


class _TwoDense(linen.Module):
    @linen.compact
    def __call__(self, x):
        return _MyDense(4, name="mine")(linen.Dense(8, name="plain")(x))


X16 = jnp.asarray(np.random.default_rng(5).standard_normal((2, 16)), jnp.float32)


def _int8_values(w):
    """Per-channel int8 with float32 absmax scales, by the oracle."""
    codes, scales, _ = reference.quantize(
        np.asarray(w), "int8", (w.shape[0], 1), scale_fmt="float32", scale_rule="absmax"
    )
    return reference.dequantize(codes, scales, (w.shape[0], 1))


class _Net(nnx.Module):
    def __init__(self):
        self.a = _MyLinear(16, 4, rngs=nnx.Rngs(0))


def test_nnx_subclasses_are_quantized_unless_excluded():
    net = ef.quantize_model(_Net(), "int8")
    assert isinstance(net.a.kernel[...], emulate.QArray)
    np.testing.assert_array_equal(
        np.asarray(emulate.dequantize(net.a.kernel[...])), _int8_values(_Net().a.kernel[...])
    )
    kept = ef.quantize_model(_Net(), ef.Rule(".*", "int8", subclasses=False))
    assert type(kept.a.kernel) is nnx.Param


def test_linen_subclasses_are_quantized_unless_excluded():
    model = _TwoDense()
    variables = model.init(jax.random.key(0), X16)
    qmodel, qvars = ef.quantize_model(model, "int8", variables, X16)
    assert [p for p, _ in qmodel.sites] == ["plain", "mine"]
    assert isinstance(qvars["params"]["mine"]["kernel"], emulate.QArray)
    qmodel, qvars = ef.quantize_model(
        model, ef.Rule(".*", "int8", subclasses=False), variables, X16
    )
    assert [p for p, _ in qmodel.sites] == ["plain"]
    assert not isinstance(qvars["params"]["mine"]["kernel"], emulate.QArray)


def test_a_chosen_layer_that_cannot_be_quantized_is_refused_by_name():
    class WithTranspose(nnx.Module):
        def __init__(self):
            self.up = nnx.ConvTranspose(3, 2, (2,), rngs=nnx.Rngs(0))

    with pytest.raises(
        ValueError,
        match=r"^rules: the layer at 'up' \(ConvTranspose\) has a kernel, but emulate\.flax "
        r"quantizes Linear, LinearGeneral, Einsum, Conv and Embed layers \(and their "
        r"subclasses\) only; leave it float with Rule\('up', None\)",
    ):
        ef.quantize_model(WithTranspose(), "int8")
    net = ef.quantize_model(WithTranspose(), [ef.Rule("up", None), ef.Rule(".*", "int8")])
    assert type(net.up.kernel) is nnx.Param


def test_bare_linen_layer_and_quantizing_again():
    dense = linen.Dense(4)
    variables = dense.init(jax.random.key(1), X16)
    qmodel, qvars = ef.quantize_model(dense, "int8", variables, X16)
    assert [p for p, _ in qmodel.sites] == [""]
    w = _int8_values(variables["params"]["kernel"])
    want = np.asarray(X16, np.float64) @ w + np.asarray(variables["params"]["bias"])
    got = np.asarray(qmodel.apply(qvars, X16), np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=64 * 2.0**-24 * np.abs(want).max())
    # again, with MXFP4 for "plain" only: from the int8 values; "mine" keeps its int8 QArray
    model = _TwoDense()
    first, v1 = ef.quantize_model(model, "int8", model.init(jax.random.key(0), X16), X16)
    again, v2 = ef.quantize_model(model, ef.Rule("plain", "MXFP4"), v1, X16)
    assert v2["params"]["mine"]["kernel"] is v1["params"]["mine"]["kernel"]
    plain = emulate.dequantize(v1["params"]["plain"]["kernel"])
    want_q = emulate.quantize(plain, emulate.mx.MXFP4, axis=0, ragged=True)
    got_q = v2["params"]["plain"]["kernel"]
    assert np.asarray(got_q.scales).tobytes() == np.asarray(want_q.scales).tobytes()
    assert [p for p, _ in again.sites] == ["plain", "mine"]
    assert again.apply(v2, X16).shape == (2, 4)


def test_an_empty_contraction_gives_the_bias():
    lin = nnx.Linear(
        0, 3, kernel_init=nnx.initializers.zeros, bias_init=nnx.initializers.ones, rngs=nnx.Rngs(0)
    )  # flax's default initializer divides by the fan-in
    ef.quantize_model(lin, "int8")
    assert lin.kernel[...].shape == (0, 3)
    assert np.asarray(lin(jnp.ones((2, 0)))).tolist() == [[1.0] * 3] * 2
