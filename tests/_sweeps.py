"""Example counts of the compile-heavy property tests, where each example compiles XLA
programs of its own: a few by default, more in the long sweep (``EMULATE_LONG_TESTS=1``,
docs/testing.md). Under ``derandomize`` (the ``ci`` profile) the default examples are
the same on every run."""

from __future__ import annotations

import os

LONG = os.environ.get("EMULATE_LONG_TESTS", "") == "1"


def examples(default: int, long: int) -> int:
    """``long`` in the long sweep, else ``default``."""
    return long if LONG else default
