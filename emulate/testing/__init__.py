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

Your own kernel (``emulate.testing.harness``)
  :func:`check_function` draws problems, calls your function, checks every result under a
  contract ("exact", "fast" or a bound) and raises with a reproducer that calls your
  function on literal values (:func:`function_reproducer`, :func:`literal_source`);
  :func:`collect_results` gathers the :class:`CheckResult` values (the pytest plugin,
  ``emulate.testing.plugin``, writes them as JSON and HTML, ``emulate.testing.report``).
  Without ``seed=`` it draws with :func:`default_seed`: 0, or the seed of a
  :func:`use_default_seed` block (the plugin sets pytest's ``--hypothesis-seed`` there).

Hazards (``emulate.testing.hazards``) and quantized operands (``emulate.testing.operands``)
  :func:`exactness_thresholds` and :func:`threshold_layouts` put K where sums stop being
  exact; ``fill="odd_extreme"`` (:func:`odd_extreme_codes`) makes the sums drop units
  there. :func:`qarrays` draws :class:`emulate.QArray` values of any scheme with special
  scales; :func:`plain`, :func:`packed` and :func:`quantized` describe an operand.
  :func:`assert_matches_reference` accepts QArray and Packed operands.

TPU numerics on any backend (``emulate.testing.tpu_rounding``)
  :func:`tpu_numerics` rewrites a function so that each matmul, in XLA programs and in
  Pallas kernels run in interpret mode, rounds as the chosen TPU target's does;
  ``check_function(..., tpu_numerics=True)`` runs the harness that way.

Helpers (``emulate.testing.reproducers``)
  :func:`reproducer` writes a problem as a ready-to-run Python script;
  :func:`representative_targets` picks one target per distinct plan, so that a suite
  checks each program once.

Every public name is re-exported here: ``emulate.testing.X`` is the name to use. This
package needs ``hypothesis`` (a dependency of ``emulate``); ``import emulate`` alone does
not import it.
"""

from __future__ import annotations

from emulate.testing import harness, operands, strategies
from emulate.testing.comparison import (
    Comparison,
    Mismatch,
    assert_matches_reference,
    compare,
    segment_count,
)
from emulate.testing.harness import (
    CheckResult,
    check_function,
    collect_results,
    default_seed,
    use_default_seed,
)
from emulate.testing.hazards import exactness_thresholds, threshold_layouts
from emulate.testing.operands import (
    OperandSpec,
    QuantSpec,
    packed,
    plain,
    qarrays,
    quant_spec,
    quantized,
    scale_values,
)
from emulate.testing.reproducers import (
    function_reproducer,
    literal_source,
    plan_key,
    representative_targets,
    reproducer,
)
from emulate.testing.strategies import DimensionNumbers as DimensionNumbers
from emulate.testing.strategies import (
    DotProblem,
    arrays,
    codes,
    dot_general_problems,
    finite_codes,
    formats,
    odd_extreme_codes,
    result_types,
    special_codes,
)
from emulate.testing.strategies import Layout as Layout
from emulate.testing.tpu_rounding import tpu_numerics

# DimensionNumbers and Layout, the type aliases of the signatures, are re-exported (``X as
# X``) for annotations, and left out of __all__.

# The constants are bound here, not imported, so that their doc comments are this
# module's: autodoc reads a constant's ``#:`` comment from the module it documents.

#: The shapes and dimension numbers :func:`dot_general_problems` draws from by default: a
#: fixed pool, so that compiled programs are reused across examples. K = 1, odd sizes,
#: contracting dims first, two contracting dims in permuted order with a batch dim, a
#: batch dim that is not first, no free dims, and K = 33.
DEFAULT_LAYOUTS = strategies.DEFAULT_LAYOUTS

#: One layout (not a pool: pass ``layouts=[LONG_K_LAYOUT]``), K = 1100: with
#: ``fill="odd_extreme"`` operands int8 x int8 sums pass 2**24 in odd units, which a naive
#: float32 running sum drops (with ``fill="extreme"``, -128 gives products of 2**14, which
#: float32 adds exactly). :func:`threshold_layouts` draws K at every threshold of a pair.
LONG_K_LAYOUT = strategies.LONG_K_LAYOUT

#: ``(M, K, N)`` of the matmuls :func:`check_function` draws when given neither ``shapes``
#: nor ``layouts``: K = 1, odd sizes, K = 33 (a ragged block of 32) and K = 160 (a full and
#: a ragged group of 128).
DEFAULT_SHAPES = harness.DEFAULT_SHAPES

#: ``(lo, hi)``: the scales ``scales="normal"`` draws (:func:`qarrays`,
#: :func:`scale_values`) lie in ``[2**-30, 2**14]``: what a quantizer writes, ``absmax /
#: qmax``, for data whose absmax lies in ``[2**-14, 2**14]`` and a largest code from 1 to
#: 57344 (float8_e5m2's). ``scales="extreme"`` draws up to the scale format's largest.
QUANTIZER_SCALES = operands.QUANTIZER_SCALES

#: Values drawn for the wide float types (bfloat16, float16, float32) lie in
#: ``[-WIDE_RANGE, WIDE_RANGE]``, plus the boosted special values.
WIDE_RANGE = strategies.WIDE_RANGE

__all__ = [
    "DEFAULT_LAYOUTS",
    "DEFAULT_SHAPES",
    "LONG_K_LAYOUT",
    "QUANTIZER_SCALES",
    "WIDE_RANGE",
    "CheckResult",
    "Comparison",
    "DotProblem",
    "Mismatch",
    "OperandSpec",
    "QuantSpec",
    "arrays",
    "assert_matches_reference",
    "check_function",
    "codes",
    "collect_results",
    "compare",
    "default_seed",
    "dot_general_problems",
    "exactness_thresholds",
    "finite_codes",
    "formats",
    "function_reproducer",
    "literal_source",
    "odd_extreme_codes",
    "packed",
    "plain",
    "plan_key",
    "qarrays",
    "quant_spec",
    "quantized",
    "representative_targets",
    "reproducer",
    "result_types",
    "scale_values",
    "segment_count",
    "special_codes",
    "threshold_layouts",
    "tpu_numerics",
    "use_default_seed",
]
