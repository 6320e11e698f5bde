"""quantize / dequantize / QArray against the independent numpy oracle (emulate.reference),
and the OCP MX rules on hand-worked values."""

from __future__ import annotations

import re
from fractions import Fraction

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _sweeps import examples
from hypothesis import given, settings
from hypothesis import strategies as st

import emulate
from emulate import mx, reference
from emulate.numerics.rounding import ROUNDINGS, STOCHASTIC, random_integers
from emulate.quantized.array import QArray

# (element format, scale_rule, scale_fmt, tensor_scale): every element format with the
# OCP rule, every rule with an 8-bit, a 4-bit and an integer element format. By default
# the OCP rule runs one format of each encoding (float8_e4m3fn, float6_e2m3fn,
# float4_e2m1fn, packed int4): float8_e5m2, float6_e3m2fn and int8 take the same code path
# with other widths (int8 runs by default with the other rules), and are long; each other
# (rule, scale format) runs with one of the three formats (in turn), the other two long
# (EMULATE_LONG_TESTS=1).
_OCP_LONG = ("float8_e5m2", "float6_e3m2fn", "int8")
_RULES = (
    ("round_up", "float8_e8m0fnu", False),
    ("ceil", "float8_e8m0fnu", False),
    ("even", "float8_e8m0fnu", False),
    ("ocp_floor", "float32", False),
    ("absmax", "float32", False),
    ("absmax", "bfloat16", False),
    ("absmax", "float8_e4m3fn", True),
)
_RULE_FORMATS = ("float8_e4m3fn", "float4_e2m1fn", "int8")
CASES = (
    [
        pytest.param(
            (f, "ocp_floor", "float8_e8m0fnu", False),
            marks=pytest.mark.long if f in _OCP_LONG else (),
        )
        for f in (
            "float8_e4m3fn",
            "float8_e5m2",
            "float6_e2m3fn",
            "float6_e3m2fn",
            "float4_e2m1fn",
            "int8",
            "int4",
        )
    ]
    + [
        pytest.param((f, rule, sf, ts), marks=() if i % 3 == j else pytest.mark.long)
        for j, f in enumerate(_RULE_FORMATS)
        for i, (rule, sf, ts) in enumerate(_RULES)
    ]
    # float16 scales: by default in test_quantize_into_narrow_integers_matches_reference
    # (int3, absmax); a tensor scale with absmax: float8_e4m3fn's case above; long here
    + [
        pytest.param(("float6_e2m3fn", "absmax", "float16", True), marks=pytest.mark.long),
        pytest.param(("int4", "absmax", "float16", False), marks=pytest.mark.long),
    ]
)
# (shape, axis, block): a fixed pool, so compiled programs are reused across examples
LAYOUTS = [
    ((33, 5), 0, 16),  # ragged last block
    ((6, 7), 1, 1),  # a scale per element
    ((4, 40), -1, 16),  # ragged, blocks along the last axis
]
SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 2.0**-130, -(2.0**-127), 3.0e38, 1.0e-30]


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.name.startswith("float6"):
        return a.view(np.uint8)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _codes(q: QArray) -> np.ndarray:
    """The QArray's codes as an ml_dtypes array of its format (float6 included)."""
    c = np.asarray(emulate.unpack(q.codes) if isinstance(q.codes, emulate.Packed) else q.codes)
    if q.format_name.startswith("float6"):
        return c.astype(np.uint8).view(getattr(ml_dtypes, q.format_name))
    return c


@st.composite
def _inputs(draw):
    shape, axis, block = draw(st.sampled_from(LAYOUTS))
    n = int(np.prod(shape))
    scale = draw(st.sampled_from([1.0, 2.0**-40, 2.0**40, 1e-3]))
    base = draw(
        st.lists(
            st.floats(-8, 8, allow_nan=False, width=32) | st.sampled_from(SPECIAL),
            min_size=n,
            max_size=n,
        )
    )
    x = (np.asarray(base, np.float64) * scale).astype(np.float32).reshape(shape)
    if draw(st.booleans()):  # a zero block
        idx = [slice(None)] * len(shape)
        idx[axis] = slice(0, block)
        x[tuple(idx)] = 0.0
    return x, axis, block


