"""emulate.kvcache.decode_kernel: the decode kernel in Pallas' interpret mode against
softmax attention in float64 over the dequantized cache (within the stated bound), its
HBM traffic (each stored byte read once: blocks past a sequence's length never copied),
and the real TPU compiler (compile-only) with Mosaic's compatibility mode on and off."""

from __future__ import annotations

import _compile_only as compile_only
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kv_cases import check, random_cache

import emulate
from benchmarks.pallas_traffic import kernel_traffic
from emulate import compiler
from emulate.kvcache import FORMATS, KVCache, attention, decode_kernel
from emulate.kvcache.blocks import Geometry

B = 2


def _interpret(case, lengths, special=None, seed=0) -> float:
    name, hd, kv, g, cap, block = case
    rng = np.random.default_rng(seed)
    cache = random_cache(
        rng, name, batch=B, kv=kv, head_dim=hd, capacity=cap, lengths=lengths, special=special
    )
    q = rng.standard_normal((B, 1, kv * g, hd)).astype(np.float32) * 2
    visible = jnp.asarray(lengths, jnp.int32)
    with emulate.use_route("interpret"):
        got = attention(jnp.asarray(q), cache, 0, visible=visible, block=block, target="tpu_v5e")
    return check(got, q, cache, np.asarray(lengths), 1 / np.sqrt(hd), block)


#: (format, head_dim, KV heads, query heads a KV head, capacity, block): by default two
#: heads sharing a 128-lane window with 4-bit blocks, and one head a window in int8
#: (interpret mode: 5-15 s each); every format and head width under EMULATE_LONG_TESTS=1.
_CASES = [("q4_0", 64, 2, 4, 512, 256), ("int8", 128, 1, 2, 512, 256)]
_LONG = [(n, hd, 2, 2, 512, 256) for n in FORMATS for hd in (64, 128, 256)]


@pytest.mark.parametrize(
    "case", _CASES + [pytest.param(c, marks=pytest.mark.long) for c in _LONG], ids=str
)
def test_the_kernel_is_within_the_bound_of_the_dequantized_cache(case) -> None:
    # sequence 0 ends inside its second block, sequence 1 inside its first: the blocks
    # past each length hold random codes the kernel must not read
    assert _interpret(case, [300, 17]) < 1


def test_a_nan_scale_among_the_visible_tokens_makes_its_heads_nan() -> None:
    _interpret(_CASES[1], [40, 1], special="nan")  # the int8 case's program: no new compile


def test_a_sequence_that_sees_nothing_gives_zero() -> None:
    assert _interpret(("q4_0", 64, 2, 4, 512, 256), [0, 300]) < 1


def _specs_of(name: str, batch: int, kv: int, g: int, hd: int, cap: int) -> tuple:
    cache = jax.eval_shape(lambda: KVCache.create(2, batch, kv, hd, cap, name))
    return jax.ShapeDtypeStruct((batch, 1, kv * g, hd), jnp.bfloat16), cache


#: q4_0 by default (packed codes and block scales); the others under EMULATE_LONG_TESTS=1
@pytest.mark.parametrize(
    "name", ["q4_0", *(pytest.param(n, marks=pytest.mark.long) for n in ("int8", "bfloat16"))]
)
def test_the_kernel_reads_each_stored_byte_once(name) -> None:
    batch, kv, g, hd, cap = 2, 8, 4, 128, 4096
    q, cache = _specs_of(name, batch, kv, g, hd, cap)

    def fn(q, cache):
        with emulate.use_route("kernel"):
            return attention(q, cache, 1, target="tpu_v5e")

    # sequence 1 half full: its blocks past the length are not read (one count:
    # each traces the kernel and evaluates its index maps, 6 s)
    seen = np.array([cap, cap // 2], np.int32)
    got = kernel_traffic(fn, (q, cache), "tpu_v5e", prefetch=lambda eqn: (seen, np.array([1])))
    stored = (
        sum(
            a.size * a.dtype.itemsize
            for a in (cache.k, cache.v, cache.k_scales, cache.v_scales)
            if a is not None
        )
        // 2
    )  # one layer of two
    visible = stored * 3 // 4  # the stored bytes of the visible tokens
    x_and_out = batch * kv * g * hd * (4 + 2)  # f32 queries in, bf16 out
    assert got["calls"] == 1
    assert visible <= got["read"] and got["bytes"] <= 1.005 * visible + x_and_out


# The real compiler: a small layer (2 KV heads of 128, 4 query heads each, 1024 tokens).
def compiled_program(xq, k, ks, v, vs, visible, layer, *, name: str, target: str):
    fmt = emulate.kvcache.cache_format(name)
    compute = "float32" if target in ("tpu_v2", "tpu_v3") else "bfloat16"
    cfg = decode_kernel.DecodeConfig(fmt, Geometry(2, 4, 128, fmt.blocks(128)), 512, compute)
    return decode_kernel.decode(xq, k, ks, v, vs, visible, layer, cfg)


def _specs(name: str) -> tuple:
    _, cache = _specs_of(name, 2, 2, 4, 128, 1024)
    return (
        jax.ShapeDtypeStruct((2, 2, 4, 128), jnp.float32),
        cache.k, cache.k_scales, cache.v, cache.v_scales,
        jax.ShapeDtypeStruct((2,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32),
    )  # fmt: skip


RUNS = compile_only.runs(
    ("q4_0", "float8_e5m2", "mxfp4", "int8", "bfloat16"),
    ("tpu_v2", "tpu_v4", "tpu_v5e", "tpu_v7x"),
    {("q4_0", "tpu_v2")},  # f32-only matrix units, 4-bit codes, float16 scales
)
verdicts = compile_only.fixture("name", compiled_program, _specs)


@pytest.mark.skipif(not compiler.available(), reason="libtpu is not installed")
@pytest.mark.parametrize("name, target", RUNS)
def test_the_tpu_compiler_compiles_it(verdicts, name, target) -> None:
    compile_only.assert_compiles(verdicts, name, target)
