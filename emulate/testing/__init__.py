"""Building blocks for numeric-validation suites: hypothesis strategies and assertions.

Strategies (``emulate.testing.strategies``)
  :func:`formats`, :func:`codes`, :func:`arrays` and :func:`dot_general_problems` draw
  low-precision formats, raw codes, arrays and whole ``dot_general`` problems (operands,
  dimension numbers, result type). Every strategy draws raw codes, so each format's special
  values (NaN, +-Inf, +-0, +-max, the smallest normal and subnormal values, +-1) are
  boosted: they are drawn far more often than a uniform draw over codes would give them.

Assertions (``emulate.testing.comparison``)
  :func:`assert_matches_reference` checks a result against :mod:`emulate.reference` under
  the numerics contract (bit for bit for the exact classes and mode "exact", within
  :func:`emulate.bounds.dot_general_bound` for the other pairs in mode "fast"), and names
  the first mismatching element, its value, the reference's and the exact sum.
  :func:`compare` returns the same verdict as a :class:`Comparison`, with the largest
  error in ulps of the result type.

Helpers (``emulate.testing.reproducers``)
  :func:`reproducer` writes a problem as a ready-to-run Python script;
  :func:`representative_targets` picks one target per distinct plan, so that a suite
  checks each program once.

Every public name is re-exported here: ``emulate.testing.X`` is the name to use. This
package needs ``hypothesis`` (a dependency of ``emulate``); ``import emulate`` alone does
not import it.
"""

from __future__ import annotations

from emulate.testing.comparison import Comparison, Mismatch, assert_matches_reference, compare
from emulate.testing.reproducers import plan_key, representative_targets, reproducer
from emulate.testing.strategies import (
    DEFAULT_LAYOUTS,
    LONG_K_LAYOUT,
    WIDE_RANGE,
    DotProblem,
    arrays,
    codes,
    dot_general_problems,
    finite_codes,
    formats,
    result_types,
    special_codes,
)

# Type aliases of the annotations above (not in __all__: the docs show them expanded).
from emulate.testing.strategies import DimensionNumbers as DimensionNumbers
from emulate.testing.strategies import Layout as Layout

__all__ = [
    "DEFAULT_LAYOUTS",
    "LONG_K_LAYOUT",
    "WIDE_RANGE",
    "Comparison",
    "DotProblem",
    "Mismatch",
    "arrays",
    "assert_matches_reference",
    "codes",
    "compare",
    "dot_general_problems",
    "finite_codes",
    "formats",
    "plan_key",
    "representative_targets",
    "reproducer",
    "result_types",
    "special_codes",
]
