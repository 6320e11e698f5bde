"""Compiling jobs in this process or in a fresh one with the other compatibility setting.

libtpu reads ``LIBTPU_INIT_ARGS=--xla_mosaic_compat_mode=false`` once, when it loads, so a
compile with the setting other than this process's runs in a subprocess: a child
``python -c`` that imports :func:`_worker` from this module, reads batches of pickled
:class:`Job` lists on stdin and writes one JSON verdict a line. The child stays for later
calls, one per setting, until this process exits or its working directory or the
environment variables compiles depend on change (:data:`_CHILD_ENV`): starting one costs
about 2 s of CPU. Jobs pickle by reference (their functions must be importable by module
path in the child); a job that kills the child (an abort inside libtpu) gets a
``"crash"`` verdict and the rest go on in a fresh child.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import jax
import numpy as np

from emulate import targets as _targets
from emulate.compiler.devices import (
    COMPAT_FLAG,
    CompilerUnavailable,
    compat_mode,
    device,
    first_line,
    is_libtpu_noise,
    offered_devices,
    on_device,
)
from emulate.mosaic import ProgramFacts, Verdict

__all__ = [
    "Job",
    "child_env",
    "compile_in_process",
    "compile_isolated",
    "place_specs",
    "program_facts",
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
    """

    fn: Callable[..., Any]
    arg_specs: tuple[Any, ...]
    target: str


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


def _portable(arg_specs: tuple[Any, ...]) -> tuple[Any, ...]:
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

    return tuple(jax.tree.map(place, a, is_leaf=_is_leaf) for a in _portable(arg_specs))


def compile_in_process(job: Job) -> Verdict:
    """Compile ``job`` in this process (its compatibility setting); the verdict, never an
    exception for a program JAX or the compiler refuses."""
    dev = device(job.target)
    specs = place_specs(job.arg_specs, dev)
    try:
        # Traced and lowered under emulate.target(job.target), the target's device the
        # default one and the abstract mesh's, so that code asking what it runs on
        # (emulate's kernels; pltpu.get_tpu_info(), which Pallas calls when it lowers
        # integer division, emit_pipeline; pl.kernel's create_tensorcore_mesh) sees it.
        with on_device(dev, job.target):
            lowered = jax.jit(job.fn).lower(*specs)
    except Exception as e:  # noqa: BLE001 - every refusal is a verdict
        return _refusal("lower", e)
    try:
        compiled = lowered.compile()
    except Exception as e:  # noqa: BLE001 - every refusal is a verdict
        return _refusal("compile", e)
    return Verdict(True, program=program_facts(compiled))


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


def compile_isolated(jobs: Sequence[Job], compat: bool) -> list[Verdict]:
    """Compile ``jobs`` in a subprocess with compatibility mode ``compat``, in order.

    Raises:
      TypeError: a job's ``fn`` that does not pickle by reference, or that the subprocess
        cannot import.
      CompilerUnavailable: the subprocess cannot load the compiler.
    """
    portable = [Job(j.fn, _portable(j.arg_specs), _targets.get(j.target).name) for j in jobs]
    try:
        pickle.dumps([j.fn for j in portable])
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise TypeError(
            f"fn: compiling with compat={compat} runs in a subprocess (this process has "
            f"compat={compat_mode()}), which needs fn to pickle by reference (a module-level "
            f"function or a functools.partial of one); got {e}"
        ) from e
    return _run_subprocess(portable, compat)


def child_env(compat: bool) -> dict[str, str]:
    """The environment of a compiler subprocess with compatibility mode ``compat``."""
    env = dict(os.environ)
    args = re.sub(rf"{COMPAT_FLAG}(=\S*)?", "", env.get("LIBTPU_INIT_ARGS", "")).split()
    args.append(f"{COMPAT_FLAG}={'true' if compat else 'false'}")
    env["LIBTPU_INIT_ARGS"] = " ".join(args)
    env["JAX_PLATFORMS"] = "cpu"  # compile-only devices need no TPU backend
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"  # beside this process and the other setting's
    return env


_CHILD = (
    "import sys; sys.path[:0] = [{root!r}]; "
    "from emulate.compiler.isolate import _worker; sys.exit(_worker())"
)


