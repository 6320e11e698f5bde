"""Shared pytest setup: hypothesis profiles and the long-test switch.

Hypothesis profiles:
  ci: derandomized, a fixed 20 examples per test, no deadline, failing examples printed
      as reproduction blobs. Loaded when the environment has ``CI=true``.
  dev: 50 random examples per test, no deadline. Loaded otherwise.
``HYPOTHESIS_PROFILE=<name>`` picks a profile explicitly and wins over both.

Opt-in tests (:data:`OPT_IN`): a test (or a parametrized case) marked
``@pytest.mark.long`` is a long sweep whose representative subset runs by default (each
module states its rule); one marked ``@pytest.mark.browser`` needs a headless Chromium
(the HTML report's test). Each is deselected at collection (pytest counts it as
"deselected") unless the environment has its variable set to 1 (``EMULATE_LONG_TESTS``,
``EMULATE_BROWSER_TESTS``); docs/testing.md gives the commands. pytest's header names
what ran.

Compilation cache: one session shares one JAX persistent compilation cache, in a fresh
temporary folder, between its processes: the pytest-xdist workers and the subprocesses
that tests start inherit it (``EMULATE_TEST_XLA_CACHE``, ``JAX_COMPILATION_CACHE_DIR``),
with no minimum compile time or size. Tests build the same programs from fresh closures
and in several processes; XLA compiles each once per session, and a cache hit returns the
executable the compiler built for the same program and options. Most of the suite's time
is JAX tracing and lowering programs in Python (the cache saves only XLA's part).
``EMULATE_TEST_COMPILE_CACHE=0`` turns it off; a session never reads
another session's cache.

The CPU kernel is off unless a test turns it on (``EMULATE_CPU_KERNEL=0``: its numba
compiles cost 8-17 s a weight form on 2 cores; tests/cpu/ and the importers' oracle tests
run it), and compiled for one thread (``NUMBA_THREADING_LAYER=workqueue``: a kernel over
numba's threads compiles in about 1.5x the time); tests/cpu/test_gemv.py checks, under
EMULATE_LONG_TESTS=1, that the threaded kernel gives the same bits. Each worker compiles
the forms its tests need (the folder of compiled kernels, :mod:`emulate.cpu.kernel_cache`,
is switched off).

Order: the modules of :data:`RUN_FIRST` (the session's longest single steps) run first,
so that under pytest-xdist they start at once and the session ends on short tests.

XLA:CPU code generation: the session's processes compile with quicker XLA:CPU settings
than XLA's defaults (tests/_xla_flags.py says what they change; tests/test_suite_codegen.py
checks it); ``EMULATE_TEST_XLA_DEFAULT=1`` keeps XLA's defaults.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from _xla_flags import with_flags

# XLA:CPU code generation: quicker settings for the suite's processes, set before JAX
# starts its backend (tests/_xla_flags.py says which and why).
if os.environ.get("EMULATE_TEST_XLA_DEFAULT", "") != "1":
    os.environ["XLA_FLAGS"] = with_flags(os.environ.get("XLA_FLAGS", ""), add=True)

# The CPU kernel (emulate.cpu): numba compiles one kernel per weight form, 8-17 s each, so
# the suite keeps it off (EMULATE_CPU_KERNEL, read at the first contraction: emulate's
# pytest plugin may have imported emulate before this file) and the tests
# of the kernel turn it on (emulate.use_cpu_kernel): tests/cpu/, and the importers' oracle
# tests of each convention through it.
os.environ.setdefault("EMULATE_CPU_KERNEL", "0")
# ... and compiles the kernels for one thread (emulate.cpu.parallel is False under numba's
# workqueue layer): a threaded kernel compiles in 20 s against 14 s (Q4_K); one long test
# compiles threaded kernels and compares their bits (tests/cpu/test_gemv.py)
os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")

import jax  # noqa: E402 - after XLA_FLAGS
import pytest
from hypothesis import HealthCheck, settings

# pytester runs pytest inside a test: tests/testing/test_plugin.py checks emulate's plugin.
# emulate's own plugin (its pytest11 entry point has the module's name, so an installed
# emulate registers it once): docs/kernels_test.py uses its emulate_target fixture.
pytest_plugins = ["pytester", "emulate.testing.plugin"]


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


def _share_compilations() -> None:
    """Point JAX's persistent compilation cache at this session's folder (module docstring).
    The first process of the session makes the folder and removes it at exit; the
    processes it starts find it in the environment."""
    if os.environ.get("EMULATE_TEST_COMPILE_CACHE", "1") == "0":
        return
    folder = os.environ.get("EMULATE_TEST_XLA_CACHE")
    if not folder:
        folder = tempfile.mkdtemp(prefix="emulate-test-xla-cache-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        os.environ["EMULATE_TEST_XLA_CACHE"] = folder
    os.environ["JAX_COMPILATION_CACHE_DIR"] = folder
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


_share_compilations()


#: The opt-in markers: marker -> (the variable that selects its tests, what they are).
#: The browser test fails, not skips, where ``chromium`` is missing (apt-get install -y
#: chromium); CI does not install it.
OPT_IN = {
    "long": ("EMULATE_LONG_TESTS", "a long sweep"),
    "browser": ("EMULATE_BROWSER_TESTS", "runs a headless Chromium"),
}

#: The opt-in markers whose tests run in this session.
SELECTED = frozenset(m for m, (var, _) in OPT_IN.items() if os.environ.get(var, "") == "1")
LONG_TESTS = "long" in SELECTED


def pytest_configure(config: pytest.Config) -> None:
    for marker, (var, what) in OPT_IN.items():
        config.addinivalue_line(
            "markers", f"{marker}: {what}, deselected unless {var}=1 (docs/testing.md)"
        )


#: Modules whose tests hold the session's longest single steps (a shared compile of every
#: TPU case behind a file lock, the docs build, mypy, the eight-device subprocesses): they
#: run first, in this order, each module's tests in their own order. pytest-xdist's
#: worksteal gives each worker a contiguous half of the items, so these start at once on
#: one worker while the other runs short tests, and the session ends on short tests that
#: either worker can take; a worker stealing a test_tpu_compile case while the other
#: compiles them would wait on the lock.
RUN_FIRST = (
    "tests/test_tpu_compile.py",
    "tests/test_docs.py",
    "tests/test_typing.py",
    "tests/quantized/test_array_sharding.py",
    "tests/test_sharding.py",
    "tests/test_rewrite_sharding.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the items of each opt-in marker whose variable is not set; put the
    :data:`RUN_FIRST` modules' items first."""
    off = [m for m in OPT_IN if m not in SELECTED]
    dropped = [item for item in items if any(item.get_closest_marker(m) for m in off)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not any(item.get_closest_marker(m) for m in off)]
    rank = {path: i for i, path in enumerate(RUN_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(RUN_FIRST)))


def pytest_report_header() -> list[str]:
    """Name the hypothesis profile and the test profile in pytest's header, so that a CI
    log says which ones ran."""
    tests = (
        "long (EMULATE_LONG_TESTS=1: every sweep)"
        if LONG_TESTS
        else ("default (long sweeps deselected; EMULATE_LONG_TESTS=1 runs them)")
    )
    browser = "browser test run" if "browser" in SELECTED else "browser test deselected"
    return [
        f"hypothesis profile: {PROFILE} (max_examples={settings().max_examples})",
        f"emulate test profile: {tests}; {browser} (EMULATE_BROWSER_TESTS=1 runs it)",
    ]
