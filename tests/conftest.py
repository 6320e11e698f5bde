"""Shared pytest setup: hypothesis profiles.

Profiles:
  ci: derandomized, a fixed 20 examples per test, no deadline, failing examples printed
      as reproduction blobs. Loaded when the environment has ``CI=true``.
  dev: 50 random examples per test, no deadline. Loaded otherwise.
``HYPOTHESIS_PROFILE=<name>`` picks a profile explicitly and wins over both.
"""

from __future__ import annotations

import os

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


def pytest_report_header() -> str:
    """Name the hypothesis profile in pytest's header, so a CI log says which one ran."""
    return f"hypothesis profile: {PROFILE} (max_examples={settings().max_examples})"
