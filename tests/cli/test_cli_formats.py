"""emulate formats: one row per low-precision format, cells checked by hand."""

from __future__ import annotations

import pytest

from emulate import cli, formats
from emulate.cli.formats import format_row

HAND_KNOWN_MAX = {
    "int4": "7",
    "uint4": "15",
    "int8": "127",
    "uint8": "255",
    "float8_e4m3fn": "448",
    "float8_e5m2": "57344",
    "float8_e4m3fnuz": "240",
    "float8_e5m2fnuz": "57344",
    "float8_e4m3b11fnuz": "30",
    "float8_e3m4": "15.5",
    "float6_e2m3fn": "7.5",
    "float6_e3m2fn": "28",
    "float4_e2m1fn": "6",
    "float8_e8m0fnu": "2^127",
    # P3109 (gfloat 0.5's layout): largest finite magnitude code, worked by hand.
    "p3109_k8p1se": "2^62",  # 0x7e: 2**(126 - 64)
    "p3109_k8p1ue": "2^125",  # 0xfd: 2**(253 - 128)
    "p3109_k8p3se": "49152",  # 0x7e: 2**(31 - 16) * 1.5
    "p3109_k8p3sf": "57344",  # 0x7f: 2**15 * 1.75
    "p3109_k8p3ue": "2684354560.0",  # 0xfd: 2**(63 - 32) * 1.25
    "p3109_k8p3uf": "3221225472.0",  # 0xfe: 2**31 * 1.5
    "p3109_k8p4se": "224",  # 0x7e: 2**(15 - 8) * 1.75
    "p3109_k8p4sf": "240",  # 0x7f: 2**7 * 1.875
    "p3109_k8p4ue": "53248",  # 0xfd: 2**(31 - 16) * 1.625
    "p3109_k8p4uf": "57344",  # 0xfe: 2**15 * 1.75
    "p3109_k8p7sf": "1.984375",  # 0x7f: 2**(1 - 1) * (1 + 63/64)
    "p3109_k8p8uf": "1.984375",  # 0xfe: 2**(1 - 1) * (1 + 126/128)
}


def _rows(out: str) -> dict[str, dict[str, str]]:
    """Parse the table: header, dashes, one row per format; columns start where dashes do."""
    lines = out.splitlines()
    assert lines[0].startswith("format")
    # Column starts from the dashes line, which has no spaces inside a column.
    starts, pos = [], 0
    for dashes in lines[1].split("  "):
        if dashes:
            starts.append(pos)
        pos += len(dashes) + 2
    rows: dict[str, dict[str, str]] = {}
    for line in lines[2:]:
        if not line.strip():
            break
        bounds = [*starts, None]
        cells = [line[a:b].strip() for a, b in zip(bounds, bounds[1:], strict=False)]
        names = [lines[0][a:b].strip() for a, b in zip(bounds, bounds[1:], strict=False)]
        rows[cells[0]] = dict(zip(names, cells, strict=True))
    return rows


def test_formats_table_has_one_row_per_format_with_max(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["formats"]) == 0
    rows = _rows(capsys.readouterr().out)
    # Then the formats registered in this process (other tests register some).
    assert list(rows) == list(formats.LOW_PRECISION + formats.registered())
    assert list(rows)[: len(HAND_KNOWN_MAX)] == list(HAND_KNOWN_MAX)
    assert {n: rows[n]["max"] for n in HAND_KNOWN_MAX} == HAND_KNOWN_MAX


