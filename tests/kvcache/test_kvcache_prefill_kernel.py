"""emulate.kvcache.prefill_kernel: blocks of queries in Pallas' interpret mode against
softmax attention in float64 over the dequantized cache (within the stated bound), and the
real TPU compiler (compile-only) with Mosaic's compatibility mode on and off."""

from __future__ import annotations

import _compile_only as compile_only
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kv_cases import check, random_cache

import emulate
from emulate import compiler
from emulate.kvcache import FORMATS, KVCache, attention, prefill_kernel
from emulate.kvcache.blocks import Geometry

B = 2


#: (format, head_dim, KV heads, query heads a KV head, queries, capacity, block): by
#: default q8_0 blocks with two heads sharing a window and 70 queries (two query blocks of
#: 64, the second partly past T); every format under EMULATE_LONG_TESTS=1.
_CASES = [("q8_0", 64, 2, 2, 70, 512, 256)]
_LONG = [(n, hd, 1, 4, 20, 512, 256) for n in FORMATS for hd in (64, 128, 256)]


@pytest.mark.parametrize(
    "case", _CASES + [pytest.param(c, marks=pytest.mark.long) for c in _LONG], ids=str
)
def test_the_kernel_is_within_the_bound_of_the_dequantized_cache(case) -> None:
    name, hd, kv, g, t, cap, block = case
    rng = np.random.default_rng(4)
    lengths = [260, 3]  # query t of sequence b sees lengths[b] + t tokens
    cache = random_cache(rng, name, batch=B, kv=kv, head_dim=hd, capacity=cap, lengths=lengths)
    q = rng.standard_normal((B, t, kv * g, hd)).astype(np.float32)
    with emulate.use_route("interpret"):
        got = attention(
            jnp.asarray(q), cache, 0, visible=jnp.asarray(lengths), block=block, target="tpu_v5e"
        )
    assert check(got, q, cache, np.asarray(lengths), 1 / np.sqrt(hd), block) < 1


def compiled_program(xq, k, ks, v, vs, visible, layer, *, name: str, target: str):
    fmt = emulate.kvcache.cache_format(name)
    compute = "float32" if target in ("tpu_v2", "tpu_v3") else "bfloat16"
    g = Geometry(2, 4, 128, fmt.blocks(128))
    return prefill_kernel.prefill(xq, k, ks, v, vs, visible, layer, fmt, g, 512, compute)


def _specs(name: str) -> tuple:
    cache = jax.eval_shape(lambda: KVCache.create(2, 1, 2, 128, 2048, name))
    return (
        jax.ShapeDtypeStruct((1, 512, 2, 4, 128), jnp.float32),
        cache.k, cache.k_scales, cache.v, cache.v_scales,
        jax.ShapeDtypeStruct((1,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32),
    )  # fmt: skip


RUNS = compile_only.runs(
    ("q4_0", "int8", "mxfp4", "bfloat16"), ("tpu_v2", "tpu_v4", "tpu_v5e", "tpu_v7x"), set()
)  # all under EMULATE_LONG_TESTS=1: the decode kernel's test compiles the shared pieces
verdicts = compile_only.fixture("name", compiled_program, _specs)


@pytest.mark.skipif(not compiler.available(), reason="libtpu is not installed")
@pytest.mark.parametrize("name, target", RUNS)
def test_the_tpu_compiler_compiles_it(verdicts, name, target) -> None:
    compile_only.assert_compiles(verdicts, name, target)
