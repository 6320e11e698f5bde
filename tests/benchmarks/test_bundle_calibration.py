"""benchmarks.bundle_calibration, chip_programs, chip_time and bundle_columns: the recorded
real-chip timings, the programs' names, the fit and the cells (nothing compiled or timed)."""

from __future__ import annotations

import math
from pathlib import Path

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


def test_the_fit_is_a_geometric_mean_per_kind_of_row():
    def at(case: str, real: float) -> bundle_calibration.Located:
        row = bundle_calibration.Row(case, "tpu_v5e", "0" * 40, real, "x.json")
        return bundle_calibration.Located(row, Path("."), ())

    raw = [
        (at("projection/q4_k/m1/default", 2.0), {"seconds": 1.0}),
        (at("layer/kernel/m1", 8.0), {"seconds": 1.0}),
        (at("layer/bf16/m1", 2.0), {"seconds": 1.0}),
    ]
    got = bundle_calibration.fit(raw)
    assert got["cycles_per_bundle"] == 4.0  # sqrt(2 * 8)
    assert got["hbm_efficiency"] == 0.5  # the bf16 row took twice the model's DMA time
    assert (got["compute_rows"], got["memory_rows"]) == (2, 1)
    assert math.isclose(bundle_calibration.fit(raw[:1])["hbm_efficiency"], 1.0)


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
