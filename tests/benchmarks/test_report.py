"""benchmarks.report: docs/performance.md's generated blocks and plots are what the
checked-in results give (the page is up to date), and the page's markers are checked."""

from __future__ import annotations

import re
import xml.dom.minidom

import pytest

from benchmarks import provenance, report, svg
from benchmarks.tables import markdown_table


def test_the_page_and_its_plots_are_up_to_date():
    files = report.generate()
    assert report.stale(files) == [], "run python -m benchmarks.report and commit the result"
    assert report.main(["--check"]) == 0
    for path, text in files.items():
        if path.suffix == ".svg":
            xml.dom.minidom.parseString(text)  # well-formed


def test_every_result_the_page_reads_names_its_benchmark_command_date_and_full_commit():
    results = report.load()
    read = {kind for kind, _ in report.SECTIONS.values()}
    assert read == {"chip_times", "word_times", "models", "qcpu"} and read <= set(results)
    for kind in read:
        for r in results[kind]:
            module = report.ROOT / "benchmarks" / f"{r.data['benchmark']}.py"
            assert module.is_file(), r.path
            assert r.data["command"].startswith("python -m benchmarks."), r.path
            assert re.fullmatch(r"20\d\d-\d\d-\d\d(T\d\d:\d\d:\d\d\+00:00)?", r.date), r.path
            assert re.fullmatch("[0-9a-f]{40}", r.commit), r.path


def test_render_rewrites_only_between_markers():
    page = (
        "# hand\n<!-- BEGIN benchmarks.report: a -->\nold\n<!-- END benchmarks.report: a -->\n"
        "kept `<!-- BEGIN benchmarks.report: b -->` in prose\n"
    )
    assert report.render(page, {"a": "new\n"}) == page.replace("old", "new")


@pytest.mark.parametrize(
    ("page", "message"),
    [
        ("<!-- BEGIN benchmarks.report: a -->\n", "marker '<!-- BEGIN benchmarks.report: a -->' "
         "has no END after it"),
        ("<!-- BEGIN benchmarks.report: a -->\n<!-- END benchmarks.report: b -->\n",
         "marker '<!-- BEGIN benchmarks.report: a -->' has no END after it"),
        ("<!-- BEGIN benchmarks.report: c -->\n<!-- END benchmarks.report: c -->\n",
         "section 'c' is not one of ['a']"),
        ("no markers\n", "performance.md has no markers for ['a']: add <!-- BEGIN "
         "benchmarks.report: a --> / <!-- END benchmarks.report: a -->"),
    ],
)  # fmt: skip
def test_render_refuses_broken_markers(page, message):
    with pytest.raises(ValueError) as e:
        report.render(page, {"a": "x"})
    assert str(e.value).endswith(message)


def test_markdown_table_escapes_bars_and_counts_cells():
    assert markdown_table(["a", "b"], [(1, "x|y")]) == ["| a | b |", "|---|---|", "| 1 | x\\|y |"]
    with pytest.raises(ValueError, match="a row of 1 cells under 2 headers"):
        markdown_table(["a", "b"], [(1,)])


def test_line_chart_places_points_on_log_axes_and_refuses_what_it_cannot_draw():
    text = svg.line_chart("t", "x", "y", {"s": [(1, 10.0), (16, 40.0)]}, log_y=True)
    # x ticks 1..16 span the plot's 446 px from x = 64
    assert '<circle cx="64.0" cy="' in text and '<circle cx="510.0" cy="' in text
    assert text == svg.line_chart("t", "x", "y", {"s": [(16, 40.0), (1, 10.0)]}, log_y=True)
    with pytest.raises(ValueError, match="no points"):
        svg.line_chart("t", "x", "y", {})
    with pytest.raises(ValueError, match="> 0 on a log axis"):
        svg.line_chart("t", "x", "y", {"s": [(1, 0.0)]}, log_y=True)


def test_commit_is_written_in_full():
    head = provenance.commit(None)
    assert head is not None and re.fullmatch("[0-9a-f]{40}", head)
    assert provenance.commit(head[:7]) == head
    assert provenance.commit("not-a-commit") == "not-a-commit"


def test_the_cpu_table_has_a_row_per_scheme_and_shape_and_each_goal_as_measured():
    results = report.load()["qcpu"]
    result = results[-1]  # its rows are the latest of their scheme and shape
    block = report.cpu_kernel(results).markdown
    for row in result.data["rows"]:
        shape = f"{row['M']}x{row['K']}x{row['N']}"
        ms = f"{row['emulate_s'] * 1e3:.3g}"
        assert f"| {row['title']} | {shape} | " in block and f" | {ms} | " in block, shape
    for g in result.data["goals"]:
        assert f"| {g['goal']} | {g['limit']} | " in block and f"| {g['met']} |" in block
