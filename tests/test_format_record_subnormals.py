"""Formats without subnormals, ``float_format(..., subnormals=False)``, against gfloat 0.5
(graphcore-research/gfloat) ``FormatInfo(has_subnormals=False)``: code 0 is zero and every
other code of exponent field 0 is normal, so the smallest positive value is
``(1 + 2**-t) * 2**-bias``. Every code decodes as gfloat decodes it; encode, in every
rounding mode, saturating or not, gives gfloat's code at and above that smallest value;
below it, where gfloat returns values no code holds, the rule docs/numerics.md states
(between 0 and the smallest value, by the exact fraction), checked against a Fractions
oracle written here; matmuls of such operands keep the contract."""

from __future__ import annotations

import math
from fractions import Fraction

import _gfloat_cases as G
import _record_formats as R
import gfloat
import hypothesis.extra.numpy as hnp
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import emulate
from emulate import formats, reference, testing
from emulate.numerics.rounding import ROUNDINGS, STOCHASTIC
from emulate.reference import rounding as reference_rounding

#: The formats checked, registered here: fn-like (-0, a NaN a sign), unsigned with +Inf and
#: a NaN, no NaN and no Inf (saturating; the exact class, int8 k=2), fnuz-like (the -0 code
#: is the NaN), IEEE-like with Inf and three NaNs a sign, and one without an exponent field.
CONFIGS = {
    "ns_e4m3": dict(bits=8, precision=4, high_nans=1),
    "ns_u6e3m2": dict(bits=6, precision=3, bias=2, signed=False, infinities=True, high_nans=1),
    "ns_e2m1": dict(bits=4, precision=2, bias=1),
    "ns_e4m3uz": dict(bits=8, precision=4, bias=8, negative_zero=False),
    "ns_e5m2": dict(bits=8, precision=3, bias=20, infinities=True, high_nans=3),
    "ns_u7m6": dict(bits=7, precision=7, signed=False, bias=-3),
}
for _name, _kw in CONFIGS.items():
    formats.register(formats.float_format(_name, subnormals=False, **_kw))
NAMES = list(CONFIGS)
MATMUL = (((1,), (0,)), ((), ()))


@pytest.mark.parametrize("name", NAMES)
def test_every_code_decodes_as_gfloat_decodes_it(name: str) -> None:
    f = formats.get(name)
    codes = np.arange(1 << f.bits, dtype=np.uint8)
    want = R.gfloat_values(f)
    nan = np.isnan(want)
    targets = [jnp.float32] + ([jnp.bfloat16] if "bfloat16" in f.exact_in else [])
    for to in targets:
        got = np.asarray(emulate.decode(codes, name, to=to)).astype(np.float64)
        assert np.array_equal(got[~nan], want[~nan]), to
        assert np.array_equal(np.signbit(got[~nan]), np.signbit(want[~nan])), to
        assert np.isnan(got[nan]).all(), to
    oracle = reference.decode(codes, name, to=np.float64)
    assert np.array_equal(oracle, want, equal_nan=True)


@pytest.mark.parametrize("name", NAMES)
def test_the_record_holds_gfloats_range(name: str) -> None:
    f = formats.get(name)
    fi = R.gfloat_info(f)
    assert (f.max, f.min, f.min_subnormal, f.min_normal) == (
        fi.max,
        fi.min,
        fi.smallest_normal,
        fi.smallest_normal,
    )
    assert (f.has_subnormals, f.has_zero, f.emin) == (False, True, -f.bias)
    assert f.quantum == 2.0 ** (-f.bias - f.mantissa_bits)
    assert f.min_subnormal == ((1 << f.mantissa_bits) + 1) * f.quantum
    finite = R.gfloat_values(f)[np.isfinite(R.gfloat_values(f))]
    assert all(Fraction(v) % Fraction(f.quantum) == 0 for v in finite)