@pytest.mark.parametrize("case", CASES, ids=lambda r: "-".join(map(str, r)))
# each layout compiles its programs: 2 examples by default (the 13 default cases draw the
# three layouts between them), 8 long
@settings(max_examples=examples(2, 8))
@given(data=_inputs())
def test_quantize_matches_reference(case, data):
    x, axis, block = data
    fmt, scale_rule, scale_fmt, ts = case
    q = emulate.quantize(
        x,
        fmt,
        block_shape=block,
        axis=axis,
        scale_fmt=scale_fmt,
        scale_rule=scale_rule,
        tensor_scale=ts,
        ragged=True,
    )
    codes, scales, t = reference.quantize(
        x, fmt, q.block_shape, scale_fmt=scale_fmt, scale_rule=scale_rule, tensor_scale=ts
    )
    np.testing.assert_array_equal(_bits(_codes(q)), _bits(codes))
    np.testing.assert_array_equal(_bits(q.scales), _bits(scales))
    if ts:
        assert float(q.tensor_scale) == t
    else:
        assert q.tensor_scale is None
    want = reference.dequantize(codes, scales, q.block_shape, t)
    np.testing.assert_array_equal(_bits(emulate.dequantize(q)), _bits(want))


# Every narrow integer format with each rule; by default int2 with the OCP rule and int3
# with absmax (the other widths pack and round through the same code), the other six long
# (EMULATE_LONG_TESTS=1).
_NARROW_DEFAULT = (("int2", "ocp_floor"), ("int3", "absmax"))


@pytest.mark.parametrize(
    ("fmt", "scale_rule", "scale_fmt"),
    [
        pytest.param(
            f,
            rule,
            sf,
            marks=() if (f, rule) in _NARROW_DEFAULT else pytest.mark.long,
        )
        for rule, sf in (("ocp_floor", "e8m0"), ("absmax", "f16"))
        for f in ("int2", "int3", "int5", "int6")
    ],
)
@settings(max_examples=examples(2, 4))  # 2 by default, 4 under EMULATE_LONG_TESTS=1
@given(data=_inputs())
def test_quantize_into_narrow_integers_matches_reference(fmt, scale_rule, scale_fmt, data):
    x, axis, block = data
    q = emulate.quantize(
        x,
        fmt,
        block_shape=block,
        axis=axis,
        scale_fmt=scale_fmt,
        scale_rule=scale_rule,
        ragged=True,
    )
    assert isinstance(q.codes, emulate.Packed) and q.codes.format_name == fmt
    codes, scales, _ = reference.quantize(
        x, fmt, q.block_shape, scale_fmt=scale_fmt, scale_rule=scale_rule
    )
    bits = emulate.formats.get(fmt).bits
    c = np.asarray(emulate.unpack(q.codes)).astype(np.int64)  # two's complement codes
    np.testing.assert_array_equal(np.where(c >= 1 << (bits - 1), c - (1 << bits), c), codes)
    np.testing.assert_array_equal(_bits(q.scales), _bits(scales))
    want = reference.dequantize(codes, scales, q.block_shape)
    np.testing.assert_array_equal(_bits(emulate.dequantize(q)), _bits(want))


#: Every preset by default but three under EMULATE_LONG_TESTS=1, each the rule of a default
#: one with another element format of its width: MXFP8_E5M2 (MXFP8_E4M3's), MXFP6_E3M2
#: (MXFP6_E2M3's) and FP8_PER_CHANNEL (INT8_PER_CHANNEL's, float8 codes as FP8_BLOCK_128x128).
_PRESETS_LONG = ("MXFP8_E5M2", "MXFP6_E3M2", "FP8_PER_CHANNEL")


