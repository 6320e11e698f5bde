"""Format records built from parameters: every field checked against gfloat's FormatInfo
(gfloat 0.5, graphcore-research/gfloat), and the impossible records refused."""

from __future__ import annotations

import re

import gfloat
import numpy as np
import pytest
from gfloat.formats import format_info_p3109
from gfloat.types import Domain, Signedness

from emulate import formats
from emulate.float_format import P3109_BINARY8, float_format, p3109

#: gfloat's own list of the binary8 P3109 formats, by name.
GFLOAT_BINARY8 = {fi.name: fi for fi in gfloat.formats.p3109_binary8_formats}


def _gfloat_p3109(name: str) -> gfloat.FormatInfo:
    k, rest = name.removeprefix("p3109_k").split("p")
    p, s, d = int(rest[:-2]), rest[-2], rest[-1]
    return format_info_p3109(
        int(k),
        p,
        Signedness.Signed if s == "s" else Signedness.Unsigned,
        Domain.Extended if d == "e" else Domain.Finite,
    )


def test_the_built_in_family_is_gfloats_binary8_list() -> None:
    assert sorted(P3109_BINARY8) == sorted(GFLOAT_BINARY8)
    assert all(formats.get(n).name == n for n in P3109_BINARY8)


FAMILY = [
    f"p3109_k{k}p{p}{s}{d}"
    for k in (3, 4, 6, 8)
    for p in range(1, k + 1)
    for s in "su"
    for d in "ef"
]
#: The wide formats emulate builds, a few of each width: those with an exponent field of at
#: most 8 bits (float32 holds their values).
WIDE_FAMILY = [
    f"p3109_k{k}p{p}{s}{d}"
    for k in (9, 12, 16)
    for s in "su"
    for p in sorted({k - 8 + (s == "u"), k - 6, k - 1, k})
    for d in "ef"
]


@pytest.mark.parametrize("name", FAMILY + WIDE_FAMILY)
def test_p3109_record_matches_gfloat_format_info(name: str) -> None:
    fi = _gfloat_p3109(name)
    f = formats.get(name)
    assert (f.bits, f.mantissa_bits + 1, f.bias, f.signed) == (
        fi.k,
        fi.precision,
        fi.bias,
        fi.is_signed,
    )
    assert f.exponent_bits == fi.expBits
    assert f.max == fi.max and f.min == fi.min
    assert f.min_subnormal == fi.smallest_subnormal
    assert f.max_code == fi.code_of_max
    assert len(f.nan_codes) == fi.num_nans
    assert fi.code_of_nan in f.nan_codes
    assert f.has_inf == (fi.domain == Domain.Extended)
    if f.has_inf:
        assert fi.code_of_posinf in f.inf_codes
        assert len(f.inf_codes) == fi.num_infs
    assert f.signed_zero == (fi.has_nz and fi.is_signed)
    # Each code's class, as gfloat decodes it (above 8 bits the top and bottom 256 codes of
    # each sign, where the specials are, and every 97th code).
    codes = range(1 << f.bits)
    if f.bits > 8:
        half = 1 << (f.bits - 1)
        edges = [*range(256), *range(half - 256, half + 256), *range(2 * half - 256, 2 * half)]
        codes = sorted(set(edges) | set(range(0, 2 * half, 97)))
    for code in codes:
        v = gfloat.decode_float(fi, code).fval
        assert (code in f.nan_codes) == bool(np.isnan(v)), code
        assert (code in f.inf_codes) == bool(np.isinf(v)), code


def test_user_records_match_gfloat_format_info() -> None:
    e3m3 = float_format("e3m3", bits=7, precision=4, bias=3, high_nans=1)
    fi = gfloat.FormatInfo(
        "e3m3",
        k=7,
        precision=4,
        bias=3,
        is_signed=True,
        domain=Domain.Finite,
        has_nz=True,
        num_high_nans=1,
        has_subnormals=True,
        is_twos_complement=False,
    )
    assert (e3m3.max, e3m3.min_subnormal, e3m3.max_code) == (fi.max, 2.0**-5, fi.code_of_max)
    assert e3m3.max == 28.0 and e3m3.nan_codes == (0x3F, 0x7F) and e3m3.inf_codes == ()
    assert e3m3.exact_in == ("bfloat16", "float32") and e3m3.int8_scale is None
    u5 = float_format(
        "u5e3m2", bits=5, precision=3, bias=3, signed=False, infinities=True, high_nans=1
    )
    assert (u5.max, u5.min, u5.nan_codes, u5.inf_codes) == (20.0, 0.0, (31,), (30,))
    assert u5.nan_code == 31 and u5.max_code == 29 and not u5.signed_zero


