"""emulate.engine.qtiled: a QArray weight sliced into tiles of whole blocks dequantizes as
the same slice of the whole weight, bit for bit; the tiled CPU matmul of every
checkpoint convention (benchmarks.qweights builds them as the importers do) is within
the float64 bound of docs/numerics.md over the weight's values for every tile, and the
same under jit and without (the module's comments say which schemes run what by default)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _sweeps import LONG

import emulate
from benchmarks.qweights import CPU_SCHEMES, NK, Scheme
from emulate.engine import qtiled, tiled

K, N = 256, 512
SETTINGS = tiled.Settings(min_bytes=0)


# By default one scheme of each class: two-level scales and mins (q4_k), int8 groups (q8_0),
# zero points (awq_g128), a codebook with double-quantized scales (nf4_dq), 4-bit floats
# with a tensor scale (nvfp4), fp8 blocks (fp8_block128) and act-order (gptq_act, the
# matmul only); the other GGUF K-quants, IQ4_XS, MXFP4, NF4 without double quant and
# compressed-tensors int4 under EMULATE_LONG_TESTS=1. q8_0's tiled matmul is long too
# (its slices of whole blocks stay by default): one scale per block of codes, the tiles
# that nvfp4's and awq_g128's block scales take.
DEFAULT_SCHEMES = {"q4_k", "q8_0", "awq_g128", "nf4_dq", "nvfp4", "fp8_block128", "gptq_act"}
MATMUL_LONG = {"q8_0"}
# The tiled matmul of each default scheme runs jitted with tiles of 128 by default (each
# further call is a program of its own); the call without jit (the same bits) and tiles of
# 256 (within the bound) for q4_k (two-level scales and mins) and fp8_block128 (whose
# block sums another tile width adds in another order) by default, for every scheme under
# EMULATE_LONG_TESTS=1.
EVERY_CALL = set(CPU_SCHEMES) if LONG else {"q4_k", "fp8_block128"}


def _schemes(names, long=frozenset()) -> list:
    return [
        n if n in DEFAULT_SCHEMES - long else pytest.param(n, marks=pytest.mark.long) for n in names
    ]


def _weight(name: str) -> tuple[Scheme, emulate.QArray]:
    s = CPU_SCHEMES[name]
    return s, s.build(K, N, np.random.default_rng(list(CPU_SCHEMES).index(name)))


def _free_dim(s: Scheme) -> int:
    return 0 if s.dn == NK else 1


@pytest.mark.parametrize("name", _schemes(n for n in CPU_SCHEMES if n != "gptq_act"))
def test_a_slice_of_whole_blocks_dequantizes_as_the_slice_of_the_weight(name: str) -> None:
    s, q = _weight(name)
    dim = _free_dim(s)
    whole = np.asarray(emulate.dequantize(q, to=jnp.float32))
    length = 128  # whole blocks (and packing groups) of every scheme along its free dim

    @jax.jit
    def traced(q, start):
        return emulate.dequantize(qtiled.slice_blocks(q, dim, start, length), to=jnp.float32)

    for start in (0, 256, N - length):
        want = np.take(whole, np.arange(start, start + length), axis=dim)
        got = np.asarray(traced(q, jnp.int32(start)))
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    tail = qtiled.slice_blocks(q, dim, 384, N - 384)  # a static tail
    np.testing.assert_array_equal(
        np.asarray(emulate.dequantize(tail, to=jnp.float32)),
        np.take(whole, np.arange(384, N), axis=dim),
    )


def _values(q: emulate.QArray) -> np.ndarray:
    """The weight's values in logical order as float64 (dequantize's f32 numbers: the
    values the matmul contract speaks of)."""
    return np.asarray(emulate.dequantize(q, to=jnp.float32), np.float64)


@pytest.mark.parametrize("name", _schemes(CPU_SCHEMES, long=MATMUL_LONG))
def test_tiled_matmul_is_within_the_bound_for_every_tile(name: str) -> None:
    s, q = _weight(name)
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.standard_normal((3, K)), jnp.bfloat16)
    unpermuted = dataclasses.replace(q, perm=None, perm_axis=None) if q.perm is not None else q
    t = qtiled.qtiling_for(unpermuted, 1, 2, s.dn, dataclasses.replace(SETTINGS, tile=128))
    assert t is not None and t.tile == 128 and t.size == N  # the tiled route runs

    def run(tile: int, jit: bool = True) -> np.ndarray:
        def f(x, q):
            return emulate.dot_general(x, q, s.dn, preferred_element_type=jnp.float32)

        with tiled.settings(min_bytes=0, tile=tile):
            return np.asarray((jax.jit(f) if jit else f)(x, q))

    got = run(128)
    if name in EVERY_CALL:
        np.testing.assert_array_equal(got, run(128, jit=False))
    w = _values(q)
    w = w.T if s.dn == NK else w
    xf = np.asarray(x, np.float64)
    n = K + K + 4  # docs/numerics.md: gamma_(K + S + 4), S <= K segments
    bound = n * 2.0**-24 / (1 - n * 2.0**-24) * (np.abs(xf) @ np.abs(w)) + 2.0**-126
    # another tile: XLA's dot may add a column's products in another order for another
    # width (fp8 blocks do), so the bits may differ, never the bound
    for y in (got, run(256)) if name in EVERY_CALL else (got,):
        assert np.all(np.abs(y - xf @ w) <= bound)


def test_choose_refuses_what_it_does_not_tile() -> None:
    s, q = _weight("fp8_block128")
    dn = s.dn
    # a small weight still takes two steps (the loop keeps the blocks' factors apart),
    # a tiny one none
    assert K * N >= qtiled.MIN_ELEMENTS
    assert qtiled.qtiling_for(q, 1, 2, dn, tiled.DEFAULT).tile == 256
    _, tiny = _weight("awq_g128")
    tiny = qtiled.slice_blocks(tiny, 1, 0, 64)  # 256 x 64
    assert qtiled.qtiling_for(tiny, 1, 2, dn, tiled.DEFAULT) is None
    assert qtiled.qtiling_for(tiny, 1, 2, dn, SETTINGS).tile == 32
    assert (
        qtiled.qtiling_for(q, 1, 2, dn, dataclasses.replace(SETTINGS, tile=64)) is None
    )  # 128-blocks
    assert qtiled.qtiling_for(q, 1, 2, dn, dataclasses.replace(SETTINGS, enabled=False)) is None
    assert qtiled.qtiling_for(
        q, 1, 2, dn, dataclasses.replace(SETTINGS, tile=128)
    ) == qtiled.QTiling(side=1, dim=1, size=N, tile=128, out_dim=1)
    _, g = _weight("gptq_act")
    assert g.perm is not None and qtiled.qtiling_for(g, 1, 2, dn, SETTINGS) is None
    # the largest tile within max_tile_bytes of f32 values: 2**17 bytes / (K * 4) = 128
    auto = qtiled.qtiling_for(q, 1, 2, dn, dataclasses.replace(SETTINGS, max_tile_bytes=1 << 17))
    assert auto is not None and auto.tile == 128


def test_a_qarray_on_the_left_is_tiled_along_its_free_dimension() -> None:
    s, q = _weight("awq_g128")  # (K, N): contract its K (dim 0) with x's
    x = jnp.asarray(np.random.default_rng(8).standard_normal((3, K)), jnp.bfloat16)
    dn = (((0,), (1,)), ((), ()))
    t = qtiled.qtiling_for(q, 0, 2, dn, dataclasses.replace(SETTINGS, tile=128))
    assert t == qtiled.QTiling(side=0, dim=1, size=N, tile=128, out_dim=0)
    with tiled.settings(min_bytes=0, tile=128):
        got = np.asarray(emulate.dot_general(q, x, dn, preferred_element_type=jnp.float32))
    w, xf = _values(q), np.asarray(x, np.float64)
    n = 2 * K + 4
    bound = n * 2.0**-24 / (1 - n * 2.0**-24) * (np.abs(w).T @ np.abs(xf).T) + 2.0**-126
    assert got.shape == (N, 3) and np.all(np.abs(got - w.T @ xf.T) <= bound)
