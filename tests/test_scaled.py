"""Matmuls on QArrays, scaled_matmul and the polyfill of jax.nn.scaled_matmul, against the
exact sum of the dequantized values (emulate.reference) and the fast-mode bound."""

from __future__ import annotations

import functools
import importlib.util
import math
import pathlib
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _sweeps import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import emulate
from emulate import bounds, mx, program, reference

TARGETS = ["cpu", "tpu_v5e", "tpu_v4"]


def _exact(a: np.ndarray, b: np.ndarray, dn) -> np.ndarray:
    return np.vectorize(float)(reference.exact_dot_general(a, b, dn))


def _assert_within(got, a, b, dn, terms: int):
    """|got - exact(a . b)| <= gamma_terms * sum|a*b| + K * 2**-125 elementwise; the
    contract's ``terms`` is K + segments + 4 (docs/quantized.md)."""
    (lc, _), _ = dn
    k = math.prod(a.shape[d] for d in lc)
    want = _exact(a, b, dn)
    subs = bounds.einsum_subscripts(a.ndim, b.ndim, dn)
    mag = np.einsum(subs, np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)))
    bound = bounds.gamma(terms) * mag + k * bounds.UNDERFLOW_PER_TERM
    err = np.abs(np.asarray(got, np.float64) - want)
    assert np.all(err <= bound), f"max excess {np.max(err - bound)}"


def _deq(q) -> np.ndarray:
    return np.asarray(emulate.dequantize(q, to=jnp.float32))


def _weights(scheme, k: int, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((k, n)) * np.exp2(rng.integers(-3, 3, (k, 1)))
    return w.astype(np.float32)


#: Each preset on one target by default, the targets taken in turn (MXINT8 on tpu_v5e's
#: native int8, the float8 presets on tpu_v4's emulated float8; each target meets
#: int, float8, 4-bit and per-channel presets); every preset on every target under
#: EMULATE_LONG_TESTS=1. NVFP4 is long on every target here: bf16 activations times
#: NVFP4 within the same bound run by default in
#: test_f32_values_contract_at_full_f32_precision[NVFP4-cpu] and [NVFP4-tpu_v5e].
#: MXFP8_E5M2 and MXFP6_E3M2 are long too: the route of MXFP8_E4M3 and MXFP6_E2M3 (e8m0
#: scales in blocks of 32 along K) with another element format, whose decode
#: tests/numerics checks.
SAME_ROUTE = (mx.NVFP4, mx.MXFP8_E5M2, mx.MXFP6_E3M2)
PRESET_CASES = [
    pytest.param(
        scheme,
        target,
        id=f"{scheme.name}-{target}",
        marks=()
        if TARGETS[(i + 2) % len(TARGETS)] == target and scheme not in SAME_ROUTE
        else pytest.mark.long,
    )
    for i, scheme in enumerate(mx.SCHEMES.values())
    for target in TARGETS
]


@pytest.mark.parametrize(("scheme", "target"), PRESET_CASES)
def test_bf16_activations_times_each_preset(scheme, target):
    k = 256
    # the contraction axis K (0) holds the blocks, or is the one block of a per-channel scheme
    axis = (0, 1) if scheme.block is not None and len(scheme.block) == 2 else 0
    wq = emulate.quantize(_weights(scheme, k, 128), scheme, axis=axis)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((3, k)), jnp.bfloat16)
    got = emulate.matmul(x, wq, target=target)
    assert got.dtype == jnp.float32 and got.shape == (3, 128)
    dn = (((1,), (0,)), ((), ()))
    g = wq.block_shape[0]
    _assert_within(got, np.asarray(x, np.float32), _deq(wq), dn, terms=k + k // g + 4)


@pytest.mark.parametrize("target", TARGETS)
def test_both_operands_scaled_transposed_layout_mixed_blocks(target):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((5, 96)).astype(np.float32)
    b = rng.standard_normal((7, 96)).astype(np.float32)
    qa = emulate.quantize(a, "float4_e2m1fn", block_shape=16, axis=1)  # blocks of 16
    qb = emulate.quantize(b, mx.MXFP4, axis=1)  # blocks of 32: segments of 16
    dn = (((1,), (1,)), ((), ()))
    got = emulate.dot_general(qa, qb, dn, target=target)
    _assert_within(got, _deq(qa), _deq(qb), dn, terms=96 + 6 + 4)


def test_batched_einsum_and_3d_matmul():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 64, 24)).astype(np.float32)
    wq = emulate.quantize(w, mx.MXFP8_E4M3, axis=1)
    x = jnp.asarray(rng.standard_normal((4, 6, 64)), jnp.bfloat16)
    got = emulate.einsum("bmk,bkn->bmn", x, wq, target="tpu_v4")
    dn = (((2,), (1,)), ((0,), (0,)))
    _assert_within(got, np.asarray(x, np.float32), _deq(wq), dn, terms=64 + 2 + 4)
    w2 = emulate.quantize(w[0], mx.MXFP8_E4M3, axis=0)
    got = x @ w2  # (4, 6, 64) @ QArray (64, 24): one dot_general, no broadcast copy
    assert got.shape == (4, 6, 24)
    _assert_within(got, np.asarray(x, np.float32), _deq(w2), (((2,), (0,)), ((), ())), 64 + 2 + 4)


