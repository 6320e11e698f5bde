"""emulate.testing is a package of modules; its public names stay where they were, and the
names added since (the harness, hazards, quantized operands) come from their modules."""

from __future__ import annotations

import types

import emulate.testing.comparison
import emulate.testing.harness
import emulate.testing.hazards
import emulate.testing.operands
import emulate.testing.reproducers
import emulate.testing.strategies
import emulate.testing.tpu_rounding
from emulate import testing as et

# The names emulate.testing exported as one module, before the split.
PUBLIC = [
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

ADDED = [
    "DEFAULT_SHAPES",
    "QUANTIZER_SCALES",
    "CheckResult",
    "OperandSpec",
    "QuantSpec",
    "check_function",
    "collect_results",
    "default_seed",
    "exactness_thresholds",
    "function_reproducer",
    "literal_source",
    "odd_extreme_codes",
    "packed",
    "plain",
    "qarrays",
    "quant_spec",
    "quantized",
    "scale_values",
    "segment_count",
    "threshold_layouts",
    "tpu_numerics",
    "use_default_seed",
]


def test_every_public_name_is_reexported_from_its_module():
    assert sorted(et.__all__, key=str.swapcase) == sorted(PUBLIC + ADDED, key=str.swapcase)
    t = emulate.testing
    modules = [
        t.strategies,
        t.comparison,
        t.reproducers,
        t.harness,
        t.hazards,
        t.operands,
        t.tpu_rounding,
    ]
    homes = {name: m for m in modules for name in m.__all__}
    for name in PUBLIC + ADDED:
        assert getattr(et, name) is getattr(homes[name], name), name
    # Names the package's modules export besides: helpers, not part of emulate.testing.
    assert sorted(set(homes) - set(PUBLIC + ADDED)) == [
        "BoundLike",
        "CONTRACTS",
        "DEFAULT_MAX_K",
        "DimensionNumbers",
        "Layout",
        "MEASURED_WITH",
        "PASSES",
        "SCALE_ELEMENTS",
        "array_source",
        "check_mode",
        "operand_source",
        "oracle_values",
    ]
    assert et.Layout is emulate.testing.strategies.Layout


def test_submodules_are_not_shadowed_by_functions():
    # `import a.b as m` takes the attribute b of a first: a module named after one of its
    # functions (compare, reproducer) would bind the function.
    import emulate.testing.comparison as comparison
    import emulate.testing.reproducers as reproducers

    assert isinstance(comparison, types.ModuleType)
    assert isinstance(reproducers, types.ModuleType)
    assert callable(et.compare) and callable(et.reproducer)
