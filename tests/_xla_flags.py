"""The suite's XLA:CPU code generation settings.

The suite's processes compile with :data:`TEST_XLA_FLAGS` added to ``XLA_FLAGS``
(tests/conftest.py sets it before JAX starts a backend; the subprocesses tests start
inherit it; ``EMULATE_TEST_XLA_DEFAULT=1`` keeps XLA's defaults): the legacy elemental
fusion emitters and LLVM at -O0, which compile emulate's programs about 3x quicker;
compiling is most of the suite's time. tests/test_suite_codegen.py asserts that
tests/_codegen_programs.py's programs give the same bits under both settings.

No JAX import here: conftest reads this module before JAX is imported.
"""

from __future__ import annotations

#: Added to ``XLA_FLAGS`` for the suite (module docstring).
TEST_XLA_FLAGS = ("--xla_cpu_use_fusion_emitters=false", "--xla_backend_optimization_level=0")


def with_flags(xla_flags: str, add: bool) -> str:
    """``xla_flags`` (an ``XLA_FLAGS`` value) with :data:`TEST_XLA_FLAGS` added where it
    does not set them already (``add``), or with them removed (not ``add``)."""
    ours = {f.split("=")[0] for f in TEST_XLA_FLAGS}
    flags = xla_flags.split()
    if not add:
        return " ".join(f for f in flags if f.split("=")[0] not in ours)
    named = {f.split("=")[0] for f in flags}
    return " ".join(flags + [f for f in TEST_XLA_FLAGS if f.split("=")[0] not in named])
