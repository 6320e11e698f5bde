"""emulate.tables: the plain-text table and the grid split into column groups."""

from __future__ import annotations

from emulate import tables

CELLS = {
    ("int4", "v4"): "e/e",
    ("int4", "v5e"): "N/e",
    ("int4", "cpu"): "e/e",
    ("int8", "v4"): "e/e",
    ("int8", "v5e"): "N/e",
    ("int8", "cpu"): "N/e",
}
COLUMNS = [("v4", "tpu"), ("v5e", "tpu"), ("cpu", "other")]


def test_table():
    rows = [{"a": "1", "bb": "x"}, {"a": "333", "bb": ""}]
    assert tables.table(rows) == "a    bb\n---  --\n1    x\n333"
    assert tables.table(rows, rule=False, columns=["bb", "a"]) == "bb  a\nx   1\n    333"
    assert tables.table([], columns=["a"]) == "a\n-" and tables.table([]) == ""


def test_grid_in_one_table_when_it_fits():
    assert tables.grid("T", ["int4", "int8"], COLUMNS, CELLS) == (
        "T\n"
        "format  v4   v5e  cpu\n"
        "------  ---  ---  ---\n"
        "int4    e/e  N/e  e/e\n"
        "int8    e/e  N/e  N/e"
    )


def test_grid_splits_by_group_then_by_width():
    # "format" (6) + three columns of 5: 21 characters. At 20, one table per group.
    by_group = tables.grid("T", ["int4", "int8"], COLUMNS, CELLS, width=20)
    assert by_group == (
        "T\nformat  v4   v5e\n------  ---  ---\nint4    e/e  N/e\nint8    e/e  N/e\n\n"
        "T\nformat  cpu\n------  ---\nint4    e/e\nint8    N/e"
    )
    # At 15 the TPU group is cut further; a column wider than the limit still gets a table.
    cut = tables.grid("T", ["int4"], COLUMNS, CELLS, width=15, corner="fmt")
    assert cut.split("\n\n") == [
        "T\nfmt   v4   v5e\n----  ---  ---\nint4  e/e  N/e",
        "T\nfmt   cpu\n----  ---\nint4  e/e",
    ]
    assert tables.grid("T", ["int4"], COLUMNS, CELLS, width=5).count("T\n") == 3


def test_grid_without_rows_or_columns():
    assert tables.grid("T", [], COLUMNS, {}) == "T\nformat  v4  v5e  cpu\n------  --  ---  ---"
    assert tables.grid("T", ["int4"], [], {}) == "T\nformat\n------\nint4"


def test_short_names():
    assert tables.WIDTH == 100
    assert [tables.short_format(f) for f in ("float8_e4m3fn", "bfloat16", "int4")] == [
        "e4m3fn",
        "bf16",
        "int4",
    ]
    assert [tables.short_target(t) for t in ("tpu_v5e", "gpu_sm90", "cpu")] == [
        "v5e",
        "sm90",
        "cpu",
    ]
