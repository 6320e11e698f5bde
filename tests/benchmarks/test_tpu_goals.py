"""benchmarks.tpu_goals: each goal's limit and the rows that fail it, on rows written by
hand (the compiled rows' goals are checked in test_tpu.py, which compiles them once)."""

from __future__ import annotations

from benchmarks import tpu_goals

GEN = "tpu_v5e"


def test_a_failing_row_is_named_by_the_goal():
    base = {"generation": GEN, "contender": "fast", "status": "ok", "K": 8, "N": 8}
    fake = [
        {**base, "pair": "int8", "M": 1, "temp_over_decoded_weight": 0.1},
        {**base, "pair": "int4", "M": 2, "temp_over_decoded_weight": 0.5},
    ]
    (g,) = [g for g in tpu_goals.goals(fake) if g.get("key") == "temp_over_decoded_weight"]
    assert (g["measured"], g["met"], g["worst"], g["failing"]) == (
        0.5,
        False,
        "int4 2x8x8",
        ["int4 2x8x8"],
    )
