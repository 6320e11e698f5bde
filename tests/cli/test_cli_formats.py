"""emulate formats: one row per low-precision format, cells checked by hand."""

from __future__ import annotations

import pytest

from emulate import cli, formats

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
    assert list(rows) == list(formats.LOW_PRECISION)
    assert {n: r["max"] for n, r in rows.items()} == HAND_KNOWN_MAX


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


def test_formats_selected_by_alias(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["formats", "e4m3", "fp4"]) == 0
    assert list(_rows(capsys.readouterr().out)) == ["float8_e4m3fn", "float4_e2m1fn"]
