"""q[i] on a QArray's leading, unblocked axes: one expert of stacked experts, every part
indexed alike, nothing decoded; blocked axes refused."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import emulate
from emulate import codebooks, mx

E, K, N = 3, 64, 16


def _affine() -> emulate.QArray:
    """uint4 codes with per-block zero points and offsets, act-order along K, a tensor scale."""
    rng = np.random.default_rng(0)
    return emulate.QArray.from_parts(
        rng.integers(0, 16, (E, K, N), dtype=np.uint8),
        rng.uniform(0.5, 2, (E, K // 32, N)).astype(np.float16),
        block_shape=(1, 32, 1),
        fmt="uint4",
        zero_points=rng.integers(0, 16, (E, K // 32, N), dtype=np.uint8),
        offsets=rng.uniform(-1, 1, (E, K // 32, N)).astype(np.float32),
        perm=rng.permutation(K).astype(np.int32),
        perm_axis=1,
        tensor_scale=np.float32(0.75),
        dtype=jnp.bfloat16,
    )


def _two_level_nf4() -> emulate.QArray:
    """NF4 codes with a QArray of scales (its own blocks span N, not E)."""
    rng = np.random.default_rng(1)
    scales = emulate.QArray.from_parts(
        rng.integers(0, 256, (E, K // 64, N), dtype=np.uint8),
        rng.uniform(0.01, 0.1, (E, 1, 1)).astype(np.float32),
        block_shape=(1, K // 64, N),
        fmt="uint8",
    )
    return emulate.QArray.from_parts(
        rng.integers(0, 16, (E, K, N), dtype=np.uint8),
        scales,
        block_shape=(1, 64, 1),
        codebook=codebooks.NF4.array(),
    )


QARRAYS = {
    "mxfp4-packed": lambda: emulate.quantize(
        jax.random.normal(jax.random.key(3), (E, K, N)), mx.MXFP4, axis=1
    ),
    "affine-perm": _affine,
    "nf4-two-level": _two_level_nf4,
}


@pytest.mark.parametrize("name", list(QARRAYS))
def test_an_expert_is_the_stack_indexed(name):
    q = QARRAYS[name]()
    values = np.asarray(q.dequantize(jnp.float32))
    for key in (1, -1, np.int32(2), (0, ...), (2, slice(None), slice(None))):
        e = q[key]
        assert isinstance(e, emulate.QArray) and e.shape == (K, N)
        assert e.block_shape == q.block_shape[1:] and e.dtype == q.dtype
        k0 = key[0] if isinstance(key, tuple) else key
        np.testing.assert_array_equal(np.asarray(e.dequantize(jnp.float32)), values[k0])
    for key in (slice(1, 3), slice(None, None, 2), slice(-1, None)):
        s = q[key]
        assert s.shape == values[key].shape
        np.testing.assert_array_equal(np.asarray(s.dequantize(jnp.float32)), values[key])
    assert q[...] is q and q[()] is q and q[:] is q


def test_an_expert_multiplies_as_its_values():
    q = QARRAYS["mxfp4-packed"]()
    # small integers times e2m1 values and power-of-two scales: every sum is exact in f32
    x = jnp.asarray((np.arange(4 * K) % 7 - 3).astype(np.float32).reshape(4, K))
    got = emulate.matmul(x, q[1])
    want = emulate.matmul(x, q)[1]  # the stacked product's expert 1
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_an_expert_under_jit_and_a_traced_stack():
    q = QARRAYS["affine-perm"]()
    got = jax.jit(lambda q: q[2].dequantize(jnp.float32))(q)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(q.dequantize(jnp.float32))[2])


def test_refusals():
    q = QARRAYS["mxfp4-packed"]()
    with pytest.raises(
        ValueError,
        match=r"^key: axis 1 of this QArray is blocked \(block length 32 of shape "
        r"\(3, 64, 16\)\): indexing it would cut a scale block",
    ):
        q[0, 5]
    with pytest.raises(IndexError, match=r"^key: index 3 is out of range for axis 0 of size 3$"):
        q[3]
    with pytest.raises(IndexError, match=r"^key: 4 indices for a QArray of 3 dimensions$"):
        q[0, :, :, 0]
    for bad in (None, jnp.array([0, 1]), [0, 1], True):
        with pytest.raises(TypeError, match=r"^key: a QArray takes ints and slices of leading"):
            q[bad]
    flat = emulate.quantize(jnp.ones((64, 8)), mx.MXFP4, axis=0)
    with pytest.raises(ValueError, match=r"^key: axis 0 of this QArray is blocked"):
        flat[0]
    a = QARRAYS["affine-perm"]()
    by_column = emulate.QArray.from_parts(
        a.codes, a.scales, block_shape=a.block_shape, fmt="uint4", perm=jnp.arange(N), perm_axis=2
    )
    with pytest.raises(ValueError, match=r"^key: axis 2 of this QArray is act-order permuted;"):
        by_column[:, :, 0]


@pytest.mark.parametrize("key", [(slice(None), -1), (0, slice(None), 2)])
def test_an_axis_after_the_packed_one(key):
    # int4 per-column scales, packed along K: an int on an axis after the packed one takes
    # that axis away (issue 49: "axis: -2 is out of range for data of shape (32,)" before)
    w = np.arange(-32, 32, dtype=np.float32).reshape(64, 1) * np.arange(1, 5, dtype=np.float32)
    q = emulate.quantize(w if len(key) == 2 else np.stack([w, -w]), "int4", axis=len(key) - 2)
    got = q[key]
    assert isinstance(got.codes, emulate.Packed) and got.codes.axis == -1
    want = np.asarray(q.dequantize(jnp.float32))[key]
    np.testing.assert_array_equal(np.asarray(got.dequantize(jnp.float32)), want)
