"""emulate.kvcache.KVCache: every format's written codes and scales against
emulate.reference.quantize (numpy), the 4-bit token layout against numpy's unpacking, a
batch of sequences at their own positions, writes past the capacity, updates in place
under jit, and the argument errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _kv_oracle import FOUR_BIT, LAYOUTS, token_codes, values

from emulate import compiler, reference
from emulate.kvcache import FORMATS, KVCache

B, KV, HD = 2, 2, 64
SCALES = {"int8_per_head": 0.05}  # int8 per head needs them; the float8 ones default to 1


def _rows(rng: np.random.Generator, t: int, hd: int = HD) -> np.ndarray:
    """(B, t, KV, hd) f32 with special values: a zero head, -0, an f32 subnormal, values
    past every format's range (saturated), tiny ones."""
    x = rng.standard_normal((B, t, KV, hd)).astype(np.float32) * 3
    x[0, 0, 0] = 0.0
    x[0, 1, 1, :4] = [-0.0, 1e-40, 5e5, -7e4]
    x[1, -1, 0] *= 1e-30
    return x


def _expected(x: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray | None]:
    """The codes (one a token, per lane) and scales (B, t, KV * nb) a write must store,
    by emulate.reference."""
    element, scale_fmt, width = LAYOUTS[name]
    b, t, kv, hd = x.shape
    if element == "bfloat16":
        return x.astype(ml_dtypes.bfloat16).reshape(b, t, -1), None
    if scale_fmt == "head":
        s = np.float32(SCALES.get(name, 1.0))
        y = x * (np.float32(1) / s)  # f32 product, as quantize's absmax division
        fmax = float(ml_dtypes.finfo(element).max) if "float" in element else 127.0
        y = np.clip(y, -fmax, fmax)
        y = np.where(np.abs(y) < 2.0**-126, y * 0, y)
        codes = reference.rounding.encode(y, element, saturate=True)
        return codes.reshape(b, t, -1), None
    rule = "ocp_floor" if scale_fmt == "float8_e8m0fnu" else "absmax"
    codes, scales, _ = reference.quantize(
        x, element, (1, 1, 1, width or hd), scale_fmt=scale_fmt, scale_rule=rule
    )
    return codes.reshape(b, t, -1), scales.reshape(b, t, -1)