def test_per_channel_int8_scales_apply_once_to_the_accumulator():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((512, 16)).astype(np.float32)
    wq = emulate.quantize(w, "int8", axis=0, scale_fmt="float32", scale_rule="absmax")
    assert wq.block_shape == (512, 1)
    x = rng.standard_normal((2, 512)).astype(np.float32)
    xq = emulate.quantize(x, "int8", axis=1, scale_fmt="float32", scale_rule="absmax")
    got = emulate.matmul(xq, wq, target="tpu_v5e")
    # int8 x int8 over all of K is exact in int32 and the scales apply once: far inside
    # the contract's gamma_(K + 5); check the tighter gamma_5 this route gives
    _assert_within(got, _deq(xq), _deq(wq), (((1,), (0,)), ((), ())), terms=1 + 4)


def test_nan_scale_poisons_its_outputs_only():
    w = np.ones((64, 4), np.float32)
    w[3, 1] = np.nan
    wq = emulate.quantize(w, mx.MXFP8_E4M3, axis=0)
    got = np.asarray(emulate.matmul(np.ones((2, 64), np.float32), wq))
    assert np.isnan(got[:, 1]).all() and (got[:, [0, 2, 3]] == 64.0).all()


def test_e8m0_smallest_scale_is_not_flushed():
    # scale 2**-127 is an f32 subnormal; the block sum times it is a normal number
    w = np.zeros((32, 1), np.float32)
    w[:, 0] = 2.0**-126
    wq = emulate.quantize(w, mx.MXFP4, axis=0)
    assert np.asarray(wq.scales, np.float32).item() == 2.0**-127  # floor(-126) - 2 clamps
    got = emulate.matmul(np.ones((1, 32), np.float32), wq)
    assert float(got[0, 0]) == 32 * 2.0**-126


def _jax_scaled_operands():
    rng = np.random.default_rng(5)
    a = jnp.asarray(rng.standard_normal((2, 8, 64)), jnp.float8_e4m3fn)
    b = jnp.asarray(rng.standard_normal((2, 4, 64)), jnp.float8_e5m2)
    sa = jnp.asarray(np.exp2(rng.integers(-4, 4, (2, 8, 2))), jnp.float8_e8m0fnu)
    sb = jnp.asarray(np.exp2(rng.integers(-4, 4, (2, 4, 2))), jnp.float8_e8m0fnu)
    return a, b, sa, sb