@pytest.mark.parametrize(
    "scheme",
    [
        pytest.param(s, marks=pytest.mark.long) if s.name in _PRESETS_LONG else s
        for s in mx.SCHEMES.values()
    ],
    ids=lambda s: s.name,
)
def test_presets_round_trip_against_reference(scheme):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((256, 256)) * np.exp2(rng.integers(-6, 6, (256, 1)))).astype(
        np.float32
    )
    x[3, :40] = 0.0
    q = emulate.quantize(x, scheme)
    assert q.format_name == scheme.format and q.scale_format == scheme.scale_format
    codes, scales, t = reference.quantize(
        x,
        scheme.format,
        q.block_shape,
        scale_fmt=scheme.scale_format,
        scale_rule=scheme.scale_rule,
        tensor_scale=scheme.tensor_scale,
        element_exponent=scheme.element_exponent,
    )
    np.testing.assert_array_equal(_bits(_codes(q)), _bits(codes))
    np.testing.assert_array_equal(_bits(q.scales), _bits(scales))
    deq = emulate.dequantize(q)
    want = reference.dequantize(codes, scales, q.block_shape, t, q.element_exponent)
    np.testing.assert_array_equal(_bits(deq), _bits(want))
    # The round trip loses at most half a step of the element grid (plus saturation).
    assert np.all(np.isfinite(np.asarray(deq)))


def _mx_by_hand(values, emax):
    """OCP MX v1.0 section 6.3, the shared scale of one block, in Fractions:
    X = 2**(floor(log2 amax) - emax)."""
    amax = max(abs(Fraction(float(v))) for v in values)
    e = amax.numerator.bit_length() - amax.denominator.bit_length()
    if Fraction(2) ** e > amax:
        e -= 1
    return Fraction(2) ** (e - emax)


def test_ocp_rule_on_worked_values():
    # MXFP8 E4M3 (emax 8, max 448): amax 1000 -> X = 2**(9 - 8) = 2, 1000/2 = 500 saturates.
    block = np.array([1000.0, 3.0, -0.5] + [0.0] * 29, np.float32)
    q = emulate.quantize(block, mx.MXFP8_E4M3)
    assert _mx_by_hand(block, 8) == 2
    assert float(np.asarray(q.scales, np.float32)[0]) == 2.0
    assert np.asarray(q.codes, np.float32)[:3].tolist() == [448.0, 1.5, -0.25]
    # MXFP4 (emax 2): amax 7 -> X = 1 and 7 saturates to 6; round_up takes X = 2 and
    # 7/2 = 3.5 rounds to even 4.
    block = np.array([7.0, 1.25, -2.5] + [0.0] * 29, np.float32)
    q = emulate.quantize(block, mx.MXFP4, packed=False)
    assert float(np.asarray(q.scales, np.float32)[0]) == 1.0
    assert np.asarray(q.codes, np.float32)[:3].tolist() == [6.0, 1.0, -2.0]
    q = emulate.quantize(block, mx.MXFP4, scale_rule="round_up", packed=False)
    assert float(np.asarray(q.scales, np.float32)[0]) == 2.0
    assert np.asarray(q.codes, np.float32)[:3].tolist() == [4.0, 0.5, -1.0]
    # MXINT8 (OCP): scale X = 2**floor(log2 amax) (emax 0), elements int8 * 2**-6
    block = np.array([100.0, -3.0] + [0.0] * 30, np.float32)
    q = emulate.quantize(block, mx.MXINT8)
    assert float(np.asarray(q.scales, np.float32)[0]) == 2.0**6
    assert np.asarray(q.codes)[:2].tolist() == [100, -3]


def test_nan_block_dequantizes_to_nan_and_others_survive():
    x = np.ones((64,), np.float32)
    x[5] = np.nan
    q = emulate.quantize(x, mx.MXFP8_E4M3)
    d = np.asarray(emulate.dequantize(q))
    assert np.isnan(d[:32]).all() and (d[32:] == 1.0).all()
    assert np.isnan(np.asarray(q.scales, np.float32)[0])


