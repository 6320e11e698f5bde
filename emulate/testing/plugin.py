"""emulate's pytest plugin: run your numeric tests over targets and modes, with a report.

Registered as the ``emulate`` entry point of ``pytest11`` (active once emulate is
installed; ``-p emulate.testing.plugin`` loads it explicitly). It adds:

- options ``--emulate-targets tpu_v4,tpu_v5e`` and ``--emulate-modes fast,exact`` (default:
  the current target, mode "fast"), and ``--emulate-report PATH``: write
  ``PATH.json`` and ``PATH.html`` at the end of the session;
- the fixtures ``emulate_target`` and ``emulate_mode``: a test that asks for either is
  parametrized over the targets (modes) and runs inside ``emulate.use_target(...)`` and
  ``emulate.use_mode(...)``; the fixture's value is the target name (the mode);
- the marker ``@pytest.mark.emulate(targets=[...], modes=[...])``: the same for one test,
  overriding the command line;
- the seed: pytest's ``--hypothesis-seed=N`` (hypothesis' own option) becomes the
  seed of every :func:`emulate.testing.check_function` call that passes none
  (:func:`emulate.testing.harness.use_default_seed`); without it the seed is 0;
- the report: every :func:`emulate.testing.check_function` call made inside a test is
  recorded under the test's id: examples, max ulps, err/bound and its histogram, and the
  reproducer of a failure (:mod:`emulate.testing.report`). Every test that made such a
  call, carries the marker (``pytestmark = pytest.mark.emulate(...)`` marks a module's
  tests) or asks for ``emulate_target`` / ``emulate_mode`` is listed with its status:
  passed, failed (an error in setup or teardown too), xfailed, xpassed or skipped, so
  that tests that check otherwise (``emulate.pallas.check``, your own asserts) are
  listed too.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from emulate import targets as _targets
from emulate.testing.harness import CheckResult, collect_results, use_default_seed
from emulate.testing.report import render_html, render_json

__all__ = [
    "emulate_mode",
    "emulate_target",
    "pytest_addoption",
    "pytest_configure",
    "pytest_generate_tests",
    "pytest_runtest_call",
    "pytest_runtest_makereport",
    "pytest_sessionfinish",
]

_ENTRIES = pytest.StashKey[list[tuple[str, CheckResult]]]()
_SEED = pytest.StashKey[int]()
_STATUS = pytest.StashKey[dict[str, str]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("emulate", "emulate numeric validation")
    group.addoption(
        "--emulate-targets",
        metavar="T1,T2",
        help="targets (names or aliases) that tests using the emulate_target fixture run "
        "under, comma-separated; default: the current target",
    )
    group.addoption(
        "--emulate-modes",
        metavar="M1,M2",
        help="numerics modes (fast, exact) that tests using the emulate_mode fixture run "
        "under; default: fast",
    )
    group.addoption(
        "--emulate-report",
        metavar="PATH",
        help="write the session's checks to PATH.json and PATH.html",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "emulate(targets=None, modes=None): run the test over these emulate targets and modes",
    )
    config.stash[_ENTRIES] = []
    config.stash[_STATUS] = {}
    config.stash[_SEED] = _hypothesis_seed(config)
    # Bad option values stop the session before collection (no target detection unless
    # the option is given).
    if config.getoption("--emulate-targets"):
        _targets_of(config, None)
    if config.getoption("--emulate-modes"):
        _modes_of(config, None)


def _hypothesis_seed(config: pytest.Config) -> int:
    """pytest's ``--hypothesis-seed`` as an int (0 when not given or when hypothesis'
    plugin is not loaded)."""
    try:
        value = config.getoption("--hypothesis-seed")
    except ValueError:  # hypothesis' pytest plugin is not loaded
        return 0
    if value is None:
        return 0
    try:
        return int(value)
    except ValueError:
        raise pytest.UsageError(
            f"--hypothesis-seed: emulate's checks take an integer seed, got {value!r}"
        ) from None


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _targets_of(config: pytest.Config, marker: Any) -> list[str]:
    names = list(marker.kwargs.get("targets") or []) if marker else []
    names = names or _split(config.getoption("--emulate-targets"))
    if not names:
        return [_targets.current_target().name]
    try:
        return [_targets.get(n).name for n in names]
    except (TypeError, ValueError) as e:
        raise pytest.UsageError(f"--emulate-targets: {e}") from None


def _modes_of(config: pytest.Config, marker: Any) -> list[str]:
    modes = list(marker.kwargs.get("modes") or []) if marker else []
    modes = modes or _split(config.getoption("--emulate-modes")) or ["fast"]
    bad = [m for m in modes if m not in ("fast", "exact")]
    if bad:
        raise pytest.UsageError(f"--emulate-modes: expected fast or exact, got {bad[0]!r}")
    return modes


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker("emulate")
    if "emulate_target" in metafunc.fixturenames:
        metafunc.parametrize("emulate_target", _targets_of(metafunc.config, marker), indirect=True)
    if "emulate_mode" in metafunc.fixturenames:
        metafunc.parametrize("emulate_mode", _modes_of(metafunc.config, marker), indirect=True)


@pytest.fixture
def emulate_target(request: pytest.FixtureRequest) -> Iterator[str]:
    """The target this run of the test is for; the test body runs under it."""
    name = getattr(request, "param", None) or _targets.current_target().name
    with _targets.use_target(name):
        yield name


@pytest.fixture
def emulate_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """The numerics mode this run of the test is for; the test body runs under it."""
    mode = getattr(request, "param", None) or "fast"
    with _targets.use_mode(mode):
        yield mode


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with collect_results() as results, use_default_seed(item.config.stash[_SEED]):
        yield
    item.config.stash[_ENTRIES].extend((item.nodeid, r) for r in results)


def _phase_status(report: pytest.TestReport) -> str | None:
    """The test's status as one phase's report gives it; None where the phase says
    nothing (a passing setup or teardown)."""
    xfail = hasattr(report, "wasxfail")
    if report.failed:
        return "failed"  # a strict xpass fails too
    if report.skipped:
        return "xfailed" if xfail else "skipped"
    if report.when == "call":
        return "xpassed" if xfail else "passed"
    return None


def _reported(item: pytest.Item) -> bool:
    """Whether the report lists ``item``: it carries the marker or uses a fixture."""
    names = getattr(item, "fixturenames", ())
    marked = item.get_closest_marker("emulate") is not None
    return marked or "emulate_target" in names or "emulate_mode" in names


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    status = _phase_status(report)
    statuses = item.config.stash[_STATUS]
    checked = any(t == item.nodeid for t, _ in item.config.stash[_ENTRIES])
    if status is None or not (checked or _reported(item)):
        return
    if statuses.get(item.nodeid) != "failed":  # a failed phase decides
        statuses[item.nodeid] = status


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("--emulate-report")
    if not path:
        return
    entries = session.config.stash.get(_ENTRIES, [])
    tests = list(session.config.stash.get(_STATUS, {}).items())
    base = pathlib.Path(path)
    base.with_suffix(".json").write_text(render_json(entries, tests))
    base.with_suffix(".html").write_text(render_html(entries, tests=tests))
