"""Timed on a real TPU: the programs of benchmarks.chip_programs, as raw JSON for the bundle model.

Run on a lent TPU from the repository root, without installing emulate (it needs jax with
its TPU backend, numpy and ml_dtypes only)::

    python -m benchmarks.chip_time --commit COMMIT

Each case of :data:`CASES` (or ``--cases``) is built (weights from a fixed seed, prepared
once on the chip), compiled and called twice, then timed ``--repeats`` times with
``block_until_ready``; a case's figure is the median over the repeats of one program
(:data:`benchmarks.chip_programs.LOOP` calls in a ``fori_loop``) divided by the calls.
Cases left when ``--budget-s`` seconds have passed are skipped and listed (the default
keeps a run of every case well inside 10 minutes on a v5e: the projections first, the
layers, whose weights are the program's constants and compile slowest, last). The JSON
holds the device kind, the target it maps to, jax/jaxlib/libtpu versions and the
runtime's platform version, the commit, the command, the date and every timing; it is
written again after each case (a run cut short keeps what it timed), to ``--json``, by
default ``$OUT/chip_time.json`` where ``OUT`` is set (the lent machine's folder that comes
back), else ``benchmarks/results/chip_time.json``. Commit it under
``benchmarks/data/chip_times/`` and ``python -m benchmarks.bundle_calibration`` sets the
bundle model beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import jax

from benchmarks import harness
from benchmarks.chip_programs import LOOP, ChipCase
from benchmarks.provenance import provenance
from benchmarks.tables import text_table

_BLOCKS = ("default", "16x256x1024", "16x512x1024", "16x1024x2048", "16x512x4096")

#: The cases timed by default: the Q4_K projection at the five block shapes of
#: docs/performance.md (b = 16 at M = 1, 64 at M = 64), four more schemes at the default
#: blocks, the bf16 projection, and the Llama-3-8B layer three ways, at M = 1 and 64.
CASES: tuple[str, ...] = tuple(
    [f"projection/q4_k/m1/{b}" for b in _BLOCKS]
    + [f"projection/q4_k/m64/{b.replace('16x', '64x')}" for b in _BLOCKS]
    + [f"projection/{s}/m{m}/default" for s in ("awq_g128", "nf4_b64", "fp8_block128", "nvfp4")
       for m in (1, 64)]
    + [f"projection/bf16/m{m}" for m in (1, 64)]
    + [f"layer/{c}/m{m}" for c in ("bf16", "xla", "kernel") for m in (1, 64)]
)  # fmt: skip


def _time_case(name: str, target: str, repeats: int) -> dict[str, object]:
    t0 = time.perf_counter()
    fn, host_args = ChipCase(name).build(target)
    args = jax.device_put(host_args)
    built = time.perf_counter() - t0
    jitted = jax.jit(fn)
    t0 = time.perf_counter()
    jax.block_until_ready(jitted(*args))
    first = time.perf_counter() - t0
    jax.block_until_ready(jitted(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(jitted(*args))
        times.append((time.perf_counter() - t0) / LOOP)
    return {
        "case": name,
        "seconds": statistics.median(times),
        "min_s": min(times),
        "times_s": times,
        "build_s": built,
        "first_call_s": first,
    }


def _platform_version(dev: jax.Device) -> str | None:
    try:
        return str(dev.client.platform_version)
    except AttributeError:
        return None


def run(args: argparse.Namespace) -> harness.Report:
    """Time every case on this machine's TPU; the report (the JSON written after each
    case)."""
    import emulate

    dev = jax.devices()[0]
    if dev.platform != "tpu":
        raise harness.Unavailable(f"benchmarks.chip_time times a TPU; this JAX runs {dev.platform}")
    target = emulate.targets.from_device(dev).name
    if os.environ.get("OUT") and args.json == BENCHMARK.default_json:
        args.json = Path(os.environ["OUT"]) / "chip_time.json"  # the lent machine's folder
    start = time.perf_counter()
    rows: list[dict[str, object]] = []
    skipped: list[str] = []
    failed: dict[str, str] = {}
    data = {
        **provenance("chip_time", args.command, args.commit),
        "devices": jax.device_count(),
        "platform_version": _platform_version(dev),
        "loop": LOOP,
        "repeats": args.repeats,
        "rows": rows,
        "skipped": skipped,
        "failed": failed,
        "wall_s": 0.0,
    }
    for name in args.cases:
        if time.perf_counter() - start > args.budget_s:
            skipped.append(name)
            continue
        try:
            rows.append(_time_case(name, target, args.repeats))
            print(f"{name}: {float(rows[-1]['seconds']) * 1e6:.1f} us", file=sys.stderr)  # type: ignore[arg-type]
        except Exception as e:  # noqa: BLE001 - a case that fails is reported, the rest run
            failed[name] = f"{type(e).__name__}: {str(e)[:400]}"
            print(f"{name}: {failed[name][:200]}", file=sys.stderr)
        data["wall_s"] = time.perf_counter() - start
        if args.json is not None:  # what was timed so far survives a run cut short
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(data, indent=2) + "\n")
    table = [[str(r["case"]), f"{float(r['seconds']) * 1e6:.1f}"] for r in rows]  # type: ignore[arg-type]
    table += [[n, "skipped (budget)"] for n in skipped]
    table += [[n, f"failed: {why[:100]}"] for n, why in failed.items()]
    lines = [f"`{args.command}`: {dev.device_kind} ({target}), {args.repeats} repeats", ""]
    lines.append(text_table(["program", "us a call"], table, right={1}))
    return harness.Report(data, "\n".join(lines) + "\n")


def _cases(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    for n in names:
        try:
            ChipCase(n).parts()
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"--cases: {e}") from None
    return names


def flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cases", type=_cases, default=list(CASES), help="comma-separated case names")
    p.add_argument("--commit", help="the commit of the tree timed (default: git rev-parse HEAD)")
    p.add_argument(
        "--budget-s", type=float, default=420.0,
        help="start no case after this many seconds (default 420)",
    )  # fmt: skip


BENCHMARK = harness.Benchmark(
    name="chip_time",
    description=__doc__.splitlines()[0],
    run=run,
    flags=flags,
    repeats=(5, 5),
    writes=True,
)
main = BENCHMARK.main

if __name__ == "__main__":
    sys.exit(main())