def test_int8_scale_and_scale_only_come_from_the_values() -> None:
    # p3109_k8p7sf: multiples of 2**-6 up to 127/64: times 64 they are int8s.
    assert formats.get("p3109_k8p7sf").int8_scale == 6
    assert formats.get("p3109_k8p8uf").int8_scale is None  # 254/128: 254 > 127
    # Values below 2**-126 (float32 denormals): a scale type, like e8m0.
    assert formats.get("p3109_k8p1ue").is_scale_only
    assert formats.get("p3109_k8p1ue").exact_in == ()
    assert formats.get("float8_e8m0fnu").is_scale_only
    assert not formats.get("p3109_k8p1se").is_scale_only  # down to 2**-63 only


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            dict(bits=17, precision=4),
            ValueError,
            "bits: a format is stored in 2 to 16 bits, got 17",
        ),
        (
            dict(bits=8, precision=0),
            ValueError,
            "precision: expected 1 to 8 (the storage bits), got 0",
        ),
        (dict(bits=8, precision=4.0), TypeError, "precision: expected an int, got float 4.0"),
        (dict(bits=8, precision=4, signed=1), TypeError, "signed: expected True or False"),
        (
            dict(bits=4, precision=3, high_nans=7),
            ValueError,
            "high_nans: 7 NaN codes leave no finite nonzero code among the 8 magnitudes",
        ),
        (
            dict(bits=8, precision=1, bias=-200),
            ValueError,
            "bias: -200 puts values outside float32",
        ),
        (
            dict(bits=8, precision=2, bias=160),
            ValueError,
            "bias: 160 puts values outside float32 (its quantum 2**-160, below "
            "float32's smallest denormal 2**-149); emulate decodes into float32 (JAX holds "
            "no float64 without x64, and no TPU has it)",
        ),
        (
            dict(bits=16, precision=4),
            ValueError,
            "bias: 2047 puts values outside float32 (its largest value at least 2**2048, above "
            "float32's max (below 2**128))",
        ),
        (
            dict(bits=8, precision=2, bias=127, subnormals=False),
            ValueError,
            "bias: 127 is too large for a format without subnormals with a trailing "
            "significand (at most 126)",
        ),
        (
            dict(bits=8, precision=1, subnormals=False),
            ValueError,
            "subnormals: a precision-1 format without subnormals has no zero (gfloat 0.5 "
            "decodes its code 0 as 2**-bias, as float8_e8m0fnu's)",
        ),
    ],
)
def test_impossible_records_are_refused(kwargs, error, message) -> None:
    with pytest.raises(error, match="^" + re.escape(message)):
        float_format("x8", **kwargs)


def test_names_are_checked() -> None:
    with pytest.raises(ValueError, match="^name: expected a non-empty name"):
        float_format("e3 m3", bits=7, precision=4)
    with pytest.raises(ValueError, match="^precision: a 8-bit P3109 format has precision 1 to 8"):
        p3109(9)


def test_a_format_built_from_parameters_writes_the_all_ones_nan() -> None:
    # An IEEE-like 7-bit e3m3 (Inf, every nonzero trailing field of the top exponent a
    # NaN): NaN is the all-ones magnitude with the input's sign, 0x3f / 0x7f, where gfloat
    # writes 0x7f (2**k - 1) for both. The ml_dtypes formats keep ml_dtypes' quiet NaN.
    import emulate

    record = float_format("ieee_e3m3", bits=7, precision=4, infinities=True, high_nans=7)
    f = formats.register(record)
    assert f.nan_code == 0x3F and 0x3C in f.nan_codes
    codes = np.asarray(emulate.encode(np.float32([np.nan, -np.nan, np.inf]), f))
    assert codes.tolist() == [0x3F, 0x7F, 0x38]
    fi = gfloat.FormatInfo(
        "ieee_e3m3", 7, 4, bias=3, is_signed=True, domain=Domain.Extended, has_nz=True,
        num_high_nans=7, has_subnormals=True, is_twos_complement=False,
    )  # fmt: skip
    assert gfloat.encode_float(fi, np.nan) == 0x7F
    for name in ("float8_e5m2", "float8_e3m4"):  # ml_dtypes' own NaN code: 0x7e, 0x78
        ml = np.float32([np.nan]).astype(formats.get(name).dtype).view(np.uint8)
        assert formats.get(name).nan_code == ml[0] == {"float8_e5m2": 0x7E}.get(name, 0x78)


@pytest.mark.parametrize("p", [1, 2])
def test_the_two_bit_signed_extended_p3109_formats_say_why_they_are_not_built(p) -> None:
    name = f"p3109_k2p{p}se"
    why = (
        f"{name} is not built: its four codes are 0, +Inf, NaN and -Inf, no finite nonzero "
        "value (gfloat's format_info_p3109 describes the same codes), and emulate builds "
        "formats that hold at least one"
    )
    with pytest.raises(ValueError, match="^" + re.escape(why) + "$"):
        p3109(p, bits=2)
    with pytest.raises(ValueError, match=f"^fmt: {name} is not built: its four codes"):
        formats.get(name)
    fi = _gfloat_p3109(name)  # gfloat: codes 0, 1, 2, 3 are 0, +Inf, NaN, -Inf
    assert [gfloat.decode_float(fi, c).fval for c in (0, 1, 3)] == [0.0, np.inf, -np.inf]
    assert np.isnan(gfloat.decode_float(fi, 2).fval)


def test_p3109_formats_wider_than_16_bits_say_they_are_not_built() -> None:
    with pytest.raises(ValueError, match=r"^fmt: 'p3109_k17p8se' is a 17-bit P3109 format, not "
                       r"built: emulate builds P3109 formats of 2 to 16 bits \(its codes are "
                       r"uint8 or uint16\)$"):  # fmt: skip
        formats.get("p3109_k17p8se")
    with pytest.raises(ValueError, match=r"^bits: P3109 formats of 2 to 16 bits are built"):
        p3109(3, bits=17)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("p3109_k16p1se", "16384, which makes its largest value at least 2**16382"),
        ("p3109_k9p1ue", "256, which makes its largest value at least 2**253"),
        ("p3109_k16p7sf", "256, which makes its largest value at least 2**255"),
    ],
)
def test_wide_p3109_formats_beyond_float32_say_why_they_are_not_built(name, why) -> None:
    message = (
        f"fmt: {name} is not built: its exponent bias is {why}, above float32's max (below "
        "2**128); emulate decodes into float32 (JAX holds no float64 without x64, and no TPU "
        "has it)"
    )
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        formats.get(name)
