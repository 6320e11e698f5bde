"""The harness every benchmark here runs under: flags, timing, tables, units and files.

A benchmark module builds its cases and contenders and renders its own report; it
registers itself as a :class:`Benchmark` and leaves the rest to this module (the model is
JAX's ``benchmarks/math_benchmark.py``, where ``google_benchmark`` owns flags, timing and
output). Run any of them as ``python -m benchmarks.NAME`` from the repository root.

Flags the harness owns (each benchmark adds its own beside them):

  --quick        a short run (where the benchmark defines one)
  --repeats N    timed rounds (where the benchmark times anything)
  --json PATH    where the JSON goes (default ``benchmarks/results/NAME.json``, not in
                 git); the markdown (``.md``) and the plot (``.png``) go beside it
  --no-json      write no files, only print
  --no-plot      write no PNG (where the benchmark draws one)

Timing: every case is run twice to warm up (the first call compiles), then ``repeats``
interleaved rounds are timed (every case once per round: A B C A B C ...), so that a
slow period of a shared machine hits all cases alike. Each call ends in
``block_until_ready``.

Units: :func:`ms`, :func:`us` and :func:`mb` print three significant digits (whole
numbers from 100 up), or a fixed number of decimals where ``places`` is given; a missing
figure (None) prints as ``"?"``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import jax

try:
    import resource
except ImportError:  # not on Windows
    resource = None  # type: ignore[assignment]

RESULTS = Path(__file__).resolve().parent / "results"
MISSING = "?"

# ---------------------------------------------------------------------------------------
# Units


def _digits(v: float, places: int | None) -> str:
    if places is not None:
        return f"{v:.{places}f}"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def ms(seconds: float | None, places: int | None = None) -> str:
    """``seconds`` in milliseconds, without the unit: ``ms(0.0123) == "12.3"``,
    ``ms(0.1234) == "123"``, ``ms(0.0123, places=3) == "12.300"``, ``ms(None) == "?"``."""
    return MISSING if seconds is None else _digits(seconds * 1e3, places)


def us(seconds: float | None, places: int | None = None) -> str:
    """``seconds`` in microseconds, without the unit, as :func:`ms` writes milliseconds."""
    return MISSING if seconds is None else _digits(seconds * 1e6, places)


def mb(nbytes: float | None, places: int | None = None) -> str:
    """``nbytes`` in megabytes (10**6 bytes), without the unit: ``mb(8_388_608) == "8.39"``,
    ``mb(134_217_728) == "134"``, ``mb(None) == "?"``."""
    return MISSING if nbytes is None else _digits(nbytes / 1e6, places)


def ratio(value: float | None, places: int = 2) -> str:
    """A ratio with ``places`` decimals and no unit: ``ratio(1.234) == "1.23"``,
    ``ratio(None) == "?"``."""
    return MISSING if value is None else f"{value:.{places}f}"


def quotient(a: float | None, b: float | None) -> float | None:
    """``a / b``, or None where either figure is missing or ``b`` is 0 (a compiler that
    gave no estimate, a contender that did not run)."""
    return None if a is None or not b else a / b


def shape_text(shape: Sequence[int]) -> str:
    """A shape as the flags write it: ``shape_text((64, 4096, 1024)) == "64x4096x1024"``."""
    return "x".join(str(d) for d in shape)


# ---------------------------------------------------------------------------------------
# Timing


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

# ---------------------------------------------------------------------------------------
# Tables and files


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> str:
    """A plain-text table with aligned columns; columns in ``right`` are right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(vals: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(vals, widths))
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def index(
    rows: Iterable[dict[str, Any]], fields: Sequence[str], contender: str | None = None
) -> dict[tuple, dict[str, Any]]:
    """The rows with status "ok" (and, where given, of ``contender``) by the tuple of
    their ``fields``: what a ratio looks its denominator up in."""
    return {
        tuple(r[f] for f in fields): r
        for r in rows
        if r["status"] == "ok" and (contender is None or r["contender"] == contender)
    }


