"""emulate.reference.decode against every code's bit fields (tests/reference/_brute.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from _brute import DTYPES, bits_of, code_dtype, field_value, same_float

from emulate import formats, reference


@pytest.mark.parametrize("to", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("name", formats.LOW_PRECISION)
def test_decode_every_code(name, to):
    codes = np.arange(1 << bits_of(name), dtype=np.uint64).astype(code_dtype(name))
    got = reference.decode(codes, name, to=to)
    assert got.dtype == np.dtype(to)
    with np.errstate(invalid="ignore"):
        ml = codes.view(DTYPES[name]).astype(to)
    fields = np.array([field_value(name, int(c)) for c in codes])
    assert np.array_equal(np.isnan(got), np.isnan(ml))
    assert np.array_equal(np.isnan(got), np.isnan(fields))
    assert same_float(got, ml)
    assert same_float(got, fields)
    assert np.array_equal(np.signbit(got), np.signbit(ml))
    assert same_float(reference.decode(codes.view(DTYPES[name]), to=to), fields)


def test_decode_float64_and_wide_types():
    codes = np.arange(1 << 16, dtype=np.uint16)
    got = reference.decode(codes, "bfloat16", to=np.float64)
    assert got.dtype == np.float64
    assert same_float(got, np.array([field_value("bfloat16", int(c)) for c in codes]))
    assert reference.decode(np.array([0x3F800001], np.uint32), "f32", to=np.float64)[0] == (
        1 + 2.0**-23
    )


def test_decode_rejects_bad_input():
    with pytest.raises(TypeError, match="x: .*float64"):
        reference.decode(np.zeros(3))
    with pytest.raises(TypeError, match="x: .*int16.*float8_e4m3fn"):
        reference.decode(np.zeros(3, np.int16), "e4m3")
    with pytest.raises(ValueError, match="x: code 0x10 .*int4"):
        reference.decode(np.array([3, 16], np.uint8), "int4")
    with pytest.raises(ValueError, match="x: code 0x40 .*float6_e2m3fn"):
        reference.decode(np.array([0x40], np.uint8), "float6_e2m3fn")
    with pytest.raises(ValueError, match="to: .*float16"):
        reference.decode(np.zeros(3, np.uint8), "e4m3", to=np.float16)
    with pytest.raises(ValueError, match="fmt: unknown format"):
        reference.decode(np.zeros(3, np.uint8), "e9m9")
    with pytest.raises(TypeError, match="x: .*float8_e5m2.*float8_e4m3fn"):
        reference.decode(np.zeros(3, ml_dtypes.float8_e5m2), "e4m3")


# ------------------------------------------------------------------------ round_exact
