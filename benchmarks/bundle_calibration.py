"""The bundle model against every real-chip timing the project recorded, and its calibration.

Reads the raw timings under ``benchmarks/data/chip_times/*.json`` (written by
:mod:`benchmarks.chip_time` on a lent TPU, or transcribed from docs/performance.md) and
``benchmarks/data/word_times/*.json`` (:mod:`benchmarks.word_time`, as ``word/`` cases),
compiles each timed program of :mod:`benchmarks.chip_programs` for the timing's target
*at the commit it was timed at* (a ``git archive`` of that commit, compiled in a
subprocess whose libtpu dumps its final bundle schedules; the dumps are kept under
``benchmarks/results/bundle_dumps/`` for the next run), estimates it with
:func:`emulate.compiler.estimate_dump`, and prints, per row, the measured time, the raw
model (one bundle a cycle at the generation's clock, DMAs at the peak HBM bandwidth, no
DMA round trip, no launch), the calibrated model and the errors.

Every timing is a program of ``loop`` calls divided by ``loop``, so it holds the host's
launch of the program (about 0.63 ms on a v5e: ``benchmarks/data/dispatch_times``, a
program of trivial calls) over ``loop``; the calibrated column adds it, the model's own
estimates never do. The calibration, per target with timings (:func:`fit`):

- the DMAs, on the ``stream/`` kernels (a Pallas kernel that only reads a 117 MB array,
  at 14 block shapes: 32 KB to 8 MB a grid step): the fraction of peak HBM bandwidth a
  stream of DMAs reaches and the round trip of one DMA (issue to landing, beyond its
  bytes), which the replay puts on every DMA the schedule issues, by its size and
  where the schedule waits for it;
- then the cycles a bundle, on the Q4_K projections of :data:`FIT_BUNDLES` (bound by
  their bundles);
- every other timing is held out: the word step's kernels, the other schemes, the
  layers, attention over each cache format, XLA's dots.

``--write`` stores the constants in ``emulate/data/bundle_calibration.json``, which
:func:`emulate.compiler.generation` reads, and the table (every timing: measured, raw,
calibrated, error) in ``benchmarks/data/bundle_calibration.json``, which
docs/performance.md quotes. Run as ``python -m benchmarks.bundle_calibration [--write]``;
nothing here runs in a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks import harness
from benchmarks.chip_programs import LOOP
from benchmarks.tables import markdown_table

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "chip_times"
WORDS = ROOT / "benchmarks" / "data" / "word_times"
DISPATCH = ROOT / "benchmarks" / "data" / "dispatch_times"
#: The calibration table (every timing against the model before and after), for docs.
TABLE = ROOT / "benchmarks" / "data" / "bundle_calibration.json"
DUMPS = harness.RESULTS / "bundle_dumps"
# chip_programs.py loaded by path in another commit's checkout (whose benchmarks package
# may lack it), then its dump_main on the arguments.
_LOAD = (
    "import importlib.util, sys; "
    "s = importlib.util.spec_from_file_location('chip_programs', {path!r}); "
    "m = importlib.util.module_from_spec(s); sys.modules['chip_programs'] = m; "
    "s.loader.exec_module(m); "
    "sys.exit(m.dump_main(sys.argv[1:]))"
)


@dataclasses.dataclass(frozen=True)
class Row:
    """One recorded timing: ``seconds`` a call, a program of ``loop`` calls divided by
    ``loop`` (so it holds the host's launch of the program over ``loop``)."""

    case: str
    target: str
    commit: str
    seconds: float
    source: str
    loop: int = LOOP


def rows(directory: Path = DATA, words: Path | None = WORDS) -> list[Row]:
    """Every recorded timing, file by file: ``benchmarks.chip_time``'s rows under
    ``directory``, then ``benchmarks.word_time``'s under ``words`` (as ``word/`` cases)."""
    out = []
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text())
        for r in data["rows"]:
            out.append(
                Row(r["case"], data["target"], r.get("commit") or data["commit"],
                    float(r["seconds"]), path.name, int(data.get("loop", LOOP)))
            )  # fmt: skip
    for path in sorted(words.glob("*.json")) if words is not None else ():
        data = json.loads(path.read_text())
        for r in data["rows"]:
            case = f"word/{r['scheme']}/m{r['m']}/{r['k']}x{r['n']}"
            out.append(
                Row(case, data["target"], data["commit"], float(r["seconds"]),
                    f"word_times/{path.name}", int(data["loop"]))
            )  # fmt: skip
    return out


