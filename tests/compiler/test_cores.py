"""emulate.compiler.cores: each TPU generation's constants for the time model, with
their sources, and the refusals."""

from __future__ import annotations

import dataclasses

import pytest

from emulate import targets
from emulate.compiler import cores, generation, timing


def test_published_clocks_and_the_ones_read_off_the_schedule():
    assert generation("tpu_v2").clock_hz == 700e6
    assert generation("v3").clock_hz == 940e6
    assert generation("tpu_v4").clock_hz == 1050e6
    # the peak bf16 rate over twice the multiply-adds a bundle of XLA's own matmul
    v5e = generation("tpu_v5e", calibrated=False)
    assert v5e.clock_hz == 197e12 / (2 * 82603)
    assert v5e.clock_source.startswith("read off the compiler's schedule")
    assert generation("tpu_v6e").clock_hz == 918e12 / (2 * 254083)
    assert set(cores.CLOCKS) == set(cores.MXU_COUNT) - {"tpu_v8i"}


def test_the_constants_targets_already_own_are_read_from_them():
    for name in ("tpu_v2", "tpu_v4", "tpu_v5e", "tpu_v6e", "tpu_v7x"):
        t, g = targets.get(name), generation(name, calibrated=False)
        assert g.hbm_bytes_per_second == t.mem_bw_bytes_per_second
        assert g.mxu_size == t.mxu_column_size
        assert g.vmem_bytes == t.vmem_capacity_bytes
    assert [generation(n).mxu_count for n in ("v2", "v3", "v4", "v5e", "v6e", "v7x")] == [
        1,
        2,
        4,
        4,
        2,
        2,
    ]
    assert [generation(n).granule_bytes for n in ("v2", "v3", "v4", "v5e", "v7x")] == [
        1024,
        1024,
        512,
        32,
        32,
    ]
    assert [generation(n).delay_slots for n in ("v2", "v4", "v5e", "v5p", "v6e", "v7x")] == [
        1,
        1,
        4,
        4,
        4,
        4,
    ]


def test_seconds_for_bytes_and_for_the_matrix_units_feed():
    g = dataclasses.replace(generation("tpu_v5e", calibrated=False), clock_hz=1e9)
    assert g.hbm_seconds(820e9) == 1.0
    # 197 TFLOP/s = 98.5e12 multiply-adds a second, 128 x 128 of them for 128 elements
    assert g.feed_seconds(98.5e12 / 128) == 1.0
    assert generation("tpu_v7x").feed_seconds(1155e12 / 2 / 256) == 1.0


def test_the_calibration_applies_only_where_recorded(monkeypatch):
    found = {"cycles_per_bundle": 1.25, "hbm_efficiency": 0.8, "dma_latency_s": 4e-7,
             "dispatch_seconds": 6e-4, "source": "3 rows"}  # fmt: skip
    monkeypatch.setattr(cores, "calibrations", lambda: {"tpu_v5e": found})
    g = generation("tpu_v5e")
    assert (g.cycles_per_bundle, g.hbm_efficiency, g.calibration) == (1.25, 0.8, "3 rows")
    assert (g.dma_latency_s, g.dispatch_seconds) == (4e-7, 6e-4)
    m = timing.machine(g)
    assert (m.cycles_per_bundle, m.dma_latency_s) == (1.25, 4e-7)
    assert m.hbm_bytes_per_second == pytest.approx(0.8 * g.hbm_bytes_per_second)
    raw = generation("tpu_v5e", calibrated=False)
    assert (raw.cycles_per_bundle, raw.hbm_efficiency, raw.calibration) == (1.0, 1.0, "")
    assert (raw.dma_latency_s, raw.dispatch_seconds) == (0.0, 0.0)
    assert generation("tpu_v4").calibration == ""


def test_targets_without_a_time_model_are_refused_by_name():
    with pytest.raises(ValueError) as e:
        generation("cpu")
    assert str(e.value) == "target: the bundle time model is for TPU targets, got 'cpu' (cpu)"
    with pytest.raises(ValueError) as e:
        generation("tpu_v8i")
    assert str(e.value) == (
        "target: no clock is known for 'tpu_v8i'; known: tpu_v2, tpu_v3, tpu_v4, tpu_v4i, "
        "tpu_v5e, tpu_v5p, tpu_v6e, tpu_v7, tpu_v7x"
    )
    with pytest.raises(ValueError, match=r"^target: unknown target 'tpu_v9'"):
        generation("tpu_v9")
