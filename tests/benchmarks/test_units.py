"""benchmarks.units: three significant digits, fixed places, the missing figure, the
quotient. Expected strings are written out by hand."""

from __future__ import annotations

from benchmarks import units


def test_units_print_three_significant_digits_or_fixed_places():
    assert units.ms(0.0123) == "12.3"
    assert units.ms(0.001) == "1"
    assert units.ms(0.1234) == "123"
    assert units.ms(1.5) == "1500"  # no exponent from 1000 up
    assert units.ms(0.0123, places=3) == "12.300"
    assert units.ms(2.5e-5, places=2) == "0.03"
    assert units.us(2e-6) == "2"
    assert units.us(1.234e-4) == "123"
    assert units.us(0.0125) == "12500"
    assert units.mb(8_388_608) == "8.39"
    assert units.mb(134_217_728) == "134"
    assert units.mb(2_500_000_000) == "2500"
    assert units.mb(32_768, places=2) == "0.03"
    assert units.ratio(1.234) == "1.23"
    assert units.ratio(0.5, places=1) == "0.5"
    assert units.shape_text((64, 4096, 1024)) == "64x4096x1024"


def test_a_missing_figure_prints_as_a_question_mark():
    for fmt in (units.ms, units.us, units.mb, units.ratio):
        assert fmt(None) == "?"


def test_quotient_is_none_without_both_figures():
    assert units.quotient(3.0, 2.0) == 1.5
    assert units.quotient(None, 2.0) is None
    assert units.quotient(3.0, None) is None
    assert units.quotient(3.0, 0.0) is None
