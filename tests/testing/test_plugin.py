"""emulate's pytest plugin, run inside pytest (pytester): parametrization over targets and
modes, the marker, and the JSON and HTML report of a session with a failing kernel.

One pytest session, in this process, runs both suites (:data:`SUITE`, parametrized by the
options, and :data:`STATUS_SUITE`, whose module marker overrides them): a pytest
subprocess would import JAX and emulate again (about 4 s) for what is the plugin's
parametrization and report, not a process boundary; the usage errors run in process too.
``python -m emulate`` runs in a fresh interpreter in tests/cli/test_cli_main.py."""

from __future__ import annotations

import json
import pathlib

import pytest

SUITE = """
import jax
import jax.numpy as jnp
import pytest

import emulate
from emulate import testing


@jax.jit
def int8_exact(a, b):
    return jnp.dot(a.astype(jnp.int32), b.astype(jnp.int32))


@jax.jit
def int8_via_f32(a, b):
    f32 = jnp.float32
    return jnp.dot(a.astype(f32), b.astype(f32)).astype(jnp.int32)


def test_runs_under_the_target(emulate_target, emulate_mode):
    assert emulate.current_target().name == emulate_target
    assert emulate.current_mode() == emulate_mode


def test_good_kernel(emulate_target):
    testing.check_function(int8_exact, "int8", "int8", examples=5)


@pytest.mark.emulate(targets=["tpu_v7x"])
def test_bad_kernel(emulate_target):
    testing.check_function(int8_via_f32, "int8", "int8", examples=20)
"""


def _parametrized_and_reported(result: pytest.RunResult, path: pathlib.Path) -> None:
    """SUITE's checks: parametrized by the options, seeded by --hypothesis-seed."""
    report = json.loads((path / "report.json").read_text())
    rows = [
        (c["test"].split("::")[1], c["target"], c["seed"], c["examples"], c["failure"] is None)
        for c in report["checks"]
        if c["test"].startswith("test_suite.py::")
    ]
    # pytest's --hypothesis-seed is the seed of every check that passes none.
    assert rows == [
        ("test_good_kernel[tpu_v4]", "tpu_v4", 7, 5, True),
        ("test_good_kernel[tpu_v5e]", "tpu_v5e", 7, 5, True),
        ("test_bad_kernel[tpu_v7x]", "tpu_v7x", 7, rows[2][3], False),
    ]
    (bad,) = [c for c in report["checks"] if c["test"].endswith("test_bad_kernel[tpu_v7x]")]
    assert "with emulate.use_target('tpu_v7x'):" in bad["reproducer"]
    assert "under tpu_v7x (seed 7, hypothesis-shrunk example)" in "".join(result.outlines)
    assert "from test_suite import int8_via_f32" in bad["reproducer"]
    page = (path / "report.html").read_text()
    # Exact checks have no err/bound: a passed/failed bar plot each, no histogram (the
    # three of SUITE and STATUS_SUITE's one).
    assert page.count('<svg class="outcomes"') == 4 and '<svg class="hist"' not in page
    assert "seed 7" in page
    assert "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "test_bad_kernel[tpu_v7x]" in page and "int8_via_f32(lhs, rhs)" in page


def test_plugin_bad_options(pytester: pytest.Pytester):
    # in process: a usage error stops pytest before any test (or JAX) runs; a subprocess
    # would only add two interpreter start-ups
    pytester.makepyfile(test_suite="def test_t(emulate_target):\n    pass\n")
    result = pytester.runpytest_inprocess(
        "-p", "emulate.testing.plugin", "--emulate-targets", "tpu_v99", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --emulate-targets: target: unknown target 'tpu_v99'; *"])
    result = pytester.runpytest_inprocess(
        "-p", "emulate.testing.plugin", "--emulate-modes", "quick", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --emulate-modes: expected fast or exact, got 'quick'"])


STATUS_SUITE = """
import jax
import jax.numpy as jnp
import pytest

import emulate
from emulate import testing

pytestmark = pytest.mark.emulate(targets=["tpu_v6e", "tpu_v7x"])


@jax.jit
def int8_via_f32(a, b):
    f32 = jnp.float32
    return jnp.dot(a.astype(f32), b.astype(f32)).astype(jnp.int32)


def test_module_marker_sets_the_targets(emulate_target):
    assert emulate.current_target().name == emulate_target


@pytest.mark.xfail(reason="sums int8 in float32", strict=True)
def test_known_bad_kernel():
    testing.check_function(int8_via_f32, "int8", "int8", examples=20, seed=0)


@pytest.mark.xfail(reason="not yet", strict=False)
def test_unexpectedly_fine():
    pass


def test_checked_without_check_function():
    assert emulate.formats.get("int8").bits == 8


@pytest.mark.skip(reason="no TPU")
def test_skipped():
    pass


def test_listed_by_the_module_marker():
    pass
"""


def _every_test_has_a_status(path: pathlib.Path) -> None:
    """STATUS_SUITE's tests: each listed with its status, under its module's marker."""
    report = json.loads((path / "report.json").read_text())
    tests = [
        (t["test"].split("::")[1], t["status"], t["checks"])
        for t in report["tests"]
        if t["test"].startswith("test_statuses.py::")
    ]
    # The module's pytestmark overrides --emulate-targets and lists every test of it.
    assert tests == [
        ("test_module_marker_sets_the_targets[tpu_v6e]", "passed", 0),
        ("test_module_marker_sets_the_targets[tpu_v7x]", "passed", 0),
        ("test_known_bad_kernel", "xfailed", 1),
        ("test_unexpectedly_fine", "xpassed", 0),
        ("test_checked_without_check_function", "passed", 0),
        ("test_skipped", "skipped", 0),
        ("test_listed_by_the_module_marker", "passed", 0),
    ]
    (check,) = [c for c in report["checks"] if c["test"].startswith("test_statuses.py::")]
    assert (check["status"], check["failure"] is None) == ("xfailed", False)
    page = (path / "report.html").read_text()
    # both suites: 4 checks (one xfailed), 14 tests (SUITE's 7: 6 passed, 1 failed)
    assert "4 checks, 1 failed, 1 failed as expected (xfail)" in page
    assert "14 tests: 10 passed, 1 failed, 1 xfailed, 1 xpassed, 1 skipped" in page
    verdict = '<td class="failed"><a href="#c0">FAILED</a></td>'
    assert verdict + '<td class="xfailed">xfailed</td>' in page
    assert (
        "<tr><td>test_statuses.py::test_checked_without_check_function</td>"
        + "<td>-</td>" * 8
        + '<td>no check_function</td><td class="passed">passed</td></tr>'
    ) in page


def test_plugin_parametrizes_and_reports_every_status(pytester: pytest.Pytester):
    pytester.makepyfile(test_suite=SUITE, test_statuses=STATUS_SUITE)
    result = pytester.runpytest_inprocess(
        "-p",
        "emulate.testing.plugin",
        "--emulate-targets",
        "v4,tpu_v5e",
        "--emulate-modes",
        "fast,exact",
        "--emulate-report",
        "report",
        "--hypothesis-seed",
        "7",
        "-p",
        "no:cacheprovider",
        "-q",
    )
    # SUITE: 4 + 2 passed, 1 failed; STATUS_SUITE: 4 passed, 1 xfailed, 1 xpassed, 1 skipped
    result.assert_outcomes(passed=10, failed=1, xfailed=1, xpassed=1, skipped=1)
    _parametrized_and_reported(result, pytester.path)
    _every_test_has_a_status(pytester.path)