def test_formats_table_cells(capsys: pytest.CaptureFixture) -> None:
    cli.main(["formats"])
    rows = _rows(capsys.readouterr().out)
    e4m3 = rows["float8_e4m3fn"]
    assert (e4m3["bits"], e4m3["E"], e4m3["M"], e4m3["bias"]) == ("8", "4", "3", "7")
    assert e4m3["NaN codes"] == "0x7f,0xff" and e4m3["Inf codes"] == "-"
    assert e4m3["min normal"] == "2^-6" and e4m3["min subnormal"] == "2^-9"
    assert rows["float8_e5m2"]["Inf codes"] == "0x7c,0xfc"
    assert rows["float8_e5m2"]["NaN codes"] == "0x7d-0x7f,0xfd-0xff"
    assert rows["float8_e4m3fnuz"]["NaN codes"] == "0x80"
    assert rows["float8_e4m3fnuz"]["-0"] == "no"
    assert rows["float8_e8m0fnu"]["min subnormal"] == "-"
    assert rows["float8_e8m0fnu"]["signed"] == "no"
    assert rows["float4_e2m1fn"]["int8 k"] == "1"
    assert rows["float6_e2m3fn"]["int8 k"] == "3"
    assert rows["int4"]["int8 k"] == "0"
    assert rows["float6_e3m2fn"]["int8 k"] == "-"
    se = rows["p3109_k8p3se"]
    assert (se["E"], se["M"], se["bias"], se["-0"]) == ("5", "2", "16", "no")
    assert se["NaN codes"] == "0x80" and se["Inf codes"] == "0x7f,0xff"
    ue = rows["p3109_k8p4ue"]
    assert (ue["signed"], ue["NaN codes"], ue["Inf codes"]) == ("no", "0xff", "0xfe")
    assert rows["p3109_k8p3sf"]["Inf codes"] == "-"
    assert rows["p3109_k8p7sf"]["int8 k"] == "6"  # multiples of 2**-6 up to 127/64
    assert rows["p3109_k8p1ue"]["exact in"] == "-"  # 2**-127 is a float32 denormal


def test_formats_builds_any_p3109_name_and_refuses_others(
    capsys: pytest.CaptureFixture,
) -> None:
    assert cli.main(["formats", "p3109_k6p3se"]) == 0
    row = _rows(capsys.readouterr().out)["p3109_k6p3se"]
    # 6 bits, precision 3, bias 2**(6-3-1) = 4: 0x1e is 2**(7 - 4) * 1.5.
    assert (row["bits"], row["bias"], row["max"], row["NaN codes"]) == ("6", "4", "12", "0x20")
    with pytest.raises(SystemExit) as e:
        cli.main(["formats", "p3109_k8p9se"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("emulate formats: error: unknown low-precision format 'p3109_k8p9se'")


def test_formats_selected_by_alias(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["formats", "e4m3", "fp4"]) == 0
    assert list(_rows(capsys.readouterr().out)) == ["float8_e4m3fn", "float4_e2m1fn"]


def test_formats_describes_a_wide_p3109_format_and_says_why_one_is_not_built(
    capsys: pytest.CaptureFixture,
) -> None:
    assert cli.main(["formats", "p3109_k16p11se"]) == 0
    row = _rows(capsys.readouterr().out)["p3109_k16p11se"]
    # 16 bits, precision 11, bias 2**(16-11-1) = 16; 0x7ffe (exponent field 31, trailing
    # 1022) is 2**(31 - 16) * (1 + 1022/1024) = 65472; 0x7fff is +Inf, 0x8000 NaN.
    assert (row["bits"], row["E"], row["M"], row["bias"], row["max"]) == (
        "16", "5", "10", "16", "65472",
    )  # fmt: skip
    assert (row["NaN codes"], row["Inf codes"], row["exact in"]) == (
        "0x8000", "0x7fff,0xffff", "f32",
    )  # fmt: skip
    with pytest.raises(SystemExit) as e:
        cli.main(["formats", "p3109_k16p1se"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        "emulate formats: error: p3109_k16p1se is not built: its exponent bias is 16384, "
        "which makes its largest value at least 2**16382, above float32's max (below "
        "2**128); emulate decodes into float32 (JAX holds no float64 without x64, and no "
        "TPU has it)"
    )


def test_a_format_without_subnormals_has_its_smallest_value_as_min_normal() -> None:
    # A 4-bit e2m1 without subnormals: 0, 0.75 (1.5 * 2**-1, the smallest), 1 ... 6.
    f = formats.float_format("cli_e2m1_nosub", bits=4, precision=2, bias=1, subnormals=False)
    row = format_row(f)
    assert (row["min normal"], row["min subnormal"], row["max"]) == ("0.75", "-", "6")
    assert row["int8 k"] == "2"  # multiples of 2**-2 up to 6
