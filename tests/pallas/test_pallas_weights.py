"""emulate.pallas.prepare_weight / KernelWeight: the K-planar layout's bytes against the
layout's definition written out in numpy, the codes back for every sub-byte width, the
kernel on prepared weights bit for bit against emulate.reference, and bad input."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import emulate
import emulate.pallas
from emulate import reference
from emulate.pallas import weights

DN = (((1,), (0,)), ((), ()))


def _planar_numpy(codes: np.ndarray, bits: int, g: int, nbytes: int) -> np.ndarray:
    """The layout, from its definition: tile s, byte p of group r at row s*128*b + p*128 + r;
    group r holds rows s*128*g + t*128 + r at stream bits [bits*t, bits*(t+1))."""
    k, n = codes.shape
    tiles = -(-k // (128 * g))
    c = np.zeros((tiles * 128 * g, n), np.uint64)
    c[:k] = codes
    out = np.zeros((tiles * 128 * nbytes, n), np.uint8)
    for s in range(tiles):
        for r in range(128):
            word = sum(
                int_col << (bits * t)
                for t, int_col in enumerate(c[s * 128 * g + t * 128 + r] for t in range(g))
            )
            for p in range(nbytes):
                out[s * 128 * nbytes + p * 128 + r] = (word >> np.uint64(8 * p)) & np.uint64(255)
    return out


def _word_order_numpy(codes: np.ndarray) -> np.ndarray:
    """4-bit word order, from its definition: in tile s, nibble p of little-endian 32-bit
    word i (bytes 4i .. 4i + 3 of the tile's 128 byte rows) holds row 64*(p%4) + 2i + p//4."""
    k, n = codes.shape
    tiles = -(-k // 256)
    c = np.zeros((tiles * 256, n), np.uint32)
    c[:k] = codes
    words = np.zeros((tiles * 32, n), np.uint32)
    for s in range(tiles):
        for i in range(32):
            for p in range(8):
                words[s * 32 + i] |= c[s * 256 + 64 * (p % 4) + 2 * i + p // 4] << np.uint32(4 * p)
    as_bytes = words.astype("<u4").view(np.uint8).reshape(tiles * 32, n, 4)
    return as_bytes.transpose(0, 2, 1).reshape(-1, n)


def _six_bit_word_order_numpy(codes: np.ndarray) -> np.ndarray:
    """6-bit word order, from its definition: each 512-row tile two word tiles of 256 rows,
    each the 4-bit word order of the codes' low nibbles (128 byte rows) and then 16 words
    (64 byte rows) whose crumb p (bits 2p .. 2p + 1) of word j holds the high two bits of
    row 64 * (r % 4) + 2 * (j + 16 * (r // 4)) + p // 8, r = p % 8."""
    k, n = codes.shape
    halves = -(-k // 512) * 2
    c = np.zeros((halves * 256, n), np.uint32)
    c[:k] = codes
    parts = []
    for h in range(halves):
        tile = c[h * 256 : (h + 1) * 256]
        parts.append(_word_order_numpy(tile & 0xF))
        high = np.zeros((16, n), np.uint32)
        for j in range(16):
            for p in range(16):
                r = p % 8
                row = 64 * (r % 4) + 2 * (j + 16 * (r // 4)) + p // 8
                high[j] |= (tile[row] >> np.uint32(4)) << np.uint32(2 * p)
        parts.append(high.astype("<u4").view(np.uint8).reshape(16, n, 4).transpose(0, 2, 1))
    return np.concatenate([p_.reshape(-1, n) for p_ in parts], axis=0)


@pytest.mark.parametrize("fmt", ["uint6", "float6_e3m2fn"])
def test_6_bit_codes_are_in_word_order(fmt):
    codes = np.random.default_rng(6).integers(0, 64, (520, 3)).astype(np.uint8)
    kw = emulate.pallas.prepare_weight(codes, fmt)
    assert kw.tile == 512 and kw.data.shape == (768, 3)
    assert np.asarray(kw.data).tobytes() == _six_bit_word_order_numpy(codes).tobytes()
    assert np.asarray(weights.kernel_codes(kw)).tobytes() == codes.tobytes()


def test_4_bit_codes_are_in_word_order():
    codes = np.random.default_rng(4).integers(0, 16, (300, 3)).astype(np.uint8)
    kw = emulate.pallas.prepare_weight(codes, "uint4")
    assert kw.tile == 256
    assert np.asarray(kw.data).tobytes() == _word_order_numpy(codes).tobytes()
    assert np.asarray(weights.kernel_codes(kw)).tobytes() == codes.tobytes()


@pytest.mark.parametrize(
    "fmt, bits, g, nbytes, k",
    [("int5", 5, 8, 5, 1030), ("int2", 2, 4, 1, 130)],
)
def test_the_layout_is_the_documented_one(fmt, bits, g, nbytes, k):
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 1 << bits, (k, 3)).astype(np.uint8)
    kw = emulate.pallas.prepare_weight(codes, fmt)
    assert kw.shape == (k, 3) and kw.format.name == fmt and kw.tile == 128 * g
    assert np.asarray(kw.data).tobytes() == _planar_numpy(codes, bits, g, nbytes).tobytes()


@pytest.mark.parametrize("fmt", ["int2", "int3", "uint4", "int5", "float6_e2m3fn"])
def test_the_codes_come_back(fmt):
    bits = emulate.formats.get(fmt).bits
    codes = np.random.default_rng(7).integers(0, 1 << bits, (777, 5)).astype(np.uint8)
    kw = emulate.pallas.prepare_weight(emulate.pack(codes, fmt, axis=0))
    assert np.asarray(weights.kernel_codes(kw)).tobytes() == codes.tobytes()


def test_prepared_weights_are_bit_identical_to_the_reference():
    rng = np.random.default_rng(27)
    x = rng.integers(-128, 128, (20, 700)).astype(np.int8)
    w = rng.integers(-8, 8, (700, 130)).astype(ml_dtypes.int4)
    kw = emulate.pallas.prepare_weight(w)
    # K = 700 in blocks of 512: the last block reads rows past the prepared 768.
    got = emulate.pallas.matmul(
        x, kw, target="tpu_v5e", block_shape=(32, 128, 512), out_dtype="float32"
    )
    want = reference.dot_general(x, w, DN, preferred_element_type="float32")
    assert np.asarray(got).tobytes() == want.tobytes()
    # float6 e2m3 codes x e2m3 weight, decoded to bf16 (v4: no int8 unit for bf16 x int8)
    xc = rng.integers(0, 64, (9, 300)).astype(np.uint8)
    wc = rng.integers(0, 64, (300, 140)).astype(np.uint8)
    got = emulate.pallas.matmul(
        xc,
        emulate.pallas.prepare_weight(wc, "e2m3"),
        target="tpu_v4",
        x_format="e2m3",
        out_dtype="float32",
    )
    xv = xc.view(ml_dtypes.float6_e2m3fn)
    wv = wc.view(ml_dtypes.float6_e2m3fn)
    want = reference.dot_general(xv, wv, DN, preferred_element_type="float32")
    assert np.asarray(got).tobytes() == want.tobytes()


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: emulate.pallas.prepare_weight(np.zeros((8, 4), np.int8)), ValueError,
         r"^w: int8 is 8-bit; matmul reads 8-bit weights as stored, pass them directly"),
        (lambda: emulate.pallas.prepare_weight(
            emulate.pack(np.zeros((8, 4), ml_dtypes.int4), axis=1)), ValueError,
         r"^w: a Packed weight must be 2-D \(K, N\) and packed along K \(axis 0\); got shape "
         r"\(8, 4\) packed along axis 1$"),
        (lambda: emulate.pallas.prepare_weight("w"), TypeError,
         r"^w: expected a Packed weight, a sub-byte array or uint8 codes with w_format; got str$"),
        (lambda: emulate.pallas.prepare_weight(np.zeros((2, 8, 4), ml_dtypes.int4)), ValueError,
         r"^w: expected a 2-D \(K, N\) weight, got shape \(2, 8, 4\)$"),
        (lambda: emulate.pallas.KernelWeight(np.zeros((100, 4), np.uint8), "int4", 256),
         ValueError, r"^length: 256 int4 rows in the K-planar layout need 128 byte rows, the "
         r"data has 100$"),
        (lambda: emulate.pallas.matmul(
            np.ones((4, 256), np.int8),
            emulate.pallas.prepare_weight(np.zeros((256, 4), ml_dtypes.int4)),
            target="v5e", w_format="uint4"), ValueError,
         r"^w_format: uint4 disagrees with the KernelWeight's format int4$"),
    ],
)  # fmt: skip
def test_bad_input_names_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_the_gradient_reads_a_prepared_weight():
    # d/dx sum(x @ W) = 1 @ W.T: the row sums of the int4 values, exact in f32.
    w = np.random.default_rng(3).integers(-8, 8, (256, 128)).astype(ml_dtypes.int4)
    kw = emulate.pallas.prepare_weight(w)
    dx = jax.grad(lambda x: emulate.pallas.matmul(x, kw, target="tpu_v5e").sum())(
        jnp.ones((8, 256), jnp.float32)
    )
    want = np.broadcast_to(w.astype(np.float32).sum(axis=1), (8, 256))
    assert np.asarray(dx).tobytes() == want.astype(np.float32).tobytes()


def test_a_kernel_weight_answers_as_the_packed_array():
    # shape, dtype, ndim, size, nbytes as emulate.Packed answers them (K a whole number of
    # tiles: no padding rows), also for stacked experts (a leading axis on the data)
    codes = np.random.default_rng(3).integers(-8, 8, (512, 384)).astype(ml_dtypes.int4)
    packed = emulate.pack(codes, axis=0)
    kw = emulate.pallas.prepare_weight(codes)
    answers = ((512, 384), np.dtype(ml_dtypes.int4), 2, 512 * 384, 512 * 384 // 2)
    for a in (packed, kw):
        assert (a.shape, a.dtype, a.ndim, a.size, a.nbytes) == answers
    stacked = emulate.pallas.prepare_experts(np.stack([codes, codes]))
    assert (stacked.shape, stacked.ndim, stacked.size, stacked.nbytes) == (
        (2, 512, 384), 3, 2 * 512 * 384, 512 * 384,
    )  # fmt: skip
