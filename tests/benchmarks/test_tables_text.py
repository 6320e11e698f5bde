"""benchmarks.tables: the aligned text table, the index of ok rows and the goal tables.
Expected strings are written out by hand."""

from __future__ import annotations

from benchmarks import tables


def test_text_table_aligns_columns():
    got = tables.text_table(["name", "ms"], [["a", "1.5"], ["long name", "12.25"]], right={1})
    assert got == "\n".join(
        [
            "name          ms",
            "---------  -----",
            "a            1.5",
            "long name  12.25",
        ]
    )


def test_index_keys_the_ok_rows_of_a_contender():
    rows = [
        {"pair": "a", "M": 1, "contender": "floor", "status": "ok", "v": 1},
        {"pair": "a", "M": 2, "contender": "floor", "status": "refused", "v": 2},
        {"pair": "a", "M": 1, "contender": "fast", "status": "ok", "v": 3},
    ]
    assert {k: r["v"] for k, r in tables.index(rows, ("pair", "M"), "floor").items()} == {
        ("a", 1): 1
    }
    assert {k: r["v"] for k, r in tables.index(rows, ("M", "contender")).items()} == {
        (1, "floor"): 1,
        (1, "fast"): 3,
    }


def test_goal_table_writes_each_goal_and_its_failures():
    goals = [
        {"generation": "tpu_v5e", "goal": "g1", "limit": 1.1, "measured": None},
        {
            "generation": "tpu_v4",
            "goal": "g2",
            "limit": 2,
            "measured": 2.5,
            "worst": "int4 1x2x3",
            "met": False,
            "failing": ["int4 1x2x3"],
            "unestimated": ["int8 1x2x3"],
        },
    ]
    assert tables.goal_table("## T", []) == []
    assert tables.goal_table("## T", goals) == [
        "## T",
        "",
        "| generation | goal | limit | worst measured | where | met | failing |",
        "|---|---|---|---|---|---|---|",
        "| tpu_v5e | g1 | 1.1 | not measured | | | |",
        "| tpu_v4 | g2 | 2 | 2.5 | int4 1x2x3 | no | int4 1x2x3, int8 1x2x3 (no estimate) |",
    ]
