"""The harness every benchmark here runs under: its flags, its run, and the files it
writes.

A benchmark module builds its cases and contenders and renders its own report; it
registers itself as a :class:`Benchmark` and leaves the rest to this module (the model is
JAX's ``benchmarks/math_benchmark.py``, where ``google_benchmark`` owns flags, timing and
output). Run any of them as ``python -m benchmarks.NAME`` from the repository root. The
rest is shared by concept: :mod:`benchmarks.timing` (the timing loop),
:mod:`benchmarks.units`, :mod:`benchmarks.tables`, :mod:`benchmarks.plots` (the PNGs) and
:mod:`benchmarks.provenance` (what every result file says about its run).

Flags the harness owns (each benchmark adds its own beside them):

  --quick        a short run (where the benchmark defines one)
  --repeats N    timed rounds (where the benchmark times anything)
  --json PATH    where the JSON goes (default ``benchmarks/results/NAME.json``, not in
                 git; a result kept for docs/performance.md goes under
                 ``benchmarks/data/NAME/``); the markdown (``.md``) and the plot
                 (``.png``) go beside it
  --no-json      write no files, only print
  --no-plot      write no PNG (where the benchmark draws one)

The JSON starts with :func:`benchmarks.provenance.provenance`'s fields (benchmark,
command, commit, date, device, versions), then the benchmark's own.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.provenance import provenance

RESULTS = Path(__file__).resolve().parent / "results"


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
        head = provenance(self.name, args.command, getattr(args, "commit", None))  # at the start
        try:
            report = self.run(args)
        except FlagError as e:
            self.parser().error(str(e))
        except Unavailable as e:
            print(e, file=sys.stderr)
            return 2
        if report is None:
            return 0
        report = dataclasses.replace(report, data={**head, **report.data})
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
