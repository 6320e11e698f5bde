"""decode and encode of the formats built from parameters (the P3109 binary8 family, two
user-built formats) against gfloat 0.5 (graphcore-research/gfloat) and emulate's numpy
oracle (:mod:`emulate.reference.codes`): every code, every bfloat16 value, a float32 sample
with ties and their neighbours, overflow, subnormals, NaN and Inf."""

from __future__ import annotations

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import emulate
from emulate import formats
from emulate.reference import codes as reference_codes

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import _record_formats as R  # noqa: E402

R.register_user_formats()

#: Where saturation is checked too: the user formats and one P3109 format of each kind.
SATURATED = ["e3m3", "u5e3m2", "p3109_k8p3se", "p3109_k8p4uf", "p3109_k8p1ue"]


def _same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    return bool(
        np.array_equal(got, want, equal_nan=True)
        and np.array_equal(np.signbit(got), np.signbit(want))
    )


@pytest.mark.parametrize("name", R.CHECKED)
def test_every_code_decodes_as_gfloat_decodes_it(name: str) -> None:
    f = formats.get(name)
    codes = np.arange(1 << f.bits, dtype=np.uint8)
    want = R.gfloat_values(f)
    got32 = np.asarray(emulate.decode(codes, name, to=jnp.float32)).astype(np.float64)
    assert _same_bits(got32[~np.isnan(want)], want[~np.isnan(want)])
    assert np.isnan(got32[np.isnan(want)]).all()
    if "bfloat16" in f.exact_in:
        got16 = np.asarray(emulate.decode(codes, name, to=jnp.bfloat16)).astype(np.float64)
        assert _same_bits(got16, got32)


def test_exponent_only_codes_below_2_pow_126_are_exact_bits() -> None:
    # p3109_k8p1ue: code 1 is 2**-127, a float32 denormal; its bits, not a flushed zero.
    got = emulate.decode(np.array([0, 1, 2, 0xFD], np.uint8), "p3109_k8p1ue", to=jnp.float32)
    bits = np.asarray(jax.lax.bitcast_convert_type(got, jnp.uint32)).tolist()
    assert bits == [0, 0x00400000, 0x00800000, 0x7E000000]  # 0, 2**-127, 2**-126, 2**125


@pytest.mark.parametrize("name", R.CHECKED)
def test_nearest_even_encode_matches_gfloat_and_the_oracle(name: str) -> None:
    f = formats.get(name)
    v = np.concatenate([R.every_bf16(), R.f32_sample(f, n=2048)]).astype(np.float32)
    for saturate in (False, True) if name in SATURATED else (False,):
        got = np.asarray(emulate.encode(v, name, saturate=saturate)).astype(np.int64)
        oracle = reference_codes.encode_values(v, f, saturate=saturate).astype(np.int64)
        bad = np.flatnonzero(got != oracle)
        assert bad.size == 0, (saturate, v[bad[:5]], got[bad[:5]], oracle[bad[:5]])
        keep = ~np.signbit(v) if not f.signed else np.ones(v.shape, bool)
        want = R.gfloat_codes(f, v[keep].astype(np.float64), saturate=saturate)
        bad = np.flatnonzero(R.nan_as_one(got[keep], f) != R.nan_as_one(want, f))
        assert bad.size == 0, (saturate, v[keep][bad[:5]], got[keep][bad[:5]], want[bad[:5]])


def test_encode_of_decode_is_identity_on_every_finite_code() -> None:
    for name in ("e3m3", "p3109_k8p1se"):
        f = formats.get(name)
        codes = np.array([c for c in range(1 << f.bits) if c not in f.nan_codes], np.uint8)
        if not f.signed_zero:
            codes = codes[codes != 1 << (f.bits - 1)] if f.signed else codes
        back = emulate.encode(emulate.decode(codes, name, to=jnp.float32), name)
        assert np.asarray(back).tolist() == codes.tolist(), name


@pytest.mark.long
@pytest.mark.parametrize("name", R.FAMILY)
def test_the_whole_p3109_family_matches_gfloat(name: str) -> None:
    f = formats.get(name)
    codes = np.arange(1 << f.bits, dtype=np.uint8)
    want = R.gfloat_values(f)
    got = np.asarray(emulate.decode(codes, name, to=jnp.float32)).astype(np.float64)
    assert np.array_equal(got, want, equal_nan=True)
    v = R.every_bf16()
    v = v if f.signed else v[~np.signbit(v)]
    got_codes = np.asarray(emulate.encode(v.astype(np.float32), name)).astype(np.int64)
    want_codes = R.gfloat_codes(f, v, saturate=False)
    assert np.array_equal(R.nan_as_one(got_codes, f), R.nan_as_one(want_codes, f))
