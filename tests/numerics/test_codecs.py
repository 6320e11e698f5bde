"""decode / encode against ml_dtypes, exhaustively over codes and by property over f32 bits.

Every format runs by default; the bfloat16 inputs' exhaustive sweep takes six formats by
default and all of them under EMULATE_LONG_TESTS=1 (BF16_FLOATS); decode without jit of
every code takes one result type per format by default, both under EMULATE_LONG_TESTS=1."""

from __future__ import annotations

import fractions

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _sweeps import LONG
from hypothesis import given
from hypothesis import strategies as st

import emulate
from emulate import formats
from emulate.numerics.storage import to_codes

LOW = formats.LOW_PRECISION
FLOATS = [n for n in LOW if formats.get(n).is_float]
INTS = [n for n in LOW if formats.get(n).is_integer]
TARGETS = {
    "float32": (jnp.float32, np.float32, np.uint32),
    "bfloat16": (jnp.bfloat16, ml_dtypes.bfloat16, np.uint16),
}


def all_codes(name: str) -> np.ndarray:
    return np.arange(1 << formats.get(name).bits, dtype=np.uint8)


def ml_value(codes: np.ndarray, name: str, to) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return codes.view(formats.get(name).dtype).astype(to)


def assert_same_bits(got: np.ndarray, want: np.ndarray, uint) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype
    nan_want = np.isnan(want.astype(np.float32))
    nan_got = np.isnan(got.astype(np.float32))
    np.testing.assert_array_equal(nan_got, nan_want)
    np.testing.assert_array_equal(got.view(uint)[~nan_want], want.view(uint)[~nan_want])


_decode_jit = jax.jit(emulate.decode, static_argnames=("fmt", "to"))


@pytest.mark.parametrize("to", sorted(TARGETS))
@pytest.mark.parametrize("name", LOW)
def test_decode_every_code_is_bit_exact(name, to):
    jto, npto, uint = TARGETS[to]
    codes = all_codes(name)
    want = ml_value(codes, name, npto)
    assert_same_bits(_decode_jit(codes, fmt=name, to=jto), want, uint)
    # The same codes as an array of the format's own dtype, jitted and not: without jit
    # (every operation compiled on its own) into one result type per format by default,
    # the two in turn over the formats; into both under EMULATE_LONG_TESTS=1.
    typed = codes.view(formats.get(name).dtype)
    if LONG or (LOW.index(name) + sorted(TARGETS).index(to)) % 2 == 0:
        assert_same_bits(emulate.decode(typed, to=jto), want, uint)
    if formats.get(name).xla_storable:
        assert_same_bits(_decode_jit(jnp.asarray(typed), to=jto), want, uint)


def test_subnormal_codes_are_not_flushed():
    # Hand values: the smallest subnormal of each float format, from its definition.
    for name, value in [
        ("float8_e4m3fn", 2.0**-9),
        ("float8_e5m2", 2.0**-16),
        ("float8_e4m3fnuz", 2.0**-10),
        ("float8_e5m2fnuz", 2.0**-17),
        ("float8_e4m3b11fnuz", 2.0**-13),
        ("float8_e3m4", 2.0**-6),
        ("float6_e2m3fn", 2.0**-3),
        ("float6_e3m2fn", 2.0**-4),
        ("float4_e2m1fn", 2.0**-1),
    ]:
        got = emulate.decode(np.array([1, 3], np.uint8), name, to=jnp.float32)
        assert np.asarray(got).tolist() == [value, 3 * value], name


def test_e8m0_code_zero_is_denormal_bits():
    got = emulate.decode(np.array([0, 127, 254, 255], np.uint8), "float8_e8m0fnu", to=jnp.float32)
    bits = np.asarray(got).view(np.uint32)
    assert bits[:3].tolist() == [0x00400000, 0x3F800000, 0x7F000000]
    assert np.isnan(np.asarray(got)[3])


