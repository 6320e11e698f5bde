"""How the benchmarks time their cases: one call up to ``block_until_ready``, the
interleaved rounds, the statistics, and what a case that fails leaves behind.

Every case is run twice to warm up (the first call compiles), then ``repeats``
interleaved rounds are timed (every case once per round: A B C A B C ...), so that a
slow period of a shared machine hits all cases alike. Each call ends in
``block_until_ready``.
"""

from __future__ import annotations

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


#: What a compile-only benchmark records as a refused row instead of raising: emulate's
#: own refusals (ValueError), Pallas' (NotImplementedError) and the TPU compiler's (XLA:TPU
#: and Mosaic raise JaxRuntimeError). Anything else is a bug in the benchmark and raises.
COMPILE_REFUSALS = (ValueError, NotImplementedError, jax.errors.JaxRuntimeError)


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
