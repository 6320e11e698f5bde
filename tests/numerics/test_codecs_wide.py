"""The P3109 formats of 9 to 16 bits (uint16 codes) against gfloat 0.5 (graphcore-research/
gfloat): every code of the formats up to 12 bits and a sample of the 16-bit ones decoded as
``decode_float`` decodes them; rounding in every mode, stochastic ones with explicit random
integers (gfloat's ``srbits``), as ``round_float`` / ``encode_float`` round; matmuls on the
XLA route against emulate.reference within the contract's bound; and the refusals, where
a path takes codes of at most 8 bits, word for word."""

from __future__ import annotations

import re

import gfloat
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _gfloat_cases import GFLOAT_MODES
from _record_formats import gfloat_info
from hypothesis import given, settings
from hypothesis import strategies as st

import emulate
from emulate import formats, reference
from emulate.numerics.rounding import ROUNDINGS, STOCHASTIC
from emulate.planning import slicing
from emulate.reference import rounding as reference_rounding

#: Built wide formats of each kind: 8-bit exponent fields (bias 128, values down to float32
#: denormals: k9p2ue, k10p2se, k16p8se), bfloat16-exact ones (k12p6se), float32-only ones.
CHECKED = [
    "p3109_k9p2ue",
    "p3109_k10p2se",
    "p3109_k11p5sf",
    "p3109_k12p6se",
    "p3109_k12p12uf",
    "p3109_k16p8se",
    "p3109_k16p11se",
    "p3109_k16p16uf",
]
RANDOM_BITS = 7
N = 1024  # every encode call here has this shape, so each (format, mode) compiles once


def _codes(f: formats.Format) -> np.ndarray:
    """Every code up to 12 bits; for 16 bits the 256 codes at each end of each sign's
    magnitudes (zero, the subnormals, max, Inf, NaN) and every 61st code."""
    if f.bits <= 12:
        return np.arange(1 << f.bits, dtype=np.uint16)
    half = 1 << (f.bits - 1)
    edges = [*range(256), *range(half - 256, half + 256), *range(2 * half - 256, 2 * half)]
    return np.array(sorted(set(edges) | set(range(0, 2 * half, 61))), np.uint16)


def _gfloat_values(f: formats.Format, codes: np.ndarray) -> np.ndarray:
    fi = gfloat_info(f)
    return np.array([gfloat.decode_float(fi, int(c)).fval for c in codes])


@pytest.mark.parametrize("name", CHECKED)
def test_codes_decode_as_gfloat_decodes_them(name: str) -> None:
    f = formats.get(name)
    assert f.dtype == np.uint16 and f.bits > 8
    codes = _codes(f)
    want = _gfloat_values(f, codes)
    got = np.asarray(emulate.decode(codes, name, to=jnp.float32)).astype(np.float64)
    oracle = reference.decode(codes, name, to=np.float64)
    nan = np.isnan(want)
    assert np.isnan(got[nan]).all() and np.isnan(oracle[nan]).all()
    for values in (got, oracle):
        assert np.array_equal(values[~nan], want[~nan])
        assert np.array_equal(np.signbit(values[~nan]), np.signbit(want[~nan]))
    if "bfloat16" in f.exact_in:
        bf16 = np.asarray(emulate.decode(codes, name, to=jnp.bfloat16)).astype(np.float64)
        assert np.array_equal(bf16, got, equal_nan=True)


def test_an_8_bit_exponent_field_decodes_to_float32_denormal_bits() -> None:
    # p3109_k10p2se: bias 128, one trailing bit; codes 1 to 3 are float32 denormals.
    codes = np.array([1, 2, 3, 4, 0x1FD, 0x201], np.uint16)
    got = emulate.decode(codes, "p3109_k10p2se", to=jnp.float32)
    bits = np.asarray(jax.lax.bitcast_convert_type(got, jnp.uint32)).tolist()
    # 2**-128, 2**-127, 1.5 * 2**-127 (denormals), 2**-126 (normal), 1.5 * 2**126, -2**-128
    assert bits == [0x00200000, 0x00400000, 0x00600000, 0x00800000, 0x7EC00000, 0x80200000]


