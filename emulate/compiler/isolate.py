"""Compiling jobs in this process or in a fresh one with the other compatibility setting.

libtpu reads ``LIBTPU_INIT_ARGS=--xla_mosaic_compat_mode=false`` once, when it loads, so a
compile with the setting other than this process's runs in a subprocess: a child
``python -c`` that runs :func:`emulate.compiler.jobs.worker_main`, reads batches of pickled
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
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from emulate import targets as _targets
from emulate.compiler.devices import (
    COMPAT_FLAG,
    CompilerUnavailable,
    compat_mode,
    compat_setting,
    first_line,
    is_libtpu_noise,
)
from emulate.compiler.jobs import (
    DUMP_VARIABLE,
    Dumped,
    Job,
    portable_specs,
    row_verdict,
    verdict_row,
)
from emulate.mosaic import Verdict

__all__ = [
    "child_env",
    "compile_isolated",
    "dump_args",
    "dump_isolated",
]


def _portable_jobs(jobs: Sequence[Job], why: str) -> list[Job]:
    """``jobs`` as a child process takes them (specs, target names), their functions checked
    to pickle by reference (TypeError naming fn and ``why`` a child compiles them)."""
    portable = [
        Job(j.fn, portable_specs(j.arg_specs), _targets.get(j.target).name, tuple(j.donate_argnums))
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
    return [row_verdict(row) for row, _ in _run_rows(portable, compat, dump=False)]


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
    "from emulate.compiler.jobs import worker_main; sys.exit(worker_main())"
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
        out.append((row_verdict(row), dumped))
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
            rows.append((verdict_row(crash), None))
    return rows
