"""The bundle model against every real-chip timing the project recorded, and its calibration.

Reads the raw timings under ``benchmarks/data/chip_times/*.json`` (written by
:mod:`benchmarks.chip_time` on a lent TPU, or transcribed from docs/performance.md),
compiles each timed program of :mod:`benchmarks.chip_programs` for the timing's target
*at the commit it was timed at* (a ``git archive`` of that commit, compiled in a
subprocess whose libtpu dumps its final bundle schedules; the dumps are kept under
``benchmarks/results/bundle_dumps/`` for the next run), estimates it with
:func:`emulate.compiler.estimate_dump`, and prints, per row, the real time, the raw
model (one bundle a cycle at the generation's clock, DMAs at the peak HBM bandwidth), the
calibrated model and the error.

The calibration, per target with timings: the cycles a bundle takes (the compute-bound
rows: each Mosaic kernel and the XLA route) and the fraction of peak HBM bandwidth DMAs
reach (the memory-bound rows: the bf16 programs), each the geometric mean over its rows
of real over raw model (of raw model over real for the bandwidth). ``--write`` stores them in
``emulate/data/bundle_calibration.json``, which :func:`emulate.compiler.generation`
reads. Run as ``python -m benchmarks.bundle_calibration [--write]``; nothing here runs
in a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import os
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
    """One recorded timing."""

    case: str
    target: str
    commit: str
    seconds: float
    source: str


def rows(directory: Path = DATA) -> list[Row]:
    """Every recorded timing, file by file."""
    out = []
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text())
        for r in data["rows"]:
            out.append(
                Row(r["case"], data["target"], r.get("commit") or data["commit"],
                    float(r["seconds"]), path.name)
            )  # fmt: skip
    return out


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


def model(at: Located, **constants: float) -> dict[str, float]:
    """The estimate a call of ``at``'s program (seconds): total, its kernels', XLA's, the
    bundles' and the DMA stalls' parts, and its HBM bytes; the generation's raw
    constants overridden by ``constants``."""
    from emulate.compiler import estimate_dump, generation

    g = dataclasses.replace(generation(at.row.target, calibrated=False), **constants)  # type: ignore[arg-type]
    t = estimate_dump(at.directory, at.row.target, files=at.files, constants=g)
    called = t.kernels + t.xla
    return {
        "seconds": t.seconds / LOOP,
        "kernels": t.kernel_seconds / LOOP,
        "xla": t.xla_seconds / LOOP,
        "compute": sum(k.compute_seconds for k in called) / LOOP,
        "stall": sum(k.stall_seconds for k in called) / LOOP,
        "bytes": t.hbm_bytes / LOOP,
    }


def _memory_bound(case: str) -> bool:
    return case.startswith(("layer/bf16", "projection/bf16"))


def fit(raw: list[tuple[Located, dict[str, float]]]) -> dict[str, Any]:
    """One target's calibration from its rows' raw estimates (see the docstring)."""

    def gmean(v: list[float]) -> float:
        return math.exp(sum(math.log(x) for x in v) / len(v)) if v else 1.0

    compute = [a.row.seconds / m["seconds"] for a, m in raw if not _memory_bound(a.row.case)]
    memory = [m["seconds"] / a.row.seconds for a, m in raw if _memory_bound(a.row.case)]
    return {
        "cycles_per_bundle": round(gmean(compute), 4),
        "hbm_efficiency": round(gmean(memory), 4),
        "compute_rows": len(compute),
        "memory_rows": len(memory),
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


_HEADS = ("target", "program", "commit", "real (us)", "model, raw (us)",
          "model, calibrated (us)", "error")  # fmt: skip


def run(args: argparse.Namespace) -> harness.Report:
    """Estimate every recorded timing; the report (and the calibration file with
    ``--write``)."""
    from emulate.compiler import libtpu_version

    with tempfile.TemporaryDirectory(prefix="emulate-trees-") as scratch:
        located = locate(rows(args.data), Path(scratch), compile_missing=not args.no_compile)
    raw: dict[str, list[tuple[Located, dict[str, float]]]] = {}
    for at in located:
        raw.setdefault(at.row.target, []).append((at, model(at)))
    calibration = {t: fit(got) for t, got in raw.items()}
    cells = []
    out = []
    for target, got in raw.items():
        c = calibration[target]
        for at, m in got:
            cal = model(at, cycles_per_bundle=c["cycles_per_bundle"],
                        hbm_efficiency=c["hbm_efficiency"])  # fmt: skip
            r = at.row
            err = cal["seconds"] / r.seconds - 1
            out.append({"target": target, "case": r.case, "commit": r.commit, "error": err,
                        "real_s": r.seconds, "raw": m, "calibrated": cal})  # fmt: skip
            cells.append((
                target, f"`{r.case}`", r.commit[:7], f"{r.seconds * 1e6:.1f}",
                f"{m['seconds'] * 1e6:.1f}", f"{cal['seconds'] * 1e6:.1f}", f"{err * 100:+.1f}%",
            ))  # fmt: skip
        errors = [abs(float(o["error"])) for o in out if o["target"] == target]
        c["worst_error"] = round(max(errors), 4)
        c["source"] = (
            f"{len(got)} timings in benchmarks/data/chip_times "
            f"({', '.join(sorted({a.row.source for a, _ in got}))})"
        )
    lines = [
        f"`{args.command}` (libtpu {libtpu_version()})",
        "",
        *markdown_table(_HEADS, cells),
        "",
    ]
    for t, c in calibration.items():
        lines.append(
            f"{t}: {c['cycles_per_bundle']:.3f} cycles a bundle ({c['compute_rows']} rows), "
            f"DMAs at {c['hbm_efficiency']:.3f} of peak HBM ({c['memory_rows']} rows); "
            f"worst error {c['worst_error'] * 100:.1f}%"
        )
    if args.write:
        lines.append(_write(calibration, libtpu_version()))
    data = {"benchmark": "bundle_calibration", "command": args.command, "rows": out,
            "calibration": calibration}  # fmt: skip
    return harness.Report(data, "\n".join(lines) + "\n")


def _write(calibration: dict[str, Any], libtpu: str | None) -> str:
    from emulate.compiler import cores

    payload = {
        "about": "written by python -m benchmarks.bundle_calibration --write",
        "libtpu": libtpu,
        "generations": calibration,
    }
    cores.CALIBRATION_PATH.write_text(json.dumps(payload, indent=1) + "\n")
    cores.calibrations.cache_clear()
    return f"wrote {cores.CALIBRATION_PATH.relative_to(ROOT)}"


def flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", type=Path, default=DATA, help="the timings' directory")
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
