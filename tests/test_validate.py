"""emulate.validate as a library: its defaults, pairs and the compile-heavy rows' one
program. The command line is tested in tests/cli/test_cli_validate.py."""

from __future__ import annotations

import math
import pathlib

from hypothesis import given, settings

import emulate
from emulate import formats, targets, validate

LOW = [f for f in formats.LOW_PRECISION if f != "float8_e8m0fnu"]


def test_defaults() -> None:
    assert validate.default_formats() == LOW
    assert validate.default_targets() == [targets.current_target().name, "tpu_v4"]
    assert validate.pairs(["int8", "bfloat16"]) == [
        ("int8", "int8"),
        ("bfloat16", "bfloat16"),
        ("bfloat16", "int8"),
    ]
    assert len(validate.pairs(validate.default_formats())) == 26


def test_readme_quickstart_runs_validate_and_keeps_the_ci_test_command() -> None:
    root = pathlib.Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    block = readme.split("## Quickstart", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    main, test = block.splitlines()
    assert main == (
        "python -m venv .venv && . .venv/bin/activate && pip install -e . && "
        "python -m emulate validate"
    )
    ci = (root / ".ci" / "run").read_text().splitlines()
    assert test in ci  # .ci/run runs the README's test command verbatim


def test_compile_heavy_rows_draw_from_one_program() -> None:
    assert validate.heavy("float8_e4m3fn", "float8_e4m3fn", "exact")
    assert not validate.heavy("float8_e4m3fn", "float8_e4m3fn", "fast")
    assert not validate.heavy("int8", "float4_e2m1fn", "exact")
    seen: set = set()

    @settings(max_examples=40, database=None, deadline=None)
    @given(validate.row_strategy("float8_e5m2", "float8_e5m2", reduced=True))
    def draw(p):
        seen.add((p.lhs.shape, p.rhs.shape, p.dimension_numbers, p.preferred_element_type))

    draw()
    assert seen == {((2, 3, 16, 150), (150, 2, 16, 2), (((2, 3), (2, 0)), ((0,), (1,))), None)}
    # K spans more than one exact chunk of tpu_v4's bf16 slice route in every heavy row.
    (lc, _), _ = validate.HEAVY_LAYOUT[2]
    k = math.prod(validate.HEAVY_LAYOUT[0][d] for d in lc)
    fmts = [f for f in formats.LOW_PRECISION if f != "float8_e8m0fnu"]
    chunks = [
        emulate.plan(a, b, target="tpu_v4", mode="exact").k_chunk
        for a, b in validate.pairs(fmts)
        if validate.heavy(a, b, "exact")
    ]
    assert len(chunks) == 20 and k == 2400 > max(chunks)


# --------------------------------------------------------------------------- check's tally


def test_tally_counts_each_outcome() -> None:
    problems = [f"problem {i}" for i in range(4)]
    outcomes = [
        validate.Outcome(True, 0.0, None, ""),
        validate.Outcome(False, 3.0, 1.5, "off by 3 ulps"),
        validate.Outcome(True, 1.0, 0.25, ""),
        validate.Outcome(False, math.inf, None, "raised"),
    ]
    tally = validate.Tally()
    assert (tally.examples, tally.max_ulps, tally.worst_ratio, tally.first_failure) == (
        0,
        0.0,
        None,
        None,
    )
    for p, o in zip(problems, outcomes, strict=True):
        tally.add(p, o)  # type: ignore[arg-type]
    assert (tally.examples, tally.mismatches) == (4, 2)
    assert (tally.max_ulps, tally.worst_ratio, tally.first_failure) == (math.inf, 1.5, "problem 1")


def test_check_reports_the_tally_of_a_passing_row() -> None:
    row = validate.check("tpu_v4", "int8", "int8", "fast", examples=3, seed=0)
    assert (row.status, row.contract, row.plan, row.runs) == ("ok", "exact", "bf16", "bf16")
    assert (row.examples, row.mismatches, row.max_ulps, row.worst_ratio) == (3, 0, 0.0, None)
    assert (row.reproducer, row.report) == (None, None)
