"""benchmarks.bundle_calibration, chip_programs, chip_time and bundle_columns: the recorded
real-chip timings, the programs' names, the fit and the cells (nothing compiled or timed)."""

from __future__ import annotations

import pytest

from benchmarks import bundle_calibration, bundle_columns, chip_time
from benchmarks.chip_programs import ChipCase


def test_every_recorded_timing_names_a_program():
    rows = bundle_calibration.rows()
    v5e = [r for r in rows if r.source == "tpu_v5e-2026-12-06.json"]
    assert len(v5e) == 18 and {r.target for r in v5e} == {"tpu_v5e"}
    for r in rows:
        ChipCase(r.case).parts()
        assert len(r.commit) == 40 and 0 < r.seconds < 0.01
    after = {r.case: r.seconds for r in v5e if r.commit.startswith("1e26873")}
    assert after["projection/q4_k/m1/16x512x4096"] == 205e-6
    assert after["layer/kernel/m1"] == 967e-6


def test_case_names_and_their_refusal():
    assert ChipCase("projection/q4_k/m64/64x512x4096").parts() == {
        "kind": "projection", "scheme": "q4_k", "m": 64, "block_shape": (64, 512, 4096)
    }  # fmt: skip
    assert ChipCase("projection/bf16/m1").parts()["block_shape"] is None
    assert ChipCase("layer/xla/m64").parts() == {"kind": "layer", "contender": "xla", "m": 64}
    with pytest.raises(ValueError, match=r"^case: 'layer/fp8/m1' is not projection/"):
        ChipCase("layer/fp8/m1").parts()
    assert ChipCase("stream/i32/256x512").parts() == {
        "kind": "stream", "dtype": "i32", "block_shape": (256, 512)
    }  # fmt: skip
    assert ChipCase("word/awq/m16/14336x4096").parts() == {
        "kind": "word", "scheme": "awq", "m": 16, "k": 14336, "n": 4096
    }  # fmt: skip
    assert (ChipCase("word/awq/m16/14336x4096").loop, ChipCase("layer/xla/m64").loop) == (50, 20)
    assert len(chip_time.CASES) == 26
    for name in chip_time.CASES:
        ChipCase(name).parts()


def test_chip_time_refuses_a_machine_without_a_tpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert chip_time.main(["--cases", "projection/bf16/m1"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "benchmarks.chip_time times a TPU; this JAX runs cpu"
    )
    assert list(tmp_path.iterdir()) == []


def test_word_time_rows_stream_rows_and_the_launch():
    rows = bundle_calibration.rows()
    words = [r for r in rows if r.case.startswith("word/")]
    # every scheme of the word step at 1 and 16 rows and both shapes, and bf16 (728de59)
    assert len(words) == 32 and {r.loop for r in words} == {50}
    assert {r.commit[:7] for r in words} == {"728de59"}
    assert {r.case.split("/")[1] for r in words} == {
        "bf16",
        "q4_k",
        "q6_k",
        "awq",
        "int4",
        "mxfp4",
        "nvfp4",
        "nf4",
    }
    q4k = {r.case: r.seconds for r in words}["word/q4_k/m1/4096x14336"]
    assert q4k == pytest.approx(86.9006e-6, rel=1e-5)
    streams = [r for r in rows if r.case.startswith("stream/")]
    assert len(streams) == 14 and {r.loop for r in streams} == {20}
    assert {bundle_calibration.role(r) for r in streams} == {"DMA"}
    fitted = [r for r in rows if bundle_calibration.role(r) == "bundles"]
    assert len(fitted) == 10 and {r.case.split("/")[1] for r in fitted} == {"q4_k"}
    held = [r for r in rows if bundle_calibration.role(r) == "held out"]
    assert len(held) == len(rows) - 24
    # the median of six programs of trivial calls, 576.2 ... 682.2 us
    launch = bundle_calibration.dispatch_seconds("tpu_v5e")
    assert launch == pytest.approx((619.91 + 650.58) / 2 * 1e-6, rel=1e-4)
    assert bundle_calibration.dispatch_seconds("tpu_v2") is None
    assert bundle_calibration.step_bytes("stream/bf16/512x2048") == 2 << 20
    assert bundle_calibration.step_bytes("stream/i32/256x512") == 512 << 10


def test_the_calibrated_column_adds_the_launch_per_call():
    row = bundle_calibration.Row("word/int4/m1/4096x14336", "tpu_v5e", "0" * 40, 1e-4, "x", 50)
    assert bundle_calibration.timed({"seconds": 60e-6}, row, 635e-6) == pytest.approx(72.7e-6)


def test_the_search_finds_a_minimum():
    got = bundle_calibration._minimize(lambda v: (v - 0.3) ** 2, 0.0, 1.0, steps=30)
    assert got == pytest.approx(0.3, abs=1e-5)


def test_the_bundle_cells():
    rows = [
        {
            "platform": "v",
            "pair": "q",
            "contender": "floor",
            "status": "ok",
            "bundle_s": 2e-6,
            "hbm_s": 1e-6,
        },
        {
            "platform": "v",
            "pair": "q",
            "contender": "pallas",
            "status": "ok",
            "bundle_s": 5e-6,
            "hbm_s": 1e-6,
        },
        {"platform": "v", "pair": "q", "contender": "xla", "status": "refused"},
    ]
    bundle_columns.add_ratios(rows, ("platform", "pair"), "floor")
    assert [bundle_columns.cell(r) for r in rows] == [
        "2 us (2.0x HBM)", "5 us (2.50x (a), 5.0x HBM)", "refused"
    ]  # fmt: skip
    assert bundle_columns.cell(None) == ""
    assert bundle_columns.cell({"status": "ok"}) == "?"
