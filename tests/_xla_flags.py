"""The suite's XLA:CPU code generation settings.

The suite's processes compile with :data:`TEST_XLA_FLAGS` added to ``XLA_FLAGS``
(tests/conftest.py sets it before JAX starts a backend; the subprocesses tests start
inherit it; ``EMULATE_TEST_XLA_DEFAULT=1`` keeps XLA's defaults): the elemental emitters
in place of the fusion emitters, and LLVM at -O0; compiling emulate's programs takes
about a third of the time, and compiling is most of the suite's time.

What changes: at -O0 LLVM contracts no f32 multiply-add into an FMA instruction (at XLA's
default -O2 it does where the host has FMA), so bounded results whose f32 arithmetic has
such pairs (a group sum times its scale plus the accumulator) may differ in their last
bits from the same program under XLA's defaults; both are within the contract's bound.
Exact results cannot differ (their products and sums are exact). tests/test_suite_codegen.py
checks both on tests/_codegen_programs.py's programs. XLA:TPU's programs are unaffected.

No JAX import here: conftest reads this module before JAX is imported.
"""

from __future__ import annotations

import os

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


def host_devices_env(count: int = 8) -> dict[str, str]:
    """This process's environment for a subprocess with ``count`` host CPU devices: its
    ``XLA_FLAGS`` (the suite's settings included) plus the device count."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}"
    return env
