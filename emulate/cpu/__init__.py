"""The CPU kernels: a QArray weight times few rows of activations, decoded next to the dot
by a numba-compiled kernel that XLA:CPU calls through JAX's FFI (:mod:`emulate.cpu.call`).

numba (a wheel; it brings its own LLVM, no compiler needed) is a dependency of emulate;
where it does not import or compiles nothing (``NUMBA_DISABLE_JIT=1``), :func:`available`
is False (:func:`unavailable` says why) and the XLA route
(:mod:`emulate.engine.qtiled`) runs instead, with the same contract. numba's threads run
the kernel where its threading layer is thread-safe (OpenMP or TBB: XLA may call a kernel
from several threads at once); with its fallback layer the kernel runs on one thread.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util

__all__ = ["available", "parallel", "table_lookups", "unavailable", "vector_isa"]


@functools.cache
def unavailable() -> str | None:
    """Why the kernels cannot be compiled in this process, or None where they can: numba
    is not installed, or its compiler is switched off (``NUMBA_DISABLE_JIT=1``, numba's
    debugging switch: its functions then run as Python, and XLA calls a kernel as machine
    code). Read once a process, as numba reads its settings."""
    if importlib.util.find_spec("numba") is None:
        return "numba is not installed: the CPU kernel is compiled by numba"
    import numba

    if getattr(numba.config, "DISABLE_JIT", False):  # set from the environment at import
        return (
            "NUMBA_DISABLE_JIT is set: numba compiles nothing, and XLA calls the CPU kernel "
            "as compiled code"
        )
    return None


def available() -> bool:
    """Whether the kernels can be compiled here (:func:`unavailable` gives why not)."""
    return unavailable() is None


@functools.cache
def parallel() -> bool:
    """Whether the kernels run on numba's threads: its threading layer is not forced to
    "workqueue" (``NUMBA_THREADING_LAYER``: not thread-safe, and XLA may call kernels
    from several threads) and its OpenMP or TBB layer loads; else one thread."""
    import numba

    if getattr(numba.config, "THREADING_LAYER", "default") == "workqueue":
        return False
    for layer in ("omppool", "tbbpool"):
        try:
            importlib.import_module(f"numba.np.ufunc.{layer}")
        except ImportError:
            continue
        return True
    return False


@functools.cache
def vector_isa() -> str | None:
    """The x86 vector instructions the kernels may call by name: "avx512" where numba
    compiles for this host (``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES`` unset) with
    AVX-512F among the features it compiles with, "avx2" where with AVX2, else None
    (``NUMBA_ENABLE_AVX=0`` turns both off; the kernels' generic LLVM vectors serve every
    host). Read from ``numba.core.codegen.get_host_cpu_features``, which honours
    ``NUMBA_ENABLE_AVX`` (llvmlite's own host features do not: an AVX-512 intrinsic compiled
    without AVX-512 aborts the process)."""
    if not available():
        return None
    import numba
    from numba.core import codegen

    config = numba.config
    if getattr(config, "CPU_NAME", None) or getattr(config, "CPU_FEATURES", None):
        return None
    try:  # numba's view: it honours NUMBA_ENABLE_AVX and returns "" where LLVM cannot tell
        features = codegen.get_host_cpu_features().split(",")
    except RuntimeError:
        return None
    if "+avx512f" in features:
        return "avx512"
    return "avx2" if "+avx2" in features else None


def table_lookups(bits: int = 4) -> bool:
    """Whether the kernels look up the values of ``bits``-bit codes (codebooks, float codes)
    in registers (:func:`vector_isa`): 4-bit codes by one ``vpermps`` a vector of 16
    (AVX-512) or two ``vpermps`` and a blend a vector of 8 (AVX2); 8-bit codes by eight
    ``vpermi2ps`` (AVX-512 only). Elsewhere such weights take the XLA route (a gather an
    element measured slower there)."""
    isa = vector_isa()
    return isa == "avx512" or (isa == "avx2" and bits == 4)
