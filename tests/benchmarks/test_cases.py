"""benchmarks.cases: the pairs, shapes and flag parsers benchmarks.matmul and
benchmarks.tpu share, and the registration of every benchmark with the harness."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import jax.numpy as jnp
import pytest

from benchmarks import cases, harness

BENCHMARKS = (
    "bundle_calibration",
    "chip_time",
    "decode",
    "exact",
    "kv_attention",
    "layer_time",
    "matmul",
    "models",
    "pallas_matmul",
    "pallas_ops",
    "pallas_qtime",
    "qcpu",
    "quantized",
    "ragged",
    "scaled",
    "tpu",
)


def test_pairs_name_their_operands():
    p = cases.PAIRS
    assert list(p) == [
        "int8",
        "int4",
        "float8_e4m3fn",
        "float8_e5m2",
        "float4_e2m1fn",
        "int8xint8",
        "fp8xfp8",
    ]
    assert p["int4"].title == "bf16 x int4 (packed)"
    assert p["float4_e2m1fn"].title == "bf16 x e2m1fn (packed)"
    assert p["fp8xfp8"].title == "e4m3fn x e4m3fn"
    assert p["int8xint8"].accumulator is jnp.int32
    assert p["int8"].accumulator is jnp.float32  # bf16 x int8 is not an integer pair
    assert [n for n, q in p.items() if q.packed] == ["int4", "float4_e2m1fn"]


def test_parse_shapes_and_its_messages():
    assert cases.parse_shapes("1x2x3, 4X5X6") == [(1, 2, 3), (4, 5, 6)]
    assert cases.parse_shape("64x4096x1024") == (64, 4096, 1024)
    with pytest.raises(argparse.ArgumentTypeError) as e:
        cases.parse_shapes("1x2x0")
    assert str(e.value) == "--shapes: expected MxKxN[,MxKxN...] of positive integers, got '1x2x0'"
    with pytest.raises(argparse.ArgumentTypeError) as e:
        cases.parse_shapes("1x2", "--exact-shapes")
    assert str(e.value).startswith("--exact-shapes: expected MxKxN")
    with pytest.raises(argparse.ArgumentTypeError) as e:
        cases.parse_shape("1x2x3,4x5x6")
    assert str(e.value) == "--shape: expected one MxKxN, got '1x2x3,4x5x6'"


def test_parse_names_and_pairs():
    assert cases.parse_pairs(" int4,fp8xfp8 ") == ["int4", "fp8xfp8"]
    with pytest.raises(argparse.ArgumentTypeError) as e:
        cases.parse_names("a,zz", ["a", "b"], "--contenders")
    assert str(e.value) == "--contenders: unknown zz; choose from a, b"
    with pytest.raises(argparse.ArgumentTypeError) as e:
        cases.parse_pairs(",")
    assert str(e.value).startswith("--formats: unknown (none); choose from int8, int4,")


def test_rows_name_their_shape_and_contenders():
    assert cases.shape_of({"M": 1, "K": 4096, "N": 512}) == "1x4096x512"
    assert cases.shape_of({"M": None, "K": 64, "N": 32}) == "64x32"
    contenders = [cases.Contender(k, k.upper(), "") for k in ("floor", "xla", "fast")]
    rows = [{"contender": "fast"}, {"contender": "floor"}, {"contender": "other"}]
    assert cases.present(rows, contenders) == ["floor", "fast"]


def test_every_benchmark_registers_under_its_module_name():
    for name in BENCHMARKS:
        module = importlib.import_module(f"benchmarks.{name}")
        assert isinstance(module.BENCHMARK, harness.Benchmark)
        assert module.BENCHMARK.name == name
        assert module.main == module.BENCHMARK.main
    found = sorted(p.stem for p in Path(harness.__file__).parent.glob("*.py"))
    helpers = {"__init__", "cases", "harness", "pallas_traffic", "plots"}
    # models
    helpers |= {"model_goals", "model_layers", "model_specs", "model_steps", "model_weights"}
    helpers.add("qweights")  # the checkpoint weights of quantized and qcpu
    helpers |= {"contenders", "schemes"}  # what matmul / tpu and the quantized scripts share
    helpers.add("tpu_goals")  # the TPU goals of issues 16 and 27, read off tpu's rows
    helpers.add("chip_programs")  # the programs chip_time times and bundle_calibration estimates
    helpers.add("provenance")  # what every result file records about its run
    helpers |= {"timing", "units", "tables", "svg"}  # the harness's concepts, shared
    helpers.add("report")  # docs/performance.md from benchmarks/data, no Benchmark
    helpers.add("word_time")  # a script for a lent TPU (jax, numpy, ml_dtypes only), no Benchmark
    helpers.add("bundle_columns")  # the bundle model's figures in quantized and models
    assert found == sorted(helpers | set(BENCHMARKS))


def test_no_benchmark_edits_sys_path():
    for path in Path(harness.__file__).parent.glob("*.py"):
        assert "sys.path" not in path.read_text(), path.name


def test_matmul_and_tpu_flags():
    from benchmarks import matmul, tpu

    args = matmul.BENCHMARK.parse(["--quick", "--formats", "int4"])
    assert (args.repeats, args.formats, args.shapes) == (10, ["int4"], None)
    assert args.command == "python -m benchmarks.matmul --quick --formats int4"
    assert args.json == Path(harness.__file__).parent / "results" / "matmul.json"
    assert tpu.BENCHMARK.parse([]).exact_shapes == [(64, 4096, 4096)]
    assert tpu.BENCHMARK.parse(["--exact-shapes", "all"]).exact_shapes is None
    assert tpu.BENCHMARK.parse(["--exact-shapes", "1x2x3"]).exact_shapes == [(1, 2, 3)]
    assert not hasattr(tpu.BENCHMARK.parse([]), "repeats")  # tpu times nothing


def test_a_goal_names_its_worst_row_and_every_failing_one():
    rows = [
        {"pair": "int8", "M": 1, "K": 8, "N": 8, "r": 0.5},
        {"pair": "int4", "M": 2, "K": 8, "N": 8, "r": 1.5},
        {"pair": "int4", "M": 4, "K": 8, "N": 8, "r": 1.2},
    ]
    assert cases.goal("g", "r", 1.0, rows, unit="x") == {
        "unit": "x",
        "goal": "g",
        "key": "r",
        "limit": 1.0,
        "measured": 1.5,
        "met": False,
        "worst": "int4 2x8x8",
        "n": 3,
        "failing": ["int4 2x8x8", "int4 4x8x8"],
    }
    assert cases.goal("g", "r", 2.0, rows[:1])["met"] is True
    assert cases.goal("g", "r", 1.0, []) == {
        "goal": "g",
        "key": "r",
        "limit": 1.0,
        "measured": None,
        "met": None,
        "worst": None,
        "n": 0,
        "failing": [],
    }
