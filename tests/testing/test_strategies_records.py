"""emulate.testing's strategies and reproducers for formats without a dtype (P3109, formats
users register): operands are Packed arrays, special codes come from the record's oracle,
and a reproducer script re-registers the format and runs."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import emulate
from emulate import formats
from emulate import testing as et

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import _record_formats as R  # noqa: E402

R.register_user_formats()


def test_special_codes_of_a_p3109_format_by_hand() -> None:
    # p3109_k8p3se: bias 16, 2 trailing bits; 0x80 NaN, 0x7f/0xff Inf, no -0.
    # 0 (and -0) 0x00; max 0x7e / min 0xfe; min normal 2**-15 is 0x04 / 0x84;
    # min subnormal 2**-17 is 0x01 / 0x81; 1.0 is 2**(16-16): 0x40 / 0xc0.
    assert et.special_codes("p3109_k8p3se", finite=True) == [
        0x00, 0x01, 0x04, 0x40, 0x7E, 0x81, 0x84, 0xC0, 0xFE,
    ]  # fmt: skip
    assert et.special_codes("p3109_k8p3se")[-3:] == [0xC0, 0xFE, 0xFF]
    assert 0x80 in et.special_codes("p3109_k8p3se") and 0x7F in et.special_codes("p3109_k8p3se")
    # u5e3m2 (unsigned, bias 3): 0; max 20 is 0x1d; min normal 2**-2 is 0x04; 2**-4 is 0x01;
    # 1.0 is 0x0c; 0x1e Inf; 0x1f NaN. Negative values have no code.
    assert et.special_codes("u5e3m2") == [0x00, 0x01, 0x04, 0x0C, 0x1D, 0x1E, 0x1F]
    assert et.odd_extreme_codes("e3m3") == [0x3D, 0x7D]  # +-26: 16 * 1.625, odd mantissa


@settings(max_examples=6, database=None)
@given(st.data())
def test_arrays_of_a_format_without_a_dtype_are_packed(data) -> None:
    name = data.draw(st.sampled_from(["e3m3", "u5e3m2", "p3109_k8p4sf"]))
    x = data.draw(et.arrays(name, (3, 5), elements="finite"))
    assert isinstance(x, emulate.Packed) and x.format_name == name and x.shape == (3, 5)
    codes = np.asarray(emulate.unpack(x))
    assert set(codes.ravel().tolist()) <= set(et.finite_codes(name))


def test_formats_strategy_draws_registered_operands_only_when_asked() -> None:
    drawn = set()

    @settings(max_examples=200, derandomize=True, database=None)
    @given(et.formats(include_registered=True))
    def collect(f) -> None:
        drawn.add(f.name)

    collect()
    assert "p3109_k8p3se" in drawn and "e3m3" in drawn
    assert "p3109_k8p1ue" not in drawn and "float8_e8m0fnu" not in drawn  # scale types
    assert not any(n.startswith("p3109") for n in formats.LOW_PRECISION_OPERANDS)


def test_reproducer_of_packed_user_format_operands_runs() -> None:
    # e3m3 (sign, 3 exponent bits, 3 trailing, bias 3): 0x38 = 2**(7-3) = 16; 0x45 = -(5 *
    # 2**-5); 0. u5e3m2 (3 exponent bits, 2 trailing, bias 3): 0x0c = 1; 0x1d = 2**4 * 1.25
    # = 20; 0x04 = 2**-2. The sum: 16 - 5/32 * 20 + 0 = 12.875.
    lhs = emulate.pack(np.array([[0x38, 0x45, 0x00]], np.uint8), "e3m3", axis=-1)
    rhs = emulate.pack(np.array([[0x0C], [0x1D], [0x04]], np.uint8), "u5e3m2", axis=0)
    problem = et.DotProblem(lhs, rhs, (((1,), (0,)), ((), ())), "float32")
    script = et.reproducer(problem, target="tpu_v4", mode="fast")
    assert (
        "emulate.formats.register(emulate.formats.float_format('e3m3', bits=7, precision=4, "
        "bias=3, signed=True, infinities=False, high_nans=1, negative_zero=True))"
    ) in script
    assert "rhs = emulate.pack(rhs_codes, 'u5e3m2', axis=-2)" in script
    scope: dict = {}
    exec(compile(script, "<reproducer>", "exec"), scope)  # asserts the contract itself
    assert np.asarray(scope["got"]).tolist() == [[12.875]]
    assert scope["want"].tolist() == [[12.875]]
