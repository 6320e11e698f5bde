"""emulate.kvcache.attention on the XLA route (the CPU's): random stored caches of every
format against softmax attention in float64 over the dequantized cache, within the stated
bound (emulate.kvcache.bounds); grouped-query heads, a batch of sequences with their own
lengths, blocks of queries, NaN and Inf, a query that sees nothing or one token, long
sequences; the route decision; the argument errors."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kv_cases import check, random_cache
from _sweeps import LONG, examples
from hypothesis import given, settings
from hypothesis import strategies as st

import emulate
from emulate.kvcache import FORMATS, KVCache, attention, attention_route

#: (format, head_dim, KV heads, query heads a KV head, queries T, capacity) by default:
#: each kind of format, head width and grouping at least once; every format and head width
#: under EMULATE_LONG_TESTS=1. Each case compiles one program (2-4 s).
_CASES = [
    ("int8", 64, 2, 4, 1, 512),
    ("q4_0", 128, 1, 2, 1, 768),
    ("mxfp4", 64, 2, 1, 3, 512),
    ("float8_e4m3fn_per_head", 256, 1, 4, 1, 512),
    ("bfloat16", 128, 2, 2, 2, 512),
    ("q8_0", 64, 1, 8, 1, 256),
]
_LONG_CASES = [
    (name, hd, 2, 2, t, 768)
    for name in FORMATS
    for hd in (64, 128, 256)
    for t in (1, 4)
    if (name, hd) not in {(c[0], c[1]) for c in _CASES}
]
BLOCK = 256
B = 2


@functools.cache
def _attend(t: int):
    return jax.jit(
        lambda q, cache, visible: attention(q, cache, 0, visible=visible, block=BLOCK, target="cpu")
    )


def _run(case, data_seed: int, lengths: list[int], special: str | None = None) -> float:
    name, hd, kv, g, t, cap = case
    rng = np.random.default_rng(data_seed)
    cache = random_cache(
        rng, name, batch=B, kv=kv, head_dim=hd, capacity=cap, lengths=lengths, special=special
    )
    q = rng.standard_normal((B, t, kv * g, hd)).astype(np.float32) * 2
    visible = np.asarray(lengths, np.int32)
    got = _attend(t)(jnp.asarray(q), cache, jnp.asarray(visible))
    return check(got, q, cache, visible, 1 / np.sqrt(hd), BLOCK)


@pytest.mark.parametrize(
    "case", _CASES + [pytest.param(c, marks=pytest.mark.long) for c in _LONG_CASES], ids=str
)
@settings(max_examples=examples(3, 30), deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    lengths=st.lists(st.integers(1, 768), min_size=B, max_size=B),
)
def test_attention_is_within_the_bound_of_the_dequantized_cache(case, seed, lengths) -> None:
    cap, t = case[-1], case[-2]
    lengths = [min(n, cap - t + 1) for n in lengths]  # the last query sees the capacity at most
    ratio = _run(case, seed, lengths)
    assert ratio < 1.0


@pytest.mark.parametrize(
    ("case", "special"),
    [
        (("int8", 64, 2, 4, 1, 512), "nan"),  # a NaN scale: the token's whole head
        (("float8_e4m3fn", 64, 2, 4, 1, 512), "nan"),  # a NaN code (e4m3fn's only special)
        (("bfloat16", 128, 2, 2, 2, 512), "nan"),
        (("float8_e5m2_per_head", 64, 2, 4, 1, 512), "nan"),
    ],
    ids=str,
)
def test_a_nan_among_the_visible_keys_makes_its_heads_nan(case, special) -> None:
    _run(case, 7, [300, 40], special)  # token 0 of sequence 0, KV head 0: NaN there only


def test_an_infinite_score_gives_nan_as_ieee_does() -> None:
    # the bfloat16 case's shapes (its compiled program, not the eager ops: 10 s)
    rng = np.random.default_rng(3)
    cache = random_cache(rng, "bfloat16", batch=B, kv=2, head_dim=128, capacity=512, lengths=[9, 9])
    k = cache.k.at[0, 0, 4, 0].set(jnp.inf)  # KV head 0 of token 4, sequence 0
    cache = KVCache(k, cache.v, None, None, cache.lengths, cache.format, 128)
    q = jnp.ones((B, 2, 4, 128), jnp.float32)
    got = np.asarray(_attend(2)(q, cache, cache.lengths))
    assert np.isnan(got[0, :, :2]).all() and np.isfinite(got[0, :, 2:]).all()
    assert np.isfinite(got[1]).all()


def test_a_query_that_sees_nothing_gives_zero_and_one_token_gives_its_value() -> None:
    case = ("q4_0", 128, 1, 2, 1, 256)
    rng = np.random.default_rng(5)
    cache = random_cache(rng, "q4_0", batch=B, kv=1, head_dim=128, capacity=256, lengths=[0, 1])
    q = jnp.asarray(rng.standard_normal((B, 1, 2, 128)), jnp.float32)
    got = np.asarray(_attend(1)(q, cache, cache.lengths))
    np.testing.assert_array_equal(got[0], 0.0)
    assert check(got, np.asarray(q), cache, np.array([0, 1]), 1 / np.sqrt(128), BLOCK) < 1
    del case


@pytest.mark.skipif(not LONG, reason="the long sequence runs under EMULATE_LONG_TESTS=1")
@pytest.mark.long
def test_a_long_sequence_stays_within_the_bound() -> None:
    assert _run(("q4_0", 128, 2, 4, 1, 8192), 11, [8000, 3000]) < 1


def test_the_route_is_the_kernel_on_a_tpu_and_xla_elsewhere() -> None:
    cache = jax.eval_shape(lambda: KVCache.create(2, 1, 1, 128, 4096, "q4_0"))
    q = jax.ShapeDtypeStruct((1, 1, 4, 128), jnp.bfloat16)
    r = attention_route(q, cache, 1, target="tpu_v2")
    assert r.kernel and r.label() == "kvcache.attention"
    r = attention_route(q, cache, 1, target="cpu")
    assert not r.kernel and r.reason == "target cpu is not a TPU"
    rows = emulate.inspect(lambda q, c: attention(q, c, 1), q, cache, target="tpu_v5e").rows
    assert [(r.primitive, r.rhs, r.weight_route) for r in rows] == [
        ("attention", "int4[2,1,4096,1,128]:kvcache(q4_0)", "kvcache.attention")
    ]
    with emulate.use_route("xla"):
        assert not attention_route(q, cache, 1, target="tpu_v5e").kernel
    small = KVCache.create(2, 1, 8, 128, 256, "int8")
    with emulate.use_route("kernel"), pytest.raises(ValueError, match="target: route 'kernel'"):
        attention(jnp.ones((1, 1, 32, 128)), small, 0, target="cpu")


@pytest.mark.parametrize(
    ("q_shape", "layer", "kw", "error", "message"),
    [
        ((2, 1, 5, 64), 0, {}, ValueError, r"q: shape \(2, 1, 5, 64\) does not fit the cache"),
        ((2, 1, 4, 32), 0, {}, ValueError, "does not fit the cache"),
        ((2, 1, 4), 0, {}, ValueError, "q: expected .batch, tokens, heads, head_dim."),
        ((2, 1, 4, 64), 3, {}, ValueError, "layer: 3 is not a layer of the cache's 1"),
        ((2, 1, 4, 64), 0.5, {}, TypeError, "layer: expected an int"),
        ((2, 1, 4, 64), 0, {"block": 100}, ValueError, "block: expected a multiple of 256"),
    ],
)
def test_attention_names_the_bad_argument(q_shape, layer, kw, error, message) -> None:
    cache = KVCache.create(1, 2, 2, 64, 256, "int8")
    with pytest.raises(error, match=message):
        attention(jnp.ones(q_shape), cache, layer, target="cpu", **kw)
