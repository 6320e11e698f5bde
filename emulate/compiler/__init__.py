"""The real TPU compiler, on a machine without a TPU: compile-only devices per target.

With libtpu installed (``pip install "jax[tpu]"``), ``jax.experimental.topologies`` hands
out compile-only TPU devices: ``jax.jit(f).lower(specs on that device).compile()`` runs the
real XLA:TPU and Mosaic compilers, and nothing executes. This package owns those devices, so
nothing else in emulate repeats the name mapping or the subprocess plumbing:

- :mod:`emulate.compiler.devices`: :data:`TOPOLOGIES` (each TPU target's libtpu topology,
  or None where libtpu offers none), :func:`libtpu_version`, :func:`available`,
  :func:`generations`, :func:`device`, :func:`compat_mode`, :func:`topology_devices`
  (the devices of a multi-chip topology, for a Mesh).
- :mod:`emulate.compiler.compiling`: :func:`compile` compiles in this process;
  :func:`check`, :func:`check_many` and :func:`check_both` return a
  :class:`emulate.mosaic.Verdict` and run in a subprocess
  (:mod:`emulate.compiler.isolate`) when asked for a Mosaic compatibility mode other than
  this process's (``LIBTPU_INIT_ARGS=--xla_mosaic_compat_mode=false`` is read once, when
  libtpu loads, so the other setting needs a fresh process).
- :mod:`emulate.compiler.probing`: :func:`probe` compiles a one-line Pallas matmul for every
  case of :func:`probe_cases`, :func:`compiles` one case; :func:`disagreements`,
  :func:`differences` and :func:`report` compare probes with JAX's table and each other.

The recorded probe and its verdicts (``emulate/data/mosaic_probe.json``) live in
:mod:`emulate.mosaic` and need no compiler; :meth:`emulate.targets.Target.compiles` reads
them. Reprobe with ``python -m emulate targets --probe [--out PATH]``.
"""

from emulate import moved
from emulate.compiler.compiling import check, check_both, check_many, compile
from emulate.compiler.devices import (
    TOPOLOGIES,
    CompilerUnavailable,
    available,
    compat_mode,
    device,
    first_line,
    generations,
    libtpu_version,
    topology_devices,
)
from emulate.compiler.isolate import Job
from emulate.compiler.probing import (
    Disagreement,
    compiles,
    differences,
    disagreements,
    probe,
    probe_cases,
    report,
)

__all__ = [
    "TOPOLOGIES",
    "CompilerUnavailable",
    "Disagreement",
    "Job",
    "available",
    "check",
    "check_both",
    "check_many",
    "compat_mode",
    "compile",
    "compiles",
    "device",
    "differences",
    "disagreements",
    "first_line",
    "generations",
    "libtpu_version",
    "probe",
    "probe_cases",
    "report",
    "topology_devices",
]


#: Names the docs gave this module before they moved (emulate.moved).
__getattr__ = moved.module_getattr(__name__)
