"""emulate explain: the plan of one pair, as emulate.plan(...).explain() prints it.

The usage errors run in-process by default (a real ``python -m emulate`` exiting 2 without
a traceback is tests/cli/test_cli_main.py's); explain's own in a subprocess as well under
EMULATE_LONG_TESTS=1."""

from __future__ import annotations

import subprocess
import sys

import pytest

from emulate import cli


def test_explain_fp4_on_v5e_takes_the_exact_int8_route(capsys: pytest.CaptureFixture) -> None:
    import emulate

    assert cli.main(["explain", "float4_e2m1fn", "float4_e2m1fn", "--target", "tpu_v5e"]) == 0
    out = capsys.readouterr().out
    p = emulate.plan("float4_e2m1fn", "float4_e2m1fn", target="tpu_v5e")
    assert out == p.explain() + "\n"
    lines = out.splitlines()
    assert lines[0] == "float4_e2m1fn x float4_e2m1fn -> float4_e2m1fn on tpu_v5e (mode 'fast')"
    assert "  method: decode to int8 (exact power-of-two scaling), int32 accumulation" in lines
    assert "  matrix unit sees: int8 x int8, accumulating in int32" in lines
    assert "  numerics: exact; the result is the exact sum rounded once" in lines


def test_explain_options(capsys: pytest.CaptureFixture) -> None:
    import emulate

    argv = ["explain", "e2m1", "int4", "--target", "v4", "--out", "f32", "--mode", "exact"]
    assert cli.main(argv) == 0
    p = emulate.plan(
        "float4_e2m1fn", "int4", target="tpu_v4", preferred_element_type="float32", mode="exact"
    )
    assert capsys.readouterr().out == p.explain() + "\n"
    assert p.out == "float32" and p.mode == "exact" and p.exact


def test_explain_uses_the_current_target(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("EMULATE_TARGET", "ironwood")
    assert cli.main(["explain", "e4m3", "e4m3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "float8_e4m3fn x float8_e4m3fn -> float8_e4m3fn on tpu_v7x (mode 'fast')"
    assert lines[1] == "  method: native: the operands go to the matrix unit as they are"


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["explain", "float7", "int8"],
            "emulate explain: error: unknown operand format 'float7' (choose from int4, uint4, "
            "int8, uint8, float8_e4m3fn, float8_e5m2, float8_e4m3fnuz, float8_e5m2fnuz, "
            "float8_e4m3b11fnuz, float8_e3m4, float6_e2m3fn, float6_e3m2fn, float4_e2m1fn, "
            "bfloat16, float16, float32, or an alias such as e4m3)",
        ),
        (
            ["explain", "int8", "int8", "--target", "tpu_v9"],
            "emulate explain: error: unknown target 'tpu_v9' (choose from tpu_v2, tpu_v3, "
            "tpu_v4, tpu_v4i, tpu_v5e, tpu_v5p, tpu_v6e, tpu_v7, tpu_v7x, tpu_v8i, cpu, "
            "gpu_sm80, gpu_sm89, gpu_sm90, gpu_sm100, or an alias such as v5e)",
        ),
        (
            ["explain", "int32", "int32", "--target", "v4", "--mode", "exact"],
            "emulate explain: error: mode='exact' for int32 x int32 is not built: it covers "
            "the low-precision formats (integers, float8, float6, float4), bfloat16, float16 "
            "and float32 with each other; use mode='fast'",
        ),
        (
            ["explain", "e8m0", "int8", "--target", "v4"],
            "emulate explain: error: lhs: float8_e8m0fnu is a scale type, not a matmul "
            "operand; pass it as the scales of a scaled operand",
        ),
        (
            ["explain", "int8", "e4m3", "--target", "v4", "--out", "int8"],
            "emulate explain: error: preferred_element_type: an integer result (int8) needs "
            "integer operands, got int8 x float8_e4m3fn",
        ),
    ],
)
def test_explain_errors_are_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == message + "\n"


def test_explain_bad_environment_target_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setenv("EMULATE_TARGET", "tpu_v99")
    with pytest.raises(SystemExit) as exc:
        cli.main(["explain", "int8", "int8"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("emulate explain: error: EMULATE_TARGET: unknown target 'tpu_v99'")
    assert err.count("\n") == 1


@pytest.mark.long  # in-process: test_explain_errors_are_one_line's int32 x int32 case
def test_explain_exact_on_a_bounded_pair_exits_2_without_traceback() -> None:
    argv = ["explain", "int32", "int32", "--target", "v5e", "--mode", "exact"]
    bad = subprocess.run(
        [sys.executable, "-m", "emulate", *argv], capture_output=True, text=True, check=False
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == (
        "emulate explain: error: mode='exact' for int32 x int32 is not built: it covers the "
        "low-precision formats (integers, float8, float6, float4), bfloat16, float16 and "
        "float32 with each other; use mode='fast'\n"
    )
