"""Timing helpers shared by the benchmarks: one timed call, interleaved rounds, a text table.

Every benchmark here times in one process, runs each case twice to warm up (the first call
compiles), then times ``repeats`` interleaved rounds (every case once per round: A B C A B
C ...), so that a slow period of a shared machine hits all cases alike. Each call ends in
``block_until_ready``.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

import jax

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

__all__ = [
    "Timed",
    "environment",
    "interleave",
    "minor_faults",
    "short_error",
    "stats",
    "text_table",
    "timed_call",
]


def timed_call(fn: Callable[..., Any], *args: Any) -> float:
    """Seconds for ``fn(*args)`` up to ``block_until_ready`` of its result (a pytree)."""
    t0 = time.perf_counter()
    out = fn(*args)
    jax.block_until_ready(out)
    dt = time.perf_counter() - t0
    del out
    return dt


def minor_faults() -> int | None:
    """This process's minor page faults so far (None where ``getrusage`` is missing).

    glibc hands a block over its mmap threshold (dynamic, at most 32 MiB by default) back
    to the OS when it is freed, so an XLA program whose output or temporaries exceed it
    faults every page of them in again on each call, and the kernel zeroes each page. The
    difference of two readings around a call counts those pages (4 KiB each).
    """
    if resource is None:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class Timed(Protocol):
    """What :func:`interleave` times: ``run()`` returns the seconds of one call."""

    times: list[float]

    @property
    def label(self) -> str: ...

    def run(self) -> float: ...


T = TypeVar("T", bound=Timed)


def short_error(e: BaseException, limit: int = 120) -> str:
    """The first line of an exception's message, at most ``limit`` characters."""
    text = str(e).strip()
    line = text.splitlines()[0] if text else type(e).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def interleave(
    cases: Iterable[T], repeats: int, *, warmup: int = 2, report: bool = True
) -> tuple[list[T], dict[str, str]]:
    """Warm up each case, then time ``repeats`` interleaved rounds.

    Returns the cases that ran (their ``times`` filled in) and, for each one that raised
    during the warm-up, its label and a short reason; ``report`` also prints those to
    stderr.
    """
    ok: list[T] = []
    failed: dict[str, str] = {}
    for c in cases:
        try:
            for _ in range(warmup):
                c.run()
        except Exception as e:  # noqa: BLE001 - report and go on with the other cases
            failed[c.label] = short_error(e)
            if report:
                print(f"skipped {c.label}: {failed[c.label]}", file=sys.stderr)
            continue
        ok.append(c)
    for _ in range(repeats):
        for c in ok:
            c.times.append(c.run())
    return ok, failed


def stats(times: Sequence[float]) -> dict[str, float]:
    """Median, min and max of ``times`` (seconds)."""
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
    }


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> str:
    """A plain-text table with aligned columns; columns in ``right`` are right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(vals: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(vals, widths))
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def environment() -> dict[str, Any]:
    """Where and when a benchmark ran: versions, backend, cores, load, time."""
    try:
        load: list[float] | None = [round(v, 2) for v in os.getloadavg()]
    except OSError:
        load = None
    return {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device": jax.devices()[0].device_kind,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "load_average": load,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        # allocator settings that change the timings of programs with large temporaries
        "malloc_env": {k: v for k, v in os.environ.items() if k in _MALLOC_ENV},
    }


_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES", "LD_PRELOAD")
