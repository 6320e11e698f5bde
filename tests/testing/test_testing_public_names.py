"""emulate.testing is a package of three modules; its public names stay where they were."""

from __future__ import annotations

import types

import emulate.testing.comparison
import emulate.testing.reproducers
import emulate.testing.strategies
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


def test_every_public_name_is_reexported_from_its_module():
    assert et.__all__ == PUBLIC
    modules = [emulate.testing.strategies, emulate.testing.comparison]
    modules.append(emulate.testing.reproducers)
    homes = {name: m for m in modules for name in m.__all__}
    for name in PUBLIC:
        assert getattr(et, name) is getattr(homes[name], name), name
    # Names the package's modules export besides: helpers, not part of emulate.testing.
    assert sorted(set(homes) - set(PUBLIC)) == [
        "DimensionNumbers",
        "Layout",
        "array_source",
        "check_mode",
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
