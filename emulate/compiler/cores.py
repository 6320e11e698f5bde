"""The TensorCore of each TPU generation: the constants that turn a bundle schedule into seconds.

:mod:`emulate.targets` already owns what JAX's table states per TensorCore: the HBM
bandwidth (``mem_bw_bytes_per_second``), VMEM, the matrix unit's width and the peak
rates. This module owns what the time model adds, each with its source
(docs/targets.md, "Time from the compiler's schedule"):

- the clock: the rate the core issues bundles at. Published for v2 (700 MHz), v3
  (940 MHz), v4 and v4i (1050 MHz). For v5e, v5p, v6e and 7x no clock is published; it
  is read off the compiler's own schedule: XLA's dense 4096 x 4096 x 4096 bf16 matmul
  issues a fixed number of multiply-adds a bundle, and the published peak rate divided
  by twice that number is the bundle rate at which that matmul reaches the peak. On v2,
  v3 and v4 this reading gives 0.711, 0.961 and 1.069 GHz (1.6-2.3% above the published
  clocks: XLA's matmul keeps the units about 98% busy); on v5e it gives 1.19 GHz, where
  the kernels timed on a real v5e, the host's launch of each timed program taken out,
  issue 1.39 G bundles a second (``cycles_per_bundle`` 0.857; the peak rate over
  four 128 x 128 units would say 1.5 GHz, which the schedules contradict: they feed
  82.6k multiply-adds a bundle, more than 4 x 128 x 128).
- the matrix units a core has (JAX's ``TpuInfo.num_mxus``; the schedules address
  ``mxu0`` ... ``mxu3`` on v4, v5e, v5p and ``mxu0``, ``mxu1`` on v6e and 7x);
- the DMA granule, the unit of a DMA's ``size_in_granules`` and of a sync flag's count
  (1024 bytes on v2/v3, 512 on v4, 32 from v5e on, read off the schedules' DMA windows);
- a branch's delay slots (1 on v2, v3, v4; 4 from v5e on, read off the loops' back edges);
- the calibration against real-chip timings, where there are some
  (``emulate/data/bundle_calibration.json``, written by
  ``python -m benchmarks.bundle_calibration --write``): the cycles a bundle takes, the
  fraction of peak HBM bandwidth a DMA stream reaches, a DMA's round trip and the host's
  cost of launching a program.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Final, NamedTuple

from emulate import targets as _targets

__all__ = ["CALIBRATION_PATH", "CLOCKS", "Clock", "Generation", "calibrations", "generation"]

#: The calibration written by ``python -m benchmarks.bundle_calibration --write``.
CALIBRATION_PATH: Final = Path(__file__).parents[1] / "data" / "bundle_calibration.json"


class Clock(NamedTuple):
    """A generation's bundle rate and where it comes from."""

    hz: float
    source: str


_SCHEDULE = (
    "read off the compiler's schedule: peak bf16 rate / (2 x multiply-adds a bundle of "
    "XLA's dense 4096^3 bf16 matmul, {macs} on libtpu 0.0.42.1)"
)

#: Each TPU generation's bundle rate (see the module docstring).
CLOCKS: Final[Mapping[str, Clock]] = {
    "tpu_v2": Clock(700e6, "published (Jouppi et al., CACM 63(7), 2020): 700 MHz"),
    "tpu_v3": Clock(940e6, "published (Jouppi et al., CACM 63(7), 2020): 940 MHz"),
    "tpu_v4": Clock(1050e6, "published (Jouppi et al., ISCA 2023): 1050 MHz"),
    "tpu_v4i": Clock(1050e6, "published (Jouppi et al., ISCA 2021): 1050 MHz"),
    "tpu_v5e": Clock(197e12 / (2 * 82603), _SCHEDULE.format(macs=82603)),
    "tpu_v5p": Clock(229.5e12 / (2 * 82398), _SCHEDULE.format(macs=82398)),
    "tpu_v6e": Clock(918e12 / (2 * 254083), _SCHEDULE.format(macs=254083)),
    "tpu_v7": Clock(1155e12 / (2 * 419356), _SCHEDULE.format(macs="419356 (7x's)")),
    "tpu_v7x": Clock(1155e12 / (2 * 419356), _SCHEDULE.format(macs=419356)),
}

#: Matrix units per TensorCore (JAX's ``TpuInfo.num_mxus``).
MXU_COUNT: Final[Mapping[str, int]] = {
    "tpu_v2": 1,
    "tpu_v3": 2,
    "tpu_v4": 4,
    "tpu_v4i": 4,
    "tpu_v5e": 4,
    "tpu_v5p": 4,
    "tpu_v6e": 2,
    "tpu_v7": 2,
    "tpu_v7x": 2,
    "tpu_v8i": 2,
}

#: Bytes of one DMA granule, by generation number (32 from v5 on).
GRANULE_BYTES: Final[Mapping[int, int]] = {2: 1024, 3: 1024, 4: 512}
_GRANULE_FROM_V5: Final = 32

#: A branch's delay slots, by generation number (4 from v5 on): the loops' back edges
#: end their region that many bundles later, and a loop-carried copy sits in the last.
DELAY_SLOTS: Final[Mapping[int, int]] = {2: 1, 3: 1, 4: 1}
_DELAY_SLOTS_FROM_V5: Final = 4