def test_scaled_matmul_follows_jax_definition_and_polyfill_agrees():
    a, b, sa, sb = _jax_scaled_operands()
    got = emulate.scaled_matmul(a, b, sa, sb, target="tpu_v5e")
    assert got.shape == (2, 8, 4) and got.dtype == jnp.float32
    # jax.nn.scaled_matmul's documented meaning: repeat the scales over blocks, contract K
    av = np.asarray(a, np.float32) * np.repeat(np.asarray(sa, np.float32), 32, axis=-1)
    bv = np.asarray(b, np.float32) * np.repeat(np.asarray(sb, np.float32), 32, axis=-1)
    _assert_within(got, av, bv, (((2,), (2,)), ((0,), (0,))), terms=32 + 2 + 4)
    poly = emulate.polyfill(jax.nn.scaled_matmul, target="tpu_v5e")(a, b, sa, sb)
    np.testing.assert_array_equal(np.asarray(poly), np.asarray(got))


def test_jax_scaled_matmul_agrees_where_a_backend_lowers_it():
    a, b, sa, sb = _jax_scaled_operands()
    try:
        theirs = jax.jit(jax.nn.scaled_matmul).lower(a, b, sa, sb).compile()(a, b, sa, sb)
    except NotImplementedError as e:  # CPU and TPU: JAX lowers it for CUDA and ROCm only
        assert "MLIR translation rule for primitive 'scaled_matmul' not found" in str(e)
        return
    ours = emulate.scaled_matmul(a, b, sa, sb)
    av = np.asarray(a, np.float32) * np.repeat(np.asarray(sa, np.float32), 32, axis=-1)
    bv = np.asarray(b, np.float32) * np.repeat(np.asarray(sb, np.float32), 32, axis=-1)
    dn = (((2,), (2,)), ((0,), (0,)))
    _assert_within(theirs, av, bv, dn, terms=64 + 4)
    _assert_within(ours, av, bv, dn, terms=64 + 4)


def test_polyfill_runs_jax_scaled_dot_general_mxfp8():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 16, 64)).astype(np.float32)
    y = rng.standard_normal((1, 8, 64)).astype(np.float32)
    cfg = [jax.nn.get_scaled_dot_general_config("mxfp8")] * 3
    dn = (((2,), (2,)), ((0,), (0,)))
    fn = emulate.polyfill(lambda u, v: jax.nn.scaled_dot_general(u, v, dn, configs=cfg))
    got = fn(x, y)
    assert got.shape == (1, 16, 8)
    assert program.unsupported_sites(fn, x, y) == []
    np.testing.assert_array_equal(
        np.asarray(emulate.scaled_dot_general(x, y, dn, configs=cfg)), np.asarray(got)
    )
    # mxfp8 keeps ~3 significant bits per operand: within 2**-3 relative of the f32 product
    want = np.einsum("bmk,bnk->bmn", x.astype(np.float64), y.astype(np.float64))
    scale = np.einsum("bmk,bnk->bmn", np.abs(x), np.abs(y))
    assert np.all(np.abs(np.asarray(got) - want) <= 2.0**-3 * scale)


_MOE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "moe_mxfp4.py"
_spec = importlib.util.spec_from_file_location("moe_mxfp4", _MOE)
moe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(moe)


# tpu_v4 by default (emulated float8, no native int8: the narrowest plans), tpu_v5e too
# under EMULATE_LONG_TESTS=1
@pytest.mark.parametrize("target", ["tpu_v4", pytest.param("tpu_v5e", marks=pytest.mark.long)])
def test_moe_mxfp4_through_polyfill_uses_native_pairs_only(target):
    params = moe.quantize(moe.init(jax.random.key(0), d_model=64, d_ff=32, experts=4))
    x = jax.random.normal(jax.random.key(1), (8, 64)).astype(jnp.bfloat16)
    run = emulate.polyfill(moe.forward, target=target)
    assert program.unsupported_sites(run, params, x, target=target) == []
    pairs = {(s.lhs_dtype, s.rhs_dtype) for s in program.sites(jax.make_jaxpr(run)(params, x))}
    assert pairs <= {("bfloat16", "bfloat16"), ("float32", "float32")}
    got = np.asarray(run(params, x), np.float64)
    want = moe.dense_reference(params, np.asarray(x))
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


