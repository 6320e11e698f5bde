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

:func:`dump_isolated` compiles in a child started with libtpu's dump flags
(:func:`dump_args`): each program's final bundle schedule lands in a directory that child
owns, and each job's answer names the files its compile added (read by
:mod:`emulate.compiler.timing`).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, Final

import jax
import numpy as np

from emulate import targets as _targets
from emulate.compiler.devices import (
    COMPAT_FLAG,
    CompilerUnavailable,
    compat_mode,
    compat_setting,
    device,
    first_line,
    is_libtpu_noise,
    offered_devices,
    on_device,
)
from emulate.mosaic import ProgramFacts, Verdict

__all__ = [
    "Dumped",
    "Job",
    "child_env",
    "compile_in_process",
    "compile_isolated",
    "dump_args",
    "dump_isolated",
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
      donate_argnums: the positional arguments whose buffers the program may reuse for
        its outputs (as ``jax.jit``'s).
    """

    fn: Callable[..., Any]
    arg_specs: tuple[Any, ...]
    target: str
    donate_argnums: tuple[int, ...] = ()


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


def _portable_jobs(jobs: Sequence[Job], why: str) -> list[Job]:
    """``jobs`` as a child process takes them (specs, target names), their functions checked
    to pickle by reference (TypeError naming fn and ``why`` a child compiles them)."""
    portable = [
        Job(j.fn, _portable(j.arg_specs), _targets.get(j.target).name, tuple(j.donate_argnums))
        for j in jobs
    ]
    try:
        pickle.dumps([j.fn for j in portable])
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise TypeError(
            f"fn: {why}, which needs fn to pickle by reference (a module-level "
            f"function or a functools.partial of one); got {e}"
        ) from e
    return portable


def compile_isolated(jobs: Sequence[Job], compat: bool) -> list[Verdict]:
    """Compile ``jobs`` in a subprocess with compatibility mode ``compat``, in order.

    Raises:
      TypeError: a job's ``fn`` that does not pickle by reference, or that the subprocess
        cannot import.
      CompilerUnavailable: the subprocess cannot load the compiler.
    """
    portable = _portable_jobs(
        jobs,
        f"compiling with compat={compat} runs in a subprocess (this process has "
        f"compat={compat_mode()})",
    )
    # a fresh child after a crash
    return [_verdict(row) for row, _ in _run_rows(portable, compat, dump=False)]


#: The environment variable that tells a compiler child its dump directory.
DUMP_VARIABLE: Final = "EMULATE_BUNDLE_DUMP"

_DUMP_FLAGS = re.compile(r"--xla_jf_dump\w*(=\S*)?")


def dump_args(directory: str) -> list[str]:
    """libtpu's flags that write each compiled program's final bundle schedule (and only
    that pass, with the top-level program's deduplication map) into ``directory``."""
    return [
        f"--xla_jf_dump_to={directory}",
        "--xla_jf_dump_llo_text=true",
        "--xla_jf_dump_llo_pass_label_regex=final_bundles|deduplication-map",
    ]


def child_env(compat: bool, dump_to: str | None = None) -> dict[str, str]:
    """The environment of a compiler subprocess with compatibility mode ``compat``;
    ``dump_to``: a directory its libtpu dumps final bundle schedules into (this process's
    own dump flags are dropped either way)."""
    env = dict(os.environ)
    text = re.sub(rf"{COMPAT_FLAG}(=\S*)?", "", env.get("LIBTPU_INIT_ARGS", ""))
    args = _DUMP_FLAGS.sub("", text).split()
    args.append(f"{COMPAT_FLAG}={'true' if compat else 'false'}")
    env.pop(DUMP_VARIABLE, None)
    if dump_to is not None:
        args += dump_args(dump_to)
        env[DUMP_VARIABLE] = dump_to
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
    to a temporary file, read for the last lines when it dies. A dumping child (``dump``)
    also owns a temporary directory libtpu writes its final bundle schedules into, removed
    when the child closes."""

    def __init__(self, env: dict[str, str], cwd: str, dump: bool = False) -> None:
        self.env, self.cwd, self.parent = env, cwd, os.getpid()
        self.dump_dir = tempfile.mkdtemp(prefix="emulate-bundles-") if dump else None
        self.err: IO[bytes] = tempfile.TemporaryFile()
        root = str(Path(__file__).resolve().parents[2])
        run_env = env
        if self.dump_dir is not None:
            compat = compat_setting(env.get("LIBTPU_INIT_ARGS", ""))
            run_env = child_env(compat, dump_to=self.dump_dir)
            run_env.update({k: v for k, v in env.items() if k not in run_env})
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD.format(root=root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            env=run_env,
        )

    def run(self, jobs: Sequence[Job]) -> tuple[list[dict[str, Any]], int | None, list[str]]:
        """The answers (JSON rows) to ``jobs`` in order, up to the first one the child dies
        on; when it died, its exit status and the stderr lines it wrote for this batch."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        start = self.err.seek(0, os.SEEK_END)
        rows: list[dict[str, Any]] = []
        try:
            self.proc.stdin.write(pickle.dumps(list(sys.path)) + pickle.dumps(list(jobs)))
            self.proc.stdin.flush()
            while len(rows) < len(jobs) and (raw := self.proc.stdout.readline()):
                rows.append(json.loads(raw))
        except BrokenPipeError:
            pass  # it died before reading the batch: its status says why
        if len(rows) == len(jobs):
            return rows, None, []
        rc = self.proc.wait()
        self.err.seek(start)
        text = self.err.read().decode(errors="replace")
        self.close()
        return rows, rc, [line for line in text.splitlines() if not is_libtpu_noise(line)]

    def close(self) -> None:
        """Close its stdin (it exits), wait for it, remove its dump directory."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        self.proc.wait()
        self.err.close()
        if self.dump_dir is not None:
            shutil.rmtree(self.dump_dir, ignore_errors=True)


def _verdict(row: dict[str, Any]) -> Verdict:
    facts = ProgramFacts(**row["program"]) if row["program"] else None
    return Verdict(row["ok"], row["stage"], row["message"], row["detail"], facts)


#: The live child of each (compatibility setting, dumping), and the lock of each
#: (check_both compiles both settings at once, from two threads).
_children: dict[tuple[bool, bool], _Child] = {}
_locks = {(c, d): threading.Lock() for c in (True, False) for d in (True, False)}


def _child(compat: bool, dump: bool = False) -> _Child:
    """This process's child for ``compat`` (a dumping one when ``dump``): a fresh one
    when there is none, or when this process's working directory or the variables of
    :data:`_CHILD_ENV` changed since it started, or when this process is a fork of the one
    that started it (that one's child is left alone)."""
    env, cwd = child_env(compat), os.getcwd()
    old = _children.get((compat, dump))
    if old is not None and old.parent != os.getpid():
        old = None
    if old is not None and old.proc.poll() is None and (_key(old.env), old.cwd) == (_key(env), cwd):
        return old
    if old is not None:
        old.close()
    _children[compat, dump] = _Child(env, cwd, dump)
    return _children[compat, dump]


#: The environment variables a child's compiles depend on, by prefix: JAX's, XLA's and
#: libtpu's settings, Python's paths, emulate's own.
_CHILD_ENV = ("JAX_", "XLA_", "LIBTPU_", "TPU_", "ALLOW_MULTIPLE_LIBTPU_LOAD", "PYTHON", "EMULATE_")


def _key(env: dict[str, str]) -> dict[str, str]:
    """What of a child's environment decides whether it may be reused (others, such as
    the test name pytest sets or a path a library records when first imported, do not)."""
    return {k: v for k, v in env.items() if k.startswith(_CHILD_ENV)}


@atexit.register
def _close_children() -> None:
    for key in list(_children):
        child = _children.pop(key)
        if child.parent == os.getpid():
            child.close()


def dump_isolated(jobs: Sequence[Job]) -> list[tuple[Verdict, Dumped | None]]:
    """Compile ``jobs`` in order in a child with this process's compatibility setting that
    dumps final bundle schedules (:func:`dump_args`); for each, its verdict and, when it
    compiled, what the compile left (:class:`Dumped`). The caller reads the files and may
    delete them; the directory goes when the child does.

    Raises:
      TypeError: a job's ``fn`` that does not pickle by reference, or that the subprocess
        cannot import.
      CompilerUnavailable: the subprocess cannot load the compiler.
    """
    portable = _portable_jobs(
        jobs,
        "reading the compiler's schedule compiles in a subprocess (libtpu reads its "
        "dump flags when it loads)",
    )
    out: list[tuple[Verdict, Dumped | None]] = []
    for row, directory in _run_rows(portable, compat_mode(), dump=True):
        dumped = None
        if row.get("files") is not None and directory is not None:
            dumped = Dumped(directory, tuple(row["files"]), dict(row.get("cost") or {}))
        out.append((_verdict(row), dumped))
    return out


def _run_rows(
    jobs: Sequence[Job], compat: bool, dump: bool
) -> list[tuple[dict[str, Any], str | None]]:
    """Each job's JSON row and the dump directory of the child that answered it, compiled
    in the child for (``compat``, ``dump``), in a fresh one after a crash."""
    rows: list[tuple[dict[str, Any], str | None]] = []
    key = (compat, dump)
    with _locks[key]:
        while len(rows) < len(jobs):
            todo = list(jobs[len(rows) :])
            child = _child(compat, dump)
            try:
                got, rc, tail = child.run(todo)
            except BaseException:
                # interrupted mid-batch: the child's unread answers must not answer the
                # next call
                _children.pop(key, None)
                child.proc.kill()
                child.close()
                raise
            rows.extend((row, child.dump_dir) for row in got)
            if rc is None:
                break
            _children.pop(key, None)
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
            crash = Verdict(
                False,
                "crash",
                f"the compiler process died ({how}){': ' + message if message else ''}",
                "\n".join(tail[-50:]),
            )
            rows.append((_row(crash), None))
    return rows


def _row(v: Verdict, **extra: Any) -> dict[str, Any]:
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


def _worker() -> int:
    """The subprocess side of :func:`_run_rows`: for each batch on stdin (a pickled
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
                out.write(json.dumps(_row(compile_in_process(job))) + "\n")
                continue
            before = set(os.listdir(dump_dir))
            jax.clear_caches()  # a program JAX compiled before would leave no files
            compiled = _compiled(job)
            if isinstance(compiled, Verdict):
                out.write(json.dumps(_row(compiled)) + "\n")
                continue
            files = sorted(set(os.listdir(dump_dir)) - before)
            v = Verdict(True, program=program_facts(compiled))
            out.write(json.dumps(_row(v, files=files, cost=_cost(compiled))) + "\n")