@pytest.mark.parametrize("name", INTS)
def test_decode_integers_to_int(name):
    f = formats.get(name)
    codes = all_codes(name)
    want = ml_value(codes, name, np.int32)
    np.testing.assert_array_equal(emulate.decode(codes, name, to=jnp.int32), want)
    if f.max <= 127:
        got = emulate.decode(codes, name, to=jnp.int8)
        assert got.dtype == jnp.int8
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", [n for n in FLOATS])
def test_encode_of_decode_is_identity(name):
    f = formats.get(name)
    codes = np.array([c for c in all_codes(name) if int(c) not in f.nan_codes], np.uint8)
    values = emulate.decode(codes, name, to=jnp.float32)
    back = np.asarray(to_codes(emulate.encode(values, name), name)[0])
    if not f.signed_zero and f.signed:
        codes = np.where(codes == 0x80, 0, codes)  # no -0 in fnuz formats
    np.testing.assert_array_equal(back, codes)


_encode_jit = jax.jit(emulate.encode, static_argnames=("fmt", "saturate"))
f32_bits = hnp.arrays(np.uint32, 64, elements=st.integers(0, 2**32 - 1))


@pytest.mark.parametrize("name", FLOATS)
@given(bits=f32_bits)
def test_encode_of_any_f32_matches_ml_dtypes(name, bits):
    x = bits.view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        want = x.astype(formats.get(name).dtype).view(np.uint8)
    got = to_codes(_encode_jit(x, fmt=name), name)[0]
    np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("name", FLOATS)
def test_encode_matches_ml_dtypes_near_every_boundary(name):
    # Every f32 within a few ulps of each value and of each midpoint between neighbours.
    f = formats.get(name)
    vals = ml_value(all_codes(name), name, np.float64)
    vals = np.unique(vals[np.isfinite(vals)])
    mids = (vals[1:] + vals[:-1]) / 2
    pts = np.concatenate([vals, mids, [f.max * 1.0625, f.max * 1.125, 2 * f.max]]).astype(
        np.float32
    )
    u = pts.view(np.int32)
    near = (u[:, None] + np.arange(-2, 3)[None, :]).reshape(-1).view(np.float32)
    near = np.concatenate([near, -near])
    with np.errstate(invalid="ignore", over="ignore"):
        want = near.astype(f.dtype).view(np.uint8)
    got = to_codes(_encode_jit(near, fmt=name), name)[0]
    np.testing.assert_array_equal(np.asarray(got), want)


#: The formats test_encode_from_bfloat16_matches_ml_dtypes takes by default (one program
#: of 65536 inputs each): one of each class of special values (IEEE Inf and NaN, fn's NaN
#: only, fnuz's one NaN, e8m0's no zero) and of each width; every float format under
#: EMULATE_LONG_TESTS=1. Every format meets f32 inputs at every rounding boundary in
#: test_encode_matches_ml_dtypes_near_every_boundary by default.
BF16_FLOATS = (
    FLOATS
    if LONG
    else [
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float6_e2m3fn",
        "float4_e2m1fn",
        "float8_e8m0fnu",
    ]
)


def test_encode_from_bfloat16_matches_ml_dtypes():
    bits = np.arange(0, 1 << 16, dtype=np.uint16)
    x = bits.view(ml_dtypes.bfloat16)
    for name in BF16_FLOATS:
        with np.errstate(invalid="ignore", over="ignore"):
            want = x.astype(formats.get(name).dtype).view(np.uint8)
        got = to_codes(_encode_jit(jnp.asarray(x), fmt=name), name)[0]
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=name)


@pytest.mark.parametrize(
    "name,value,code",
    [
        ("float8_e4m3fn", 464.0, 0x7E),
        ("float8_e4m3fn", 465.0, 0x7E),
        ("float8_e4m3fn", np.inf, 0x7E),
        ("float8_e4m3fn", -1e30, 0xFE),
        ("float8_e5m2", np.inf, 0x7B),
        ("float8_e5m2", -70000.0, 0xFB),
        ("float8_e4m3fnuz", 1e9, 0x7F),
        ("float4_e2m1fn", 7.0, 0x7),
        ("float8_e8m0fnu", np.inf, 254),
    ],
)
def test_encode_saturate(name, value, code):
    got = emulate.encode(np.array([value], np.float32), name, saturate=True)
    assert int(np.asarray(to_codes(got, name)[0])[0]) == code


