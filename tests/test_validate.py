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
    @given(validate._strategy("float8_e5m2", "float8_e5m2", reduced=True))
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
