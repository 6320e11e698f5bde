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
- :mod:`emulate.compiler.timing`: :func:`estimate` (and :func:`estimate_many`,
  :func:`estimate_dump`, :func:`estimate_compiled` in a process started with
  :func:`dumping_env`) times a compiled program from libtpu's final bundle schedule:
  a :class:`ProgramTime` with each Mosaic kernel's and XLA fusion's :class:`KernelTime`.
  It reads the schedule with :mod:`emulate.compiler.bundles`, replays it with
  :mod:`emulate.compiler.replay`, and takes each generation's clock, bandwidth and
  calibration from :mod:`emulate.compiler.cores` (:func:`generation`).

The recorded probe and its verdicts (``emulate/data/mosaic_probe.json``) live in
:mod:`emulate.mosaic` and need no compiler; :meth:`emulate.targets.Target.compiles` reads
them. Reprobe with ``python -m emulate targets --probe [--out PATH]``.
"""

from emulate import moved
from emulate.compiler.compiling import check, check_both, check_many, compile
from emulate.compiler.cores import Generation, generation
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
from emulate.compiler.jobs import Job
from emulate.compiler.probing import (
    Disagreement,
    compiles,
    differences,
    disagreements,
    probe,
    probe_cases,
    report,
)
from emulate.compiler.timing import (
    KernelTime,
    ProgramRefused,
    ProgramTime,
    dump_directory,
    dumping_env,
    estimate,
    estimate_compiled,
    estimate_dump,
    estimate_many,
)

__all__ = [
    "TOPOLOGIES",
    "CompilerUnavailable",
    "Disagreement",
    "Generation",
    "Job",
    "KernelTime",
    "ProgramRefused",
    "ProgramTime",
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
    "dump_directory",
    "dumping_env",
    "estimate",
    "estimate_compiled",
    "estimate_dump",
    "estimate_many",
    "first_line",
    "generation",
    "generations",
    "libtpu_version",
    "probe",
    "probe_cases",
    "report",
    "topology_devices",
]


#: Names the docs gave this module before they moved (emulate.moved).
__getattr__ = moved.module_getattr(__name__)
