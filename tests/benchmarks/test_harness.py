"""benchmarks.harness: the units, the timing loop, the table, the flags every benchmark
shares, and what a registered benchmark writes. Expected strings are written out by hand."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import harness


def test_units_print_three_significant_digits_or_fixed_places():
    assert harness.ms(0.0123) == "12.3"
    assert harness.ms(0.001) == "1"
    assert harness.ms(0.1234) == "123"
    assert harness.ms(1.5) == "1500"  # no exponent from 1000 up
    assert harness.ms(0.0123, places=3) == "12.300"
    assert harness.ms(2.5e-5, places=2) == "0.03"
    assert harness.us(2e-6) == "2"
    assert harness.us(1.234e-4) == "123"
    assert harness.us(0.0125) == "12500"
    assert harness.mb(8_388_608) == "8.39"
    assert harness.mb(134_217_728) == "134"
    assert harness.mb(2_500_000_000) == "2500"
    assert harness.mb(32_768, places=2) == "0.03"
    assert harness.ratio(1.234) == "1.23"
    assert harness.ratio(0.5, places=1) == "0.5"
    assert harness.shape_text((64, 4096, 1024)) == "64x4096x1024"


def test_a_missing_figure_prints_as_a_question_mark():
    for fmt in (harness.ms, harness.us, harness.mb, harness.ratio):
        assert fmt(None) == "?"


def test_text_table_aligns_columns():
    got = harness.text_table(["name", "ms"], [["a", "1.5"], ["long name", "12.25"]], right={1})
    assert got == "\n".join(
        [
            "name          ms",
            "---------  -----",
            "a            1.5",
            "long name  12.25",
        ]
    )


def test_stats_and_short_error():
    assert harness.stats([3.0, 1.0, 2.0, 10.0]) == {"median_s": 2.5, "min_s": 1.0, "max_s": 10.0}
    assert harness.short_error(ValueError("first line\nsecond")) == "first line"
    assert harness.short_error(ValueError("x" * 30), limit=10) == "xxxxxxx..."
    assert harness.short_error(KeyboardInterrupt()) == "KeyboardInterrupt"


class _Case:
    def __init__(self, label: str, calls: list[str], fail: bool = False) -> None:
        self.label = label
        self.times: list[float] = []
        self.calls = calls
        self.fail = fail

    def run(self) -> float:
        self.calls.append(self.label)
        if self.fail:
            raise RuntimeError("no such program\nmore detail")
        return float(len(self.calls))


def test_interleave_warms_up_each_case_then_times_rounds(capsys):
    calls: list[str] = []
    a, bad, b = _Case("A", calls), _Case("B", calls, fail=True), _Case("C", calls)
    ok, failed = harness.interleave([a, bad, b], repeats=3)
    assert ok == [a, b]
    assert failed == {"B": "no such program"}
    # two warm-up calls each (the failing case stops at its first), then A C rounds
    assert calls == ["A", "A", "B", "C", "C", "A", "C", "A", "C", "A", "C"]
    assert a.times == [6.0, 8.0, 10.0] and b.times == [7.0, 9.0, 11.0]
    assert capsys.readouterr().err == "skipped B: no such program\n"


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
    assert json.loads(out.read_text()) == {"repeats": 2, "quick": True, "command": command}
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


def test_quotient_is_none_without_both_figures():
    assert harness.quotient(3.0, 2.0) == 1.5
    assert harness.quotient(None, 2.0) is None
    assert harness.quotient(3.0, None) is None
    assert harness.quotient(3.0, 0.0) is None


def test_index_keys_the_ok_rows_of_a_contender():
    rows = [
        {"pair": "a", "M": 1, "contender": "floor", "status": "ok", "v": 1},
        {"pair": "a", "M": 2, "contender": "floor", "status": "refused", "v": 2},
        {"pair": "a", "M": 1, "contender": "fast", "status": "ok", "v": 3},
    ]
    assert {k: r["v"] for k, r in harness.index(rows, ("pair", "M"), "floor").items()} == {
        ("a", 1): 1
    }
    assert {k: r["v"] for k, r in harness.index(rows, ("M", "contender")).items()} == {
        (1, "floor"): 1,
        (1, "fast"): 3,
    }


def test_goal_table_writes_each_goal_and_its_failures():
    goals = [
        {"generation": "tpu_v5e", "goal": "g1", "limit": 1.1, "measured": None},
        {
            "generation": "tpu_v4",
            "goal": "g2",
            "limit": 2,
            "measured": 2.5,
            "worst": "int4 1x2x3",
            "met": False,
            "failing": ["int4 1x2x3"],
            "unestimated": ["int8 1x2x3"],
        },
    ]
    assert harness.goal_table("## T", []) == []
    assert harness.goal_table("## T", goals) == [
        "## T",
        "",
        "| generation | goal | limit | worst measured | where | met | failing |",
        "|---|---|---|---|---|---|---|",
        "| tpu_v5e | g1 | 1.1 | not measured | | | |",
        "| tpu_v4 | g2 | 2 | 2.5 | int4 1x2x3 | no | int4 1x2x3, int8 1x2x3 (no estimate) |",
    ]