class _Child:
    """A compiler subprocess with one compatibility setting, kept for later calls: starting
    one (importing JAX, loading libtpu) costs about 2 s of CPU, compiling a small kernel
    there a few ms. It reads batches of jobs on stdin until stdin closes; its stderr goes
    to a temporary file, read for the last lines when it dies."""

    def __init__(self, env: dict[str, str], cwd: str) -> None:
        self.env, self.cwd, self.parent = env, cwd, os.getpid()
        self.err: IO[bytes] = tempfile.TemporaryFile()
        root = str(Path(__file__).resolve().parents[2])
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD.format(root=root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            env=env,
        )

    def run(self, jobs: Sequence[Job]) -> tuple[list[Verdict], int | None, list[str]]:
        """The verdicts of ``jobs`` in order, up to the first one the child dies on; when
        it died, its exit status and the stderr lines it wrote for this batch."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        start = self.err.seek(0, os.SEEK_END)
        verdicts: list[Verdict] = []
        try:
            self.proc.stdin.write(pickle.dumps(list(sys.path)) + pickle.dumps(list(jobs)))
            self.proc.stdin.flush()
            while len(verdicts) < len(jobs) and (raw := self.proc.stdout.readline()):
                row = json.loads(raw)
                facts = ProgramFacts(**row["program"]) if row["program"] else None
                verdicts.append(
                    Verdict(row["ok"], row["stage"], row["message"], row["detail"], facts)
                )
        except BrokenPipeError:
            pass  # it died before reading the batch: its status says why
        if len(verdicts) == len(jobs):
            return verdicts, None, []
        rc = self.proc.wait()
        self.err.seek(start)
        text = self.err.read().decode(errors="replace")
        self.close()
        return verdicts, rc, [line for line in text.splitlines() if not is_libtpu_noise(line)]

    def close(self) -> None:
        """Close its stdin (it exits) and wait for it."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        self.proc.wait()
        self.err.close()


#: The live child of each compatibility setting, and the lock of each (check_both compiles
#: both settings at once, from two threads).
_children: dict[bool, _Child] = {}
_locks = {True: threading.Lock(), False: threading.Lock()}


def _child(compat: bool) -> _Child:
    """This process's child for ``compat``: a fresh one when there is none, or when this
    process's working directory or the variables of :data:`_CHILD_ENV` changed since it
    started, or when this process is a fork of the one that started it (that one's child
    is left alone)."""
    env, cwd = child_env(compat), os.getcwd()
    old = _children.get(compat)
    if old is not None and old.parent != os.getpid():
        old = None
    if old is not None and old.proc.poll() is None and (_key(old.env), old.cwd) == (_key(env), cwd):
        return old
    if old is not None:
        old.close()
    _children[compat] = _Child(env, cwd)
    return _children[compat]


#: The environment variables a child's compiles depend on, by prefix: JAX's, XLA's and
#: libtpu's settings, Python's paths, emulate's own.
_CHILD_ENV = ("JAX_", "XLA_", "LIBTPU_", "TPU_", "ALLOW_MULTIPLE_LIBTPU_LOAD", "PYTHON", "EMULATE_")


def _key(env: dict[str, str]) -> dict[str, str]:
    """What of a child's environment decides whether it may be reused (others, such as
    the test name pytest sets or a path a library records when first imported, do not)."""
    return {k: v for k, v in env.items() if k.startswith(_CHILD_ENV)}


@atexit.register
def _close_children() -> None:
    for compat in list(_children):
        child = _children.pop(compat)
        if child.parent == os.getpid():
            child.close()


def _run_subprocess(jobs: Sequence[Job], compat: bool) -> list[Verdict]:
    """Compile ``jobs`` in the subprocess for ``compat``, in a fresh one after a crash."""
    verdicts: list[Verdict] = []
    with _locks[compat]:
        while len(verdicts) < len(jobs):
            todo = list(jobs[len(verdicts) :])
            child = _child(compat)
            try:
                got, rc, tail = child.run(todo)
            except BaseException:
                # interrupted mid-batch: the child's unread verdicts must not answer the
                # next call
                _children.pop(compat, None)
                child.proc.kill()
                child.close()
                raise
            verdicts.extend(got)
            if rc is None:
                break
            _children.pop(compat, None)
            if not got and rc == 3:
                raise CompilerUnavailable.because(
                    f"the compiler subprocess could not start ({' '.join(tail)})"
                )
            if not got and rc == 4:
                raise TypeError(
                    "fn: the compiler subprocess could not unpickle the jobs "
                    f"({first_line(chr(10).join(tail[-1:]))})"
                )
            how = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
            message = first_line("\n".join(tail[-3:])) if tail else ""
            verdicts.append(
                Verdict(
                    False,
                    "crash",
                    f"the compiler process died ({how}){': ' + message if message else ''}",
                    "\n".join(tail[-50:]),
                )
            )
    return verdicts


def _worker() -> int:
    """The subprocess side of :func:`_run_subprocess`: for each batch on stdin (a pickled
    ``sys.path``, then the pickled jobs), one JSON line per job on stdout; exits when stdin
    closes."""
    out: IO[str] = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything the C++ side prints to stdout must not reach the protocol
    stdin = sys.stdin.buffer
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
            v = compile_in_process(job)
            facts = dataclasses.asdict(v.program) if v.program is not None else None
            row = {"ok": v.ok, "stage": v.stage, "message": v.message, "detail": v.detail}
            out.write(json.dumps({**row, "program": facts}) + "\n")