@dataclasses.dataclass(frozen=True)
class Generation:
    """The constants the time model uses for one TPU target.

    Attributes:
      target: the target's name (``"tpu_v5e"``).
      clock_hz: bundles issued per second (:data:`CLOCKS`).
      clock_source: where ``clock_hz`` comes from.
      hbm_bytes_per_second: one TensorCore's HBM bandwidth (:mod:`emulate.targets`).
      mxu_count: matrix units per TensorCore.
      mxu_size: a matrix unit's width (128 or 256).
      peak_bf16_ops_per_second: the core's published dense bf16 rate (2 ops a
        multiply-add; :mod:`emulate.targets`).
      vmem_bytes: VMEM per TensorCore.
      granule_bytes: the DMA granule.
      delay_slots: the bundles a branch issues after itself before it takes effect.
      cycles_per_bundle: the calibration's cycles a bundle (1.0: none).
      hbm_efficiency: the calibration's fraction of ``hbm_bytes_per_second`` DMAs reach
        (1.0: none).
      dma_latency_s: the calibration's round trip of one DMA: seconds from its issue to
        its landing on top of its bytes, overlapped with other DMAs' transfers but not
        with the waits that depend on it (0.0: none; :class:`~emulate.compiler.replay.Machine`).
      dispatch_seconds: the calibration's cost of launching one program and waiting for
        it from the host (a timed program of n calls took this plus n calls). Not part of
        any estimate: a program's time is the chip's; this is what a host adds per
        launch. 0.0: not measured.
      calibration: what the calibration was fitted on, or ``""`` when uncalibrated.
    """

    target: str
    clock_hz: float
    clock_source: str
    hbm_bytes_per_second: float
    mxu_count: int
    mxu_size: int
    peak_bf16_ops_per_second: float
    vmem_bytes: int
    granule_bytes: int
    delay_slots: int
    cycles_per_bundle: float = 1.0
    hbm_efficiency: float = 1.0
    dma_latency_s: float = 0.0
    dispatch_seconds: float = 0.0
    calibration: str = ""

    def hbm_seconds(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` at the (peak) HBM bandwidth."""
        return nbytes / self.hbm_bytes_per_second

    def feed_seconds(self, elements: float) -> float:
        """Seconds one TensorCore's matrix units need to take in ``elements`` weight
        elements (at decode every weight element passes through a unit once): a
        ``mxu_size``-wide unit takes ``mxu_size`` elements in the cycle it does
        ``mxu_size**2`` multiply-adds, so the core takes ``peak_bf16_ops_per_second / 2 /
        mxu_size`` elements a second. The peak rate, not the bundle clock: from v5e on a
        bundle feeds more multiply-adds than the units' width squared (see the module
        docstring)."""
        return elements * 2 * self.mxu_size / self.peak_bf16_ops_per_second


@functools.cache
def calibrations() -> dict[str, dict[str, object]]:
    """The recorded calibration per target (``{}`` when none is recorded)."""
    if not CALIBRATION_PATH.exists():
        return {}
    data = json.loads(CALIBRATION_PATH.read_text())
    return dict(data.get("generations", {}))


def generation(target: str | _targets.Target, *, calibrated: bool = True) -> Generation:
    """The constants of ``target`` (a TPU target name, alias or Target).

    ``calibrated``: apply the recorded calibration where there is one for the target
    (:func:`calibrations`); False gives the raw schedule (one cycle a bundle, peak HBM).

    Raises:
      ValueError: an unknown target; a target that is not a TPU, or a TPU generation
        without a known clock (``tpu_v8i``).
    """
    t = _targets.get(target)
    if t.kind != "tpu":
        raise ValueError(
            f"target: the bundle time model is for TPU targets, got {t.name!r} ({t.kind})"
        )
    clock = CLOCKS.get(t.name)
    if clock is None or t.mem_bw_bytes_per_second is None or t.bf16_ops_per_second is None:
        raise ValueError(f"target: no clock is known for {t.name!r}; known: {', '.join(CLOCKS)}")
    gen = Generation(
        target=t.name,
        clock_hz=clock.hz,
        clock_source=clock.source,
        hbm_bytes_per_second=float(t.mem_bw_bytes_per_second),
        mxu_count=MXU_COUNT[t.name],
        mxu_size=int(t.mxu_column_size or 128),
        peak_bf16_ops_per_second=float(t.bf16_ops_per_second),
        vmem_bytes=int(t.vmem_capacity_bytes or 0),
        granule_bytes=GRANULE_BYTES.get(t.generation or 0, _GRANULE_FROM_V5),
        delay_slots=DELAY_SLOTS.get(t.generation or 0, _DELAY_SLOTS_FROM_V5),
    )
    found = calibrations().get(t.name) if calibrated else None
    if not found:
        return gen
    return dataclasses.replace(
        gen,
        cycles_per_bundle=float(found.get("cycles_per_bundle", 1.0)),  # type: ignore[arg-type]
        hbm_efficiency=float(found.get("hbm_efficiency", 1.0)),  # type: ignore[arg-type]
        dma_latency_s=float(found.get("dma_latency_s", 0.0)),  # type: ignore[arg-type]
        dispatch_seconds=float(found.get("dispatch_seconds", 0.0)),  # type: ignore[arg-type]
        calibration=str(found.get("source", "")),
    )
