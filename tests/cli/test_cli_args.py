"""emulate.cli.args: the argument types and validators the subcommands share."""

from __future__ import annotations

import argparse

import pytest

from emulate import cli, formats, targets
from emulate.cli import args

TPUS = "tpu_v2, tpu_v3, tpu_v4, tpu_v4i, tpu_v5e, tpu_v5p, tpu_v6e, tpu_v7, tpu_v7x, tpu_v8i"


def _error(capsys: pytest.CaptureFixture, call) -> str:
    """The one line ``call`` prints before it exits with status 2."""
    with pytest.raises(SystemExit) as exc:
        call()
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.endswith("\n") and captured.err.count("\n") == 1
    return captured.err


def test_target_all_and_aliases() -> None:
    parser = cli.build_parser()
    assert args.target_names(["all"], parser) == list(targets.names())
    assert args.target_names(["v4", "TPU v4", "h100"], parser) == ["tpu_v4", "gpu_sm90"]
    assert args.operand_formats(["e4m3", "float8_e4m3fn", "s4"], parser) == [
        "float8_e4m3fn",
        "int4",
    ]


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = cli.build_parser()
    monkeypatch.setenv("EMULATE_TARGET", "v5e")
    assert args.target_names(None, parser) == ["tpu_v5e", "tpu_v4"]
    assert args.tpu_target_names([], parser) == ["tpu_v5e"]
    low = [f for f in formats.LOW_PRECISION if f != "float8_e8m0fnu"]
    assert args.operand_formats(None, parser) == low


def test_tpu_target_names(capsys: pytest.CaptureFixture, monkeypatch) -> None:
    parser = cli.build_parser()
    assert args.tpu_target_names(["v5e", "ironwood", "tpu_v5e"], parser) == [
        "tpu_v5e",
        "tpu_v7x",
    ]
    assert args.tpu_target_names(["ALL"], parser) == TPUS.split(", ")
    err = _error(capsys, lambda: args.tpu_target_names(["h100"], parser))
    assert err == (
        f"emulate: error: not a TPU target: 'h100' (choose from {TPUS}, all, or an alias "
        "such as v5e)\n"
    )
    monkeypatch.setenv("EMULATE_TARGET", "cpu")
    err = _error(capsys, lambda: args.tpu_target_names(None, parser))
    assert err == "emulate: error: the current target is cpu; pass --target (a TPU, or all)\n"


def test_target(capsys: pytest.CaptureFixture) -> None:
    parser = cli.build_parser()
    assert args.target("h100", parser) is targets.get("gpu_sm90")
    err = _error(capsys, lambda: args.target("v99", parser))
    assert err == (
        f"emulate: error: unknown target 'v99' (choose from {TPUS}, cpu, gpu_sm80, gpu_sm89, "
        "gpu_sm90, gpu_sm100, or an alias such as v5e)\n"
    )


def test_formats(capsys: pytest.CaptureFixture) -> None:
    parser = cli.build_parser()
    assert args.low_precision("e2m1", parser) is formats.get("float4_e2m1fn")
    assert args.format_name("bf16", parser, "result", ["x"]) == "bfloat16"
    err = _error(capsys, lambda: args.format_name("fp7", parser, "result", ["a", "b"]))
    assert err == (
        "emulate: error: unknown result format 'fp7' (choose from a, b, or an alias such as e4m3)\n"
    )
    assert args.OPERAND_CHOICES == (*formats.LOW_PRECISION_OPERANDS, *formats.WIDE_FLOATS)
    err = _error(capsys, lambda: args.operand_formats(["int32"], parser))
    assert err.startswith("emulate: error: not a matmul operand format 'int32' (choose from ")


def test_argument_types() -> None:
    assert args.positive_int("3") == 3
    for text, shown in (("0", "0"), ("-2", "-2"), ("x", "'x'")):
        with pytest.raises(argparse.ArgumentTypeError) as exc:
            args.positive_int(text)
        assert str(exc.value) == f"expected a positive integer, got {shown}"
    assert args.mode("exact") == "exact"
    with pytest.raises(argparse.ArgumentTypeError) as exc:
        args.mode("Fast")
    assert str(exc.value) == "expected fast or exact, got 'Fast'"


def test_parse_shapes_is_reexported() -> None:
    assert cli.parse_shapes is args.parse_shapes
    (x, s) = args.parse_shapes("4x8:int8, :f32")
    assert (x.shape, x.dtype.name, s.shape, s.dtype.name) == ((4, 8), "int8", (), "float32")
