"""The real TPU compiler, on a machine without a TPU: compile-only devices per target.

With libtpu installed (``pip install "jax[tpu]"``), ``jax.experimental.topologies`` hands
out compile-only TPU devices: ``jax.jit(f).lower(specs on that device).compile()`` runs the
real XLA:TPU and Mosaic compilers, and nothing executes. This module owns those devices, so
nothing else in emulate repeats the name mapping or the subprocess plumbing:

- :data:`TOPOLOGIES` maps each TPU target (:mod:`emulate.targets`) to the libtpu topology
  that stands for it (``"tpu_v5e"`` -> ``"v5e:2x2"``), or to None where libtpu offers none
  (``tpu_v4i``, ``tpu_v7``, ``tpu_v8i`` in libtpu 0.0.42.1: ``v4i`` and ``v7`` are refused
  as "Invalid TPU external name", and no name for 8i is known; none is guessed).
- :func:`libtpu_version`, :func:`available`, :func:`generations`, :func:`device`.
- :func:`compile` compiles in this process; :func:`check` and :func:`check_many` return a
  :class:`Verdict` and run in a subprocess when asked for a Mosaic compatibility mode other
  than this process's (``LIBTPU_INIT_ARGS=--xla_mosaic_compat_mode=false`` is read once,
  when libtpu loads, so the other setting needs a fresh process).
- The probe: :func:`probe` compiles a one-line Pallas matmul
  ``o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=acc)`` for every
  offered generation x (lhs, rhs) x accumulator of :func:`probe_cases`, compatibility mode
  on and off (one subprocess per setting compiles every case), and :func:`recorded` /
  :func:`verdict` read the result shipped in ``emulate/data/mosaic_probe.json``; they need
  neither libtpu nor a compiler. :func:`disagreements` sets the probe beside JAX's own
  table (``get_tpu_info_for_chip(chip, 1).is_matmul_supported``); :func:`differences`
  lists the cases where two probes (a fresh one and the recorded one) differ.

Reprobe with ``python -m emulate.compiler --probe [--out PATH]``.

libtpu prints warnings about ``TPU_ACCELERATOR_TYPE`` and ``TPU_WORKER_HOSTNAMES`` when it
loads on a machine without a TPU. They are harmless; this module loads libtpu with file
descriptor 2 redirected and passes on only the lines that are not those warnings. Where
something else loaded libtpu first (``jax.devices()`` does, when libtpu is installed), the
warnings have already been printed and cannot be taken back.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import glob
import importlib.metadata
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Final

import jax
import numpy as np

from emulate import formats as _formats
from emulate import targets as _targets
from emulate.mosaic import (
    PROBE_PATH,
    Probe,
    ProbeCase,
    ProbeRow,
    Verdict,
    natural_accumulator,
    recorded,
)

__all__ = [
    "PROBE_PATH",
    "TOPOLOGIES",
    "CompilerUnavailable",
    "Disagreement",
    "Job",
    "Probe",
    "ProbeCase",
    "ProbeRow",
    "Verdict",
    "available",
    "check",
    "check_both",
    "check_many",
    "compat_mode",
    "compile",
    "device",
    "differences",
    "disagreements",
    "first_line",
    "generations",
    "libtpu_version",
    "natural_accumulator",
    "probe",
    "probe_cases",
    "recorded",
    "report",
    "verdict",
]

#: Each TPU target's libtpu topology (the first device of which is the compile-only device),
#: or None where the installed libtpu (0.0.42.1 when this was written) offers no topology.
TOPOLOGIES: Final[Mapping[str, str | None]] = {
    "tpu_v2": "v2:2x2",
    "tpu_v3": "v3:2x2",
    "tpu_v4": "v4:2x2x1",
    "tpu_v4i": None,  # "v4i:2x2": Invalid TPU external name: TPU v4i
    "tpu_v5e": "v5e:2x2",
    "tpu_v5p": "v5p:2x2x1",
    "tpu_v6e": "v6e:2x2",
    "tpu_v7": None,  # "v7:2x2x1": Invalid TPU external name: TPU v7
    "tpu_v7x": "tpu7x:2x2x1",
    "tpu_v8i": None,  # no topology name known for 8i
}


_COMPAT_FLAG = "--xla_mosaic_compat_mode"
_PROBE_SHAPE: Final[tuple[int, int]] = (128, 128)
_PROBE_KERNEL = "o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=acc)"

# libtpu's start-up warnings on a machine without a TPU (see the module docstring).
_NOISE = re.compile(
    r"TPU_ACCELERATOR_TYPE|TPU_WORKER_HOSTNAMES|Logging before InitGoogle|"
    r"Source Location Trace|libtpu_init_utils\.cc|^\s*$"
)


class CompilerUnavailable(RuntimeError):
    """The real TPU compiler cannot run here: libtpu is not installed or does not load.

    A RuntimeError rather than an ImportError: :mod:`emulate.compiler` itself always
    imports; what is missing is a capability of this environment, found when a function
    needs it, and ``except ImportError`` guards around imports should not swallow it.
    """


@dataclasses.dataclass(frozen=True)
class Job:
    """One program to compile: ``fn(*arg_specs)`` for ``target``.

    Attributes:
      fn: the function to jit. For a subprocess it must pickle by reference: a
        module-level function, or a ``functools.partial`` of one with picklable arguments.
      arg_specs: a pytree per positional argument whose leaves have ``shape`` and
        ``dtype`` (``jax.ShapeDtypeStruct``, numpy or jax arrays); any sharding they carry
        is replaced by the target's compile-only device.
      target: a TPU target name or alias with a topology (see :data:`TOPOLOGIES`).
    """

    fn: Callable[..., Any]
    arg_specs: tuple[Any, ...]
    target: str


@dataclasses.dataclass(frozen=True)
class Disagreement:
    """A (target, lhs, rhs) where JAX's table and the compiler differ.

    Attributes:
      target, lhs, rhs: the case, at its natural accumulator (:func:`natural_accumulator`).
      jax_native: JAX's ``is_matmul_supported(lhs, rhs)``.
      compat: the compatibility-mode setting compared.
      verdict: the compiler's verdict (with ``compat``).
    """

    target: str
    lhs: str
    rhs: str
    jax_native: bool
    compat: bool
    verdict: Verdict


# --------------------------------------------------------------------------------------
# libtpu and the compile-only devices


def libtpu_version() -> str | None:
    """The installed libtpu's version (``"0.0.42.1"``), or None if it is not installed.

    Reads the package metadata of ``libtpu`` (or ``libtpu-nightly``); loads nothing.
    """
    for dist in ("libtpu", "libtpu-nightly"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _setting_from(init_args: str) -> bool:
    """The compat setting a ``LIBTPU_INIT_ARGS`` value asks for (the last flag wins)."""
    setting = True
    for m in re.finditer(rf"{_COMPAT_FLAG}(?:=(\S*))?", init_args):
        setting = (m.group(1) or "true").lower() not in ("false", "0", "no")
    return setting


_lock = threading.RLock()
_compat_at_load: bool | None = None


def compat_mode() -> bool:
    """This process's Mosaic compatibility mode: True unless ``LIBTPU_INIT_ARGS`` says
    ``--xla_mosaic_compat_mode=false``.

    libtpu reads the flag once, when it loads; this returns the value that the variable
    held when this module first loaded libtpu, or, before that, the value it holds now.
    If something else loaded libtpu earlier with other arguments, the answer can be wrong.
    """
    with _lock:
        if _compat_at_load is not None:
            return _compat_at_load
    return _setting_from(os.environ.get("LIBTPU_INIT_ARGS", ""))


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Redirect file descriptor 2; afterwards pass on the lines that are not libtpu noise."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no real fd 2 (an embedded interpreter)
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = [
                line
                for line in sink.read().decode(errors="replace").splitlines(keepends=True)
                if not _NOISE.search(line)
            ]
            if kept:
                sys.stderr.write("".join(kept))


def _unavailable(reason: str) -> CompilerUnavailable:
    return CompilerUnavailable(
        f"the real TPU compiler is unavailable: {reason}; install it with "
        "pip install 'jax[tpu]' (or emulate[tpu]). The recorded probe "
        "(emulate.compiler.recorded(), verdict()) needs no compiler."
    )


def _has_tpu_chips() -> bool:
    """Whether this machine has TPU chips (the device files JAX looks for)."""
    return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


@functools.cache
def _devices() -> dict[str, jax.Device]:
    """Compile-only device per target whose topology the installed libtpu accepts."""
    global _compat_at_load
    version = libtpu_version()
    if version is None:
        raise _unavailable("libtpu is not installed")
    try:
        from jax.experimental import topologies
    except ImportError as e:  # pragma: no cover - part of every jax >= 0.4
        raise _unavailable(f"jax.experimental.topologies does not import ({e})") from e
    found: dict[str, jax.Device] = {}
    errors: list[str] = []
    with _lock:
        if _compat_at_load is None:
            _compat_at_load = _setting_from(os.environ.get("LIBTPU_INIT_ARGS", ""))
        if not _has_tpu_chips():
            # libtpu takes /tmp/libtpu_lockfile, which guards TPU chips, when it loads: a
            # second process (the other compat setting, a pytest-xdist worker) would then
            # fail. Without chips there is nothing to guard.
            os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        with _quiet_stderr():
            for target, name in TOPOLOGIES.items():
                if name is None:
                    continue
                try:
                    found[target] = topologies.get_topology_desc(name, "tpu").devices[0]
                except Exception as e:  # noqa: BLE001 - libtpu raises JaxRuntimeError
                    errors.append(f"{name}: {first_line(str(e))}")
    if not found:
        raise _unavailable(
            f"libtpu {version} is installed but offers no TPU topology ({'; '.join(errors)})"
        )
    return found


def available() -> bool:
    """Whether the real TPU compiler runs here (libtpu installed and loads).

    The first call loads libtpu (about half a second); the answer is cached.
    """
    try:
        _devices()
    except CompilerUnavailable:
        return False
    return True


def generations() -> tuple[str, ...]:
    """The TPU target names the installed libtpu offers a compile-only device for, in
    table order (``("tpu_v2", "tpu_v3", "tpu_v4", "tpu_v5e", "tpu_v5p", "tpu_v6e",
    "tpu_v7x")`` with libtpu 0.0.42.1).

    Raises:
      CompilerUnavailable: libtpu is not installed or does not load.
    """
    return tuple(_devices())


def device(target: str | _targets.Target) -> jax.Device:
    """The compile-only device standing for ``target`` (cached: the same object each call).

    ``target`` is a target name, alias (``"v5e"``, ``"ironwood"``) or Target. Compiling for
    it runs the real compiler; nothing can execute on it (``jax.device_put`` fails).

    Raises:
      ValueError: an unknown target (the message of :func:`emulate.targets.get`); a
        target that is not a TPU; a TPU target the installed libtpu offers no topology
        for (``tpu_v4i``, ``tpu_v7``, ``tpu_v8i``). The message names the argument, what
        it got and the accepted targets.
      CompilerUnavailable: libtpu is not installed or does not load.
    """
    name = _targets.get(target).name
    devices = _devices()
    if name in devices:
        return devices[name]
    accepted = ", ".join(devices)
    if name not in TOPOLOGIES:
        raise ValueError(
            f"target: the TPU compiler compiles for TPU targets only, got {name!r}; "
            f"accepted: {accepted}"
        )
    raise ValueError(
        f"target: libtpu {libtpu_version()} offers no compile-only topology for {name!r}; "
        f"accepted: {accepted}"
    )


# --------------------------------------------------------------------------------------
# compiling


class _Spec:
    """A picklable shape and dtype name, standing for one argument leaf."""

    __slots__ = ("dtype", "shape")

    def __init__(self, shape: tuple[int, ...], dtype: str) -> None:
        self.shape = shape
        self.dtype = dtype

    def __reduce__(self) -> tuple[type[_Spec], tuple[tuple[int, ...], str]]:
        return (_Spec, (self.shape, self.dtype))


def _is_leaf(x: object) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


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


def _placed(arg_specs: tuple[Any, ...], dev: jax.Device) -> tuple[Any, ...]:
    sharding = jax.sharding.SingleDeviceSharding(dev)

    def place(x: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(tuple(x.shape), np.dtype(x.dtype), sharding=sharding)

    return tuple(jax.tree.map(place, a, is_leaf=_is_leaf) for a in arg_specs)


def compile(  # noqa: A001 - the module's verb; call it as emulate.compiler.compile
    fn: Callable[..., Any], *arg_specs: Any, target: str | _targets.Target
) -> jax.stages.Compiled:
    """Compile ``fn(*arg_specs)`` for ``target`` with the real compiler, in this process.

    The target's device is JAX's default device while ``fn`` is traced and lowered (so
    ``pltpu.get_tpu_info()`` describes the target). Uses this process's compatibility mode
    (:func:`compat_mode`); for the other one, use
    :func:`check` with ``compat=``. The result has ``cost_analysis()``,
    ``memory_analysis()`` and ``as_text()``; it cannot run.

    Raises:
      CompilerUnavailable: libtpu is not installed or does not load.
      ValueError: a target without a compile-only device (see :func:`device`).
      TypeError: a leaf of ``arg_specs`` without shape and dtype.
      Exception: whatever JAX or the compiler raises for a program they refuse (a
        ``NotImplementedError`` from Pallas, ``jax.errors.JaxRuntimeError`` from XLA:TPU or
        Mosaic).
    """
    dev = device(target)
    specs = _placed(_portable(arg_specs), dev)
    with jax.default_device(dev):
        return jax.jit(fn).lower(*specs).compile()


def first_line(text: str) -> str:
    """The first meaningful line of a compiler error, without the boilerplate."""
    for line in text.splitlines():
        line = line.strip()
        for prefix in ("INTERNAL: ", "Mosaic failed to compile TPU kernel: "):
            if line.startswith(prefix):
                line = line[len(prefix) :].strip()
        if line:
            return line[:400]
    return text.strip()[:400]


def _verdict_in_process(job: Job) -> Verdict:
    dev = device(job.target)
    specs = _placed(_portable(job.arg_specs), dev)
    try:
        # The target's device is the default one while tracing and lowering, so that code
        # asking which device it runs on (pltpu.get_tpu_info(), which Pallas calls when it
        # lowers integer division, emit_pipeline, pl.kernel) sees the target.
        with jax.default_device(dev):
            lowered = jax.jit(job.fn).lower(*specs)
    except Exception as e:  # noqa: BLE001 - every refusal is a verdict
        return _refusal("lower", e)
    try:
        lowered.compile()
    except Exception as e:  # noqa: BLE001 - every refusal is a verdict
        return _refusal("compile", e)
    return Verdict(True)


def _refusal(stage: str, e: Exception) -> Verdict:
    text = f"{type(e).__name__}: {e}"
    return Verdict(False, stage, first_line(str(e)) or type(e).__name__, text[:8000])


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
        return [_verdict_in_process(job) for job in jobs]
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


def _child_env(compat: bool) -> dict[str, str]:
    env = dict(os.environ)
    args = re.sub(rf"{_COMPAT_FLAG}(=\S*)?", "", env.get("LIBTPU_INIT_ARGS", "")).split()
    args.append(f"{_COMPAT_FLAG}={'true' if compat else 'false'}")
    env["LIBTPU_INIT_ARGS"] = " ".join(args)
    env["JAX_PLATFORMS"] = "cpu"  # compile-only devices need no TPU backend
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"  # beside this process and the other setting's
    return env


_CHILD = (
    "import sys; sys.path[:0] = [{root!r}]; "
    "from emulate.compiler import _worker; sys.exit(_worker())"
)


def _run_subprocess(jobs: Sequence[Job], compat: bool) -> list[Verdict]:
    """Compile ``jobs`` in fresh processes with ``compat``, restarting after a crash."""
    root = str(Path(__file__).resolve().parent.parent)
    verdicts: list[Verdict] = []
    while len(verdicts) < len(jobs):
        todo = list(jobs[len(verdicts) :])
        payload = pickle.dumps(list(sys.path)) + pickle.dumps(todo)
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD.format(root=root)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=_child_env(compat),
            )
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(payload)
            proc.stdin.close()
            got = 0
            for raw in proc.stdout:
                row = json.loads(raw)
                verdicts.append(Verdict(row["ok"], row["stage"], row["message"], row["detail"]))
                got += 1
            rc = proc.wait()
            err.seek(0)
            tail = [
                line
                for line in err.read().decode(errors="replace").splitlines()
                if not _NOISE.search(line)
            ]
        if got < len(todo):
            if got == 0 and rc == 3:
                raise _unavailable(f"the compiler subprocess could not start ({' '.join(tail)})")
            if got == 0 and rc == 4:
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
    """The subprocess side of :func:`_run_subprocess`: one JSON line per job on stdout."""
    out: IO[str] = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything the C++ side prints to stdout must not reach the protocol
    stdin = sys.stdin.buffer
    sys.path[:0] = [p for p in pickle.load(stdin) if p not in sys.path]
    try:
        jobs: list[Job] = pickle.load(stdin)
    except Exception as e:  # noqa: BLE001 - a module of a job's fn that does not import here
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 4
    # Filtering the traceback of every refused compile costs about 7% of a probe; this
    # process only reports first lines.
    jax.config.update("jax_traceback_filtering", "off")
    try:
        _devices()
    except CompilerUnavailable as e:
        print(e, file=sys.stderr)
        return 3
    for job in jobs:
        v = _verdict_in_process(job)
        out.write(
            json.dumps({"ok": v.ok, "stage": v.stage, "message": v.message, "detail": v.detail})
            + "\n"
        )
    out.close()
    return 0


# --------------------------------------------------------------------------------------
# the probe

# The probe's operand pairs. Every operand format emulate knows (targets.OPERANDS) with
# itself; the formats a TPU matmul might take (_CORE) beside bf16/f32 activations, both
# ways round, and with each other where a chip or JAX's table pairs them; the rest beside
# a bf16 activation. _CORE same-type pairs also get the accumulators that are not their
# natural one (int32 for floats, f32 for integers, bf16 for floats).
_ACTIVATIONS: Final = ("bfloat16", "float32")
_CORE: Final = (
    "int8",
    "int4",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3b11fnuz",
    "float4_e2m1fn",
)
_LOW_MIXES: Final = (
    ("int8", "int4"),
    ("int4", "int8"),
    ("int8", "uint8"),
    ("uint8", "int8"),
    ("int4", "uint4"),
    ("uint4", "int4"),
    ("float8_e4m3fn", "float8_e5m2"),
    ("float8_e5m2", "float8_e4m3fn"),
    ("float8_e5m2", "float8_e4m3b11fnuz"),
    ("float8_e4m3b11fnuz", "float8_e5m2"),
    ("int8", "float8_e4m3fn"),
    ("float8_e4m3fn", "int8"),
    ("float4_e2m1fn", "float8_e4m3fn"),
    ("float8_e4m3fn", "float4_e2m1fn"),
)


def _probe_pairs() -> list[tuple[str, str]]:
    others = [f for f in _targets.OPERANDS if f not in _CORE + _ACTIVATIONS]
    pairs = [(f, f) for f in _targets.OPERANDS]
    pairs += [("bfloat16", "float32"), ("float32", "bfloat16")]
    pairs += [(a, f) for a in _ACTIVATIONS for f in _CORE]
    pairs += [(f, "bfloat16") for f in _CORE]
    pairs += [("float8_e5m2", "float32"), ("float8_e4m3b11fnuz", "float32")]
    pairs += list(_LOW_MIXES)
    pairs += [("bfloat16", f) for f in others]
    return pairs


def _probe_accumulators(lhs: str, rhs: str) -> tuple[str, ...]:
    natural = natural_accumulator(lhs, rhs)
    if lhs != rhs or lhs not in _CORE + _ACTIVATIONS:
        return (natural,)
    if natural == "int32":
        return ("int32", "float32")
    return ("float32", "int32", "bfloat16")


def probe_cases(targets: Sequence[str] | None = None) -> tuple[ProbeCase, ...]:
    """The probe's cases, sorted: for each target (default: every TPU target with a
    topology in :data:`TOPOLOGIES`, whether or not libtpu is installed), compat on and off,
    at the natural accumulator (:func:`natural_accumulator`):

    - every operand format of :data:`emulate.targets.OPERANDS` with itself;
    - bfloat16 x float32 both ways; bfloat16 and float32 with int8, int4, float8_e4m3fn,
      float8_e5m2, float8_e4m3b11fnuz, float4_e2m1fn (activation as lhs), those six with
      a bfloat16 rhs, and float8_e5m2 / float8_e4m3b11fnuz with a float32 rhs;
    - int8/int4, int8/uint8, int4/uint4, e4m3fn/e5m2, e5m2/e4m3b11fnuz, int8/e4m3fn,
      e2m1fn/e4m3fn, both ways;
    - bfloat16 x each remaining format (float16, uint8, uint4, the fnuz float8s, e3m4,
      the float6s, e8m0fnu);

    and, for the same-type pairs of float32, bfloat16 and the six above, the other
    accumulators: float32 for integers; int32 and bfloat16 for floats.
    """
    names = [_targets.get(t).name for t in (targets or [t for t, n in TOPOLOGIES.items() if n])]
    return tuple(
        sorted(
            ProbeCase(t, lhs, rhs, acc, compat)
            for t in names
            for lhs, rhs in _probe_pairs()
            for acc in _probe_accumulators(lhs, rhs)
            for compat in (True, False)
        )
    )


def _probe_kernel(x_ref: Any, w_ref: Any, o_ref: Any) -> None:
    o_ref[...] = jax.numpy.dot(x_ref[...], w_ref[...], preferred_element_type=o_ref.dtype)


def _probe_matmul(x: jax.Array, w: jax.Array, *, acc: str) -> jax.Array:
    """The probe program: one ``pallas_call`` of :func:`_probe_kernel`, one block."""
    from jax.experimental import pallas as pl

    out = jax.ShapeDtypeStruct((x.shape[0], w.shape[1]), np.dtype(acc))
    return pl.pallas_call(_probe_kernel, out_shape=out)(x, w)


def _probe_job(case: ProbeCase) -> Job:
    specs = tuple(
        jax.ShapeDtypeStruct(_PROBE_SHAPE, _formats.get(f).dtype) for f in (case.lhs, case.rhs)
    )
    return Job(functools.partial(_probe_matmul, acc=case.acc), specs, case.target)


def probe(
    targets: Sequence[str] | None = None, *, cases: Sequence[ProbeCase] | None = None
) -> Probe:
    """Compile every case of :func:`probe_cases` with the real compiler.

    One subprocess per compatibility setting compiles all of that setting's cases; the two
    run at the same time. Takes about a minute for the 7 generations on 2 cores.

    Args:
      targets: the TPU targets to probe (default every generation libtpu offers).
      cases: compile only these cases (of :func:`probe_cases`, in any order; the rows come
        back sorted), instead of every case of ``targets``; ``targets`` must be None then.

    Raises:
      CompilerUnavailable: libtpu is not installed or does not load.
      ValueError: a target without a compile-only device; both ``targets`` and ``cases``.
    """
    start = time.perf_counter()
    if cases is not None and targets is not None:
        raise ValueError(
            f"targets: pass targets or cases, not both; got targets={list(targets)!r} "
            f"and {len(cases)} cases"
        )
    if cases is None:
        names = tuple(_targets.get(t).name for t in (targets or generations()))
        cases = probe_cases(names)
    else:
        cases = tuple(sorted(cases))
        names = tuple(sorted({c.target for c in cases}))
    for t in names:
        device(t)
    results = check_both(
        {compat: [_probe_job(c) for c in cases if c.compat == compat] for compat in (True, False)}
    )
    verdicts = {c: iter(v) for c, v in results.items()}
    rows = tuple(ProbeRow(c, next(verdicts[c.compat])) for c in cases)
    return Probe(
        libtpu=libtpu_version() or "",
        jax=jax.__version__,
        jaxlib=importlib.metadata.version("jaxlib"),
        shape=_PROBE_SHAPE,
        kernel=_PROBE_KERNEL,
        seconds=time.perf_counter() - start,
        topologies={t: str(TOPOLOGIES[t]) for t in names},
        rows=rows,
    )


def _format_name(arg: str, fmt: _formats.FormatLike) -> str:
    try:
        return _formats.get(fmt).name
    except (ValueError, TypeError) as e:
        raise ValueError(f"{arg}: {e}") from e


def verdict(
    target: str | _targets.Target,
    lhs: _formats.FormatLike,
    rhs: _formats.FormatLike,
    acc: _formats.FormatLike | None = None,
    *,
    compat: bool = True,
    probe: Probe | None = None,
) -> Verdict:
    """The recorded verdict for ``lhs x rhs`` accumulating in ``acc`` on ``target``.

    Formats as names, aliases or dtypes; ``acc`` defaults to :func:`natural_accumulator`.
    Reads :func:`recorded` (or ``probe``); needs no compiler.

    Raises:
      ValueError: an unknown target or format; a target that was not probed (the
        message lists those that were); a case outside :func:`probe_cases`.
    """
    data = probe or recorded()
    name = _targets.get(target).name
    if name not in data.topologies:
        raise ValueError(
            f"target: the probe (libtpu {data.libtpu}) has no verdicts for {name!r}; "
            f"probed: {', '.join(data.topologies)}"
        )
    lhs_name, rhs_name = _format_name("lhs", lhs), _format_name("rhs", rhs)
    acc_name = natural_accumulator(lhs_name, rhs_name) if acc is None else _format_name("acc", acc)
    case = ProbeCase(name, lhs_name, rhs_name, acc_name, bool(compat))
    try:
        return data.lookup(case)
    except KeyError:
        raise ValueError(
            f"lhs, rhs, acc: {lhs_name} x {rhs_name} -> {acc_name} is not a probed case; "
            f"see emulate.compiler.probe_cases()"
        ) from None


def _jax_native(target: str, lhs: str, rhs: str) -> bool:
    """JAX's table (or emulate's builtin copy of it) for the pair: the target profile's
    pairs before the compiler's verdicts replaced them."""
    t = _targets.get(target)
    return (lhs, rhs) in (t.table_pairs if t.table_pairs is not None else t.native_pairs)