_SCALE_EDGES = {
    "float8_e8m0fnu": None,  # every code, 0 (2**-127) to 254 (2**127) and 255 (NaN)
    "float32": [2.0**-126, 2.0**-100, 1.5, 3.0 * 2.0**100, 2.0**127, 3.4e38, 0.0, np.inf],
    "float8_e4m3fn": [2.0**-9, 0.875 * 2.0**-6, 1.0, 448.0, 0.0],
}


@pytest.mark.parametrize("sf", list(_SCALE_EDGES))
@pytest.mark.parametrize("fmt", ["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "int8"])
@settings(max_examples=examples(2, 6))  # 2 by default, 6 under EMULATE_LONG_TESTS=1
@given(data=st.data())
def test_dequantize_at_the_scale_extremes_matches_reference(fmt, sf, data):
    # Scales (and scale x tensor scale) from 2**-254 to 2**254: products that land in range
    # survive, the rest overflow or flush exactly as the oracle says.
    f = emulate.formats.get(fmt)
    codes = np.asarray(data.draw(st.lists(st.integers(0, 255), min_size=64, max_size=64)), np.uint8)
    codes = np.where(np.isin(codes, f.nan_codes + f.inf_codes), 0, codes).astype(np.uint8)
    codes = (codes & ((1 << f.bits) - 1)).reshape(16, 4).view(f.dtype)
    edges = _SCALE_EDGES[sf]
    if edges is None:
        raw = data.draw(st.lists(st.sampled_from([0, 1, 2, 100, 127, 200, 253, 254, 255]),
                                 min_size=8, max_size=8))  # fmt: skip
        scales = np.asarray(raw, np.uint8).view(ml_dtypes.float8_e8m0fnu).reshape(2, 4)
    else:
        vals = data.draw(st.lists(st.sampled_from(edges), min_size=8, max_size=8))
        scales = np.asarray(vals, np.float64).astype(getattr(ml_dtypes, sf, sf)).reshape(2, 4)
    ts = None
    if sf != "float8_e8m0fnu":
        ts = data.draw(st.sampled_from([None, 2.0**-126, 2.0**-100, 1.5 * 2.0**126]))
    q = QArray.from_parts(jnp.asarray(codes), jnp.asarray(scales), block_shape=(8, 1),
                          tensor_scale=ts)  # fmt: skip
    got = np.asarray(emulate.dequantize(q, to=jnp.float32))
    want = reference.dequantize(codes, scales, (8, 1), ts)
    num = ~np.isnan(want)
    assert np.array_equal(got, want, equal_nan=True), (got, want)
    assert np.array_equal(np.signbit(got[num]), np.signbit(want[num])), (got, want)


def test_qarray_is_a_pytree_and_packs_sub_byte_codes():
    x = np.linspace(-3, 3, 64 * 8, dtype=np.float32).reshape(64, 8)
    q = emulate.quantize(x, mx.MXFP4, axis=0)
    assert isinstance(q.codes, emulate.Packed) and q.codes.data.shape == (32, 8)
    assert q.nbytes == 32 * 8 + 2 * 8  # half a byte per element plus one e8m0 per 32
    assert q.shape == (64, 8) and q.block_shape == (32, 1) and q.axes == (0,)
    same = jax.jit(lambda v: v)(q)
    assert isinstance(same, QArray)
    np.testing.assert_array_equal(np.asarray(same.dequantize()), np.asarray(q.dequantize()))
    leaves = jax.tree_util.tree_leaves(q)
    assert len(leaves) == 2  # packed bytes and scales (no tensor scale)


def test_from_parts_checks_shapes():
    codes = jnp.zeros((64, 8), jnp.float4_e2m1fn)
    scales = jnp.ones((2, 8), jnp.float8_e8m0fnu)
    q = QArray.from_parts(codes, scales, block_shape=(32, 1), dtype=jnp.bfloat16)
    assert q.dtype == np.dtype(jnp.bfloat16) and q.scale_format == "float8_e8m0fnu"
    with pytest.raises(ValueError, match=re.escape("scales: expected shape (2, 8)")):
        QArray.from_parts(codes, jnp.ones((2, 4), jnp.float8_e8m0fnu), block_shape=(32, 1))
    with pytest.raises(ValueError, match="scales: dtype int8 is not a scale format"):
        QArray.from_parts(codes, jnp.ones((2, 8), jnp.int8), block_shape=(32, 1))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(fmt="float4_e2m1fn", block_shape=32, axis=0),
            "block_shape: 32 does not divide axis 0 of length 40; pass ragged=True",
        ),
        (dict(fmt="float8_e4m3fn", scale_rule="nearest"), "scale_rule: expected one of"),
        (
            dict(fmt="float8_e4m3fn", scale_fmt="int8"),
            "scale_fmt: int8 is not a scale format; expected bfloat16, float16, float32 or a "
            "float format of at most 8 bits with a NaN code",
        ),
        (
            dict(fmt="float4_e2m1fn", saturate=False),
            "saturate: float4_e2m1fn has neither Inf nor NaN",
        ),
        (
            dict(fmt="float8_e4m3fn", rounding="stochastic"),
            "key: rounding='stochastic' needs a jax.random key (jax.random.key(seed)); the "
            "same key gives the same rounding",
        ),
        (dict(fmt="float8_e4m3fn", rounding="up"), "rounding: expected one of ('nearest_even',"),
        (dict(fmt="float8_e4m3fn", axis=2), "axis: 2 is not an axis of x with shape (40, 3)"),
        (
            dict(fmt="float8_e4m3fn", scale_rule="absmax"),
            "scale_rule: 'absmax' makes scales that are not powers of two",
        ),
        (
            dict(fmt="float4_e2m1fn", scale_fmt="float32", scale_rule="absmax", tensor_scale=True),
            "tensor_scale: needs a narrow scale format",
        ),
        (dict(fmt="bfloat16"), "fmt: expected a low-precision element format"),
    ],
)
def test_bad_arguments_name_themselves(kwargs, message):
    x = np.ones((40, 3), np.float32)
    fmt = kwargs.pop("fmt")
    with pytest.raises(ValueError, match=re.escape(message)):
        emulate.quantize(x, fmt, **kwargs)


