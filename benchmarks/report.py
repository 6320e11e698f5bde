"""docs/performance.md's tables and plots, generated from the results kept in the repository.

Run from the repository root::

    python -m benchmarks.report            # rewrite the generated blocks and plots
    python -m benchmarks.report --check    # exit 1, naming them, where they are stale

A result is a benchmark's JSON kept under ``benchmarks/data/<kind>/`` (``chip_times``,
``word_times``, ...): :mod:`benchmarks.provenance`'s fields (benchmark, command, commit,
date, device, versions), then the benchmark's rows. Each :data:`SECTIONS` entry renders
the latest figures of one kind of result as markdown (and plots as SVG under
``docs/images/performance/``). In the page, a section's text lies between two markers,
each a line of its own::

    <!-- BEGIN benchmarks.report: NAME -->
    ...
    <!-- END benchmarks.report: NAME -->

and only that text is rewritten: the prose around it is written by hand, so that the
page's explanations, and sections other people add, survive every regeneration. History
is git's: a new run is a new file (or a new commit of one), and the tables show the
latest. Standard library only, fast: tests/benchmarks/test_report.py runs it on the
checked-in results and checks the committed page and plots are what it writes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import svg, units
from benchmarks.tables import markdown_table

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data"
PAGE = ROOT / "docs" / "performance.md"
IMAGES = ROOT / "docs" / "images" / "performance"

_BEGIN = "<!-- BEGIN benchmarks.report: {} -->"
_END = "<!-- END benchmarks.report: {} -->"
_MARKER = re.compile(r"^<!-- (BEGIN|END) benchmarks\.report: ([\w-]+) -->$", re.M)


@dataclasses.dataclass(frozen=True)
class Result:
    """One result file: its path under ``benchmarks/data`` and its JSON."""

    path: str
    data: dict[str, Any]

    @property
    def commit(self) -> str:
        return str(self.data.get("commit") or "?")

    @property
    def date(self) -> str:
        return str(self.data.get("date") or "")


def load(data: Path = DATA) -> dict[str, list[Result]]:
    """Every result under ``data``, by kind (its folder), oldest first (by date, then
    path)."""
    out: dict[str, list[Result]] = {}
    for p in sorted(data.glob("*/*.json")):
        result = Result(p.relative_to(data).as_posix(), json.loads(p.read_text()))
        out.setdefault(p.parent.name, []).append(result)
    for results in out.values():
        results.sort(key=lambda r: (r.date, r.path))
    return out


@dataclasses.dataclass(frozen=True)
class Block:
    """A section's output: the markdown between its markers and the plots it links to
    (file name under :data:`IMAGES` -> SVG text)."""

    markdown: str
    plots: dict[str, str] = dataclasses.field(default_factory=dict)


def _source_line(results: Iterable[Result]) -> str:
    """Where the figures come from: each file with its commit, date and device."""
    parts = []
    for r in results:
        d = r.data
        device = d.get("device_kind") or d.get("target") or "?"
        if d.get("platform") == "cpu" and d.get("libtpu"):
            device = f"compile-only, libtpu {d['libtpu']}"
        parts.append(
            f"`benchmarks/data/{r.path}` ({device}, commit {r.commit[:7]}, {r.date[:10]}, "
            f"`{d.get('command', '?')}`)"
        )
    return "Source: " + "; ".join(parts) + "."


# ---------------------------------------------------------------------------------------
# TPU on a real chip


def _cell(latest: dict[str, dict[str, Any]], case: str, base: str) -> str:
    """``us (x bf16)`` of ``case`` against ``base``; "" where it was not timed."""
    row = latest.get(case)
    if row is None:
        return ""
    text = units.us(row["seconds"])
    if case != base and base in latest:
        text += f" ({units.ratio(row['seconds'] / latest[base]['seconds'])}x)"
    return text


def _commits(latest: dict[str, dict[str, Any]], prefix: str) -> str:
    return ", ".join(sorted({r["commit"][:7] for c, r in latest.items() if c.startswith(prefix)}))


def chip_programs(results: Sequence[Result]) -> Block:
    """The latest timing of each ``benchmarks.chip_time`` program, per target, in three
    tables: the projections by scheme and block shape, the layer by route, decode
    attention by cache format; each figure with its ratio to the bf16 program beside
    it (the bf16 projection or layer at the same M; the bf16 cache on XLA's route)."""
    by_target: dict[str, dict[str, dict[str, Any]]] = {}
    used: dict[str, Result] = {}
    for r in results:
        for row in r.data["rows"]:
            by_target.setdefault(r.data["target"], {})[row["case"]] = {
                **row,
                "commit": row.get("commit", r.commit),
            }
            used[r.path] = r
    lines: list[str] = []
    for target, latest in sorted(by_target.items()):
        cases = [c.split("/") for c in latest]
        ms = sorted({int(c[2][1:]) for c in cases if c[0] in ("projection", "layer")})
        heads = [f"M = {m}" for m in ms]
        proj: dict[tuple[str, str], dict[int, str]] = {}
        for c in cases:
            if c[0] == "projection" and len(c) == 4:
                blocks = (
                    "default" if c[3] == "default" else "(b, {}, {})".format(*c[3].split("x")[1:])
                )
                proj.setdefault((c[1], blocks), {})[int(c[2][1:])] = "/".join(c)
        rows = [
            (scheme, blocks, *(_cell(latest, at.get(m, ""), f"projection/bf16/m{m}") for m in ms))
            for (scheme, blocks), at in proj.items()
        ]
        rows.insert(0, ("bf16", "XLA", *(_cell(latest, f"projection/bf16/m{m}", "") for m in ms)))
        if proj:
            commits = _commits(latest, "projection/")
            lines += [f"{target}, one 4096 x 14336 projection, us a call (x bf16); b = 16 "
                      f"at M = 1, 64 at M = 64; commits {commits}:", ""]  # fmt: skip
            lines += markdown_table(["weight", "blocks (bm, bn, bk)", *heads], rows)
            lines.append("")
        routes = list(dict.fromkeys(c[1] for c in cases if c[0] == "layer"))
        if routes:
            rows = [
                (route, *(_cell(latest, f"layer/{route}/m{m}", f"layer/bf16/m{m}") for m in ms))
                for route in routes
            ]
            lines += [f"{target}, one Llama-3-8B layer's seven projections, us a call "
                      f"(x bf16); commits {_commits(latest, 'layer/')}:", ""]  # fmt: skip
            lines += markdown_table(["route", *heads], rows)
            lines.append("")
        caches = list(dict.fromkeys(c[1] for c in cases if c[0] == "attention"))
        if caches:
            base = "attention/bfloat16/xla"
            rows = [
                (cache, *(_cell(latest, f"attention/{cache}/{route}", base)
                          for route in ("kernel", "xla")))
                for cache in caches
            ]  # fmt: skip
            lines += [f"{target}, decode attention over the stored KV cache, us a call "
                      f"(x the bf16 cache on XLA's route); commits "
                      f"{_commits(latest, 'attention/')}:", ""]  # fmt: skip
            lines += markdown_table(["cache", "kernel", "XLA route"], rows)
            lines.append("")
    lines.append(_source_line(sorted(used.values(), key=lambda r: r.path)))
    return Block("\n".join(lines))


def word_step(results: Sequence[Result]) -> Block:
    """The latest ``benchmarks.word_time`` run of each target: each scheme's time at
    each M and shape, against bf16 and against reading its bytes at the HBM bandwidth;
    one plot of time against M per shape."""
    latest = {r.data["target"]: r for r in results}
    lines: list[str] = []
    plots = {}
    for target, r in sorted(latest.items()):
        gbs = r.data["hbm_gbs"]
        bf16 = {(x["m"], x["k"], x["n"]): x for x in r.data["rows"] if x["scheme"] == "bf16"}
        rows = []
        for x in r.data["rows"]:
            base = bf16[(x["m"], x["k"], x["n"])]
            hbm = x["nbytes"] / (gbs * 1e9)
            rows.append((
                x["scheme"], f"{x['m']}x{x['k']}x{x['n']}", units.us(x["seconds"]),
                units.ratio(x["seconds"] / base["seconds"]), units.us(hbm),
                units.ratio(x["seconds"] / hbm),
            ))  # fmt: skip
        lines += [f"{target}, `emulate.pallas.matmul` on a prepared weight against `jnp.dot` "
                  f"on its bf16 copy (HBM read at {gbs:g} GB/s):", ""]  # fmt: skip
        heads = ["scheme", "M x K x N", "us a call", "x bf16", "HBM read (us)", "x HBM read"]
        lines += markdown_table(heads, rows)
        lines.append("")
        for k, n in dict.fromkeys((x["k"], x["n"]) for x in r.data["rows"]):
            series: dict[str, list[tuple[float, float]]] = {}
            for x in r.data["rows"]:
                if (x["k"], x["n"]) == (k, n):
                    series.setdefault(x["scheme"], []).append((x["m"], x["seconds"] * 1e6))
            name = f"word_step-{target}-{k}x{n}.svg"
            plots[name] = svg.line_chart(
                f"{target}: M x {k} x {n}", "rows M", "us a call", series, log_y=True
            )
            lines += [f"![time against M, {k} x {n}, {target}](images/performance/{name})", ""]
    lines.append(_source_line(latest.values()))
    return Block("\n".join(lines), plots)


# ---------------------------------------------------------------------------------------
# TPU by the compiler


_MODEL_ROUTES = {"pallas": "pallas.matmul (prepared)", "bf16": "bf16 model", "xla": "XLA route"}


def models(results: Sequence[Result]) -> Block:
    """The latest ``benchmarks.models`` row of each (model, step, generation, route,
    cache), one table a model and step: what a step reads against its ideal bytes,
    whether the model fits the chip's HBM, the time of its bytes at the HBM bandwidth,
    and the bundle model's time, against the bf16 model's on the same generation."""
    latest: dict[tuple[str, str, str, str, str], dict[str, Any]] = {}
    for r in results:
        for row in r.data["results"]:
            if row.get("status") == "ok":
                key = (row["model"], row["step"], row["generation"], row["route"],
                       row.get("cache") or "")  # fmt: skip
                latest[key] = row
    lines: list[str] = []
    for model, step in dict.fromkeys((k[0], k[1]) for k in latest):
        rows = []
        for (m, st, gen, route, cache), row in latest.items():
            if (m, st) != (model, step):
                continue
            bf16 = latest.get((m, st, gen, "bf16", ""))
            bundle = row.get("bundle_s")
            versus = units.quotient(bundle, bf16.get("bundle_s") if bf16 else None)
            label = _MODEL_ROUTES.get(route, route) + (f", {cache} KV cache" * bool(cache))
            fits = "" if row["fits"] else ", **does not fit**"
            rows.append((
                f"{gen} ({row['hbm'] >> 30} GiB)",
                label,
                f"{row['bytes'] / 1e9:.2f} GB ({units.ratio(row['bytes_over_ideal'])}x)",
                f"{row['footprint'] / 2**30:.2f} GiB{fits}",
                units.ms(row["bandwidth_s"]),
                units.ms(bundle),
                "" if route == "bf16" or versus is None else f"{units.ratio(versus)}x",
            ))  # fmt: skip
        lines += [f"{model}, {step}, one device:", ""]
        heads = ["generation (HBM)", "route", "bytes a step (x ideal)", "footprint",
                 "bytes / HBM BW (ms)", "bundle model (ms)", "x bf16 model"]  # fmt: skip
        lines += markdown_table(heads, rows)
        lines.append("")
    lines.append(_source_line(results))
    return Block("\n".join(lines))


# ---------------------------------------------------------------------------------------
# CPU


def cpu_kernel(results: Sequence[Result]) -> Block:
    """The latest ``benchmarks.qcpu`` row of each (scheme, shape): the CPU kernel's time
    against the f32 dot on the pre-decoded exact weight, the bf16 floor, reading the
    stored bytes and its own M = 1 time, XLA's route beside it; then issue 50's goals
    over those rows (met, or the worst row and its distance); one plot of time against
    M per K x N, a line per scheme."""
    latest: dict[tuple[str, int, int, int], dict[str, Any]] = {}
    for r in results:
        for row in r.data["rows"]:
            latest[(row["pair"], row["M"], row["K"], row["N"])] = row
    rows = [
        (
            row["title"], f"{m}x{k}x{n}", units.mb(row["stored_bytes"]),
            units.ms(row["emulate_s"]), units.ratio(row["emulate_over_f32"]),
            units.ratio(row["emulate_over_floor"]), units.ratio(row["emulate_over_read"], 1),
            units.ratio(row.get("emulate_over_m1")), units.ratio(row.get("xla_over_f32")),
        )
        for (_, m, k, n), row in sorted(latest.items(), key=lambda kv: kv[0][2:] + kv[0][1:2])
    ]  # fmt: skip
    heads = ["scheme", "M x K x N", "stored MB", "emulate (ms)", "x f32 dot", "x bf16 floor",
             "x read", "x its M = 1", "XLA route x f32"]  # fmt: skip
    lines = ["bf16 activations, `emulate.dot_general` (the CPU kernel, or XLA's route where "
             "it does not take the weight), medians of interleaved rounds:", ""]  # fmt: skip
    lines += markdown_table(heads, rows)
    goals = results[-1].data.get("goals", []) if results else []
    if goals:
        lines += ["", f"Issue 50's goals, over `benchmarks/data/{results[-1].path}`:", ""]
        lines += markdown_table(
            ["goal", "limit", "worst", "where", "met"],
            [
                (g["goal"], g["limit"], units.ratio(g["measured"]), g["worst"], g["met"])
                for g in goals
            ],
        )
    plots = {}
    for k, n in dict.fromkeys((key[2], key[3]) for key in latest):
        series: dict[str, list[tuple[float, float]]] = {}
        for (_, m, kk, nn), row in sorted(latest.items()):
            if (kk, nn) == (k, n) and row["emulate_s"]:
                series.setdefault(row["title"], []).append((m, row["emulate_s"] * 1e3))
        if any(len(v) > 1 for v in series.values()):
            name = f"cpu_kernel-{k}x{n}.svg"
            plots[name] = svg.line_chart(
                f"CPU: M x {k} x {n}", "rows M", "ms a call", series, log_y=True
            )
            lines += ["", f"![time against M, {k} x {n}, CPU](images/performance/{name})"]
    lines += ["", _source_line(results)]
    return Block("\n".join(lines), plots)


#: The generated sections: name (as the page's markers write it) -> (the folder under
#: ``benchmarks/data`` it reads, its renderer).
SECTIONS: dict[str, tuple[str, Callable[[Sequence[Result]], Block]]] = {
    "tpu-chip-programs": ("chip_times", chip_programs),
    "tpu-chip-word-step": ("word_times", word_step),
    "tpu-compiler-models": ("models", models),
    "cpu-kernel": ("qcpu", cpu_kernel),
}


# ---------------------------------------------------------------------------------------
# The page


def render(page: str, blocks: dict[str, str]) -> str:
    """``page`` with the text between each section's markers replaced by its block.
    Raises ValueError, naming them, for a marker without its pair or out of order, a
    section marked twice, a marked section that :data:`SECTIONS` does not know, or a
    block the page has no markers for."""
    found = [(m.group(1), m.group(2), m) for m in _MARKER.finditer(page)]
    out, pos, seen = [], 0, []
    for i in range(0, len(found), 2):
        pair = found[i : i + 2]
        if len(pair) < 2 or [p[0] for p in pair] != ["BEGIN", "END"] or pair[0][1] != pair[1][1]:
            raise ValueError(f"{PAGE.name}: marker {pair[0][2].group(0)!r} has no END after it")
        name = pair[0][1]
        if name in seen:
            raise ValueError(f"{PAGE.name}: section {name!r} marked twice")
        if name not in blocks:
            raise ValueError(f"{PAGE.name}: section {name!r} is not one of {sorted(blocks)}")
        seen.append(name)
        out += [page[pos : pair[0][2].end()], "\n", blocks[name].rstrip("\n"), "\n"]
        pos = pair[1][2].start()
    missing = sorted(set(blocks) - set(seen))
    if missing:
        raise ValueError(
            f"{PAGE.name} has no markers for {missing}: add "
            + " and ".join(f"{_BEGIN.format(n)} / {_END.format(n)}" for n in missing)
        )
    return "".join(out) + page[pos:]


def generate(data: Path = DATA, page: Path = PAGE) -> dict[Path, str]:
    """Every file the report writes (the page and its plots), path -> text."""
    results = load(data)
    blocks, files = {}, {}
    for name, (kind, section) in SECTIONS.items():
        if kind not in results:
            raise ValueError(f"section {name!r}: no results under {data / kind}")
        block = section(results[kind])
        blocks[name] = block.markdown
        files.update({IMAGES / n: text for n, text in block.plots.items()})
    files[page] = render(page.read_text(), blocks)
    return files


def stale(files: dict[Path, str]) -> list[Path]:
    """The files whose text on disk differs from ``files``' (or that are missing)."""
    return [p for p, text in files.items() if not p.exists() or p.read_text() != text]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.report", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    args = p.parse_args(argv)
    try:
        files = generate()
    except ValueError as e:
        print(f"benchmarks.report: {e}", file=sys.stderr)
        return 2
    out_of_date = stale(files)
    if args.check:
        for path in out_of_date:
            print(f"stale: {path.relative_to(ROOT)} (run python -m benchmarks.report)")
        return 1 if out_of_date else 0
    for path in out_of_date:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[path])
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
