"""Facts about the Format records, checked against ml_dtypes, hand-known values and JAX."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from emulate import formats
from emulate.formats import LOW_PRECISION, WIDE

ALL = LOW_PRECISION + WIDE
FLOATS_LP = [n for n in LOW_PRECISION if formats.get(n).is_float]
INTS_LP = [n for n in LOW_PRECISION if not formats.get(n).is_float]


def test_names_are_low_precision_then_p3109_then_wide() -> None:
    assert formats.names()[: len(LOW_PRECISION) + 12] == LOW_PRECISION + formats.P3109_BINARY8
    assert formats.names()[-len(WIDE) :] == WIDE
    assert len(set(formats.names())) == len(formats.names())


@pytest.mark.parametrize("name", ALL)
def test_record_name_and_dtype_round_trip(name: str) -> None:
    f = formats.get(name)
    assert f.name == name
    assert f.dtype.name == name
    assert formats.get(f.dtype) is f
    assert formats.get(f) is f
    assert f.is_low_precision == (name in LOW_PRECISION)


@pytest.mark.parametrize("name", FLOATS_LP + ["bfloat16", "float16"])
def test_float_fields_match_ml_dtypes_finfo(name: str) -> None:
    f = formats.get(name)
    info = ml_dtypes.finfo(f.dtype)
    assert f.is_float
    assert f.max == float(info.max)
    assert f.min_normal == float(info.smallest_normal)
    assert f.min_subnormal == float(info.smallest_subnormal)
    assert f.exponent_bits == int(info.nexp)
    assert f.mantissa_bits == int(info.nmant)
    assert f.min_normal == 2.0**f.emin
    # Width from the name: float8_*, float6_*, float4_*; bfloat16 / float16 are 16.
    assert f.bits == (16 if name in ("bfloat16", "float16") else int(name[5]))
    assert f.bits == int(f.signed) + f.exponent_bits + f.mantissa_bits


@pytest.mark.parametrize("name", INTS_LP + ["int32"])
def test_integer_fields_match_ml_dtypes_iinfo(name: str) -> None:
    f = formats.get(name)
    info = ml_dtypes.iinfo(f.dtype)
    assert not f.is_float and f.is_integer
    assert (f.max, f.min) == (float(info.max), float(info.min))
    assert f.signed == (info.min < 0)
    assert f.nan_codes == () and f.inf_codes == () and not f.has_inf
    assert f.min_normal == f.min_subnormal == 1.0


@pytest.mark.parametrize("name", LOW_PRECISION)
def test_nan_inf_codes_match_every_code(name: str) -> None:
    """Enumerate all 2**bits codes and compare the NaN / Inf sets."""
    f = formats.get(name)
    codes = np.arange(1 << f.bits, dtype=np.uint8)
    with np.errstate(invalid="ignore"):
        values = codes.view(f.dtype).astype(np.float64)
    assert f.nan_codes == tuple(int(c) for c in codes[np.isnan(values)])
    assert f.inf_codes == tuple(int(c) for c in codes[np.isinf(values)])
    finite = values[np.isfinite(values)]
    assert f.max == finite.max()
    assert f.min == finite.min()
    code = f.max_code
    assert float(np.array([code], np.uint8).view(f.dtype)[0]) == f.max


@pytest.mark.parametrize(
    "name, bits, bias, max_, nan, inf",
    [
        ("float8_e4m3fn", 8, 7, 448.0, (0x7F, 0xFF), ()),
        ("float8_e5m2", 8, 15, 57344.0, (0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF), (0x7C, 0xFC)),
        ("float8_e4m3fnuz", 8, 8, 240.0, (0x80,), ()),
        ("float8_e5m2fnuz", 8, 16, 57344.0, (0x80,), ()),
        ("float8_e4m3b11fnuz", 8, 11, 30.0, (0x80,), ()),
        (
            "float8_e3m4",
            8,
            3,
            15.5,
            tuple(range(0x71, 0x80)) + tuple(range(0xF1, 0x100)),
            (0x70, 0xF0),
        ),
        ("float6_e2m3fn", 6, 1, 7.5, (), ()),
        ("float6_e3m2fn", 6, 3, 28.0, (), ()),
        ("float4_e2m1fn", 4, 1, 6.0, (), ()),
        ("float8_e8m0fnu", 8, 127, 2.0**127, (0xFF,), ()),
    ],
)
def test_hand_known_float_facts(
    name: str, bits: int, bias: int, max_: float, nan: tuple[int, ...], inf: tuple[int, ...]
) -> None:
    f = formats.get(name)
    assert (f.bits, f.bias, f.max, f.nan_codes, f.inf_codes) == (bits, bias, max_, nan, inf)
    assert f.has_inf == bool(inf)
    assert f.has_nan == bool(nan)


@pytest.mark.parametrize("name", ["float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz"])
def test_fnuz_formats_have_no_signed_zero(name: str) -> None:
    f = formats.get(name)
    assert not f.signed_zero
    assert f.nan_codes == (0x80,)
    assert f.signed and f.min == -f.max


@pytest.mark.parametrize(
    "name", ["float8_e4m3fn", "float8_e5m2", "float8_e3m4", "float6_e2m3fn", "float4_e2m1fn"]
)
def test_ieee_like_formats_have_signed_zero(name: str) -> None:
    f = formats.get(name)
    assert f.signed_zero
    neg_zero = np.array([1 << (f.bits - 1)], np.uint8).view(f.dtype)
    assert float(neg_zero[0]) == 0.0 and np.signbit(neg_zero.astype(np.float32)[0])


def test_e8m0_has_no_subnormals_and_no_sign() -> None:
    f = formats.get("float8_e8m0fnu")
    assert not f.has_subnormals
    assert not f.signed and not f.signed_zero
    assert f.min_normal == f.min_subnormal == 2.0**-127
    assert f.emin == -127
    assert f.exponent_bits == 8 and f.mantissa_bits == 0


@pytest.mark.parametrize(
    "name, k",
    [
        ("int4", 0),
        ("uint4", 0),
        ("int8", 0),
        ("uint8", None),
        ("float4_e2m1fn", 1),
        ("float6_e2m3fn", 3),
        ("float6_e3m2fn", None),
        ("float8_e4m3fn", None),
        ("float8_e5m2", None),
        ("float8_e8m0fnu", None),
    ],
)
def test_int8_scale(name: str, k: int | None) -> None:
    assert formats.get(name).int8_scale == k


@pytest.mark.parametrize(
    "name", [n for n in LOW_PRECISION if formats.get(n).int8_scale is not None]
)
def test_int8_scale_maps_every_finite_value_to_int8(name: str) -> None:
    f = formats.get(name)
    codes = np.arange(1 << f.bits, dtype=np.uint8)
    values = codes.view(f.dtype).astype(np.float64)
    scaled = values[np.isfinite(values)] * 2.0**f.int8_scale
    assert np.all(scaled == np.round(scaled))
    assert scaled.min() >= -128 and scaled.max() <= 127


@pytest.mark.parametrize("name", LOW_PRECISION)
def test_exact_in_bf16_and_f32(name: str) -> None:
    """Every finite value of every low-precision format survives bf16 and f32."""
    f = formats.get(name)
    assert set(f.exact_in) == {"bfloat16", "float32"}
    codes = np.arange(1 << f.bits, dtype=np.uint8)
    with np.errstate(invalid="ignore"):
        values = codes.view(f.dtype).astype(np.float64)
    values = values[np.isfinite(values)]
    for wide in (ml_dtypes.bfloat16, np.float32):
        assert np.array_equal(values.astype(wide).astype(np.float64), values)


def test_float6_is_not_xla_storable() -> None:
    storable = {n: formats.get(n).xla_storable for n in ALL}
    assert [n for n, s in storable.items() if not s] == ["float6_e2m3fn", "float6_e3m2fn"]


def test_packable_and_code_mask() -> None:
    for n in LOW_PRECISION:
        f = formats.get(n)
        assert f.packable == (f.bits in (4, 6))
        assert f.code_mask == (1 << f.bits) - 1


@pytest.mark.parametrize(
    "spec, name",
    [
        ("e4m3", "float8_e4m3fn"),
        ("E4M3FN", "float8_e4m3fn"),
        ("fp8", "float8_e4m3fn"),
        ("e5m2", "float8_e5m2"),
        ("e2m1", "float4_e2m1fn"),
        ("fp4", "float4_e2m1fn"),
        ("e2m3", "float6_e2m3fn"),
        ("e3m2", "float6_e3m2fn"),
        ("e8m0", "float8_e8m0fnu"),
        ("s4", "int4"),
        ("u8", "uint8"),
        ("bf16", "bfloat16"),
        (" float8_e5m2fnuz ", "float8_e5m2fnuz"),
        (np.int8, "int8"),
        (np.dtype(np.uint8), "uint8"),
        (ml_dtypes.float8_e4m3b11fnuz, "float8_e4m3b11fnuz"),
        (ml_dtypes.float6_e2m3fn, "float6_e2m3fn"),
        (jnp.int4, "int4"),
        (jnp.float8_e4m3fn, "float8_e4m3fn"),
        (jnp.float4_e2m1fn, "float4_e2m1fn"),
        (jnp.float8_e8m0fnu, "float8_e8m0fnu"),
        (jnp.bfloat16, "bfloat16"),
        (jnp.dtype(jnp.uint4), "uint4"),
    ],
)
def test_get_accepts_names_aliases_and_dtypes(spec: object, name: str) -> None:
    assert formats.get(spec).name == name


def test_get_jax_array_dtype() -> None:
    x = jnp.zeros((2,), jnp.float8_e5m2)
    assert formats.get(x.dtype).name == "float8_e5m2"


@pytest.mark.parametrize("spec", ["float7", "e9m9", "int16"])
def test_get_unknown_name_lists_known_formats(spec: str) -> None:
    with pytest.raises(ValueError) as err:
        formats.get(spec)
    msg = str(err.value)
    assert repr(spec) in msg
    for n in formats.names():
        assert n in msg


def test_get_unsupported_dtype_lists_known_formats() -> None:
    with pytest.raises(ValueError) as err:
        formats.get(np.float64)
    assert "float64" in str(err.value) and "float8_e4m3fn" in str(err.value)


def test_get_rejects_non_format_objects() -> None:
    with pytest.raises(TypeError):
        formats.get(object())


def test_repr() -> None:
    assert repr(formats.get("e4m3")) == "Format('float8_e4m3fn')"


STORABLE = [n for n in ALL if formats.get(n).xla_storable]


def _jax_dot_result(a: str, b: str, pref: str | None = None) -> str:
    out = jax.eval_shape(
        lambda x, y: jax.lax.dot_general(
            x, y, (((1,), (0,)), ((), ())), preferred_element_type=pref and jnp.dtype(pref)
        ),
        jax.ShapeDtypeStruct((2, 4), jnp.dtype(a)),
        jax.ShapeDtypeStruct((4, 3), jnp.dtype(b)),
    )
    return out.dtype.name


@pytest.mark.parametrize("a, b", list(itertools.product(STORABLE, STORABLE)))
def test_dot_result_matches_lax_dot_general(a: str, b: str) -> None:
    try:
        expected = _jax_dot_result(a, b)
    except TypeError:
        with pytest.raises(TypeError):
            formats.dot_result(a, b)
        return
    assert formats.dot_result(a, b).name == expected


@pytest.mark.parametrize("a", STORABLE)
@pytest.mark.parametrize("pref", ["float32", "int32", "bfloat16"])
def test_dot_result_with_preferred_element_type(a: str, pref: str) -> None:
    try:
        expected = _jax_dot_result(a, a, pref)
    except TypeError:
        with pytest.raises(TypeError):
            formats.dot_result(a, a, pref)
        return
    assert formats.dot_result(a, a, pref).name == expected


def test_dot_result_examples() -> None:
    assert formats.dot_result("int8", "int8").name == "int8"
    assert formats.dot_result("e4m3", "e5m2").name == "float8_e5m2"
    assert formats.dot_result("int8", "bf16").name == "bfloat16"
    assert formats.dot_result("int8", "int8", "int32").name == "int32"


def test_get_names_the_argument_once():
    known = ", ".join(formats.names())
    with pytest.raises(ValueError) as e:
        formats.get("int9", arg="lhs_format")
    assert str(e.value) == f"lhs_format: unknown format 'int9'; known formats: {known}"
    with pytest.raises(TypeError) as t:
        formats.get(7, arg="rhs_format")
    assert str(t.value) == "rhs_format: expected a format name, a dtype or a Format, got int 7"
    with pytest.raises(ValueError) as d:
        formats.get(np.complex64, arg="to")
    assert str(d.value) == f"to: dtype complex64 is not a supported format; known formats: {known}"


def test_preferred_format_types():
    # lax.dot_general raises TypeError for a preferred_element_type that names no type
    assert formats.preferred_format("bf16").name == "bfloat16"
    with pytest.raises(TypeError, match=r"^preferred_element_type: unknown format 'junk'; "):
        formats.preferred_format("junk")
    with pytest.raises(TypeError, match=r"^preferred_element_type: expected a format name"):
        formats.preferred_format(5)
    with pytest.raises(
        ValueError, match=r"^preferred_element_type: dtype complex64 is not a supported format"
    ):
        formats.preferred_format(np.complex64)


def test_result_format_refuses_an_integer_result_of_floats():
    assert formats.result_format("int8", "int4", "int32").name == "int32"
    assert formats.result_format("int8", "bfloat16").name == "bfloat16"
    assert formats.dot_result("float8_e4m3fn", "int8", "int32").name == "int32"  # lax's rule
    with pytest.raises(
        TypeError,
        match=r"^preferred_element_type: an integer result \(int32\) needs integer operands, "
        r"got float8_e4m3fn x int8$",
    ):
        formats.result_format("float8_e4m3fn", "int8", "int32")


def test_promoted_is_jnp_result_type_for_every_pair():
    """formats.promoted (jnp.matmul's half of the result-type rule) against JAX's own
    jnp.result_type on every pair of operand formats; None where jnp has no promotion."""
    names = list(formats.MATMUL_OPERANDS) + list(formats.CODE_FORMATS)
    for a in names:
        for b in names:
            fa, fb = formats.get(a), formats.get(b)
            want = None
            if fa.xla_storable and fb.xla_storable:
                try:
                    want = np.dtype(jnp.result_type(fa.dtype, fb.dtype)).name
                except (TypeError, ValueError):  # jax's TypePromotionError is a ValueError
                    want = None
            assert formats.promoted(a, b) == want, (a, b)
    assert formats.promoted("int8", "uint8", "int8") == "int16"
    assert formats.promoted("bfloat16", "float16", "int8") == "float32"
    assert formats.promoted("float8_e4m3fn", "bfloat16", "float32") is None