def _round_half_even(v: float) -> int:
    return round(fractions.Fraction(v))  # Python rounds Fractions half to even


@pytest.mark.parametrize("name", INTS)
@given(values=hnp.arrays(np.float32, 32, elements=st.floats(-1000, 1000, width=32)))
def test_encode_integers_round_half_even_and_wrap_or_clamp(name, values):
    f = formats.get(name)
    lo, hi, span = int(f.min), int(f.max), 1 << f.bits
    wrapped = [((_round_half_even(v) - lo) % span) + lo for v in values.tolist()]
    clamped = [min(max(_round_half_even(v), lo), hi) for v in values.tolist()]
    got_wrap = emulate.decode(emulate.encode(values, name), to=jnp.int32)
    got_clamp = emulate.decode(emulate.encode(values, name, saturate=True), to=jnp.int32)
    assert np.asarray(got_wrap).tolist() == wrapped
    assert np.asarray(got_clamp).tolist() == clamped


def test_encode_integer_nan_is_zero():
    got = emulate.encode(np.array([np.nan, 2.5, 3.5, -2.5], np.float32), "int8")
    assert np.asarray(got).tolist() == [0, 2, 4, -2]


def test_float6_round_trips_as_codes():
    x = np.array([0.125, -7.5, 3.0, 100.0], np.float32)
    codes = emulate.encode(x, "float6_e2m3fn")
    assert codes.dtype == jnp.uint8
    np.testing.assert_array_equal(
        np.asarray(codes), x.astype(ml_dtypes.float6_e2m3fn).view(np.uint8)
    )
    np.testing.assert_array_equal(
        emulate.decode(codes, "float6_e2m3fn", to=jnp.float32), [0.125, -7.5, 3.0, 7.5]
    )


def test_decode_under_vmap_and_grad_free_paths():
    codes = np.arange(256, dtype=np.uint8).reshape(4, 64)
    got = jax.vmap(lambda c: emulate.decode(c, "float8_e5m2", to=jnp.float32))(codes)
    assert_same_bits(got, ml_value(codes, "float8_e5m2", np.float32), np.uint32)


class TestBadInput:
    def test_not_an_array(self):
        with pytest.raises(TypeError, match=r"^x: expected a jax or numpy array, got list"):
            emulate.decode([1, 2, 3], "int4")

    def test_unknown_format(self):
        with pytest.raises(
            ValueError, match=r"^fmt: unknown format 'float7'; known formats: int4, uint4"
        ):
            emulate.decode(np.zeros(3, np.uint8), "float7")

    def test_dtype_without_format(self):
        with pytest.raises(TypeError, match=r"^x: dtype complex64 is not a supported format"):
            emulate.decode(np.zeros(3, np.complex64))

    def test_format_disagrees_with_dtype(self):
        with pytest.raises(
            ValueError, match=r"^x: dtype float8_e5m2 does not match fmt=float8_e4m3fn"
        ):
            emulate.decode(np.zeros(3, ml_dtypes.float8_e5m2), "float8_e4m3fn")

    def test_bad_target(self):
        with pytest.raises(
            ValueError,
            match=r"^to: cannot decode float8_e4m3fn to int32; accepted: bfloat16, float32$",
        ):
            emulate.decode(np.zeros(3, np.uint8), "float8_e4m3fn", to=jnp.int32)

    def test_uint8_to_int8(self):
        with pytest.raises(
            ValueError, match=r"^to: int8 cannot hold every uint8 value; use jnp.int32$"
        ):
            emulate.decode(np.zeros(3, np.uint8), "uint8", to=jnp.int8)

    def test_encode_bool(self):
        with pytest.raises(
            TypeError, match=r"^x: expected a float or integer array, got dtype bool$"
        ):
            emulate.encode(np.zeros(3, bool), "int8")