#: Each scheme on the CPU and on one TPU plan by default (NVFP4 on tpu_v5e, INT4_G128 on
#: tpu_v4); both on every target under EMULATE_LONG_TESTS=1.
F32_CASES = [
    pytest.param(
        scheme,
        target,
        id=f"{scheme.name}-{target}",
        marks=()
        if target in ("cpu", {"NVFP4": "tpu_v5e", "INT4_G128": "tpu_v4"}[scheme.name])
        else pytest.mark.long,
    )
    for scheme in (mx.NVFP4, mx.INT4_G128)
    for target in TARGETS
]


@pytest.mark.parametrize(("scheme", "target"), F32_CASES)
def test_f32_values_contract_at_full_f32_precision(scheme, target):
    # Values that bf16 cannot hold (e4m3 or f16 scales) reach the dot as f32 with
    # Precision.HIGHEST: a TPU's default precision would round them to bf16 first.
    wq = emulate.quantize(_weights(scheme, 256, 8), scheme, axis=0)
    x = jnp.asarray(np.random.default_rng(2).standard_normal((3, 256)), jnp.bfloat16)
    jaxpr = jax.make_jaxpr(lambda x, w: emulate.matmul(x, w, target=target))(x, wq)
    dots = [e for e in program.walk(jaxpr.jaxpr) if e.primitive.name == "dot_general"]
    f32 = [e for e in dots if any(v.aval.dtype == jnp.float32 for v in e.invars)]
    # f32 dots where the route dequantizes (the CPU: one a plane of the tiled route,
    # emulate.engine.qtiled, and the untiled program for other platforms); on a TPU both
    # contract their codes segment by segment (NVFP4's 16-element segments too), with no
    # f32 dot at all.
    assert (len(f32) >= 1) if target == "cpu" else (len(f32) == 0)
    for e in f32:
        assert [v.aval.dtype for v in e.invars] == [jnp.float32, jnp.float32]
        assert e.params["precision"] in (
            (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST),
            jax.lax.Precision.HIGHEST,
        )
    got = emulate.matmul(x, wq, target=target)
    dn = (((1,), (0,)), ((), ()))
    _assert_within(got, np.asarray(x, np.float32), _deq(wq), dn, terms=256 + 256 // 16 + 4)


def test_bad_input_messages():
    wq = emulate.quantize(np.ones((64, 8), np.float32), mx.MXFP4, axis=0)
    w3 = emulate.quantize(np.ones((2, 64, 8), np.float32), mx.MXFP4, axis=1)
    with pytest.raises(ValueError, match=re.escape("a, b: matmul of a QArray needs equal")):
        emulate.matmul(np.ones((5, 3, 64), np.float32), w3)
    with pytest.raises(ValueError, match=re.escape("lhs_scales: expected shape (2, 8, K_s)")):
        emulate.scaled_matmul(
            jnp.zeros((2, 8, 64), jnp.float8_e4m3fn),
            jnp.zeros((2, 4, 64), jnp.float8_e4m3fn),
            jnp.ones((2, 8, 3), jnp.float8_e8m0fnu),
            jnp.ones((2, 4, 2), jnp.float8_e8m0fnu),
        )
    # matmul's shape rule and jnp.matmul's exception type, as for plain operands
    with pytest.raises(
        TypeError, match=re.escape("a, b: matmul contracts a's last dimension (32) with b's")
    ):
        emulate.matmul(np.ones((2, 32), np.float32), wq)
    msg = "a_format: a QArray carries its format (float4_e2m1fn); pass a_format only with"
    with pytest.raises(ValueError, match=re.escape(msg)):
        emulate.matmul(wq, np.ones((8, 2), np.float32), a_format="float4_e2m1fn")
    with pytest.raises(ValueError, match=re.escape("operand_formats: expected one format")):
        emulate.einsum("ij,jk->ik", np.ones((2, 64), np.float32), wq, operand_formats=[None])


# Mode "fast" by default: the codes-and-format arguments are read before the mode is
# looked at; mode "exact" (the same arguments into the sliced sum) under
# EMULATE_LONG_TESTS=1.
@pytest.mark.parametrize("mode", ["fast", pytest.param("exact", marks=pytest.mark.long)])
def test_uint8_codes_with_their_format_beside_a_qarray(mode):
    # The other operand as raw codes plus rhs_format / lhs_format / operand_formats gives
    # the bits of the same operand passed in its own dtype.
    xq = emulate.quantize(np.random.default_rng(3).standard_normal((3, 64)), mx.MXFP8_E4M3)
    w = np.random.default_rng(4).standard_normal((64, 5)).astype(ml_dtypes.float8_e4m3fn)
    dn = (((1,), (0,)), ((), ()))
    want = np.asarray(emulate.dot_general(xq, w, dn, mode=mode))
    codes = w.view(np.uint8)
    f = "float8_e4m3fn"
    for got in (
        emulate.dot_general(xq, codes, dn, rhs_format=f, mode=mode),
        emulate.matmul(xq, codes, b_format=f, mode=mode),
        emulate.einsum("ik,kj->ij", xq, codes, operand_formats=[None, f], mode=mode),
        emulate.dot_general(codes.T, xq, (((1,), (1,)), ((), ())), lhs_format=f, mode=mode).T,
    ):
        assert np.array_equal(np.asarray(got), want)
    _assert_within(want, _deq(xq), w.astype(np.float32), dn, terms=64 + 2 + 4)


# --------------------------------------------------------------------------- mode "exact"

_E8M0 = ml_dtypes.float8_e8m0fnu


def _from_parts(codes: np.ndarray, exps: np.ndarray, block, fmt: str):
    scales = jnp.asarray(np.ldexp(1.0, exps).astype(_E8M0))
    values = codes.astype(emulate.formats.get(fmt).dtype)
    if fmt.startswith("float6"):  # XLA cannot hold float6: uint8 codes and the format
        return emulate.QArray.from_parts(values.view(np.uint8), scales, block_shape=block, fmt=fmt)
    return emulate.QArray.from_parts(jnp.asarray(values), scales, block_shape=block)


def _values(q) -> np.ndarray:
    c = np.asarray(q.unpacked_codes())
    if q.format_name.startswith("float6"):
        c = c.astype(np.uint8).view(q.format.dtype)
    return reference.dequantize(c, np.asarray(q.scales), q.block_shape)


def _oracle(qa, qb, dn, out):
    return reference.dot_general(_values(qa), _values(qb), dn, preferred_element_type=out)


def _same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype
    view = {2: np.uint16, 4: np.uint32}[got.dtype.itemsize]
    np.testing.assert_array_equal(got.view(view), want.view(view))


_EXACT_PAIRS = [
    ("float4_e2m1fn", "float4_e2m1fn", 32, 32),
    ("float4_e2m1fn", "float4_e2m1fn", 16, 32),  # segments of 16
    ("int8", "int8", 32, 32),
    ("float6_e2m3fn", "float4_e2m1fn", 32, 16),
]


# Every pair into float32; bfloat16 results (the same sum, one more rounding) for the
# segments of 16 by default, for every pair under EMULATE_LONG_TESTS=1.
@pytest.mark.parametrize(
    "pair,out",
    [
        pytest.param(pair, out, marks=pytest.mark.long)
        if out == "bfloat16" and pair[2:] != (16, 32)
        else (pair, out)
        for pair in _EXACT_PAIRS
        for out in ("float32", "bfloat16")
    ],
    ids=[f"{p[0]}x{p[1]}-{p[2]}-{p[3]}-{o}" for p in _EXACT_PAIRS for o in ("float32", "bfloat16")],
)
@settings(max_examples=examples(3, 12))  # 3 by default, 12 under EMULATE_LONG_TESTS=1
@given(data=st.data())
def test_exact_matches_the_oracle_bit_for_bit(pair, out, data):
    fa, fb, ba, bb = pair
    k = 96
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    codes_a = data.draw(_codes(fa, (3, k)))
    codes_b = data.draw(_codes(fb, (k, 4)))
    span = data.draw(st.sampled_from([0, 6, 40]))
    ea = rng.integers(-span, span + 1, (3, k // ba))
    eb = rng.integers(-span, span + 1, (k // bb, 4))
    if data.draw(st.booleans()):  # cancellation: block 1 undoes block 0, block 2 is tiny
        codes_a[:, 32:64] = _negate(codes_a[:, :32], fa)
        ea[:, 32 // ba : 64 // ba] = ea[:, : 32 // ba]
        codes_b[32:64] = codes_b[:32]
        eb[32 // bb : 64 // bb] = eb[: 32 // bb]
        ea[:, 64 // ba :] -= 50
    qa = _from_parts(codes_a, ea, (1, ba), fa)
    qb = _from_parts(codes_b, eb, (bb, 1), fb)
    dn = (((1,), (0,)), ((), ()))
    got = emulate.dot_general(qa, qb, dn, preferred_element_type=out, mode="exact")
    _same_bits(got, _oracle(qa, qb, dn, out))


def _codes(fmt: str, shape):
    f = emulate.formats.get(fmt)
    values = [float(v) for v in np.arange(256, dtype=np.uint8).view(f.dtype)[: 1 << f.bits]]
    values = [v for v in values if np.isfinite(v)] if f.is_float else list(range(-128, 128))
    return st.lists(
        st.sampled_from(values), min_size=math.prod(shape), max_size=math.prod(shape)
    ).map(lambda v: np.asarray(v, np.float64).reshape(shape))


def _negate(codes: np.ndarray, fmt: str) -> np.ndarray:
    return np.maximum(-codes, -127) if fmt == "int8" else -codes


def test_exact_breaks_a_tie_that_fast_rounds_away():
    # 2**24 + 1 is halfway between two f32 values: ties-to-even gives 2**24; a term of
    # 2**-50 three blocks away makes it round up to 2**24 + 2, which only an exact sum sees.
    # In the shapes of test_exact_matches_the_oracle_bit_for_bit (3 x 96 times 96 x 4, in
    # blocks of 32), so that its program of mode "exact" runs this one; element [0, 0].
    k = 96
    a = np.zeros((3, k))
    b = np.zeros((k, 4))
    a[0, 0], b[0, 0] = 4.0, 1.0  # 4 * 2**22 = 2**24
    a[0, 32], b[32, 0] = 0.5, 2.0  # 1
    a[0, 64], b[64, 0] = 0.5, 0.5  # 0.25 * 2**-48
    ea = np.zeros((3, 3), int)
    ea[0] = [22, 0, -48]
    qa = _from_parts(a, ea, (1, 32), "float4_e2m1fn")
    qb = _from_parts(b, np.zeros((3, 4), int), (32, 1), "float4_e2m1fn")
    exact = emulate.matmul(qa, qb, mode="exact")
    assert float(exact[0, 0]) == 2.0**24 + 2
    fast = emulate.matmul(qa, qb, mode="fast")
    assert float(fast[0, 0]) == 2.0**24


# Long: by default test_exact_matches_the_oracle_bit_for_bit gives the oracle's bits with
# segments of 32 and of 16 (so the same bits for either) on 3-row batches.
@pytest.mark.long
def test_exact_is_the_same_for_any_segment_length_and_batch():
    rng = np.random.default_rng(9)
    codes = rng.choice(np.arange(-6, 7) / 2.0, (4, 64))
    codes = np.asarray(codes.astype(ml_dtypes.float4_e2m1fn), np.float64)
    e = rng.integers(-30, 30, (4, 2))
    q32 = _from_parts(codes, e, (1, 32), "float4_e2m1fn")
    q16 = _from_parts(codes, np.repeat(e, 2, axis=1), (1, 16), "float4_e2m1fn")
    w = _from_parts(codes.T.copy(), rng.integers(-30, 30, (2, 4)), (32, 1), "float4_e2m1fn")
    full = np.asarray(emulate.matmul(q32, w, mode="exact"))
    _same_bits(emulate.matmul(q16, w, mode="exact"), full)
    row = _from_parts(codes[2:3], e[2:3], (1, 32), "float4_e2m1fn")
    _same_bits(emulate.matmul(row, w, mode="exact"), full[2:3])


def test_exact_per_channel_int8_splits_long_contractions():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((2, 4096)).astype(np.float32)
    w = rng.standard_normal((4096, 3)).astype(np.float32)
    kw = dict(scale_fmt="float8_e8m0fnu", scale_rule="round_up")
    xq = emulate.quantize(x, "int8", axis=1, **kw)  # one scale per row
    wq = emulate.quantize(w, "int8", axis=0, **kw)  # one scale per column
    dn = (((1,), (0,)), ((), ()))
    got = emulate.dot_general(xq, wq, dn, mode="exact")  # 4096 * 127**2 > 2**24: 4 segments
    _same_bits(got, _oracle(xq, wq, dn, "float32"))


@pytest.mark.parametrize("scheme", [mx.NVFP4, mx.MXFP8_E5M2, mx.INT4_G128], ids=lambda s: s.name)
def test_exact_on_any_scheme_and_bf16_activations(scheme):
    rng = np.random.default_rng(12)
    w = (rng.standard_normal((128, 6)) * np.exp2(rng.integers(-8, 8, (128, 6)))).astype(np.float32)
    q = emulate.quantize(w, scheme, axis=0)
    x = jnp.asarray(rng.standard_normal((3, 128)), jnp.bfloat16)
    dn = (((1,), (0,)), ((), ()))
    got = emulate.dot_general(x, q, dn, mode="exact")
    want = reference.dot_general(np.asarray(x), _deq(q), dn, preferred_element_type="float32")
    _same_bits(got, want)


# Mode "fast" by default; mode "exact" under EMULATE_LONG_TESTS=1: a QArray x QArray
# program of mode "exact" takes some 5 s to build and its batched form 10 s more (the
# unbatched program's bits: test_exact_matches_the_oracle_bit_for_bit by default).
@pytest.mark.parametrize("mode", ["fast", pytest.param("exact", marks=pytest.mark.long)])
def test_vmap_over_stacked_qarrays_gives_the_same_bits(mode):
    rng = np.random.default_rng(11)
    ws = [
        emulate.quantize(rng.standard_normal((64, 8)).astype(np.float32), mx.MXFP4, axis=0)
        for _ in range(3)
    ]
    stacked = jax.tree_util.tree_map(lambda *v: jnp.stack(v), *ws)
    xq = emulate.quantize(rng.standard_normal((2, 64)).astype(np.float32), mx.MXFP4, axis=1)
    got = jax.vmap(lambda q: emulate.matmul(xq, q, mode=mode))(stacked)
    _same_bits(got, np.stack([np.asarray(emulate.matmul(xq, w, mode=mode)) for w in ws]))


# --- one result-type rule for QArrays and dense weights (issue 40) -------------------------

# The QArray dtypes the importers give (float16: AWQ, GPTQ; bfloat16: compressed-tensors,
# FP8, NVFP4, bnb; float32) and the activations beside them.
_WEIGHT_DTYPES = ["float16", "bfloat16", "float32"]
_X_DTYPES = ["bfloat16", "float16", "float32", "int8", "float8_e4m3fn"]


def _int4_weight(dtype: str, shape=(32, 8)) -> emulate.QArray:
    codes = (np.arange(math.prod(shape)) % 16 - 8).astype(ml_dtypes.int4).reshape(shape)
    scales = np.full((1,) + shape[1:], 0.5, np.dtype(getattr(ml_dtypes, dtype, dtype)))
    return emulate.QArray.from_parts(
        codes, scales, block_shape=(shape[0],) + (1,) * (len(shape) - 1), dtype=dtype
    )


def _type_of(fn, *a):
    """The result type of ``fn(*a)`` (traced only), or the exception type JAX raises."""
    try:
        return np.dtype(jax.eval_shape(fn, *a).dtype).name
    except (TypeError, ValueError) as e:
        return type(e).__name__


@pytest.mark.parametrize("wd", _WEIGHT_DTYPES)
@pytest.mark.parametrize("xd", _X_DTYPES)
def test_a_qarray_gives_the_result_type_of_its_dense_weight(xd, wd):
    """Every front end gives for a QArray what its JAX counterpart gives for the dense
    weight of the QArray's dtype: lax.dot_general's rule for dot_general (bfloat16 x
    float16 is bfloat16), jnp's for matmul, einsum and ``@`` (float32), and where jnp has
    no rule (float8 beside a wide float) lax.dot_general's."""
    q = _int4_weight(wd)
    w = jnp.asarray(q.dequantize(wd))
    x = jnp.ones((4, 32), jnp.dtype(getattr(ml_dtypes, xd, xd)))
    dn = (((1,), (0,)), ((), ()))
    lax_type = _type_of(lambda x, w: jax.lax.dot_general(x, w, dn), x, w)
    jnp_type = _type_of(jnp.matmul, x, w)
    if jnp_type.endswith("Error"):  # no implicit promotion (TypePromotionError): lax rule
        jnp_type = lax_type
    assert _type_of(lambda x: emulate.dot_general(x, q, dn), x) == lax_type
    assert _type_of(lambda x: emulate.matmul(x, q), x) == jnp_type
    assert _type_of(lambda x: emulate.einsum("mk,kn->mn", x, q), x) == jnp_type
    assert _type_of(lambda x: x @ q, x) == jnp_type
    assert _type_of(lambda x: emulate.matmul(q.T, x.T), x) == jnp_type
    if xd in ("bfloat16", "float16", "float32"):  # pallas.matmul: weight-only or wide x
        kernel = functools.partial(emulate.pallas.matmul, target="tpu_v5e", interpret=True)
        assert _type_of(kernel, x, q) == jnp_type
        # conv: lax takes one dtype, so both are promoted to jnp's type first (as flax)
        img, ker = x.reshape(1, 4, 32), _int4_weight(wd, (1, 32, 8))
        conv = functools.partial(
            emulate.conv_general_dilated,
            window_strides=(1,),
            padding="VALID",
            dimension_numbers=("NWC", "WIO", "NWC"),
        )
        assert _type_of(conv, img, ker) == np.dtype(jnp.promote_types(x.dtype, wd)).name


def test_bf16_activations_times_an_f16_qarray_keep_the_f32_sum():
    """The case of issue 40: bf16 x an f16 QArray is float32 (jnp.matmul's type for the
    dense f16 weight), not a bfloat16 rounding of the sum."""
    q = _int4_weight("float16")
    x = jnp.asarray(np.linspace(-1, 1, 4 * 32), jnp.bfloat16).reshape(4, 32)
    got = emulate.matmul(x, q)
    want = jnp.matmul(x, q.dequantize("float16"), precision="highest")
    assert got.dtype == want.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
