"""Ties of the precision-1 formats (no trailing significand bits) in the oracle.

Every value of such a format is a power of two, so the quantum at a tie ``1.5 * 2**e`` is
``2**e`` itself and "the even quantum" says nothing: the even code is the even exponent
field. :func:`emulate.reference.round_exact` and :func:`emulate.reference.rounding.encode`
are checked, at every tie and its float32 neighbours, against gfloat 0.5's ``round_float``
and a brute-force Fractions rounding over the format's list of values.
"""

from __future__ import annotations

import bisect
import math
from fractions import Fraction

import gfloat
import numpy as np
import pytest
from gfloat import Domain, RoundMode, Signedness, round_float
from gfloat.formats import format_info_p3109

from emulate import formats, reference
from emulate.reference import rounding as reference_rounding

P3109_P1 = [
    (k, signed, extended)
    for k in range(2, 9)
    for signed in (True, False)
    for extended in (True, False)
    if not (k == 2 and signed and extended)  # no finite nonzero value: not built
]
#: A user format of precision 1: 6 bits, bias 9, -0, +-Inf and one NaN (emulate builds
#: precision 1 only with subnormals: without them code 0 would not be zero).
USER = dict(bits=6, precision=1, bias=9, infinities=True, high_nans=1)
MODES = {"nearest_even": RoundMode.TiesToEven, "nearest_away": RoundMode.TiesToAway}


def _p3109_case(k: int, signed: bool, extended: bool):
    f = formats.get(f"p3109_k{k}p1{'s' if signed else 'u'}{'e' if extended else 'f'}")
    fi = format_info_p3109(
        k,
        1,
        Signedness.Signed if signed else Signedness.Unsigned,
        Domain.Extended if extended else Domain.Finite,
    )
    return f, fi


def _user_case():
    f = formats.register(formats.float_format("test_precision1_k6", **USER))
    fi = gfloat.FormatInfo(
        "test_precision1_k6",
        k=6,
        precision=1,
        bias=9,
        is_signed=True,
        domain=Domain.Extended,
        has_nz=True,
        num_high_nans=1,
        has_subnormals=True,
        is_twos_complement=False,
    )
    return f, fi


CASES = [
    pytest.param(*_p3109_case(k, s, e), id=f"p3109_k{k}p1{'s' if s else 'u'}{'e' if e else 'f'}")
    for k, s, e in P3109_P1
] + [pytest.param(*_user_case(), id="test_precision1_k6")]


def _grid(fi) -> list[tuple[Fraction, int]]:
    """(magnitude, code) of every finite non-negative value, by gfloat's decoding of each
    code, then one past the largest (``2 * max``, the next code: rounding there is
    overflow)."""
    out = {}
    for code in range(1 << fi.k):
        v = gfloat.decode_float(fi, code).fval
        if math.isfinite(v) and v >= 0 and not (v == 0 and code != 0):
            out.setdefault(Fraction(v), code)
    grid = sorted(out.items())
    top, top_code = grid[-1]
    return [*grid, (2 * top, top_code + 1)]


def _brute(x: Fraction, grid, f: formats.Format, mode: str) -> float:
    """``x`` rounded to nearest over ``grid``; a tie to the even code or away from zero."""
    mag = abs(x)
    i = bisect.bisect_left(grid, mag, key=lambda g: g[0])
    above = grid[min(i, len(grid) - 1)]  # past 2 * max: overflow whatever the mode
    below = above if above[0] == mag else grid[i - 1]
    d_lo, d_hi = mag - below[0], above[0] - mag
    if d_lo != d_hi:
        value, code = below if d_lo < d_hi else above
    elif mode == "nearest_away":
        value, code = above
    else:
        value, code = below if below[1] % 2 == 0 else above
    if code == grid[-1][1]:
        value = math.inf if f.has_inf else math.nan if f.has_nan else float(grid[-2][0])
    result = float(value)
    return -result if x < 0 else result


def _points(grid, signed: bool) -> np.ndarray:
    """Every tie between neighbours of ``grid`` and its float32 neighbours, both signs
    where the format is signed."""
    ties = np.array([float((a + b) / 2) for (a, _), (b, _) in zip(grid, grid[1:])], np.float32)
    pts = np.concatenate(
        [ties, np.nextafter(ties, np.float32(np.inf)), np.nextafter(ties, np.float32(0))]
    )
    return np.concatenate([pts, -pts]) if signed else pts


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize(("f", "fi"), CASES)
def test_precision1_ties_match_gfloat_and_brute_force(f, fi):
    grid = _grid(fi)
    x = _points(grid, f.signed)
    for mode, gmode in MODES.items():
        codes = reference_rounding.encode(x, f, rounding=mode)
        encoded = reference.decode(codes, f, to=np.float64)
        for v, got_encode in zip(x.tolist(), encoded.tolist()):
            want = _brute(Fraction(v), grid, f, mode)
            assert _same(round_float(fi, v, gmode, sat=False), want), (f.name, mode, v, want)
            assert _same(got_encode, want), (f.name, mode, v, got_encode, want)
            if mode == "nearest_even":
                frac = Fraction(v)
                exponent = 1 - frac.denominator.bit_length()
                got = reference.round_exact(frac.numerator, exponent, f)
                assert _same(got, want), (f.name, v, got, want)


def test_precision1_round_exact_ties_go_to_the_even_exponent():
    # p3109_k8p1se: 2**e has code e + 64. 1.5 lies between 1 (code 64) and 2 (code 65).
    assert reference.round_exact(3, -1, "p3109_k8p1se") == 1.0
    assert reference.round_exact(3, -3, "p3109_k8p1se") == 0.25  # 0.25: code 62
    assert reference.round_exact(3, -2, "p3109_k8p1se") == 1.0  # 1.0 over 0.5 (code 63)
    assert reference.round_exact(-3, 0, "p3109_k8p1se") == -4.0  # 4.0: code 66