def test_the_small_format_is_in_the_exact_class_and_e8m0_is_unchanged() -> None:
    f = formats.get("ns_e2m1")
    values = np.asarray(emulate.decode(np.arange(8, dtype=np.uint8), f, to=jnp.float32))
    assert values.tolist() == [0.0, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    assert (f.int8_scale, f.exact_in) == (2, ("bfloat16", "float32"))  # 6 * 4 = 24 <= 127
    e8m0 = formats.get("float8_e8m0fnu")
    assert (e8m0.has_subnormals, e8m0.has_zero, e8m0.emin, e8m0.quantum) == (
        False,
        False,
        -127,
        2.0**-127,
    )


def test_round_exact_rounds_below_the_smallest_value_to_it_or_to_zero() -> None:
    # ns_e4m3: smallest 9 * 2**-10; half of it, 9 * 2**-11, is a tie and goes to 0.
    got = [reference.round_exact(n, e, "ns_e4m3") for n, e in [(9, -11), (37, -13), (-9, -11)]]
    assert got == [0.0, 9 * 2.0**-10, -0.0] and math.copysign(1, got[2]) == -1
    assert math.copysign(1, reference.round_exact(-9, -12, "ns_e4m3uz")) == 1  # bias 8, no -0
    assert reference.round_exact(35, -13, "ns_e4m3") == 0.0  # 35/72 of the smallest


def test_round_exact_overflows_by_the_record_of_a_format_without_a_dtype() -> None:
    # Inf where it has Inf, else NaN, else +-max (its uint8 codes say nothing of either).
    assert reference.round_exact(1, 100, "ns_e5m2") == math.inf
    assert reference.round_exact(-1, 100, "p3109_k8p3se") == -math.inf
    assert math.isnan(reference.round_exact(1, 100, "ns_e4m3"))
    assert reference.round_exact(-1, 100, "ns_e2m1") == -6.0


def _below(x: np.ndarray, f: formats.Format, mode: str, r: np.ndarray, n: int) -> np.ndarray:
    """The rule below the smallest value ``s`` (docs/numerics.md), by brute force: the
    two neighbours 0 and ``s``, the fraction ``d = |x| / s`` as a Fraction; nearest modes
    tie to 0 (code 0 is even) or away; directed modes by the sign; stochastic modes up
    when ``rnd(d * 2**n) + r >= 2**n``."""
    s = Fraction(f.min_subnormal)
    codes = []
    for xi, ri in zip(x.tolist(), r.tolist(), strict=True):
        negative = math.copysign(1.0, xi) < 0
        d = Fraction(abs(xi)) / s
        y = d * 2**n
        low, half = math.floor(y), Fraction(1, 2)
        rnd = {
            "stochastic": round(y),  # Fraction's round: ties to even
            "stochastic_odd": low + int(y - low > half or (y - low == half and low % 2 == 0)),
            "stochastic_fast": math.floor(y + half),
            "stochastic_fastest": low,
        }.get(mode, 0)
        up = {
            "nearest_even": d > Fraction(1, 2),
            "nearest_away": d >= Fraction(1, 2),
            "toward_zero": False,
            "toward_positive": d > 0 and not negative,
            "toward_negative": d > 0 and negative,
        }.get(mode, rnd + ri >= 2**n)
        sign = 1 << (f.bits - 1) if negative and f.signed and (up or f.signed_zero) else 0
        codes.append(0 if negative and not f.signed else int(up) | sign)
    return np.array(codes, np.int64)


def _check(x: np.ndarray, f: formats.Format, mode: str, saturate: bool, r, n: int) -> None:
    """emulate.encode of float32 ``x`` against gfloat at and above the smallest value and
    :func:`_below` under it; the numpy oracle (emulate.reference.rounding) against both."""
    kwargs = dict(rbits=r, random_bits=n) if mode in STOCHASTIC else {}
    got = np.asarray(emulate.encode(x, f, saturate=saturate, rounding=mode, **kwargs))
    got = got.astype(np.int64)
    oracle_kwargs = dict(random_values=r, random_bits=n) if mode in STOCHASTIC else {}
    oracle = reference_rounding.encode(x, f, saturate=saturate, rounding=mode, **oracle_kwargs)
    assert np.array_equal(oracle.astype(np.int64), got)
    below = np.abs(x) < f.min_subnormal
    want_below = _below(x[below], f, mode, r[below], n)
    assert np.array_equal(got[below], want_below), (x[below], got[below], want_below)
    keep = ~below & (~np.signbit(x) if not f.signed else True)
    sat = saturate
    if not (f.has_inf or f.has_nan):  # no NaN, no Inf: always saturates (gfloat raises)
        keep, sat = keep & ~np.isnan(x), True
    fi = R.gfloat_info(f)
    want = _gfloat_round(fi, x[keep], mode, sat, r[keep], n)
    want_nan = np.isnan(want)
    want_codes = gfloat.encode_ndarray(fi, np.where(want_nan, 0.0, want)).astype(np.int64)
    got_nan = np.isin(got[keep], f.nan_codes)
    differ = np.where(want_nan, ~got_nan, got[keep] != want_codes)
    assert not differ.any(), (x[keep][differ][:6], got[keep][differ][:6], want[differ][:6])
    if not f.signed:  # every negative value, -Inf too, gives 0 (P3109's Saturate)
        assert (got[np.signbit(x) & ~np.isnan(x)] == 0).all()


def _gfloat_round(fi, x, mode: str, sat: bool, r, n: int) -> np.ndarray:
    """gfloat's ``round_ndarray`` of ``x`` (as float64), ``r`` its ``srbits``."""
    srbits = r.astype(np.int64) if mode in STOCHASTIC else None
    with np.errstate(invalid="ignore", over="ignore"):
        return gfloat.round_ndarray(fi, x.astype(np.float64), G.GFLOAT_MODES[mode], sat, srbits, n)


def _sample(f: formats.Format) -> np.ndarray:
    """G.f32_sample's values for ``f`` (every bf16, random bit patterns, each tie and its
    neighbours, past the largest, f32 denormals, specials), with one in 16 of those below
    the smallest value kept (the Fractions oracle is slow), plus the smallest, half of it
    and their float32 neighbours."""
    x = G.f32_sample(f, R.gfloat_values(f)).astype(np.float32)
    below = np.flatnonzero(np.abs(x) < f.min_subnormal)
    x = np.delete(x, np.setdiff1d(below, below[::16]))
    s = np.float32([f.min_subnormal, f.min_subnormal / 2, 2.0**-f.bias])
    around = np.concatenate([s, np.nextafter(s, np.float32(0)), np.nextafter(s, np.float32(1))])
    return np.concatenate([x, around, -around])


def _bits_for(i: int) -> int:
    return (1, G.RANDOM_BITS, 32)[i % 3]


@pytest.mark.parametrize(("name", "mode", "saturate"), G.cases(NAMES, every_mode=True))
def test_encode_is_gfloats_above_the_smallest_value_and_the_rule_below(
    name: str, mode: str, saturate: bool
) -> None:
    f = formats.get(name)
    x = _sample(f)
    n = _bits_for(ROUNDINGS.index(mode)) if mode in STOCHASTIC else 0
    r = np.random.default_rng(40).integers(0, 1 << n, x.shape, dtype=np.uint64)
    _check(x, f, mode, saturate, r.astype(np.uint32), n)


@settings(max_examples=6)
@given(st.data())
def test_values_around_the_smallest_round_by_the_rule(data) -> None:
    """Ties and neighbours of the rule's thresholds ``s * j / 2**(n+1)``, 0, the smallest
    value ``s``, ``2**-bias`` (no code), the largest, NaN and Inf, in every mode."""
    name = data.draw(st.sampled_from(["ns_e4m3", "ns_u6e3m2", "ns_e2m1", "ns_e4m3uz"]))
    mode = data.draw(st.sampled_from(ROUNDINGS))
    n = data.draw(st.sampled_from([1, 3, 32])) if mode in STOCHASTIC else 0
    f = formats.get(name)
    s = f.min_subnormal
    j = st.integers(0, (1 << (n + 1)) - 1).map(lambda k: s * k / 2 ** (n + 1))
    specials = [0.0, s, s / 2, 2.0**-f.bias, f.max, math.inf, math.nan]
    value = st.one_of(
        st.sampled_from(specials), j, st.floats(0, 2 * s, width=32), st.floats(0, f.max * 2)
    )
    x = np.float32(data.draw(st.lists(value, min_size=16, max_size=16)))
    step = data.draw(st.sampled_from([-1, 0, 1]))
    x = np.nextafter(x, np.float32(math.copysign(math.inf, step))) if step else x
    signs = data.draw(hnp.arrays(np.bool_, 16))
    x = np.where(signs, -x, x).astype(np.float32)
    r = data.draw(hnp.arrays(np.uint32, 16, elements=st.integers(0, (1 << n) - 1)))
    _check(x, f, mode, data.draw(st.booleans()), r, n)


def _operand(name: str, shape: tuple[int, ...], axis: int, seed: int) -> emulate.Packed:
    """Random values with zeros, the smallest value and values just below it planted."""
    f = formats.get(name)
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=shape) * 2).astype(np.float32)
    flat = x.reshape(-1)
    flat[::5] = f.min_subnormal * rng.choice([1, -1, 0.7, -0.3], flat[::5].shape)
    flat[::7] = 0.0
    return emulate.pack(emulate.encode(x, name, saturate=True), name, axis=axis)


