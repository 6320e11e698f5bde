"""Compiling programs for a TPU target with the real compiler: in this process, or in a
subprocess for the other Mosaic compatibility setting (:mod:`emulate.compiler.isolate`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from emulate import targets as _targets
from emulate.compiler.devices import compat_mode, device, on_device
from emulate.compiler.isolate import compile_isolated
from emulate.compiler.jobs import Job, compile_in_process, place_specs
from emulate.mosaic import Verdict

__all__ = ["check", "check_both", "check_many", "compile"]


def compile(  # noqa: A001 - the module's verb; call it as emulate.compiler.compile
    fn: Callable[..., Any],
    *arg_specs: Any,
    target: str | _targets.Target,
    donate_argnums: int | Sequence[int] | None = None,
    donate_argnames: str | Sequence[str] | None = None,
) -> jax.stages.Compiled:
    """Compile ``fn(*arg_specs)`` for ``target`` with the real compiler, in this process.

    ``fn`` is traced and lowered under ``emulate.target(target)``, with the target's device
    as JAX's default device and the abstract mesh's
    (:func:`~emulate.compiler.devices.on_device`): so emulate's kernels and drop-ins plan
    for the target, and ``pltpu.get_tpu_info()`` and ``pltpu.create_tensorcore_mesh``
    describe it.
    Uses this process's compatibility mode (:func:`compat_mode`); for the other one, use
    :func:`check` with ``compat=``. The result has ``cost_analysis()``,
    ``memory_analysis()`` and ``as_text()``; it cannot run.

    ``donate_argnums`` / ``donate_argnames``: as ``jax.jit``'s, the arguments whose
    buffers the program may reuse for its outputs (a KV cache updated in place): each
    donated argument that matches an output's shape and dtype becomes an
    ``input_output_alias`` of the compiled program, and its bytes count once in
    ``memory_analysis()`` (``alias_size_in_bytes``), not as argument and output both.

    Raises:
      CompilerUnavailable: libtpu is not installed or does not load.
      ValueError: a target without a compile-only device (see :func:`device`).
      TypeError: a leaf of ``arg_specs`` without shape and dtype.
      Exception: whatever JAX or the compiler raises for a program they refuse (a
        ``NotImplementedError`` from Pallas, ``jax.errors.JaxRuntimeError`` from XLA:TPU or
        Mosaic).
    """
    dev = device(target)
    specs = place_specs(arg_specs, dev)
    with on_device(dev, target):
        jitted = jax.jit(fn, donate_argnums=donate_argnums, donate_argnames=donate_argnames)
        return jitted.lower(*specs).compile()


def check(
    fn: Callable[..., Any],
    *arg_specs: Any,
    target: str | _targets.Target,
    compat: bool = True,
) -> Verdict:
    """Compile ``fn(*arg_specs)`` for ``target`` with compatibility mode ``compat``; the
    verdict, never an exception for a program the compiler refuses.

    Runs in this process when ``compat`` equals :func:`compat_mode`, else in a subprocess
    (about 3 s to start), which needs ``fn`` to pickle by reference (see :class:`Job`).
    For many programs use :func:`check_many`: one subprocess for all of them.

    Raises:
      CompilerUnavailable, ValueError, TypeError: as :func:`compile`; TypeError also for a
        ``fn`` that a subprocess cannot receive (a lambda or closure).
    """
    return check_many([Job(fn, arg_specs, _targets.get(target).name)], compat=compat)[0]


def check_many(jobs: Sequence[Job], *, compat: bool = True) -> list[Verdict]:
    """:func:`check` for each job, in order; at most one subprocess for all of them.

    A job that kills the compiling process (an abort inside libtpu) gets a verdict with
    stage ``"crash"``; the remaining jobs go on in a fresh subprocess.
    """
    for job in jobs:
        device(job.target)  # ValueError / CompilerUnavailable here, not in the child
    if compat == compat_mode():
        return [compile_in_process(job) for job in jobs]
    return compile_isolated(jobs, compat)


def check_both(jobs: Mapping[bool, Sequence[Job]]) -> dict[bool, list[Verdict]]:
    """:func:`check_many` for each compatibility setting in ``jobs`` (``{True: [...],
    False: [...]}``), the settings compiling at the same time (one in this process or a
    subprocess, the other in a subprocess). The first error of either is raised."""
    results: dict[bool, list[Verdict]] = {}
    errors: list[BaseException] = []

    def run(compat: bool) -> None:
        try:
            results[compat] = check_many(jobs[compat], compat=compat)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(c,)) for c in jobs]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return results
