"""benchmarks.harness: the flags every benchmark shares, and what a registered benchmark
writes (the provenance at the head of its JSON). Expected strings are written out by hand."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest

from benchmarks import harness


def _tiny(plotted: list[Path], seen: list[argparse.Namespace], **kw: Any) -> harness.Benchmark:
    """A benchmark that measures nothing: its report is its resolved flags."""

    def flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--size", type=int, default=3)

    def plot(data: dict[str, Any], path: Path) -> Path:
        plotted.append(path)
        path.write_text("png")
        return path

    def run(args: argparse.Namespace) -> harness.Report:
        seen.append(args)
        if args.size < 0:
            raise harness.FlagError(f"--size must not be negative, got {args.size}")
        if args.size == 0:
            raise harness.Unavailable("no device for size 0")
        data = {"repeats": args.repeats, "quick": args.quick, "command": args.command}
        return harness.Report(data, f"# tiny\n\nsize {args.size}\n", markdown=True, plot=plot)

    defaults: dict[str, Any] = dict(repeats=(4, 2), quick="a short run", plots=True)
    return harness.Benchmark("tiny", "A tiny benchmark.", run, flags, **{**defaults, **kw})


def test_a_registered_benchmark_writes_json_markdown_and_plot(tmp_path, capsys):
    plotted: list[Path] = []
    seen: list[argparse.Namespace] = []
    bench = _tiny(plotted, seen)
    out = tmp_path / "sub" / "t.json"
    assert bench.main(["--quick", "--size", "5", "--json", str(out)]) == 0
    command = f"python -m benchmarks.tiny --quick --size 5 --json {out}"
    written = json.loads(out.read_text())
    head = {k: written.pop(k) for k in list(written) if k not in ("repeats", "quick", "command")}
    assert written == {"repeats": 2, "quick": True, "command": command}
    # the provenance of every result file heads it (benchmarks.provenance)
    assert sorted(head) == [
        "benchmark", "commit", "cpu_count", "date", "device_kind", "jax", "jaxlib", "libtpu",
        "machine", "platform", "python", "target",
    ]  # fmt: skip
    assert head["benchmark"] == "tiny" and head["device_kind"] == "cpu"
    assert re.fullmatch("[0-9a-f]{40}", head["commit"])
    assert out.with_suffix(".md").read_text() == "# tiny\n\nsize 5\n"
    assert plotted == [out.with_suffix(".png")]
    assert capsys.readouterr().out.splitlines() == [
        "# tiny",
        "",
        "size 5",
        f"wrote {out} and {out.with_suffix('.md')}",
        f"wrote {out.with_suffix('.png')}",
    ]


def test_no_json_prints_only_and_no_plot_skips_the_png(tmp_path, capsys):
    plotted: list[Path] = []
    seen: list[argparse.Namespace] = []
    bench = _tiny(plotted, seen)
    assert bench.main(["--no-json", "--repeats", "7"]) == 0
    assert capsys.readouterr().out == "# tiny\n\nsize 3\n"
    assert (seen[-1].json, seen[-1].repeats, seen[-1].quick) == (None, 7, False)
    out = tmp_path / "t.json"
    assert bench.main(["--no-plot", "--json", str(out)]) == 0
    assert plotted == [] and out.exists() and not out.with_suffix(".png").exists()


def test_flags_resolve_to_the_benchmarks_defaults():
    bench = _tiny([], [])
    args = bench.parse([])
    assert (args.repeats, args.quick, args.plot) == (4, False, True)
    assert args.json == Path(harness.__file__).parent / "results" / "tiny.json"
    assert args.command == "python -m benchmarks.tiny"
    quiet = _tiny([], [], writes=False, plots=False)
    args = quiet.parse(["--quick"])
    assert (args.json, args.repeats, args.plot) == (None, 2, False)
    help_text = " ".join(bench.parser().format_help().split())
    assert "--repeats REPEATS timed rounds (default 4, 2 with --quick)" in help_text
    assert "--quick a short run" in help_text


def test_flags_a_benchmark_lacks_are_refused(capsys):
    bench = _tiny([], [], repeats=None, quick="")
    with pytest.raises(SystemExit) as e:
        bench.parse(["--repeats", "3"])
    assert e.value.code == 2
    assert "unrecognized arguments: --repeats 3" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse(["--quick"])
    assert "unrecognized arguments: --quick" in capsys.readouterr().err


def test_bad_values_exit_with_usage_and_the_reason(capsys):
    bench = _tiny([], [])
    with pytest.raises(SystemExit) as e:
        bench.main(["--repeats", "0", "--no-json"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "benchmarks.tiny: error: --repeats must be at least 1, got 0"
    )
    with pytest.raises(SystemExit) as e:
        bench.main(["--size", "-1", "--no-json"])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "benchmarks.tiny: error: --size must not be negative, got -1"
    )


def test_an_unavailable_requirement_is_exit_code_2_and_a_message(capsys):
    assert _tiny([], []).main(["--size", "0", "--no-json"]) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", "no device for size 0\n")


def test_write_without_json_redraws_markdown_and_plot_beside_it(tmp_path, capsys):
    path = tmp_path / "old.json"
    path.write_text('{"kept": true}\n')
    drawn: list[Path] = []
    report = harness.Report(
        {"kept": False}, "# md\n", markdown=True, plot=lambda d, p: drawn.append(p)
    )
    harness.write(report, path, with_json=False)
    assert path.read_text() == '{"kept": true}\n'
    assert path.with_suffix(".md").read_text() == "# md\n"
    assert drawn == [path.with_suffix(".png")]
    assert capsys.readouterr().out == f"wrote {path.with_suffix('.md')}\n"
