"""A program to compile for a TPU target (:class:`Job`), its compile in this process, and
the compiler child's side of :mod:`emulate.compiler.isolate`'s protocol.

A job's verdict crosses the process boundary as one JSON row (:func:`verdict_row`,
:func:`row_verdict`); :func:`worker_main` is the child: it reads batches of pickled jobs on
stdin and answers one row a job.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import sys
from collections.abc import Callable
from typing import IO, Any, Final

import jax
import numpy as np

from emulate.compiler.devices import (
    CompilerUnavailable,
    device,
    first_line,
    offered_devices,
    on_device,
)
from emulate.mosaic import ProgramFacts, Verdict

__all__ = [
    "DUMP_VARIABLE",
    "Dumped",
    "Job",
    "compile_in_process",
    "place_specs",
    "portable_specs",
    "program_facts",
    "row_verdict",
    "verdict_row",
    "worker_main",
]


@dataclasses.dataclass(frozen=True)
class Job:
    """One program to compile: ``fn(*arg_specs)`` for ``target``.

    Attributes:
      fn: the function to jit. For a subprocess it must pickle by reference: a
        module-level function, or a ``functools.partial`` of one with picklable arguments.
      arg_specs: a pytree per positional argument whose leaves have ``shape`` and
        ``dtype`` (``jax.ShapeDtypeStruct``, numpy or jax arrays); any sharding they carry
        is replaced by the target's compile-only device.
      target: a TPU target name or alias with a topology (see :data:`TOPOLOGIES`); ``fn``
        is traced under ``emulate.target(target)``.
      donate_argnums: the positional arguments whose buffers the program may reuse for
        its outputs (as ``jax.jit``'s).

    Raises:
      TypeError: a ``donate_argnums`` that is not a tuple of ints (``jax.jit``'s type for
        it; checked here, not in the process that compiles the job).
      ValueError: an index past ``arg_specs`` (``jax.jit``'s type for it).
    """

    fn: Callable[..., Any]
    arg_specs: tuple[Any, ...]
    target: str
    donate_argnums: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        d = self.donate_argnums
        if not isinstance(d, tuple) or not all(isinstance(i, int) for i in d):
            raise TypeError(
                "donate_argnums: expected a tuple of ints (indices of positional "
                f"arguments), got {d!r}"
            )
        n = len(self.arg_specs)
        if any(i >= n for i in d):
            raise ValueError(
                f"donate_argnums: {d!r} names an argument past the {n} positional "
                "argument(s) of arg_specs"
            )


@dataclasses.dataclass(frozen=True)
class Dumped:
    """What one compile in a dumping child left: the files it added to the child's dump
    directory (libtpu's final bundle schedules) and the compiler's cost analysis.

    Attributes:
      directory: the child's dump directory.
      files: the file names the compile added, sorted.
      cost: ``compiled.cost_analysis()``'s numbers (``"optimal_seconds"``, ``"bytes
        accessed"``, ``"flops"`` ...).
    """

    directory: str
    files: tuple[str, ...]
    cost: dict[str, float]


class _Spec:
    """A picklable shape and dtype name, standing for one argument leaf."""

    __slots__ = ("dtype", "shape")

    def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
        self.shape = shape
        self.dtype = dtype

    def __reduce__(self) -> tuple[type[_Spec], tuple[tuple[int, ...], str]]:
        return (_Spec, (self.shape, self.dtype))


def _is_leaf(x: object) -> bool:
    # A pytree node with a shape and dtype of its own (emulate.Packed: its logical int4
    # shape) is not a leaf: its stored leaves (the packed uint8 bytes) are the arguments.
    return hasattr(x, "shape") and hasattr(x, "dtype") and jax.tree_util.all_leaves([x])


def portable_specs(arg_specs: tuple[Any, ...]) -> tuple[Any, ...]:
    """``arg_specs`` with every leaf as a :class:`_Spec` (shape, dtype name)."""

    def convert(x: Any) -> _Spec:
        if not _is_leaf(x):
            raise TypeError(
                f"arg_specs: expected leaves with shape and dtype (jax.ShapeDtypeStruct), "
                f"got {type(x).__name__} {x!r}"
            )
        return _Spec(tuple(int(d) for d in x.shape), np.dtype(x.dtype).name)

    return tuple(jax.tree.map(convert, a, is_leaf=_is_leaf) for a in arg_specs)


def place_specs(arg_specs: tuple[Any, ...], dev: jax.Device) -> tuple[Any, ...]:
    """``arg_specs`` as ``jax.ShapeDtypeStruct`` leaves placed on ``dev``: any sharding they
    carry is replaced. TypeError for a leaf without shape and dtype."""
    sharding = jax.sharding.SingleDeviceSharding(dev)

    def place(x: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(tuple(x.shape), np.dtype(x.dtype), sharding=sharding)

    return tuple(jax.tree.map(place, a, is_leaf=_is_leaf) for a in portable_specs(arg_specs))


def compile_in_process(job: Job) -> Verdict:
    """Compile ``job`` in this process (its compatibility setting); the verdict, never an
    exception for a program JAX or the compiler refuses."""
    compiled = _compiled(job)
    if isinstance(compiled, Verdict):
        return compiled
    return Verdict(True, program=program_facts(compiled))


def _compiled(job: Job) -> jax.stages.Compiled | Verdict:
    """``job`` compiled in this process, or the verdict that refuses it."""
    dev = device(job.target)
    specs = place_specs(job.arg_specs, dev)
    try:
        # Traced and lowered under emulate.target(job.target), the target's device the
        # default one and the abstract mesh's, so that code asking what it runs on
        # (emulate's kernels; pltpu.get_tpu_info(), which Pallas calls when it lowers
        # integer division, emit_pipeline; pl.kernel's create_tensorcore_mesh) sees it.
        with on_device(dev, job.target):
            jitted = jax.jit(job.fn, donate_argnums=job.donate_argnums or None)
            lowered = jitted.lower(*specs)
    except Exception as e:  # noqa: BLE001 - every refusal is a verdict
        return _refusal("lower", e)
    try:
        return lowered.compile()
    except Exception as e:  # noqa: BLE001 - every refusal is a verdict
        return _refusal("compile", e)


def program_facts(compiled: jax.stages.Compiled) -> ProgramFacts:
    """The kernels, XLA contractions and temporary bytes of a compiled TPU program."""
    text = compiled.as_text() or ""
    memory = compiled.memory_analysis()
    return ProgramFacts(
        tpu_custom_calls=text.count('custom_call_target="tpu_custom_call"'),
        xla_contractions=text.count(" dot(") + text.count(" convolution("),
        temp_bytes=int(memory.temp_size_in_bytes) if memory is not None else -1,
    )


def _refusal(stage: str, e: Exception) -> Verdict:
    text = f"{type(e).__name__}: {e}"
    return Verdict(False, stage, first_line(str(e)) or type(e).__name__, text[:8000])


#: The environment variable that tells a compiler child its dump directory.
DUMP_VARIABLE: Final = "EMULATE_BUNDLE_DUMP"


def row_verdict(row: dict[str, Any]) -> Verdict:
    facts = ProgramFacts(**row["program"]) if row["program"] else None
    return Verdict(row["ok"], row["stage"], row["message"], row["detail"], facts)


def verdict_row(v: Verdict, **extra: Any) -> dict[str, Any]:
    facts = dataclasses.asdict(v.program) if v.program is not None else None
    row = {"ok": v.ok, "stage": v.stage, "message": v.message, "detail": v.detail}
    return {**row, "program": facts, **extra}


def _cost(compiled: jax.stages.Compiled) -> dict[str, float]:
    """The numbers of ``compiled.cost_analysis()`` (one dict; libtpu's list of one
    unwrapped)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - a compiler without a cost analysis
        return {}
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    return {k: float(v) for k, v in (cost or {}).items() if isinstance(v, (int, float))}


def worker_main() -> int:
    """The subprocess side of :func:`emulate.compiler.isolate.compile_isolated` and
    :func:`~emulate.compiler.isolate.dump_isolated`: for each batch on stdin (a pickled
    ``sys.path``, then the pickled jobs), one JSON line per job on stdout; exits when stdin
    closes. A dumping child's lines also name the files each compile added to its dump
    directory and give the compiler's cost analysis."""
    out: IO[str] = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything the C++ side prints to stdout must not reach the protocol
    stdin = sys.stdin.buffer
    dump_dir = os.environ.get(DUMP_VARIABLE)
    # Filtering the traceback of every refused compile costs about 7% of a probe; this
    # process only reports first lines.
    jax.config.update("jax_traceback_filtering", "off")
    try:
        offered_devices()
    except CompilerUnavailable as e:
        print(e, file=sys.stderr)
        return 3
    while True:
        try:
            path = pickle.load(stdin)
        except EOFError:
            return 0
        sys.path[:0] = [p for p in path if p not in sys.path]
        try:
            jobs: list[Job] = pickle.load(stdin)
        except Exception as e:  # noqa: BLE001 - a module of a job's fn that does not import here
            print(f"{type(e).__name__}: {e}", file=sys.stderr)
            return 4
        for job in jobs:
            if dump_dir is None:
                out.write(json.dumps(verdict_row(compile_in_process(job))) + "\n")
                continue
            before = set(os.listdir(dump_dir))
            jax.clear_caches()  # a program JAX compiled before would leave no files
            compiled = _compiled(job)
            if isinstance(compiled, Verdict):
                out.write(json.dumps(verdict_row(compiled)) + "\n")
                continue
            files = sorted(set(os.listdir(dump_dir)) - before)
            v = Verdict(True, program=program_facts(compiled))
            out.write(json.dumps(verdict_row(v, files=files, cost=_cost(compiled))) + "\n")