def _sample(f: formats.Format, seed: int = 0) -> np.ndarray:
    """N float32 inputs: ties between neighbouring values of a sample of codes and the
    float32 numbers either side of each, the values themselves, random bit patterns, values
    past max, the specials; both signs."""
    rng = np.random.default_rng(seed)
    v = np.unique(np.abs(_gfloat_values(f, _codes(f))))
    v = v[np.isfinite(v)]
    ties = ((v[:-1] + v[1:]) / 2).astype(np.float32)
    ties = rng.choice(ties, 96, replace=False)
    step = float(v[-1] - v[-2])
    with np.errstate(over="ignore"):  # past float32's max for k16p8se: +Inf, also a case
        beyond = np.float32([v[-1] + step / 2, v[-1] + step, 2 * v[-1]])
    specials = np.float32([0.0, np.inf, np.nan, f.min_subnormal, f.min_subnormal / 2, f.max])
    pos = np.concatenate(
        [
            ties,
            np.nextafter(ties, np.float32(np.inf)),
            np.nextafter(ties, np.float32(0)),
            rng.choice(v, 64).astype(np.float32),
            beyond,
            specials,
        ]
    )
    random = rng.integers(0, 1 << 32, N - 2 * pos.size, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([pos, -pos, random.view(np.float32)])


def _gfloat_codes(f, x: np.ndarray, mode: str, saturate: bool, rbits: np.ndarray) -> np.ndarray:
    """gfloat's code of each value by ``round_float`` and ``encode_float`` (NaN as -1)."""
    fi = gfloat_info(f)
    out = []
    for v, r in zip(x.astype(np.float64).tolist(), rbits.tolist(), strict=True):
        sr = (int(r), RANDOM_BITS) if mode in STOCHASTIC else (-1, 0)
        y = gfloat.round_float(fi, v, GFLOAT_MODES[mode], saturate, *sr)
        out.append(-1 if np.isnan(y) else gfloat.encode_float(fi, y))
    return np.array(out, np.int64)


def _encode(name: str, x: np.ndarray, mode: str, saturate: bool, rbits: np.ndarray):
    kw = dict(rbits=rbits, random_bits=RANDOM_BITS) if mode in STOCHASTIC else {}
    return np.asarray(emulate.encode(x, name, saturate=saturate, rounding=mode, **kw))


def _nan_as_minus_one(codes: np.ndarray, f: formats.Format) -> np.ndarray:
    return np.where(np.isin(codes, f.nan_codes), -1, codes.astype(np.int64))


#: CI: each format in one mode, the modes rotating (every one is met), saturation
#: alternating; the whole matrix under the long marker.
CASES = [(name, ROUNDINGS[i % len(ROUNDINGS)], i % 2 == 1) for i, name in enumerate(CHECKED)]
CASES.append((CHECKED[0], ROUNDINGS[len(CHECKED) % len(ROUNDINGS)], True))
ALL_CASES = CASES + [
    pytest.param(name, mode, sat, marks=pytest.mark.long)
    for name in CHECKED
    for mode in ROUNDINGS
    for sat in (False, True)
    if (name, mode, sat) not in CASES
]


@pytest.mark.parametrize(("name", "mode", "saturate"), ALL_CASES)
def test_encode_gives_gfloats_round_float_code(name: str, mode: str, saturate: bool) -> None:
    f = formats.get(name)
    x = _sample(f)
    rbits = np.random.default_rng(1).integers(0, 1 << RANDOM_BITS, N)
    got = _encode(name, x, mode, saturate, rbits)
    assert got.dtype == np.uint16
    oracle = reference_rounding.encode(
        x,
        name,
        saturate=saturate,
        rounding=mode,
        random_values=rbits if mode in STOCHASTIC else None,
        random_bits=RANDOM_BITS if mode in STOCHASTIC else None,
    )
    assert np.array_equal(got, oracle)
    keep = np.ones(N, bool) if f.signed else ~np.signbit(x)  # unsigned: negatives give 0
    want = _gfloat_codes(f, x[keep], mode, saturate, rbits[keep])
    bad = np.flatnonzero(_nan_as_minus_one(got[keep], f) != want)
    assert bad.size == 0, (x[keep][bad[:5]], got[keep][bad[:5]], want[bad[:5]])


def _boosted(f: formats.Format) -> st.SearchStrategy[float]:
    top = float(f.max)
    v = np.sort(np.abs(_gfloat_values(f, np.arange(4, dtype=np.uint16))))
    special = [0.0, top, f.min_subnormal, np.nan, np.inf, (v[1] + v[2]) / 2, f.min_subnormal / 2]
    special += [top + (top - float(np.nextafter(np.float32(top), np.float32(0)))), 1.0]
    signed = st.sampled_from(special).flatmap(lambda s: st.sampled_from([s, -s]))
    return signed | st.floats(width=32, allow_subnormal=True)


@pytest.mark.parametrize(("name", "mode", "saturate"), [CASES[1], *CASES[5:]])  # stochastic
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_drawn_values_round_as_gfloat_rounds_them(name, mode, saturate, data) -> None:
    f = formats.get(name)
    xs = data.draw(st.lists(_boosted(f), min_size=1, max_size=12), label="x")
    rs = data.draw(
        st.lists(st.integers(0, (1 << RANDOM_BITS) - 1), min_size=len(xs), max_size=len(xs))
    )
    x = np.zeros(N, np.float32)
    x[: len(xs)] = xs
    rbits = np.zeros(N, np.int64)
    rbits[: len(rs)] = rs
    got = _encode(name, x, mode, saturate, rbits)[: len(xs)]
    keep = np.ones(len(xs), bool) if f.signed else ~np.signbit(x[: len(xs)])
    if not f.signed:
        assert (got[~keep & ~np.isnan(x[: len(xs)])] == 0).all()  # P3109: negatives give 0
    want = _gfloat_codes(f, x[: len(xs)][keep], mode, saturate, rbits[: len(xs)][keep])
    assert np.array_equal(_nan_as_minus_one(got[keep], f), want)


@pytest.mark.parametrize("name", ["p3109_k12p6se", "p3109_k16p11se"])
def test_matmul_of_wide_codes_is_within_the_bound(name: str) -> None:
    rng = np.random.default_rng(3)
    codes = np.array(emulate.encode(rng.standard_normal((5, 40)).astype(np.float32), name))
    codes[0, :3] = [0, formats.get(name).max_code, 1]  # zero, max, the smallest subnormal
    b = rng.standard_normal((40, 3)).astype(np.float32)
    got = emulate.matmul(codes, b, a_format=name, mode="fast")
    values = reference.decode(codes, name, to=np.float32)  # exact: float32 holds them
    dn = (((1,), (0,)), ((), ()))
    emulate.testing.assert_matches_reference(got, values, b, dn, mode="fast")


def test_a_qarray_of_a_wide_format_keeps_uint16_codes_and_the_bound() -> None:
    rng = np.random.default_rng(4)
    w = rng.standard_normal((64, 8)).astype(np.float32)
    q = emulate.quantize(w, "p3109_k12p6se", block_shape=(32, 1))
    assert q.codes.dtype == np.uint16
    x = rng.standard_normal((3, 64)).astype(np.float32)
    dn = (((1,), (0,)), ((), ()))
    emulate.testing.assert_matches_reference(emulate.matmul(x, q), x, q, dn, mode="fast")


def _refusal(pattern: str):
    return pytest.raises(ValueError, match="^" + re.escape(pattern) + "$")


def test_packed_paths_refuse_codes_wider_than_a_byte() -> None:
    codes = np.zeros((4, 4), np.uint16)
    why = (
        "p3109_k12p6se is a 12-bit format, whose codes are uint16: packed storage of codes "
        "wider than a byte is not built (pack, Packed and the Pallas kernels take codes of "
        "at most 8 bits); pass its uint16 codes with the format instead"
    )
    with _refusal("x: " + why):
        emulate.pack(codes, "p3109_k12p6se")
    with _refusal("format_name: " + why):
        emulate.Packed(np.zeros((4, 4), np.uint8), "p3109_k12p6se", -1, 4)


def test_the_pallas_kernels_refuse_wide_codes() -> None:
    why = (
        "p3109_k16p11se is a 16-bit format (uint16 codes); the Pallas kernels take codes of "
        "at most 8 bits, wider ones are not built there: use emulate.matmul or "
        "emulate.dot_general (the XLA route)"
    )
    x = np.zeros((8, 128), np.float32)
    w = np.zeros((128, 128), np.uint16)
    with _refusal("w: " + why):
        emulate.pallas.matmul(x, w, w_format="p3109_k16p11se", target="tpu_v5e")
    with _refusal("x: " + why):
        emulate.pallas.matmul(w, np.zeros((128, 128), np.int8), x_format="p3109_k16p11se",
                              target="tpu_v5e")  # fmt: skip


def _decode_bf16(name: str) -> None:
    emulate.decode(np.zeros(3, np.uint16), name)


def _fast_matmul(name: str) -> None:
    a, b = np.zeros((2, 4), np.uint16), np.zeros((4, 2), np.float32)
    emulate.matmul(a, b, a_format=name, mode="fast")


@pytest.mark.parametrize(
    ("call", "name", "message"),
    [
        (
            _decode_bf16,
            "p3109_k16p11se",
            "to: bfloat16 cannot hold every p3109_k16p11se value (11-bit significands, values "
            "down to 2**-25; bfloat16 has 8-bit ones, down to 2**-133); use jnp.float32",
        ),
        (
            _decode_bf16,
            "p3109_k16p8se",
            "to: bfloat16 cannot hold every p3109_k16p8se value (8-bit significands, values "
            "down to 2**-134; bfloat16 has 8-bit ones, down to 2**-133); use jnp.float32",
        ),
        (  # values down to 2**-134: float32 denormals, which XLA flushes in a dot
            _fast_matmul,
            "p3109_k16p8se",
            "lhs/rhs: no way to run p3109_k16p8se x float32 on target cpu: native: mixed "
            "pair; decoded to one type instead; bf16: bfloat16 does not hold every "
            "p3109_k16p8se value; f32: float32 does not hold every p3109_k16p8se value",
        ),
    ],
)
def test_what_would_round_or_flush_is_refused(call, name: str, message: str) -> None:
    with _refusal(message):
        call(name)


def test_uint8_codes_of_a_wide_format_are_refused() -> None:
    with _refusal(
        "x: dtype uint8 does not match fmt=p3109_k12p6se; accepted: an array of dtype "
        "p3109_k12p6se, or unsigned integer codes (uint16)"
    ):
        emulate.decode(np.zeros(3, np.uint8), "p3109_k12p6se")
    with _refusal(
        "x: 1 code(s) exceed p3109_k12p6se's 12 bits (e.g. 0x1000; codes must lie in [0, 0xfff])"
    ):
        emulate.decode(np.array([0x1000], np.uint16), "p3109_k12p6se")


def test_a_bias_above_126_with_trailing_bits_decodes_and_encodes_as_gfloat() -> None:
    # An 8-bit e6m1 with bias 127: every value is below 2**-62, the smallest 2**-127, a
    # float32 denormal (built before as a refused record: the decoder needed 2**-bias normal).
    f = formats.register(formats.float_format("e6m1_b127", bits=8, precision=2, bias=127))
    codes = np.arange(256, dtype=np.uint8)
    want = _gfloat_values(f, codes)
    got = np.asarray(emulate.decode(codes, f, to=jnp.float32)).astype(np.float64)
    assert np.array_equal(got, want)
    x = np.concatenate([want, (want[1:128] + want[:127]) / 2]).astype(np.float32)
    x = np.concatenate([x, -x])
    codes_got = np.asarray(emulate.encode(x, f)).astype(np.int64)
    zeros = np.zeros(x.size, np.int64)
    assert np.array_equal(codes_got, _gfloat_codes(f, x, "nearest_even", True, zeros))


def test_wide_formats_are_sliced_per_row_in_mode_exact() -> None:
    # Cut statically, p3109_k12p6se's exponent range (2**-36 to 2**31) took 13 slices and
    # 104 dots with a float32 operand; per row, as float32 is, it takes 3.
    lhs, rhs, _ = slicing.fewest_passes(
        formats.get("p3109_k12p6se"), formats.get("float32"), "float32"
    )
    assert (lhs.levels, lhs.width, lhs.count) == (3, 10, 3)
    assert lhs.dynamic and rhs.dynamic


@pytest.mark.long
def test_mode_exact_on_wide_codes_is_the_reference_bit_for_bit() -> None:
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 0x300, (3, 8)).astype(np.uint16)  # values below 2**-122
    codes[1] = rng.integers(0, 0x7F00, 8)
    b = (rng.standard_normal((8, 2)) * 2.0**100).astype(np.float32)
    got = emulate.matmul(codes, b, a_format="p3109_k16p8se", mode="exact")
    values = reference.decode(codes, "p3109_k16p8se", to=np.float32)
    want = reference.dot_general(values, b, (((1,), (0,)), ((), ())))
    assert np.array_equal(np.asarray(got), want, equal_nan=True)


@pytest.mark.parametrize(
    ("name", "want"),
    [("p3109_k12p6se", np.inf), ("p3109_k12p6sf", np.nan), ("p3109_k8p3se", np.inf)],
)
def test_the_oracle_rounds_overflow_by_the_records_rule(name: str, want: float) -> None:
    # Read off a cast to the format's dtype this gave +-max for every format without an
    # ml_dtypes type (a cast of Inf to its uint8 / uint16 codes is no overflow rule).
    f = formats.get(name)
    assert reference.round_exact(3, -1, name) == 1.5
    assert reference.round_exact(1, 200, name) == pytest.approx(want, nan_ok=True)
    top = int(f.max).bit_length()  # f.max < 2**top: one unit in the last place above
    assert reference.round_exact(-1, top, name) == pytest.approx(-want, nan_ok=True)
