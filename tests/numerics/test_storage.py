"""pack / unpack round trips, the documented bit layout, and Packed as a pytree."""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import emulate
from emulate import formats
from emulate.numerics.storage import from_codes, to_codes, unpack_codes

PACKABLE = ["int4", "uint4", "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn"]
#: Every format narrower than a byte: the above and the integer code formats.
SUB_BYTE = PACKABLE + list(formats.CODE_FORMATS)


# A fixed pool of awkward shapes (length 1, odd lengths, every remainder mod 4) so that
# each compiled pack/unpack is reused across examples.
SHAPES = [(1,), (7,), (2, 9), (5, 1), (3, 4, 6), (1, 1, 3), (2, 3, 2, 5), (4, 11)]


@st.composite
def codes_and_axis(draw):
    name = draw(st.sampled_from(SUB_BYTE))
    bits = formats.get(name).bits
    shape = draw(st.sampled_from(SHAPES))
    codes = draw(hnp.arrays(np.uint8, shape, elements=st.integers(0, (1 << bits) - 1)))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    return name, codes, axis


@given(codes_and_axis())
def test_pack_round_trips(case):
    name, codes, axis = case
    p = emulate.pack(codes, name, axis=axis)
    np.testing.assert_array_equal(np.asarray(unpack_codes(p)), codes)
    assert p.shape == codes.shape
    n = codes.shape[axis]
    bits = formats.get(name).bits
    assert p.data.shape[axis] == -(-bits * n // 8)
    assert p.nbytes == codes.size // n * -(-bits * n // 8)


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (2, 0, 3)])
@pytest.mark.parametrize("name", ["int4", "float6_e2m3fn"])
def test_arrays_with_an_empty_axis_pack_and_unpack(name, shape):
    # an empty axis before the packed one left a reshape nothing to divide by (issue 49:
    # nnx.Linear(4, 0) quantized to int4 raised ZeroDivisionError)
    codes = np.zeros(shape, np.uint8)
    bits = formats.get(name).bits
    for axis in range(len(shape)):
        p = emulate.pack(codes, name, axis=axis)
        assert p.data.shape == tuple(
            -(-bits * n // 8) if d == axis else n for d, n in enumerate(shape)
        )
        assert np.asarray(unpack_codes(p)).shape == shape


def _bit_stream(codes: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """The documented layout, built bit by bit: element i at stream bits [bits*i,
    bits*(i+1)), least significant first, byte j = stream bits [8j, 8j+8)."""
    c = np.moveaxis(codes, axis, -1).astype(np.int64)
    n = c.shape[-1]
    nbytes = -(-bits * n // 8)
    out = np.zeros(c.shape[:-1] + (nbytes,), np.int64)
    for i in range(n):
        for t in range(bits):
            pos = bits * i + t
            out[..., pos // 8] |= ((c[..., i] >> t) & 1) << (pos % 8)
    return np.moveaxis(out.astype(np.uint8), -1, axis)


@given(codes_and_axis())
def test_every_width_packs_as_the_documented_bit_stream(case):
    name, codes, axis = case
    bits = formats.get(name).bits
    p = emulate.pack(codes, name, axis=axis)
    np.testing.assert_array_equal(np.asarray(p.data), _bit_stream(codes, bits, axis))


@pytest.mark.parametrize(
    ("name", "codes", "want"),
    [
        ("uint2", [1, 2, 3, 0, 3], [0b00_11_10_01, 0b11]),
        ("int3", [7, 1, 5, 2, 0, 6, 3, 4], [0b01_001_111, 0b0_000_010_1, 0b100_011_11]),
        ("uint5", [31, 1], [0b001_11111, 0b00]),
    ],
)
def test_narrow_layouts_by_hand(name, codes, want):
    p = emulate.pack(np.array(codes, np.uint8), name)
    assert np.asarray(p.data).tolist() == want


def test_int2_arrays_pack_as_two_bit_codes():
    x = np.array([-2, -1, 0, 1], ml_dtypes.int2)
    p = emulate.pack(jnp.asarray(x))
    assert np.asarray(p.data).tolist() == [0b01_00_11_10]
    assert np.asarray(unpack_codes(p)).tolist() == [2, 3, 0, 1]


def test_nibble_order_low_first():
    p = emulate.pack(np.array([0x1, 0x2, 0x3], np.uint8), "uint4")
    assert np.asarray(p.data).tolist() == [0x21, 0x03]


def test_six_bit_layout_little_endian_stream():
    c = np.array([0x01, 0x02, 0x03, 0x3F, 0x15], np.uint8)
    p = emulate.pack(c, "float6_e3m2fn")
    word = 0x01 | 0x02 << 6 | 0x03 << 12 | 0x3F << 18
    want = [word & 0xFF, word >> 8 & 0xFF, word >> 16 & 0xFF, 0x15]
    assert np.asarray(p.data).tolist() == want


def test_pack_typed_arrays_and_unpack_to_dtype():
    x = np.array([[-8, 7, 0], [1, -1, 3]], ml_dtypes.int4)
    p = emulate.pack(jnp.asarray(x), axis=0)
    u = emulate.unpack(p)
    assert u.dtype == jnp.int4
    np.testing.assert_array_equal(np.asarray(u).astype(np.int32), x.astype(np.int32))
    f6 = np.array([0.5, -3.0, 7.5], ml_dtypes.float6_e2m3fn)
    u6 = emulate.unpack(emulate.pack(f6))
    assert u6.dtype == jnp.uint8  # XLA cannot hold float6: codes come back
    np.testing.assert_array_equal(np.asarray(u6), f6.view(np.uint8))


def test_packed_through_jit_vmap_and_device_put():
    codes = np.arange(2 * 3 * 5, dtype=np.uint8).reshape(2, 3, 5) % 16
    want = emulate.decode(codes, "float4_e2m1fn", to=jnp.float32)
    stacked = emulate.pack(codes, "float4_e2m1fn")  # (2, 3, 3) bytes
    p = jax.device_put(stacked)
    got = jax.jit(lambda q: emulate.decode(q, to=jnp.float32))(p)
    np.testing.assert_array_equal(got, want)
    per_row = jax.vmap(lambda q: emulate.decode(q, to=jnp.float32))(p)
    np.testing.assert_array_equal(per_row, want)
    out = jax.jit(lambda c: emulate.pack(c, "float4_e2m1fn"))(codes)
    assert isinstance(out, emulate.Packed) and out.shape == (2, 3, 5)


class TestBadInput:
    def test_pack_8_bit(self):
        with pytest.raises(
            ValueError, match=r"^x: int8 is 8-bit, stored one a byte already; pack accepts"
        ):
            emulate.pack(np.zeros(4, np.int8))

    def test_axis_out_of_range(self):
        with pytest.raises(
            ValueError, match=r"^axis: 2 is out of range for an array of shape \(4,\)$"
        ):
            emulate.pack(np.zeros(4, np.uint8), "int4", axis=2)

    def test_length_disagrees(self):
        p = emulate.pack(np.zeros((2, 6), np.uint8), "int4")
        with pytest.raises(
            ValueError,
            match=r"^length: 9 int4 elements need 5 bytes along axis -1, the data has 3$",
        ):
            emulate.Packed(p.data, "int4", -1, 9)

    def test_format_disagrees(self):
        p = emulate.pack(np.zeros(4, np.uint8), "int4")
        with pytest.raises(
            ValueError, match=r"^fmt: uint4 disagrees with the Packed array's format int4$"
        ):
            emulate.decode(p, "uint4")


def _doc_packing_examples() -> list[tuple[str, list[int], str]]:
    """The worked examples of docs/quantized.md's "emulate's own packing"."""
    import pathlib

    doc = pathlib.Path(__file__).resolve().parents[2] / "docs" / "quantized.md"
    rows = doc.read_text().split("<!-- packing examples -->")[1].strip().splitlines()[2:]
    out = []
    for line in rows:
        if not line.startswith("|"):
            break
        fmt, codes, hexbytes = (c.strip() for c in line.strip("|").split("|"))
        out.append((fmt, [int(c) for c in codes.split(",")], hexbytes))
    return out


def test_the_documented_packing_examples() -> None:
    examples = _doc_packing_examples()
    assert [e[0] for e in examples] == ["uint4", "uint2", "uint3", "uint5", "uint6"]
    for fmt, codes, hexbytes in examples:
        bits = formats.get(fmt).bits
        stream = sum(c << (bits * i) for i, c in enumerate(codes))  # little-endian stream
        want = stream.to_bytes(-(-bits * len(codes) // 8), "little")
        assert want.hex(" ") == hexbytes, fmt
        got = emulate.pack(np.array(codes, np.uint8), fmt).data
        assert bytes(np.asarray(got)) == want, fmt


def test_int4_from_codes_is_a_value_convert_not_a_bitcast():
    """XLA:TPU (libtpu 0.0.42, v5e) drops a uint4 -> int4 bitcast that feeds a dot and
    reads the codes as unsigned: ones(2, 5) . codes 8 gave +40 on the chip, not -40. The
    codes become int4 by a value convert of the sign-extended codes instead."""
    codes = jnp.arange(16, dtype=jnp.uint8)
    text = jax.jit(lambda c: from_codes(c, "int4")).lower(codes).as_text()
    assert "bitcast_convert" not in text
    got = np.asarray(from_codes(codes, "int4")).astype(np.int64)
    assert got.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1]
    dn = (((1,), (0,)), ((), ()))
    ones, eights = jnp.ones((2, 5), jnp.uint8), jnp.full((5, 3), 8, jnp.uint8)
    out = emulate.dot_general(
        ones,
        eights,
        dn,
        lhs_format="int4",
        rhs_format="int4",
        preferred_element_type=jnp.int32,
        target="tpu_v5e",
    )
    assert np.asarray(out).tolist() == [[-40] * 3] * 2


def test_numpy_arrays_give_their_codes_in_any_byte_order():
    # to_codes reads a numpy array's bits by a view: the codes are the values' bits in
    # numpy's own encoding (the oracle), whatever the array's byte order
    values = np.array([1.0, -2.5, 0.0, np.inf], np.float32)
    want = values.view(np.uint32)
    for dt in ("<f4", ">f4"):
        got, f = to_codes(values.astype(dt))
        assert f.name == "float32" and got.dtype == jnp.uint32
        np.testing.assert_array_equal(np.asarray(got), want)
    ints = np.arange(-8, 8)
    got, f = to_codes(ints.astype(ml_dtypes.int4))
    assert f.name == "int4" and got.dtype == jnp.uint8
    np.testing.assert_array_equal(np.asarray(got), ints % 16)  # two's complement nibbles