def disagreements(probe: Probe | None = None, *, compat: bool = False) -> tuple[Disagreement, ...]:
    """Where JAX's table (``get_tpu_info_for_chip(chip, 1).is_matmul_supported``, of the
    installed JAX) and the compiler differ, per probed (target, lhs, rhs) at the natural
    accumulator with compatibility mode ``compat``.

    With ``compat=False`` (the default) "compiles" means native: the compiler converted
    nothing. With ``compat=True`` it also counts pairs that compile only because
    compatibility mode converts them.
    """
    data = probe or recorded()
    found = []
    for row in data.rows:
        c = row.case
        if c.compat != compat or c.acc != natural_accumulator(c.lhs, c.rhs):
            continue
        native = _jax_native(c.target, c.lhs, c.rhs)
        if native != row.verdict.ok:
            found.append(Disagreement(c.target, c.lhs, c.rhs, native, compat, row.verdict))
    return tuple(found)


def differences(new: Probe, old: Probe) -> list[str]:
    """One line per case whose verdict or message differs between two probes, or that
    only one of them has."""
    a, b = new._index(), old._index()
    lines = []
    for case in sorted(set(a) | set(b)):
        va, vb = a.get(case), b.get(case)
        if va != vb:
            lines.append(f"{_case_str(case)}: now {_v_str(va)}; recorded {_v_str(vb)}")
    return lines