def dispatch_seconds(target: str, directory: Path = DISPATCH) -> float | None:
    """The host's cost of launching one program and waiting for it on ``target``: the
    median over the recorded programs of trivial calls (``"tiny"`` rows of
    ``benchmarks/data/dispatch_times``), None where none is recorded."""
    found = []
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text())
        if data.get("target") == target:
            found += [float(r["program_s"]) for r in data["rows"] if r["case"] == "tiny"]
    return statistics.median(found) if found else None


def _tree(commit: str, scratch: Path) -> Path:
    """A checkout of ``commit``: this tree when it is HEAD and clean, else a ``git
    archive`` of it under ``scratch``."""
    head = _git("rev-parse", "HEAD")
    full = _git("rev-parse", commit)
    if full == head and not _git("status", "--porcelain", "--", "emulate", "benchmarks"):
        return ROOT
    tree = scratch / full[:12]
    if not tree.exists():
        tree.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", full], capture_output=True, check=True
        )
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tree, filter="data")
    return tree


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def dumps(
    target: str, commit: str, cases: Iterable[str], scratch: Path, *, compile_missing: bool = True
) -> tuple[Path, dict]:
    """The dump directory of ``commit``'s programs for ``target`` and its manifest
    (``{case: {"files": [...]} or {"error": ...}}``), compiling the cases it lacks (unless
    not ``compile_missing``: those are then absent from the manifest)."""
    from emulate.compiler import compat_mode
    from emulate.compiler.isolate import child_env

    full = _git("rev-parse", commit)
    directory = DUMPS / target / full[:12]
    directory.mkdir(parents=True, exist_ok=True)
    manifest_path = directory / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    todo = sorted(set(cases) - set(manifest))
    if todo and compile_missing:
        tree = _tree(commit, scratch)
        env = child_env(compat_mode(), dump_to=str(directory))
        env["PYTHONPATH"] = str(tree)
        code = _LOAD.format(path=str(Path(__file__).with_name("chip_programs.py")))
        ran = subprocess.run(
            [sys.executable, "-c", code, str(directory), target, *todo],
            cwd=tree, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if ran.returncode != 0 or not ran.stdout.strip():
            raise RuntimeError(f"dumping {todo} at {full[:12]} failed: {ran.stderr[-2000:]}")
        manifest.update(json.loads(ran.stdout.strip().splitlines()[-1]))
        manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return directory, manifest


@dataclasses.dataclass(frozen=True)
class Located:
    """A recorded timing and the dumped schedules of the program it timed."""

    row: Row
    directory: Path
    files: tuple[str, ...]


def model(at: Located, gen: Any) -> dict[str, float]:
    """The estimate of one call of ``at``'s program under the constants ``gen`` (a
    :class:`emulate.compiler.Generation`), seconds: total, its kernels', XLA's, the
    bundles' and the DMA stalls' parts, and its HBM bytes."""
    from emulate.compiler import estimate_dump

    t = estimate_dump(at.directory, at.row.target, files=at.files, constants=gen)
    called = t.kernels + t.xla
    n = at.row.loop
    return {
        "seconds": t.seconds / n,
        "kernels": t.kernel_seconds / n,
        "xla": t.xla_seconds / n,
        "compute": sum(k.compute_seconds for k in called) / n,
        "stall": sum(k.stall_seconds for k in called) / n,
        "bytes": t.hbm_bytes / n,
    }


#: The commit whose Q4_K projection timings fit the cycles a bundle: the kernel before the
#: word step, bound by its bundles at every block shape (2026-12-07, 10 timings).
FIT_BUNDLES = "b880c37"
#: Where the DMA constants are searched: fractions of peak HBM bandwidth, DMA round trips
#: (seconds); and the bytes a grid step must move for a ``stream/`` row to fit the
#: bandwidth (its round trips then hide behind the transfers).
EFFICIENCY_RANGE = (0.6, 1.0)
LATENCY_RANGE = (0.0, 1e-6)
BANDWIDTH_ROWS_BYTES = 1 << 20


def _minimize(f: Any, lo: float, hi: float, steps: int = 14) -> float:
    """The minimum of a unimodal ``f`` on [lo, hi] by golden-section search."""
    r = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - r * (b - a), a + r * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(steps):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - r * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + r * (b - a)
            fd = f(d)
    return (a + b) / 2


def step_bytes(case: str) -> int:
    """The bytes one grid step of a ``stream/<dtype>/<bk>x<bn>`` case moves."""
    _, dtype, shape = case.split("/")
    bk, bn = (int(v) for v in shape.split("x"))
    return bk * bn * (2 if dtype == "bf16" else 4)


def role(row: Row) -> str:
    """What a timing is for: ``"DMA"`` (a ``stream/`` kernel: fits the HBM efficiency and
    the DMA round trip), ``"bundles"`` (the Q4_K projections of :data:`FIT_BUNDLES`: fit
    the cycles a bundle) or ``"held out"`` (checks the fit)."""
    if row.case.startswith("stream/"):
        return "DMA"
    if row.case.startswith("projection/q4_k/") and row.commit.startswith(FIT_BUNDLES):
        return "bundles"
    return "held out"


def timed(m: dict[str, float], row: Row, launch: float) -> float:
    """What the chip's timing of ``row`` holds by the model ``m``: a call plus its share
    of the program's launch."""
    return m["seconds"] + launch / row.loop


def fit(target: str, located: list[Located], launch: float) -> dict[str, Any]:
    """One target's constants from its timings (the module docstring): the fraction of
    peak HBM bandwidth on the ``stream/`` rows whose grid steps move at least
    :data:`BANDWIDTH_ROWS_BYTES`, then the DMA round trip on every ``stream/`` row (each a
    golden-section search for the least squared log error, one bundle a cycle), then the
    cycles a bundle on the bundle rows (the geometric mean of measured less launch over
    the model)."""
    from emulate.compiler import generation

    raw = generation(target, calibrated=False)
    dma = [a for a in located if role(a.row) == "DMA"]
    wide = [a for a in dma if step_bytes(a.row.case) >= BANDWIDTH_ROWS_BYTES]

    def error(rows: list[Located], **constants: float) -> float:
        g = dataclasses.replace(raw, **constants)  # type: ignore[arg-type]
        return sum(math.log(timed(model(a, g), a.row, launch) / a.row.seconds) ** 2 for a in rows)

    efficiency, latency = 1.0, 0.0
    if wide:
        efficiency = round(_minimize(lambda e: error(wide, hbm_efficiency=e), *EFFICIENCY_RANGE), 3)
    if dma:
        latency = _minimize(
            lambda v: error(dma, hbm_efficiency=efficiency, dma_latency_s=v), *LATENCY_RANGE
        )
        latency = round(latency * 1e9) / 1e9
    g = dataclasses.replace(raw, hbm_efficiency=efficiency, dma_latency_s=latency)
    ratios = [
        (a.row.seconds - launch / a.row.loop) / model(a, g)["seconds"]
        for a in located
        if role(a.row) == "bundles"
    ]
    cpb = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else 1.0
    return {
        "cycles_per_bundle": round(cpb, 4),
        "hbm_efficiency": efficiency,
        "dma_latency_s": latency,
        "dispatch_seconds": round(launch, 7),
        "bundle_rows": len(ratios),
        "dma_rows": len(dma),
        "bandwidth_rows": len(wide),
    }


def locate(recorded: list[Row], scratch: Path, *, compile_missing: bool = True) -> list[Located]:
    """Each timing with its program's dumped schedules (compiled where missing, else
    left out with a line on stderr)."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in recorded:
        groups.setdefault((r.target, r.commit), []).append(r)
    found = []
    for (target, commit), rs in groups.items():
        cases = [r.case for r in rs]
        directory, manifest = dumps(target, commit, cases, scratch, compile_missing=compile_missing)
        for r in rs:
            entry = manifest.get(r.case)
            if entry is None:
                print(f"{r.case} at {commit[:7]}: not dumped (--no-compile)", file=sys.stderr)
                continue
            if "error" in entry:
                print(f"{r.case} at {commit[:7]}: {entry['error']}", file=sys.stderr)
                continue
            found.append(Located(r, directory, tuple(entry["files"])))
    return found


_HEADS = ("program", "commit", "role", "measured (us)", "raw model (us)", "raw error",
          "calibrated (us)", "error")  # fmt: skip


def run(args: argparse.Namespace) -> harness.Report:
    """Estimate every recorded timing; the report (and the calibration file and table
    with ``--write``)."""
    import unittest.mock

    from emulate.compiler import bundles, generation, libtpu_version

    with tempfile.TemporaryDirectory(prefix="emulate-trees-") as scratch:
        recorded = rows(args.data, args.words)
        located = locate(recorded, Path(scratch), compile_missing=not args.no_compile)
    by_target: dict[str, list[Located]] = {}
    for at in located:
        by_target.setdefault(at.row.target, []).append(at)
    calibration: dict[str, dict[str, Any]] = {}
    out: list[dict[str, Any]] = []
    lines = [f"`{args.command}` (libtpu {libtpu_version()})", ""]
    # each schedule parsed once for the many replays of the fit
    with unittest.mock.patch.object(
        bundles, "read", functools.lru_cache(maxsize=None)(bundles.read)
    ):
        for target, found in by_target.items():
            launch = dispatch_seconds(target, args.dispatch) or 0.0
            c = calibration[target] = fit(target, found, launch)
            raw = generation(target, calibrated=False)
            cal = dataclasses.replace(
                raw, cycles_per_bundle=c["cycles_per_bundle"], hbm_efficiency=c["hbm_efficiency"],
                dma_latency_s=c["dma_latency_s"])  # fmt: skip
            cells = []
            for at in found:
                r, m0, m1 = at.row, model(at, raw), model(at, cal)
                before, after = m0["seconds"], timed(m1, r, launch)
                out.append({
                    "target": target, "case": r.case, "commit": r.commit, "role": role(r),
                    "loop": r.loop, "source": r.source, "measured_s": r.seconds,
                    "raw_s": before, "calibrated_s": after, "launch_s": launch / r.loop,
                    "raw_error": before / r.seconds - 1, "error": after / r.seconds - 1,
                    "raw": m0, "calibrated": m1,
                })  # fmt: skip
                cells.append((
                    f"`{r.case}`", r.commit[:7], role(r), f"{r.seconds * 1e6:.1f}",
                    f"{before * 1e6:.1f}", f"{(before / r.seconds - 1) * 100:+.1f}%",
                    f"{after * 1e6:.1f}", f"{(after / r.seconds - 1) * 100:+.1f}%",
                ))  # fmt: skip
            mine = [o for o in out if o["target"] == target]
            held = [abs(o["error"]) for o in mine if o["role"] == "held out"]
            c["worst_error"] = round(max(abs(o["error"]) for o in mine), 4)
            c["worst_held_out_error"] = round(max(held), 4) if held else None
            c["source"] = (
                f"{len(found)} timings in benchmarks/data "
                f"({', '.join(sorted({a.row.source for a in found}))})"
            )
            lines += [f"{target}:", "", *markdown_table(_HEADS, cells), ""]
            lines.append(
                f"{target}: {c['cycles_per_bundle']:.3f} cycles a bundle ({c['bundle_rows']} "
                f"rows), DMAs at {c['hbm_efficiency']:.2f} of peak HBM with a "
                f"{c['dma_latency_s'] * 1e9:.0f} ns round trip ({c['dma_rows']} rows), "
                f"{launch * 1e6:.0f} us to launch a program; worst error "
                f"{c['worst_error'] * 100:.1f}%, held out {c['worst_held_out_error'] * 100:.1f}%"
            )
    if args.write:
        lines.append(_write(calibration, libtpu_version(), out, args.command))
    data = {"benchmark": "bundle_calibration", "command": args.command, "rows": out,
            "calibration": calibration}  # fmt: skip
    return harness.Report(data, "\n".join(lines) + "\n")


def _write(
    calibration: dict[str, Any], libtpu: str | None, table: list[dict[str, Any]], command: str
) -> str:
    from emulate.compiler import cores

    payload = {
        "about": "written by python -m benchmarks.bundle_calibration --write",
        "libtpu": libtpu,
        "generations": calibration,
    }
    cores.CALIBRATION_PATH.write_text(json.dumps(payload, indent=1) + "\n")
    cores.calibrations.cache_clear()
    slim = [{k: v for k, v in r.items() if k not in ("raw", "calibrated")} for r in table]
    table_json = {"command": command, "libtpu": libtpu, "calibration": calibration, "rows": slim}
    TABLE.write_text(json.dumps(table_json, indent=1) + "\n")
    return f"wrote {cores.CALIBRATION_PATH.relative_to(ROOT)} and {TABLE.relative_to(ROOT)}"


def flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", type=Path, default=DATA, help="chip_time's timings' directory")
    p.add_argument("--words", type=Path, default=WORDS, help="word_time's timings' directory")
    p.add_argument("--dispatch", type=Path, default=DISPATCH, help="the launch timings' directory")
    p.add_argument(
        "--write", action="store_true", help="write emulate/data/bundle_calibration.json"
    )
    p.add_argument(
        "--no-compile", action="store_true",
        help="estimate only the programs already dumped under benchmarks/results/bundle_dumps",
    )  # fmt: skip


BENCHMARK = harness.Benchmark(
    name="bundle_calibration",
    description=__doc__.splitlines()[0],
    run=run,
    flags=flags,
    writes=True,
)
main = BENCHMARK.main

if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