def _oracle(a: emulate.Packed, b: emulate.Packed) -> np.ndarray:
    return reference.dot_general(
        reference.decode(np.asarray(emulate.unpack(a)), a.format.name),
        reference.decode(np.asarray(emulate.unpack(b)), b.format.name),
        MATMUL,
        "float32",
    )


@pytest.mark.parametrize(
    ("target", "mode"),
    [("cpu", "fast"), ("tpu_v5e", "exact"), pytest.param("cpu", "exact", marks=pytest.mark.long)],
)
def test_matmuls_of_formats_without_subnormals_keep_the_contract(target: str, mode: str) -> None:
    a, b = _operand("ns_e4m3", (4, 40), -1, 0), _operand("ns_e5m2", (40, 3), 0, 1)
    p = emulate.plan("ns_e4m3", "ns_e5m2", target=target, mode=mode)
    assert p.method in ({"bf16", "f32"} if mode == "fast" else {"sliced-bf16", "sliced-int8"})
    got = emulate.dot_general(
        a, b, MATMUL, preferred_element_type=jnp.float32, target=target, mode=mode
    )
    c = testing.compare(got, a, b, MATMUL, mode=mode, preferred_element_type=jnp.float32)
    assert c.ok, c.report()
    if mode == "exact":
        assert np.array_equal(np.asarray(got), _oracle(a, b))