def test_non_float_input_is_a_type_error():
    with pytest.raises(TypeError, match="x: expected a float array"):
        emulate.quantize(np.ones((4,), np.int32), "int8")
    with pytest.raises(TypeError, match="q: expected an emulate.QArray"):
        emulate.dequantize(np.ones(3))


# --------------------------------------------------------------------------- array protocol


def _oracle_values(q: emulate.QArray) -> np.ndarray:
    ts = None if q.tensor_scale is None else float(q.tensor_scale)
    return reference.dequantize(
        np.asarray(q.unpacked_codes()), np.asarray(q.scales), q.block_shape, ts
    )


# MXFP8_E4M3 (unpacked codes, MXFP4's e8m0 scale blocks) under EMULATE_LONG_TESTS=1
@pytest.mark.parametrize(
    "scheme",
    [
        "MXFP4",
        "MXFP6_E2M3",
        "NVFP4",
        "INT4_G128",
        pytest.param("MXFP8_E4M3", marks=pytest.mark.long),
    ],
)
def test_transpose_moves_codes_scales_and_blocks(scheme):
    w = jax.random.normal(jax.random.key(3), (3, 64, 16))
    q = emulate.quantize(w, emulate.mx.SCHEMES[scheme], axis=1)
    t = q.T
    assert t.shape == (16, 64, 3) and t.block_shape == tuple(reversed(q.block_shape))
    np.testing.assert_array_equal(_oracle_values(t), _oracle_values(q).transpose(2, 1, 0))
    assert t.T.shape == q.shape


def test_qarray_indexing_and_key_paths():
    q = emulate.quantize(jnp.ones((64, 8)), emulate.mx.MXFP4, axis=0)
    assert q[...] is q and q[()] is q
    with pytest.raises(ValueError, match=r"^key: axis 0 of this QArray is blocked"):
        q[0]
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(q)[0]]
    assert paths == [".codes.data", ".scales"]
    assert (q.ndim, q.size, q.dtype) == (2, 512, np.dtype(np.float32))