def goal_table(title: str, goals: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown lines: ``title`` and a table of per-generation goals (``cases.goal`` dicts
    with a "generation"): the limit, the worst figure and where, whether met, and the rows
    that fail it (then those named in an "unestimated" list, as "(no estimate)"). No
    goals: no lines."""
    if not goals:
        return []
    lines = [
        title,
        "",
        "| generation | goal | limit | worst measured | where | met | failing |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in goals:
        if g["measured"] is None:
            lines.append(
                f"| {g['generation']} | {g['goal']} | {g['limit']:g} | not measured | | | |"
            )
            continue
        failing = g["failing"] + [f"{u} (no estimate)" for u in g.get("unestimated", [])]
        lines.append(
            f"| {g['generation']} | {g['goal']} | {g['limit']:g} | {g['measured']:.3g} | "
            f"{g['worst']} | {'yes' if g['met'] else 'no'} | {', '.join(failing)} |"
        )
    return lines


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend, or None (after printing
    how to install it) where matplotlib is missing: it is only in the ``bench`` extra, and
    the PNG only draws what the JSON and the markdown already hold."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e .[bench]); no PNG written")
        return None
    return plt


def legend_entries(axes: Iterable[Any]) -> tuple[list[Any], list[str]]:
    """The handles and labels of all ``axes``, each label once, in first-seen order: one
    figure legend for panels that each show some of the contenders."""
    handles: list[Any] = []
    labels: list[str] = []
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    return handles, labels


Plot = Callable[[dict[str, Any], Path], "Path | None"]


@dataclasses.dataclass(frozen=True)
class Report:
    """What one run of a benchmark produced.

    ``data`` is written as JSON; ``text`` is printed and, where ``markdown``, written
    beside the JSON as ``.md``; ``plot(data, png_path)`` draws the PNG beside it (it
    returns None where it drew nothing).
    """

    data: dict[str, Any]
    text: str
    markdown: bool = False
    plot: Plot | None = None


def write(report: Report, json_path: Path, *, with_json: bool = True, plot: bool = True) -> None:
    """Write ``report`` to ``json_path`` (unless not ``with_json``), its markdown beside it
    (``.md``) and its plot (``.png``, where ``plot`` and the report has one); print each
    path written."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    written = []
    if with_json:
        json_path.write_text(json.dumps(report.data, indent=2) + "\n")
        written.append(str(json_path))
    if report.markdown:
        md_path = json_path.with_suffix(".md")
        md_path.write_text(report.text)
        written.append(str(md_path))
    if written:
        print(f"wrote {' and '.join(written)}")
    if plot and report.plot is not None:
        png = report.plot(report.data, json_path.with_suffix(".png"))
        if png is not None:
            print(f"wrote {png}")


# ---------------------------------------------------------------------------------------
# Flags and the run


class FlagError(ValueError):
    """A flag's value that the benchmark refuses: the harness exits with usage (code 2)."""


class Unavailable(RuntimeError):
    """What the benchmark needs is not here (no libtpu, say): printed, exit code 2."""


@dataclasses.dataclass(frozen=True)
class Benchmark:
    """One benchmark as the harness runs it.

    ``run(args)`` measures and returns a :class:`Report` (or None where it wrote what it
    had to itself). ``args`` holds the harness's flags, resolved: ``quick`` (bool),
    ``repeats`` (int, or None where ``repeats`` is None or the benchmark picks),
    ``json`` (the path to write, or None under ``--no-json``), ``plot`` (bool) and
    ``command`` (the command line, ``python -m benchmarks.NAME ...``), beside the
    benchmark's own flags, which ``flags(parser)`` adds.

    ``repeats``: (default, default under ``--quick``) for ``--repeats``; None for a
    benchmark that times nothing; an entry None lets the benchmark pick (say so in
    ``repeats_help``). ``quick``: the help of ``--quick``; "" for no ``--quick``.
    ``writes``: whether a run writes ``benchmarks/results/NAME.json`` when ``--json``
    is not given. ``plots``: whether the report has a PNG (adds ``--no-plot``).
    ``dumps``: the benchmark estimates programs from libtpu's bundle schedules
    (``emulate.compiler.estimate_compiled``): :meth:`main` runs it in a process whose
    libtpu dumps them (this one when it does, else a fresh one) unless ``--no-bundles``.
    """

    name: str
    description: str
    run: Callable[[argparse.Namespace], Report | None]
    flags: Callable[[argparse.ArgumentParser], None] | None = None
    repeats: tuple[int | None, int | None] | None = None
    repeats_help: str = ""
    quick: str = ""
    writes: bool = True
    plots: bool = False
    dumps: bool = False

    @property
    def default_json(self) -> Path:
        return RESULTS / f"{self.name}.json"

    def parser(self) -> argparse.ArgumentParser:
        """The argument parser: the harness's flags, then the benchmark's own."""
        p = argparse.ArgumentParser(prog=f"benchmarks.{self.name}", description=self.description)
        if self.quick:
            p.add_argument("--quick", action="store_true", help=self.quick)
        if self.flags is not None:
            self.flags(p)
        if self.repeats is not None:
            default = self.repeats_help or f"default {self.repeats[0]}"
            if self.quick and not self.repeats_help:
                default += f", {self.repeats[1]} with --quick"
            p.add_argument("--repeats", type=int, help=f"timed rounds ({default})")
        where = f"benchmarks/results/{self.name}.json" if self.writes else "none: print only"
        beside = "; the .md and .png go beside it" if self.plots else "; the .md goes beside it"
        p.add_argument(
            "--json",
            type=Path,
            metavar="PATH",
            help=f"where to write the JSON{beside} (default {where})",
        )
        p.add_argument("--no-json", action="store_true", help="write no files, only print")
        if self.plots:
            p.add_argument("--no-plot", action="store_true", help="write no PNG")
        if self.dumps:
            p.add_argument(
                "--no-bundles", action="store_true",
                help="no estimates from the compiler's bundle schedules (faster)",
            )  # fmt: skip
        return p

    def parse(self, argv: Sequence[str] | None = None) -> argparse.Namespace:
        """Parse ``argv`` (default ``sys.argv[1:]``) and resolve the harness's flags."""
        argv = list(sys.argv[1:] if argv is None else argv)
        p = self.parser()
        args = p.parse_args(argv)
        args.quick = bool(getattr(args, "quick", False))
        if self.repeats is not None:
            if args.repeats is None:
                args.repeats = self.repeats[1] if args.quick else self.repeats[0]
            elif args.repeats < 1:
                p.error(f"--repeats must be at least 1, got {args.repeats}")
        if args.no_json:
            args.json = None
        elif args.json is None and self.writes:
            args.json = self.default_json
        args.plot = self.plots and not getattr(args, "no_plot", False)
        args.command = " ".join([f"python -m benchmarks.{self.name}", *argv])
        return args

    def main(self, argv: Sequence[str] | None = None) -> int:
        """Parse, run, print the report and write its files; returns the exit code."""
        args = self.parse(argv)
        if self.dumps and not args.no_bundles:
            code = _rerun_dumping(self.name, list(sys.argv[1:] if argv is None else argv))
            if code is not None:
                return code
        try:
            report = self.run(args)
        except FlagError as e:
            self.parser().error(str(e))
        except Unavailable as e:
            print(e, file=sys.stderr)
            return 2
        if report is None:
            return 0
        print(report.text, end="" if report.text.endswith("\n") else "\n")
        if args.json is not None:
            write(report, args.json, plot=args.plot)
        return 0


def _rerun_dumping(name: str, argv: list[str]) -> int | None:
    """Run ``python -m benchmarks.NAME argv`` in a fresh process whose libtpu dumps its
    bundle schedules into a temporary directory, and return its exit status; None when
    this process's libtpu dumps already (or there is no libtpu: the run says so)."""
    from emulate import compiler

    if compiler.dump_directory() is not None or compiler.libtpu_version() is None:
        return None
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="emulate-bundles-") as d:
        env = compiler.dumping_env(d)
        command = [sys.executable, "-m", f"benchmarks.{name}", *argv]
        return subprocess.run(command, env=env, check=False).returncode
