"""emulate's pytest plugin, run inside pytest (pytester): parametrization over targets and
modes, the marker, and the JSON and HTML report of a session with a failing kernel."""

from __future__ import annotations

import json

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


def test_plugin_parametrizes_and_reports(pytester: pytest.Pytester):
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess(
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
    result.assert_outcomes(passed=6, failed=1)
    report = json.loads((pytester.path / "report.json").read_text())
    rows = [
        (c["test"].split("::")[1], c["target"], c["seed"], c["examples"], c["failure"] is None)
        for c in report["checks"]
    ]
    # pytest's --hypothesis-seed is the seed of every check that passes none.
    assert rows == [
        ("test_good_kernel[tpu_v4]", "tpu_v4", 7, 5, True),
        ("test_good_kernel[tpu_v5e]", "tpu_v5e", 7, 5, True),
        ("test_bad_kernel[tpu_v7x]", "tpu_v7x", 7, rows[2][3], False),
    ]
    bad = report["checks"][2]
    assert "with emulate.use_target('tpu_v7x'):" in bad["reproducer"]
    assert "under tpu_v7x (seed 7, hypothesis-shrunk example)" in "".join(result.outlines)
    assert "from test_suite import int8_via_f32" in bad["reproducer"]
    page = (pytester.path / "report.html").read_text()
    # Exact checks have no err/bound: a passed/failed bar plot each, no histogram.
    assert page.count('<svg class="outcomes"') == 3 and '<svg class="hist"' not in page
    assert "seed 7" in page
    assert "3 checks, 1 failed" in page
    assert "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "test_bad_kernel[tpu_v7x]" in page and "int8_via_f32(lhs, rhs)" in page


def test_plugin_bad_options(pytester: pytest.Pytester):
    pytester.makepyfile(test_suite="def test_t(emulate_target):\n    pass\n")
    result = pytester.runpytest_subprocess(
        "-p", "emulate.testing.plugin", "--emulate-targets", "tpu_v99", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --emulate-targets: target: unknown target 'tpu_v99'; *"])
    result = pytester.runpytest_subprocess(
        "-p", "emulate.testing.plugin", "--emulate-modes", "quick", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --emulate-modes: expected fast or exact, got 'quick'"])
