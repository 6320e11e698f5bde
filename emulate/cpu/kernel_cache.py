"""Compiled CPU kernels kept in a folder between processes: built, and switched off.

:func:`cfunc_in` compiles a numba cfunc into a folder, or loads it from there when a
process wrote it under the same key. It is not used for the kernels: a Q4_K handler
(:func:`emulate.cpu.handler.handler`) loaded by a second process crashed it (SIGSEGV,
2026-12-07, ``benchmarks.qcpu --shapes 1x256x256 --schemes q4_k`` run twice; a Q8_0
handler and small cfuncs load and run; cause not found). Until that is understood,
:func:`cfunc`, the handlers' entry, compiles every kernel in every process (numba's
behaviour without ``cache=True``; some 10-20 s a weight form), and where the environment
variable ``EMULATE_CPU_KERNEL_CACHE`` is set it warns that the variable is ignored.

numba's own ``cache=True`` does not serve here: it keys a closure by the pickled cells it
closes over, and the kernels close over numba dispatchers, which pickle with a new id in
every process. A kernel's file is named instead by a hash of what its machine code
depends on: the :class:`~emulate.cpu.form.Form`, the thread setting, the few- or
many-rows kernel, the source files of :mod:`emulate.cpu`, numba's and Python's versions,
and numba's code generator for this host (target triple, CPU name and features, which
:func:`emulate.cpu.vector_isa` follows). The folder is for one installation: it is not
checked against another's files beyond that key, and nothing in it is ever removed
(delete the folder to drop it).

Files are written whole under a temporary name and renamed into place, so processes that
compile the same kernel at once each write it and a reader sees one whole file.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import pickle
import sys
import uuid
import warnings
from collections.abc import Callable
from typing import Any

import numba
from numba.core import compiler, registry, serialize, sigutils
from numba.core.ccallback import CFunc

from emulate import cpu

__all__ = ["ENV", "cfunc", "cfunc_in", "folder"]

#: The environment variable that named the folder of compiled kernels: ignored, with a
#: warning (module docstring).
ENV = "EMULATE_CPU_KERNEL_CACHE"


def folder() -> pathlib.Path | None:
    """The folder :data:`ENV` names, or None where it is unset or empty."""
    value = os.environ.get(ENV, "")
    return pathlib.Path(value) if value else None


@functools.cache
def _sources() -> str:
    """A hash of the source files of emulate.cpu, which the kernels are generated from."""
    h = hashlib.sha256()
    for path in sorted(pathlib.Path(__file__).resolve().parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


class _FileCache:
    """numba's cache protocol for one :class:`numba.core.ccallback.CFunc` (what its
    ``compile`` calls): the compile result pickled as numba's own cache pickles it."""

    def __init__(self, path: pathlib.Path):
        self._path = path

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        try:
            payload = pickle.loads(self._path.read_bytes())
        except FileNotFoundError:
            return None
        target_context.refresh()
        return compiler.CompileResult._rebuild(target_context, *payload)

    def save_overload(self, sig: Any, cres: Any) -> None:
        if cres.lifted or cres.library.has_dynamic_globals:
            return  # machine code that points into this process
        data = serialize.dumps(cres._reduce())
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_name(f"{self._path.name}.{uuid.uuid4().hex}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self._path)


class _CachedCFunc(CFunc):
    """A cfunc whose ``compile`` loads from, or saves to, one file of the folder."""

    def __init__(self, fn: Callable[..., Any], sig: Any, path: pathlib.Path):
        super().__init__(fn, sigutils.normalize_signature(sig), locals={}, options={})
        self._cache = _FileCache(path)


def cfunc(fn: Callable[..., Any], sig: Any, key: tuple[Any, ...]) -> CFunc:
    """``numba.cfunc(sig)(fn)``, compiled in this process: a kernel's handler. Where
    :data:`ENV` is set, warns (RuntimeWarning; Python's default filter shows it once) that
    it is ignored (module docstring); ``key`` is what :func:`cfunc_in` would file it under."""
    if folder() is not None:
        warnings.warn(
            f"{ENV} is ignored: CPU kernels loaded from the folder crashed a process (a Q4_K "
            "form, SIGSEGV; cause not found), so every process compiles its own "
            "(docs/cpu_kernel.md)",
            RuntimeWarning,
            stacklevel=2,
        )
    return numba.cfunc(sig)(fn)


def cfunc_in(where: pathlib.Path, fn: Callable[..., Any], sig: Any, key: tuple[Any, ...]) -> CFunc:
    """``numba.cfunc(sig)(fn)``, compiled and written to the folder ``where``, or loaded
    from it where a process wrote it under ``key`` (what ``fn``'s code depends on beyond
    emulate.cpu's sources and the host). Not used for the kernels (module docstring: a
    loaded Q4_K handler crashed its process); small cfuncs load and run."""
    parts = (
        key,
        cpu.vector_isa(),
        _sources(),
        numba.__version__,
        sys.version,
        registry.cpu_target.target_context.codegen().magic_tuple(),
        str(sig),
    )
    name = hashlib.sha256(repr(parts).encode()).hexdigest()
    c = _CachedCFunc(fn, sig, where / f"{name}.nbk")
    c.compile()
    return c
