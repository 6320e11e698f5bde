"""emulate.pallas.words: 4-bit codes cut out of whole words, against the word order's
definition written out in numpy (tests/pallas/test_pallas_weights.py checks the bytes of
the layout itself): every decode (bfloat16 arithmetic, f32 and a pack, piece order),
signed and unsigned codes, static and per-group zero points, bit for bit; the codes back
in K order; the interpret-mode pack and the piece order's permutation of x; float4_e2m1fn
codes (every code at every nibble) against emulate.reference, bit for bit (NF4's table:
tests/pallas/test_qcodebook.py); 6-bit codes (nibbles and crumbs of a 6-bit word tile) on
every decode, unsigned and two's complement, static and per-group zero points, bit for bit,
with a property test boosting the extreme and sign-boundary codes at every position."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _sweeps import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import emulate.pallas
import emulate.reference
from emulate.pallas import words


def _tiles(codes: np.ndarray) -> jnp.ndarray:
    """The (32 T, C) int32 words of a prepared weight of ``codes`` (T tiles of 256 rows)."""
    kw = emulate.pallas.prepare_weight(codes, "uint4")
    return jax.jit(words.words)(jnp.asarray(kw.data))


def _jit(f, **static):
    """``f`` with ``static`` keyword arguments, under jit (pltpu.bitcast has no eager rule)."""
    return jax.jit(functools.partial(f, **static))


def _values(codes: np.ndarray, signed: bool, zero, group: int) -> np.ndarray:
    """The oracle: each code's value (two's complement for signed codes) minus its zero
    point, per group of ``group`` rows, in float64."""
    v = codes.astype(np.int64)
    if signed:
        v = np.where(v >= 8, v - 16, v)
    if zero is None:
        return v.astype(np.float64)
    z = zero if isinstance(zero, int) else np.repeat(zero, group, axis=0)
    return (v - z).astype(np.float64)


CASES = [
    # (signed, to, bf16 vector unit, zero, group)
    (False, "bfloat16", False, None, 256),
    (True, "bfloat16", False, None, 256),
    (False, "bfloat16", False, 8, 256),  # uint4 - 8: the int4 decode of n ^ 8
    (False, "bfloat16", True, 8, 256),
    (True, "bfloat16", True, None, 256),
    (False, "bfloat16", False, "groups", 32),
    (False, "bfloat16", True, "groups", 32),
    (True, "float32", False, "groups", 64),
    (False, "float32", False, "groups", 128),
]


@pytest.mark.parametrize("signed, to, bf16_vpu, zero, group", CASES)
def test_tile_values_are_the_codes_in_k_order(signed, to, bf16_vpu, zero, group):
    rng = np.random.default_rng(hash((signed, to, bf16_vpu, str(zero), group)) % 2**32)
    codes = rng.integers(0, 16, (256, 256)).astype(np.uint8)
    z = None if zero is None else zero
    if zero == "groups":
        z = rng.integers(0, 16, (256 // group, 256))
    opts = dict(signed=signed, to=to, bf16_vpu=bf16_vpu, interpret=True, group=group)
    if zero == "groups":
        got = _jit(words.tile_values, **opts)(_tiles(codes), zero=jnp.asarray(z, jnp.int32))
    else:
        got = _jit(words.tile_values, zero=z, **opts)(_tiles(codes))
    assert got.dtype == jnp.dtype(to) and got.shape == (256, 256)
    want = _values(codes, signed, z, group)
    np.testing.assert_array_equal(np.asarray(got, np.float64), want)


def test_piece_order_holds_the_rows_piece_rows_names():
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 16, (256, 128)).astype(np.uint8)
    z = rng.integers(0, 16, (8, 128))
    opts = dict(signed=False, to="float32", bf16_vpu=False, interpret=True, group=32)
    decode = _jit(words.tile_values, piece_order=True, **opts)
    got = decode(_tiles(codes), zero=jnp.asarray(z, jnp.int32))
    rows = words.piece_rows(256)
    assert sorted(rows.tolist()) == list(range(256))
    np.testing.assert_array_equal(np.asarray(got), _values(codes, False, z, 32)[rows])
    x = rng.standard_normal((3, 512)).astype(np.float32)
    np.testing.assert_array_equal(
        np.asarray(words.to_piece_order(jnp.asarray(x))), x[:, np.concatenate([rows, 256 + rows])]
    )


def test_natural_codes_are_the_codes():
    codes = np.random.default_rng(6).integers(0, 16, (512, 128)).astype(np.uint8)
    got = _jit(words.natural_codes, interpret=True)(_tiles(codes))
    np.testing.assert_array_equal(np.asarray(got), codes.astype(np.int32))


def test_pack_rows_interleaves_rows_as_bfloat16():
    rng = np.random.default_rng(7)
    a = rng.integers(-255, 256, (8, 128)).astype(np.float32)
    b = rng.integers(-255, 256, (8, 128)).astype(np.float32)
    got = np.asarray(_jit(words.pack_rows, interpret=True)(jnp.asarray(a), jnp.asarray(b)))
    want = np.stack([a, b], axis=1).reshape(16, 128).astype(ml_dtypes.bfloat16)
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def _every_code_at_every_position() -> np.ndarray:
    """(256, 256) codes: column ``c`` holds code ``(r + c) % 16`` at row ``r``, so each of
    the 16 codes takes every row of the tile (every nibble of every word) in some column."""
    r, c = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    return ((r + c) % 16).astype(np.uint8)


@pytest.mark.parametrize(
    "to, bf16_vpu, piece_order",
    [("bfloat16", False, False), ("bfloat16", True, False), ("float32", False, True)],
)
def test_e2m1_tiles_are_every_code_bit_for_bit(to, bf16_vpu, piece_order):
    # the oracle: ml_dtypes' float4_e2m1fn values of the codes (emulate.reference),
    # compared as bits: code 8 is -0 and must stay so
    codes = _every_code_at_every_position()
    opts = dict(signed=False, to=to, bf16_vpu=bf16_vpu, interpret=True, e2m1=True)
    got = np.asarray(_jit(words.tile_values, piece_order=piece_order, **opts)(_tiles(codes)))
    want = emulate.reference.decode(codes, "float4_e2m1fn", to=np.float64)
    if piece_order:
        want = want[words.piece_rows(256)]
    assert got.dtype == np.dtype(to)
    want = want.astype(got.dtype)
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}"))


def _six_bit_words(codes: np.ndarray) -> jnp.ndarray:
    """The int32 words of a prepared uint6 weight of ``codes`` (512 rows a tile: two word
    tiles of 48 words, 32 of nibbles and 16 of crumbs)."""
    kw = emulate.pallas.prepare_weight(codes, "uint6")
    return jax.jit(words.words)(jnp.asarray(kw.data))


def _six_bit_values(codes: np.ndarray, signed: bool, zero, group: int) -> np.ndarray:
    v = codes.astype(np.int64)
    if signed:
        v = np.where(v >= 32, v - 64, v)
    z = 0 if zero is None else zero if isinstance(zero, int) else np.repeat(zero, group, axis=0)
    return (v - z).astype(np.float64)


@functools.cache
def _six_bit_decoder(static_zero, **opts):
    """``tile_values`` of a 6-bit word tile under jit (one compile per decode), a static
    zero point (or None) or, with ``static_zero == "array"``, an array argument."""
    if static_zero == "array":
        return _jit(words.tile_values, **opts)
    return _jit(words.tile_values, zero=static_zero, **opts)


def _six_bit_decode(w, half: int, zero, **opts):
    """Word tile ``half`` (rows ``256 half ..``) of the words ``w`` by ``tile_values``."""
    t = w[48 * half : 48 * half + 48]
    if zero is None or isinstance(zero, int):
        return _six_bit_decoder(zero, **opts)(t[:32], high=t[32:])
    decode = _six_bit_decoder("array", **opts)
    return decode(t[:32], high=t[32:], zero=jnp.asarray(zero, jnp.int32))


SIX_BIT_CASES = [
    # (signed, to, bf16 vector unit, piece order, zero, group)
    (False, "bfloat16", False, False, 32, 16),  # GGUF Q6_K on v4 / v5e: f32 halves, a pack
    (False, "bfloat16", True, False, 32, 16),  # v6e, 7x: one bfloat16 subtraction
    (True, "bfloat16", True, False, None, 256),  # int6: crumbs' top bits flipped
    (True, "bfloat16", False, False, "groups", 16),
    (False, "float32", False, True, "groups", 32),  # v2 / v3: piece order
    (True, "float32", False, False, None, 256),
]


@pytest.mark.parametrize("signed, to, bf16_vpu, piece_order, zero, group", SIX_BIT_CASES)
def test_six_bit_tiles_are_the_codes(signed, to, bf16_vpu, piece_order, zero, group):
    rng = np.random.default_rng(hash((signed, to, bf16_vpu, str(zero), group)) % 2**32)
    codes = rng.integers(0, 64, (512, 256)).astype(np.uint8)
    w = _six_bit_words(codes)
    opts = dict(signed=signed, to=to, bf16_vpu=bf16_vpu, interpret=True, group=group,
                piece_order=piece_order)  # fmt: skip
    for half in range(2):
        z = rng.integers(0, 64, (256 // group, 256)) if zero == "groups" else zero
        got = _six_bit_decode(w, half, z, **opts)
        want = _six_bit_values(codes[256 * half : 256 * (half + 1)], signed, z, group)
        if piece_order:
            want = want[words.piece_rows(256)]
        assert got.dtype == jnp.dtype(to) and got.shape == (256, 256)
        np.testing.assert_array_equal(np.asarray(got, np.float64), want)


def test_six_bit_natural_codes_are_the_codes():
    codes = np.random.default_rng(8).integers(0, 64, (1024, 128)).astype(np.uint8)
    got = _jit(words.natural_codes, interpret=True, bits=6)(_six_bit_words(codes))
    np.testing.assert_array_equal(np.asarray(got), codes.astype(np.int32))


#: 6-bit codes at the edges: 0, 63 (the unsigned extremes), 31 / 32 (int6's largest and
#: -32, Q6_K's 32 - 1 and 0), 15 / 16 (a carry from the nibble into the crumbs).
_SIX_BIT_SPECIAL = [0, 63, 31, 32, 15, 16, 48, 47]


@functools.cache
def _six_bit_base() -> np.ndarray:
    """Random codes the drawn special codes are written into."""
    return np.random.default_rng(9).integers(0, 64, (512, 128)).astype(np.uint8)


@settings(max_examples=examples(6, 60), deadline=None)
@given(
    cells=st.lists(
        st.tuples(st.integers(0, 511), st.integers(0, 127), st.sampled_from(_SIX_BIT_SPECIAL)),
        max_size=40,
    ),
    fill=st.sampled_from([None, *_SIX_BIT_SPECIAL]),
    decode=st.sampled_from([0, 1, 2, 5]),
)
def test_six_bit_special_codes_at_any_position(cells, fill, decode):
    # a decode of SIX_BIT_CASES with a static zero point or none, the whole
    # weight one special code (``fill``) or random, special codes at drawn positions
    codes = _six_bit_base().copy() if fill is None else np.full((512, 128), fill, np.uint8)
    for r, c, v in cells:
        codes[r, c] = v
    signed, to, bf16_vpu, piece_order, zero, group = SIX_BIT_CASES[decode]
    w = _six_bit_words(codes)
    opts = dict(signed=signed, to=to, bf16_vpu=bf16_vpu, interpret=True, group=group,
                piece_order=piece_order)  # fmt: skip
    for half in range(2):
        got = _six_bit_decode(w, half, zero, **opts)
        want = _six_bit_values(codes[256 * half : 256 * (half + 1)], signed, zero, group)
        np.testing.assert_array_equal(np.asarray(got, np.float64), want)