# Each mode but the default (tested above) with one scheme in CI, and "stochastic" with
# two; every scheme in every mode under the long marker (one compile each, about 2 s).
ROUNDING_CI = {
    ("MXFP4", "stochastic"),
    ("MXINT8", "stochastic"),
    ("MXFP4", "stochastic_fastest"),
    ("MXFP8_E4M3", "nearest_away"),
    ("NVFP4", "toward_zero"),
    ("INT4_G128", "toward_positive"),
    ("FP8_BLOCK_128x128", "toward_negative"),
}
ROUNDING_CASES = [
    pytest.param(name, mode, marks=() if (name, mode) in ROUNDING_CI else pytest.mark.long)
    for name in mx.SCHEMES
    for mode in ROUNDINGS[1:]
]
X_ROUNDING = (
    np.random.default_rng(3).standard_normal((8, 256))
    * np.exp2(np.random.default_rng(4).integers(-8, 8, (8, 1)))
).astype(np.float32)
X_ROUNDING[0, :5] = [0.0, -0.0, 1e-30, 2.0**-126, -3.0e-39]


@pytest.mark.parametrize("scheme, rounding", ROUNDING_CASES)
def test_quantize_rounding_modes_match_reference(scheme, rounding):
    """Each mode rounds the scaled elements as the numpy oracle does (with the same random
    integers: element i takes the top bits of jax.random.bits(key, x.shape)[i]); the scales
    do not depend on the mode (the oracle computes them without it)."""
    s, x = mx.SCHEMES[scheme], X_ROUNDING.copy()
    x[1, :32] = 1.0625  # with 256 in the block, an e4m3 tie at scale 1 (for nearest_away)
    x[1, 0] = 256.0
    key, n = jax.random.key(11), 9
    extra = dict(key=key, random_bits=n) if rounding in STOCHASTIC else {}
    q = emulate.quantize(x, s, rounding=rounding, **extra)
    r = np.asarray(random_integers(key, x.shape, n)) if rounding in STOCHASTIC else None
    codes, scales, t = reference.quantize(
        x,
        s.format,
        q.block_shape,
        scale_fmt=s.scale_format,
        scale_rule=s.scale_rule,
        tensor_scale=s.tensor_scale,
        element_exponent=s.element_exponent,
        rounding=rounding,
        random_values=r,
        random_bits=n if r is not None else None,
    )
    np.testing.assert_array_equal(_bits(_codes(q)), _bits(codes))
    np.testing.assert_array_equal(_bits(q.scales), _bits(scales))
    nearest = reference.quantize(
        x,
        s.format,
        q.block_shape,
        scale_fmt=s.scale_format,
        scale_rule=s.scale_rule,
        tensor_scale=s.tensor_scale,
        element_exponent=s.element_exponent,
    )[0]
    if rounding != "nearest_away" or scheme == "MXFP8_E4M3":
        assert (_bits(codes) != _bits(nearest)).any()


def test_stochastic_mxfp4_is_unbiased_on_average():
    """MXFP4 of 1.125, a quarter of the way from 1.0 to 1.5 (neighbours in e2m1), in
    blocks whose scale is 1: the fraction has 2 bits, so exactly a quarter of the random
    integers round up and the mean over many elements is close to 1.125, where
    round-to-nearest gives 1.0 everywhere."""
    x = np.full((8, 256), 1.125, np.float32)
    x[:, ::32] = 6.0  # each block's maximum: scale 2**0
    q = emulate.quantize(x, mx.MXFP4, rounding="stochastic", key=jax.random.key(0), random_bits=9)
    d = np.asarray(emulate.dequantize(q))
    d = d[x != 6.0]
    assert set(np.unique(d).tolist()) == {1.0, 1.5}
    assert abs(float(d.mean()) - 1.125) < 0.02
