"""The numpy oracle of the formats ml_dtypes lacks, checked against gfloat 0.5
(graphcore-research/gfloat): every code decodes as gfloat decodes it, and nearest-even
encoding of every bfloat16 value and a float32 sample (ties, neighbours of ties, overflow,
subnormals, NaN, Inf) gives gfloat's code."""

from __future__ import annotations

import _record_formats as R
import numpy as np
import pytest

import emulate
from emulate import formats, reference
from emulate.numerics.rounding import ROUNDINGS, STOCHASTIC
from emulate.reference import codes as reference_codes
from emulate.reference import rounding as reference_rounding

R.register_user_formats()


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal values, NaN matching NaN, and the sign of zeros equal."""
    return bool(
        np.array_equal(a, b, equal_nan=True)
        and np.array_equal(np.signbit(a[~np.isnan(a)]), np.signbit(b[~np.isnan(b)]))
    )


@pytest.mark.parametrize("name", R.CHECKED)
def test_every_code_decodes_as_gfloat_decodes_it(name: str) -> None:
    f = formats.get(name)
    assert _same(reference_codes.code_values(f), R.gfloat_values(f))
    codes = np.arange(1 << f.bits, dtype=np.uint8)
    assert _same(reference.decode(codes, f, to=np.float64), R.gfloat_values(f))


@pytest.mark.parametrize("name", R.CHECKED)
@pytest.mark.parametrize("saturate", [False, True])
def test_nearest_even_encode_matches_gfloat(name: str, saturate: bool) -> None:
    f = formats.get(name)
    v = np.concatenate([R.every_bf16(), R.f32_sample(f, n=2048)])
    if not f.signed:  # gfloat rounds negative inputs of unsigned formats as if signed
        v = v[~np.signbit(v)]
    got = reference_codes.encode_values(v, f, saturate=saturate).astype(np.int64)
    want = R.gfloat_codes(f, v, saturate=saturate)
    bad = np.flatnonzero(R.nan_as_one(got, f) != R.nan_as_one(want, f))
    assert bad.size == 0, (v[bad[:5]], got[bad[:5]], want[bad[:5]])
    # gfloat writes one NaN code (2**k - 1); where a format has a -0, emulate's NaN keeps
    # the sign of what overflowed (as ml_dtypes' e4m3fn does): docs/numerics.md.
    nan = np.isin(got, f.nan_codes)
    if f.signed_zero:
        assert np.array_equal(got[nan] >= 1 << (f.bits - 1), np.signbit(v[nan]))


NEGATIVES = np.array([-1.0, -0.0, -np.inf, -1e-30, -1e30, np.nan, -np.nan], np.float32)


# By default u5e3m2 with and without saturation, and without it a P3109 format of each
# domain (p3109_k8p3uf finite, p3109_k8p1ue extended, with one significant bit); the other
# cases (p3109_k8p4ue, extended as k8p1ue is, and the P3109 formats with saturation: the
# same rule, another record) under EMULATE_LONG_TESTS=1.
UNSIGNED_DEFAULT = {("u5e3m2", False), ("u5e3m2", True)} | {
    ("p3109_k8p3uf", False),
    ("p3109_k8p1ue", False),
}


@pytest.mark.parametrize(
    "name, saturate",
    [
        pytest.param(n, sat, marks=() if (n, sat) in UNSIGNED_DEFAULT else pytest.mark.long)
        for sat in (False, True)
        for n in ("u5e3m2", "p3109_k8p4ue", "p3109_k8p3uf", "p3109_k8p1ue")
    ],
)
def test_unsigned_formats_send_negative_values_to_zero(name, saturate) -> None:
    # P3109's Saturate gives M_lo, the smallest finite value (0 for an unsigned format),
    # for X <= M_lo and for -Inf, in every saturation mode and rounding direction; NaN
    # stays NaN. The encoder, the numpy oracle and the rounding oracle, every mode.
    f = formats.get(name)
    want = [0, 0, 0, 0, 0, f.nan_code, f.nan_code]
    got = reference_codes.encode_values(NEGATIVES, f, saturate=saturate)
    assert got.tolist() == want
    for mode in ROUNDINGS:
        kw = dict(random_values=np.zeros(7), random_bits=3) if mode in STOCHASTIC else {}
        oracle = reference_rounding.encode(NEGATIVES, f, saturate=saturate, rounding=mode, **kw)
        assert oracle.tolist() == want, mode
        kw = dict(rbits=np.zeros(7, np.int32), random_bits=3) if mode in STOCHASTIC else {}
        codes = emulate.encode(NEGATIVES, f, saturate=saturate, rounding=mode, **kw)
        assert np.asarray(codes).tolist() == want, mode


def test_quantize_and_dequantize_take_codes_of_such_formats() -> None:
    x = np.array([[1.0, -3.0, 0.25, 40.0]], np.float32)
    codes, scales, _ = reference.quantize(x, "e3m3", (1, 4), scale_rule="ocp_floor")
    assert codes.dtype == np.uint8 and scales.astype(np.float64).tolist() == [[2.0]]
    # 40 / 2 = 20 is in e3m3 (16 * 1.25); 0.25 / 2 = 0.125 (2**-3).
    assert reference_codes.decode_codes(codes, "e3m3").tolist() == [[0.5, -1.5, 0.125, 20.0]]
    back = reference.dequantize(codes, scales, (1, 4), fmt="e3m3")
    assert back.tolist() == [[1.0, -3.0, 0.25, 40.0]]


def test_formats_with_a_dtype_are_refused() -> None:
    with pytest.raises(ValueError, match="^fmt: float8_e4m3fn has an ml_dtypes type"):
        reference_codes.code_values("float8_e4m3fn")


@pytest.mark.long
@pytest.mark.parametrize("name", R.FAMILY)
def test_the_whole_p3109_family_matches_gfloat(name: str) -> None:
    f = formats.get(name)
    assert _same(reference_codes.code_values(f), R.gfloat_values(f))
    v = R.every_bf16().astype(np.float64)
    v = v if f.signed else v[~np.signbit(v)]
    got = reference_codes.encode_values(v, f).astype(np.int64)
    want = R.gfloat_codes(f, v, saturate=False)
    assert np.array_equal(R.nan_as_one(got, f), R.nan_as_one(want, f))