def test_the_exact_class_format_multiplies_exactly_in_mode_fast() -> None:
    a, b = _operand("ns_e2m1", (3, 64), -1, 2), _operand("ns_e2m1", (64, 5), 0, 3)
    p = emulate.plan("ns_e2m1", "ns_e2m1", target="cpu", mode="fast")
    assert p.exact
    got = emulate.dot_general(a, b, MATMUL, preferred_element_type=jnp.float32, target="cpu")
    assert np.array_equal(np.asarray(got), _oracle(a, b))


@settings(max_examples=5)
@given(
    testing.arrays("ns_e4m3", (2, 16), elements="finite"),
    testing.arrays("ns_e2m1", (16, 3), elements="finite"),
)
def test_drawn_operands_keep_the_bound(a, b) -> None:
    b = emulate.pack(emulate.unpack(b), "ns_e2m1", axis=0)
    got = emulate.dot_general(a, b, MATMUL, preferred_element_type=jnp.float32, target="cpu")
    c = testing.compare(got, a, b, MATMUL, mode="fast", preferred_element_type=jnp.float32)
    assert c.ok, c.report()


def test_a_format_without_subnormals_holds_power_of_two_scales_from_2_pow_1_minus_bias() -> None:
    # ns_e4m3's 2**-7 (its 2**-bias) has no code: the smallest power of two is 2**-6, code 8.
    rng = np.random.default_rng(4)
    w = (rng.normal(size=(64, 4)) * np.float32([1e-6, 1e-3, 1.0, 50.0])).astype(np.float32)
    q = emulate.quantize(
        w, "int8", block_shape=(32, 1), scale_fmt="ns_e4m3", scale_rule="ocp_floor"
    )
    codes, scales, _ = reference.quantize(
        w, "int8", (32, 1), scale_fmt="ns_e4m3", scale_rule="ocp_floor"
    )
    assert np.array_equal(np.asarray(q.unpacked_codes()), codes)
    assert np.array_equal(np.asarray(q.scales), scales)
    assert np.asarray(q.scales)[:, 0].tolist() == [8, 8]  # 2**-6 for the 1e-6 column


def test_quantize_into_a_format_without_subnormals_is_the_oracles() -> None:
    # Elements below the smallest value after scaling go to it or to 0 (ties to 0).
    rng = np.random.default_rng(5)
    w = rng.normal(size=(64, 4)).astype(np.float32)
    w[::4] *= np.float32(2.0**-16)  # far below the block's largest: the rule below s
    q = emulate.quantize(w, "ns_e4m3", block_shape=(32, 1), scale_fmt="float8_e8m0fnu")
    codes, scales, _ = reference.quantize(w, "ns_e4m3", (32, 1))
    assert np.array_equal(np.asarray(q.unpacked_codes()), codes)
    assert np.array_equal(np.asarray(q.scales).astype(np.float64), scales.astype(np.float64))
    magnitude = np.asarray(codes) & 0x7F
    assert (magnitude == 1).any() and ((magnitude == 0) & (w != 0)).any()