def _case_str(c: ProbeCase) -> str:
    return f"{c.target} {c.lhs} x {c.rhs} -> {c.acc} compat {'on' if c.compat else 'off'}"


def _v_str(v: Verdict | None) -> str:
    if v is None:
        return "not probed"
    return "compiles" if v.ok else f"refused ({v.stage}: {v.message})"


def _summary(data: Probe) -> str:
    """A per-target count of cases, and of those that compile, per compat setting."""
    lines = [
        f"libtpu {data.libtpu}, jax {data.jax}: {len(data.rows)} cases in {data.seconds:.1f} s"
    ]
    for t in data.topologies:
        counts = []
        for compat in (True, False):
            rows = [r for r in data.rows if r.case.target == t and r.case.compat == compat]
            ok = sum(r.verdict.ok for r in rows)
            counts.append(f"compat {'on' if compat else 'off'}: {ok}/{len(rows)} compile")
        lines.append(f"  {t:8} " + "; ".join(counts))
    return "\n".join(lines)


def report(result: Probe) -> tuple[str, list[str]]:
    """A fresh probe in words: the per-target counts, where JAX's table and the compiler
    disagree (compat on and off), and how it differs from the recorded probe; with those
    differences (one line each) apart."""
    lines = [_summary(result)]
    for compat in (True, False):
        found = disagreements(result, compat=compat)
        total = len({(r.case.target, r.case.lhs, r.case.rhs) for r in result.rows})
        lines.append(
            f"JAX's table vs the compiler, compat {'on' if compat else 'off'}: "
            f"{len(found)} of {total} (target, pair) cases differ"
        )
        lines += [
            f"  {d.target} {d.lhs} x {d.rhs}: JAX {'native' if d.jax_native else 'not'}; "
            f"compiler {_v_str(d.verdict)}"
            for d in found
        ]
    old = recorded()
    same_targets = dataclasses.replace(
        old, rows=tuple(r for r in old.rows if r.case.target in result.topologies)
    )
    changed = differences(result, same_targets)
    lines.append(
        f"differences from the recorded probe (libtpu {old.libtpu}), for the targets probed: "
        f"{len(changed)}"
    )
    lines += [f"  {line}" for line in changed[:50]]
    return "\n".join(lines), changed


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m emulate.compiler",
        description="The real TPU compiler: probe which Pallas matmuls it compiles.",
    )
    parser.add_argument("--probe", action="store_true", help="compile every probe case")
    parser.add_argument("--out", type=Path, help="write the probe's JSON here")
    parser.add_argument(
        "--targets", nargs="+", help="probe only these targets (default: every one offered)"
    )
    args = parser.parse_args(argv)
    if not args.probe:
        print(_summary(recorded()))
        return 0
    try:
        result = probe(args.targets)
    except (CompilerUnavailable, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text, _ = report(result)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(result.to_json(), encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    # Run the imported module's _main, not this __main__ copy's: the probe pickles its
    # functions by reference to emulate.compiler for the subprocesses.
    from emulate.compiler import _main as _module_main

    sys.exit(_module_main())
