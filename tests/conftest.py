"""Shared pytest setup: hypothesis profiles and the long-test switch.

Hypothesis profiles:
  ci: derandomized, a fixed 20 examples per test, no deadline, failing examples printed
      as reproduction blobs. Loaded when the environment has ``CI=true``.
  dev: 50 random examples per test, no deadline. Loaded otherwise.
``HYPOTHESIS_PROFILE=<name>`` picks a profile explicitly and wins over both.

Long tests: a test (or a parametrized case) marked ``@pytest.mark.long`` is a long sweep
whose representative subset runs by default (each module states its rule). It is
deselected at collection (pytest counts it as "deselected") unless the environment has
``EMULATE_LONG_TESTS=1``; docs/testing.md gives the command. pytest's header names the
profile that ran.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

# pytester runs pytest inside a test: tests/testing/test_plugin.py checks emulate's plugin.
# emulate's own plugin (its pytest11 entry point has the module's name, so an installed
# emulate registers it once): docs/kernels_test.py uses its emulate_target fixture.
pytest_plugins = ["pytester", "emulate.testing.plugin"]

# The report's test in a real headless Chromium runs only with EMULATE_BROWSER_TESTS=1
# (where it fails, not skips, if `chromium` is missing: apt-get install -y chromium).
collect_ignore = (
    [] if os.environ.get("EMULATE_BROWSER_TESTS") == "1" else ["testing/test_report_browser.py"]
)

settings.register_profile(
    "ci",
    derandomize=True,
    max_examples=20,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=50, deadline=None)


def _profile() -> str:
    explicit = os.environ.get("HYPOTHESIS_PROFILE")
    if explicit:
        return explicit
    return "ci" if os.environ.get("CI", "").lower() == "true" else "dev"


PROFILE = _profile()
settings.load_profile(PROFILE)

#: Whether the long sweeps run: ``EMULATE_LONG_TESTS=1`` in the environment.
LONG_TESTS = os.environ.get("EMULATE_LONG_TESTS", "") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "long: a long sweep, deselected unless EMULATE_LONG_TESTS=1 (docs/testing.md)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the ``long`` items unless the long sweeps were asked for."""
    if LONG_TESTS:
        return
    long_items = [item for item in items if item.get_closest_marker("long")]
    if long_items:
        config.hook.pytest_deselected(items=long_items)
        items[:] = [item for item in items if not item.get_closest_marker("long")]


def pytest_report_header() -> list[str]:
    """Name the hypothesis profile and the test profile in pytest's header, so that a CI
    log says which ones ran."""
    tests = (
        "long (EMULATE_LONG_TESTS=1: every sweep)"
        if LONG_TESTS
        else ("default (long sweeps deselected; EMULATE_LONG_TESTS=1 runs them)")
    )
    return [
        f"hypothesis profile: {PROFILE} (max_examples={settings().max_examples})",
        f"emulate test profile: {tests}",
    ]