def _stored(cache: KVCache, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The cache's K codes (one a token) and scales at ``positions`` (B, t) of layer 1."""
    element = LAYOUTS[cache.format.name][0]
    codes = token_codes(np.asarray(cache.k[1]), element)
    got = np.stack([codes[b, positions[b]] for b in range(B)])
    if cache.format.granularity not in ("token", "block"):
        return got, None
    sc = np.asarray(cache.k_scales[1])  # (B, KV * nb, S)
    return got, np.stack([sc[b][:, positions[b]].T for b in range(B)])


#: Formats whose writes run by default: one of each scaled kind (per token, per head, 4-bit
#: blocks: q4_0's integer codes with float16 scales; bfloat16's writes are read back by
#: tests/examples' cached decoding); the others under EMULATE_LONG_TESTS=1 (each compiles
#: its own quantizer: 2-5 s). mxfp4 writes its 4-bit blocks as q4_0 does, along the same
#: rows and nibbles; its e2m1 codes and e8m0 scales are emulate.quantize's, checked against
#: the reference by default in tests/quantized/test_quantizing.py (MXFP4's rule and
#: formats) and read back in tests/kvcache/test_kvcache_attention.py's mxfp4 case.
_DEFAULT = ("int8", "float8_e4m3fn_per_head", "q4_0")


@pytest.mark.parametrize(
    "name", [n if n in _DEFAULT else pytest.param(n, marks=pytest.mark.long) for n in FORMATS]
)
def test_writes_store_what_emulate_quantize_gives(name) -> None:
    rng = np.random.default_rng(1)
    cache = KVCache.create(2, B, KV, HD, 600, name, **_scale_args(name))
    assert cache.capacity == 768 and cache.k.dtype == cache.format.code_dtype
    x = _rows(rng, 300)
    # then 3 tokens across a 32-row group and a 4-bit tile's halves (382..384: two runs of
    # rows) and across a tile (254..256, sequence 1's over its own earlier ones); both
    # writes in one program (one compile: 4-7 s each on the CPU)
    x2 = _rows(rng, 3)

    def step(c, x, x2):
        c = c.write(1, x, -x).advance(jnp.array([382, 254]))
        return c.write(1, x2, x2).advance(3)

    cache = jax.jit(step)(cache, x, x2)
    assert np.asarray(cache.lengths).tolist() == [385, 257]
    later = [382 + np.arange(3), 254 + np.arange(3)]
    written = [(x, [np.arange(300), np.arange(254)]), (x2, later)]
    for rows, pos in written:
        codes, scales = _expected(rows, name)
        got_codes, got_scales = _stored(cache, np.stack([np.resize(p, rows.shape[1]) for p in pos]))
        for b in range(B):
            n = len(pos[b])
            want = codes[b, :n]
            if LAYOUTS[name][0] in FOUR_BIT:
                want = want.view(np.uint8) & 15  # the nibble: int4 in two's complement
            np.testing.assert_array_equal(
                got_codes[b, :n].view(np.uint8) if want.dtype.itemsize == 1 else got_codes[b, :n],
                want.view(np.uint8) if want.dtype.itemsize == 1 else want,
            )
            if scales is not None:
                assert got_scales is not None
                want_s = scales[b, :n]
                if want_s.dtype == np.float16:
                    want_s = want_s.view(np.uint16)
                elif want_s.dtype == ml_dtypes.float8_e8m0fnu:
                    want_s = want_s.view(np.uint8)
                np.testing.assert_array_equal(got_scales[b, :n], want_s)


def _scale_args(name: str) -> dict:
    return {"k_scales": SCALES[name], "v_scales": SCALES[name]} if name in SCALES else {}


@pytest.mark.parametrize("name", ["q4_0", pytest.param("mxfp4", marks=pytest.mark.long)])
def test_values_read_back_are_the_codes_times_their_scales(name) -> None:
    # dequantized() against the oracle's own unpacking and decoding (exact products)
    # rounded once to float32, V too
    rng = np.random.default_rng(2)
    cache = KVCache.create(1, B, KV, HD, 512, name)
    x = rng.standard_normal((B, 260, KV, HD)).astype(np.float32)
    cache = jax.jit(lambda c, x: c.write(0, x, 2 * x))(cache, x)  # one program
    k, v = (np.asarray(a, np.float64) for a in cache.dequantized(0))
    np.testing.assert_array_equal(k, values(cache, 0, "k").astype(np.float32))
    np.testing.assert_array_equal(v, values(cache, 0, "v").astype(np.float32))


def test_a_token_past_the_capacity_is_dropped() -> None:
    cache = KVCache.create(1, B, KV, HD, 256, "q4_0").with_lengths(jnp.array([254, 0]))
    x = np.ones((B, 4, KV, HD), np.float32)
    cache = jax.jit(lambda c, x: c.write(0, x, x))(cache, x)  # one program, not op by op
    k = values(cache, 0, "k")
    assert k.shape[1] == 256
    assert (k[0, 254:] > 0.99).all()  # 256 and 257 fell off the end
    np.testing.assert_array_equal(k[0, :254], 0.0)  # and wrapped onto nothing
    assert (k[1, :4] > 0.99).all() and (k[1, 4:] == 0).all()


def test_a_donated_cache_is_updated_in_place() -> None:
    cache = KVCache.create(2, B, KV, HD, 256, "int8")
    x = jnp.ones((B, 1, KV, HD), jnp.float32)
    step = jax.jit(lambda c, x: c.write(1, x, x).advance(1), donate_argnums=0)
    compiled = step.lower(cache, x).compile()  # called below: one compile
    aliased = compiled.as_text().split("input_output_alias=", 1)[1].split("\n", 1)[0]
    assert aliased.count("may-alias") + aliased.count("must-alias") == 5  # every leaf
    old = cache
    cache = compiled(cache, x)
    assert old.k.is_deleted() and not cache.k.is_deleted()


def test_nbytes_counts_codes_and_scales() -> None:
    c = jax.eval_shape(lambda: KVCache.create(32, 16, 8, 128, 4096, "q4_0"))  # no 4.6 GB
    codes = 2 * 32 * 16 * 4096 * 8 * 128 // 2
    scales = 2 * 32 * 16 * 8 * 4 * 4096 * 2
    assert c.nbytes == codes + scales + 16 * 4
    per_token = c.format.bytes_per_token(8, 128)
    assert per_token == 2 * (8 * 128 / 2 + 8 * 4 * 2) == 1152


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((1, 1, 1, 64, 16, "q3_k"), {}, ValueError, "format: unknown cache format 'q3_k'"),
        ((1, 1, 1, 48, 16, "q4_0"), {}, ValueError, "head_dim: 48 is not a multiple of the q4_0"),
        ((1, 1, 1, 64, 0, "int8"), {}, ValueError, "length: expected a positive int, got 0"),
        ((0, 1, 1, 64, 16, "int8"), {}, ValueError, "layers: expected a positive int, got 0"),
        ((1, 1, 1, 64, 16, "int8_per_head"), {}, ValueError, "k_scales: a int8_per_head cache"),
        ((1, 1, 1, 64, 16, "int8"), {"k_scales": 1.0}, ValueError, "k_scales, v_scales: the int8"),
        ((1, 1, 1, 64, 16, 3), {}, TypeError, "format: expected a cache format name"),
    ],
)  # fmt: skip
def test_create_names_the_bad_argument(args, kwargs, error, message) -> None:
    with pytest.raises(error, match=message.replace("(", r"\(")):
        KVCache.create(*args, **kwargs)


def test_write_names_a_shape_that_does_not_fit() -> None:
    cache = KVCache.create(1, B, KV, HD, 16, "int8")
    x = jnp.ones((B, 1, KV + 1, HD))
    want = r"k: expected \(batch 2, tokens, kv_heads 2, head_dim 64\)"
    with pytest.raises(ValueError, match=want):
        cache.write(0, x, x)


@pytest.mark.skipif(not compiler.available(), reason="libtpu is not installed")
@pytest.mark.parametrize(
    ("name", "target", "batch", "kv"),
    [
        ("int8", "tpu_v5e", B, KV),
        pytest.param("q4_0", "tpu_v5e", B, KV, marks=pytest.mark.long),
        # float16 scales in a loop: 7x kept the layer's scales in VMEM and copied them in
        # and out (0.51 of the cache accessed); at 2 sequences it does not (15 s a compile)
        pytest.param("q4_0", "tpu_v7x", 16, 8, marks=pytest.mark.long),
    ],
)
def test_a_write_moves_its_window_not_the_layer(name, target, batch, kv) -> None:
    # slicing the window at a traced row made XLA:TPU relay the whole layer out first:
    # 25.3 MB accessed to write one token into each of 2 sequences of a 4.3 MB int8 cache
    cache = jax.eval_shape(lambda: KVCache.create(1, batch, kv, 128, 4096, name))
    x = jax.ShapeDtypeStruct((batch, 1, kv, 128), jnp.bfloat16)
    write = compiler.compile(
        lambda c, x: c.write(0, x, x), cache, x, target=target, donate_argnums=0
    )
    assert write.cost_analysis()["bytes accessed"] < 0.2 * cache.nbytes
