"""Time from the compiler's schedule: how long a compiled TPU program takes, per generation.

libtpu's cost analysis gives a Pallas kernel neither bytes nor time, but the compiler has
scheduled every bundle of it: :func:`estimate` compiles a program in a subprocess whose
libtpu dumps its final bundle schedules (:mod:`emulate.compiler.bundles`), replays the
top-level program with every fusion and kernel it calls (:mod:`emulate.compiler.replay`:
loops, predicated regions, the Pallas grid, DMAs against HBM bandwidth) and returns a
:class:`ProgramTime`: each Mosaic kernel's time, bundles a grid step, steps, DMA bytes and
whether its schedule or its DMAs bound it; XLA's own fusions the same way; the program's
total; and the generation's constants (:mod:`emulate.compiler.cores`).

Example (a Q4_K weight prepared for the kernel; numbers from libtpu 0.0.42.1)::

    q = emulate.pallas.prepare_weight(q4_k.T)            # 4096 x 14336
    x = jax.ShapeDtypeStruct((1, 4096), jnp.bfloat16)
    t = emulate.compiler.estimate(
        functools.partial(emulate.pallas.matmul, target="tpu_v5e", out_dtype=jnp.float32),
        x, q, target="tpu_v5e")
    t.kernel().seconds, t.kernel().bundles_per_step, t.kernel().steps, t.kernel().bound

The model is the schedule's: one bundle a cycle at the generation's clock, a DMA's bytes
at the HBM bandwidth, overlapped as the program's own waits allow. Where real-chip
timings exist (``emulate/data/bundle_calibration.json``), ``calibrated=True`` (the
default) applies the calibration fitted on them; :attr:`Generation.calibration` says
which.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from emulate import targets as _targets
from emulate.compiler import bundles as _bundles
from emulate.compiler.cores import Generation, generation
from emulate.compiler.devices import compat_mode, device, libtpu_version
from emulate.compiler.isolate import child_env, dump_isolated
from emulate.compiler.jobs import DUMP_VARIABLE, Dumped, Job
from emulate.compiler.replay import Machine, Run, replay
from emulate.mosaic import Verdict

__all__ = [
    "KernelTime",
    "ProgramTime",
    "ProgramRefused",
    "dump_directory",
    "dumping_env",
    "estimate",
    "estimate_compiled",
    "estimate_dump",
    "estimate_many",
    "machine",
]

_KIND = re.compile(r"%([\w.\-]+) = ([\w\-]+)\(")


class ProgramRefused(RuntimeError):
    """The compiler (or JAX before it) refused a program :func:`estimate` was asked to time.

    Attributes:
      verdict: what the compiler said (:class:`emulate.mosaic.Verdict`).
    """

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(f"the program did not compile ({verdict.stage}): {verdict.message}")
        self.verdict = verdict


@dataclasses.dataclass(frozen=True)
class KernelTime:
    """One program the top-level program called (a Mosaic kernel or an XLA fusion), over
    all its calls.

    Attributes:
      name: its HLO instruction name (``"emulate_matmul.1"``, ``"fusion.3"``).
      kind: ``"kernel"`` (a Mosaic kernel: a ``tpu_custom_call``), ``"fusion"``, or the
        HLO opcode of another XLA op (``"convert"``, ``"copy"``, ``"slice"``).
      calls: how often the program ran.
      bundles: its schedule's length (bundles, once through).
      grid: the grid its DMA windows state (``(1, 56, 4)``), or ``()``.
      steps: grid steps a call (the product of ``grid``; 1 without a grid).
      issued: bundles issued over all calls (each a cycle, plus ``vdelay`` cycles).
      compute_seconds: those cycles at the clock (and the calibration's cycles a bundle).
      stall_seconds: time the core waited for DMAs.
      seconds: ``compute_seconds + stall_seconds``.
      hbm_read_bytes, hbm_write_bytes: what its DMAs moved from and to HBM, all calls.
      dma_seconds: those bytes at the HBM bandwidth (and the calibration's efficiency).
      unresolved: what the replay could not decide (see :class:`~emulate.compiler.replay.Run`).
    """

    name: str
    kind: str
    calls: int
    bundles: int
    grid: tuple[int, ...]
    steps: int
    issued: int
    compute_seconds: float
    stall_seconds: float
    seconds: float
    hbm_read_bytes: int
    hbm_write_bytes: int
    dma_seconds: float
    unresolved: tuple[str, ...] = ()

    @property
    def bundles_per_step(self) -> float:
        """Bundles issued a grid step, on average over all calls."""
        return self.issued / max(self.calls * self.steps, 1)

    @property
    def bound(self) -> str:
        """``"compute"`` when its bundles take longer than its DMAs, else ``"memory"``."""
        return "compute" if self.compute_seconds >= self.dma_seconds else "memory"

    @property
    def seconds_per_call(self) -> float:
        return self.seconds / max(self.calls, 1)


@dataclasses.dataclass(frozen=True)
class ProgramTime:
    """What :func:`estimate` found for one compiled program.

    Attributes:
      target: the TPU target (``"tpu_v5e"``).
      seconds: the whole program: the top-level program's own bundles plus everything it
        called, stalls included.
      kernels: the Mosaic kernels it called, in first-call order.
      xla: XLA's fusions and other ops it called, in first-call order.
      top_level_seconds: the top-level program's own bundles (control, sync, the
        runtime's start and end).
      xla_optimal_seconds: XLA's own estimate (``cost_analysis()["optimal_seconds"]``),
        None where it gives none (a missing key or its -1 sentinel). It leaves Pallas
        kernels out.
      generation: the constants used (clock, bandwidth, calibration).
      libtpu: the libtpu version that compiled it.
      unresolved: what the replay of the top-level program could not decide.
    """

    target: str
    seconds: float
    kernels: tuple[KernelTime, ...]
    xla: tuple[KernelTime, ...]
    top_level_seconds: float
    xla_optimal_seconds: float | None
    generation: Generation
    libtpu: str | None = None
    unresolved: tuple[str, ...] = ()

    @property
    def kernel_seconds(self) -> float:
        """The Mosaic kernels' seconds, all calls."""
        return sum(k.seconds for k in self.kernels)

    @property
    def xla_seconds(self) -> float:
        """XLA's fusions' and ops' seconds, all calls."""
        return sum(k.seconds for k in self.xla)

    @property
    def hbm_bytes(self) -> int:
        """Bytes the program's DMAs moved from and to HBM."""
        return sum(k.hbm_read_bytes + k.hbm_write_bytes for k in self.kernels + self.xla)

    def kernel(self, name: str | None = None) -> KernelTime:
        """The Mosaic kernel called ``name`` (its HLO name, or a prefix such as
        ``"emulate_matmul"``), or the only one when ``name`` is None.

        Raises:
          ValueError: the program has no Mosaic kernel; ``name`` matches none; ``name`` is
            None (or a prefix) and several match. The message lists the kernels.
        """
        names = [k.name for k in self.kernels]
        if not names:
            raise ValueError(
                "the program has no Mosaic kernel (no tpu_custom_call): it is XLA's "
                f"alone; its fusions: {', '.join(k.name for k in self.xla) or 'none'}"
            )
        found = [k for k in self.kernels if name is None or k.name == name]
        if name is not None and not found:
            found = [k for k in self.kernels if k.name.startswith(name)]
        if len(found) == 1:
            return found[0]
        what = "no kernel named" if not found else "several kernels match"
        raise ValueError(f"name: {what} {name!r}; the program's kernels: {', '.join(names)}")

    def table(self) -> str:
        """A plain-text table: one line per kernel and fusion, then the totals."""
        g = self.generation
        lines = [
            f"{self.target} ({g.clock_hz / 1e9:.3f} GHz, HBM "
            f"{g.hbm_bytes_per_second * g.hbm_efficiency / 1e9:.0f} GB/s"
            f"{', calibrated' if g.calibration else ', uncalibrated'}): "
            f"{self.seconds * 1e6:.1f} us",
            f"{'program':28s} {'kind':8s} {'calls':>5s} {'bundles':>8s} {'steps':>6s} "
            f"{'b/step':>8s} {'us':>10s} {'DMA MB':>8s} {'DMA us':>8s} bound",
        ]
        for k in self.kernels + self.xla:
            lines.append(
                f"{k.name[:28]:28s} {k.kind[:8]:8s} {k.calls:5d} {k.bundles:8d} {k.steps:6d} "
                f"{k.bundles_per_step:8.0f} {k.seconds * 1e6:10.1f} "
                f"{(k.hbm_read_bytes + k.hbm_write_bytes) / 1e6:8.2f} "
                f"{k.dma_seconds * 1e6:8.1f} {k.bound}"
            )
        return "\n".join(lines)


def machine(gen: Generation) -> Machine:
    """The replay's :class:`~emulate.compiler.replay.Machine` for ``gen``."""
    return Machine(
        clock_hz=gen.clock_hz,
        hbm_bytes_per_second=gen.hbm_bytes_per_second * gen.hbm_efficiency,
        granule_bytes=gen.granule_bytes,
        delay_slots=gen.delay_slots,
        cycles_per_bundle=gen.cycles_per_bundle,
        dma_latency_s=gen.dma_latency_s,
    )


def _kinds(top: _bundles.Schedule, files: Mapping[str, _bundles.ScheduleFiles]) -> dict[str, str]:
    """Each called program's kind, from the top-level program's call comments: a
    ``custom-call`` is a Mosaic kernel when its schedule analysis names a
    ``tpu_custom_call`` (XLA has custom calls of its own)."""
    kinds: dict[str, str] = {}
    for _, op in top.ops("inlined_call"):
        m = _KIND.search(op.comment)
        if not m:
            continue
        kind = m.group(2)
        if kind == "custom-call":
            f = files.get(m.group(1))
            text = f.analysis.read_text() if f is not None and f.analysis is not None else ""
            kind = "kernel" if "tpu_custom_call" in text else kind
        kinds[m.group(1)] = kind
    return kinds


def _flatten(run: Run) -> Iterable[Run]:
    for c in run.calls:
        yield c
        yield from _flatten(c)


def _summaries(
    runs: Iterable[Run],
    programs: Mapping[str, _bundles.Schedule],
    kinds: Mapping[str, str],
    gen: Generation,
) -> list[KernelTime]:
    grouped: dict[str, list[Run]] = collections.defaultdict(list)
    for r in runs:
        grouped[r.name].append(r)
    out = []
    bandwidth = gen.hbm_bytes_per_second * gen.hbm_efficiency
    for name, rs in grouped.items():
        issue = sum(r.issue_cycles for r in rs)
        stall = sum(r.stall_cycles for r in rs)
        read = sum(r.hbm_read_bytes for r in rs)
        written = sum(r.hbm_write_bytes for r in rs)
        notes = tuple(dict.fromkeys(n for r in rs for n in r.unresolved))
        out.append(
            KernelTime(
                name=name,
                kind=kinds.get(name, "runtime" if name.startswith("<") else "op"),
                calls=len(rs),
                bundles=len(programs[name]),
                grid=rs[0].grid,
                steps=rs[0].steps if rs[0].grid else 1,
                issued=sum(r.issued + r.delay_cycles for r in rs),
                compute_seconds=issue / gen.clock_hz,
                stall_seconds=stall / gen.clock_hz,
                seconds=(issue + stall) / gen.clock_hz,
                hbm_read_bytes=read,
                hbm_write_bytes=written,
                dma_seconds=(read + written) / bandwidth,
                unresolved=notes,
            )
        )
    return out


def _optimal_seconds(cost: Mapping[str, float] | None) -> float | None:
    value = (cost or {}).get("optimal_seconds")
    return float(value) if value is not None and value >= 0 else None


def estimate_dump(
    directory: str | os.PathLike[str],
    target: str | _targets.Target,
    *,
    files: Sequence[str] | None = None,
    cost: Mapping[str, float] | None = None,
    calibrated: bool = True,
    constants: Generation | None = None,
) -> ProgramTime:
    """The :class:`ProgramTime` of one program whose final bundle schedules libtpu dumped
    into ``directory`` (run with ``LIBTPU_INIT_ARGS="--xla_jf_dump_to=DIR
    --xla_jf_dump_llo_text=true"``, optionally
    ``--xla_jf_dump_llo_pass_label_regex=final_bundles``).

    Args:
      directory: the dump directory.
      target: the TPU target the program was compiled for.
      files: the file names of this program's compile (a directory that holds several
        compiles: list the files one added); default every file there, which must then
        hold exactly one top-level program.
      cost: the compiled program's ``cost_analysis()`` (for ``xla_optimal_seconds``).
      calibrated: apply the recorded calibration (:func:`generation`).
      constants: the generation's constants to use instead (a what-if: another clock,
        bandwidth or calibration); ``target`` and ``calibrated`` are then ignored.

    Raises:
      ValueError: no top-level program's schedule among the files, or several; a
        target without a clock; a schedule libtpu wrote in a form this reader does not
        know (the file is named).
    """
    gen = constants if constants is not None else generation(target, calibrated=calibrated)
    found = _bundles.dump_files(Path(directory), iter(files) if files is not None else None)
    tops = [f for f in found if f.name == "TLP"]
    if len(tops) != 1:
        raise ValueError(
            f"directory: expected one top-level program's final bundles (*-TLP-*"
            f"final_bundles.txt) in {str(directory)!r}, found {len(tops)}; dump with "
            "LIBTPU_INIT_ARGS='--xla_jf_dump_to=DIR --xla_jf_dump_llo_text=true' in a fresh "
            "process, or pass the files of one compile"
        )
    programs = {f.name: _bundles.read(f.bundles) for f in found}
    by_name = {f.name: f for f in found}
    for alias, key in _bundles.aliases(Path(directory), iter(files) if files else None).items():
        if key in programs and alias not in programs:
            programs[alias] = programs[key]
            by_name.setdefault(alias, by_name[key])
    top = programs["TLP"]
    run = replay(top, machine(gen), programs)
    kinds = _kinds(top, by_name)
    called = _summaries(_flatten(run), programs, kinds, gen)
    return ProgramTime(
        target=gen.target,
        seconds=run.cycles / gen.clock_hz,
        kernels=tuple(k for k in called if k.kind == "kernel"),
        xla=tuple(k for k in called if k.kind != "kernel"),
        top_level_seconds=run.own_cycles / gen.clock_hz,
        xla_optimal_seconds=_optimal_seconds(cost),
        generation=gen,
        libtpu=libtpu_version(),
        unresolved=run.unresolved,
    )


def estimate_many(jobs: Sequence[Job], *, calibrated: bool = True) -> list[ProgramTime | Verdict]:
    """:func:`estimate` for each job, in order, in one compiler subprocess: a
    :class:`ProgramTime`, or the :class:`~emulate.mosaic.Verdict` of a program the compiler
    refused (or that crashed it).

    Raises:
      CompilerUnavailable: libtpu is not installed or does not load.
      ValueError: a target without a compile-only device or a clock.
      TypeError: a job's ``fn`` that a subprocess cannot receive (a lambda or closure).
    """
    for job in jobs:
        device(job.target)  # ValueError / CompilerUnavailable here, not in the child
        generation(job.target)
    out: list[ProgramTime | Verdict] = []
    for job, (verdict, dumped) in zip(jobs, dump_isolated(jobs), strict=True):
        if dumped is None:
            out.append(verdict)
            continue
        try:
            out.append(_from_dump(dumped, job.target, calibrated))
        finally:
            _remove(dumped)
    return out


def _from_dump(dumped: Dumped, target: str, calibrated: bool) -> ProgramTime:
    return estimate_dump(
        dumped.directory, target, files=dumped.files, cost=dumped.cost, calibrated=calibrated
    )


def _remove(dumped: Dumped) -> None:
    for name in dumped.files:
        try:
            (Path(dumped.directory) / name).unlink()
        except OSError:
            pass


def estimate(
    fn: Callable[..., Any],
    *arg_specs: Any,
    target: str | _targets.Target,
    donate_argnums: int | Sequence[int] | None = None,
    calibrated: bool = True,
) -> ProgramTime:
    """How long ``fn(*arg_specs)`` takes on ``target``, from the compiler's own schedule.

    Compiles as :func:`emulate.compiler.compile` does (the target's compile-only device,
    this process's Mosaic compatibility mode), but in a subprocess whose libtpu dumps the
    final bundle schedules (libtpu reads its dump flags once, when it loads; the
    subprocess is kept for later calls), then replays them (see the module docstring).
    ``fn`` must pickle by reference: a module-level function or a ``functools.partial``
    of one.

    Args:
      fn: the function to jit.
      *arg_specs: a pytree per positional argument whose leaves have ``shape`` and
        ``dtype`` (``jax.ShapeDtypeStruct``, arrays, prepared weights).
      target: a TPU target with a compile-only device and a clock (``"tpu_v2"`` ...
        ``"tpu_v7x"``).
      donate_argnums: as :func:`emulate.compiler.compile`'s.
      calibrated: apply the recorded real-chip calibration where the target has one.

    Returns:
      The :class:`ProgramTime`; ``.kernel()`` is its Mosaic kernel (ValueError when it
      has none), ``.seconds`` the whole program.

    Raises:
      CompilerUnavailable: libtpu is not installed or does not load.
      ValueError: a target without a compile-only device or a clock; a
        ``donate_argnums`` past the arguments (as ``jax.jit``).
      TypeError: a leaf of ``arg_specs`` without shape and dtype; a ``fn`` that does not
        pickle by reference; a ``donate_argnums`` that is no int or sequence of ints.
      ProgramRefused: the compiler (or JAX) refused the program; ``.verdict`` says why.
    """
    donated = donate_argnums
    if isinstance(donate_argnums, int):
        donated = (donate_argnums,)
    elif donate_argnums is None:
        donated = ()
    elif isinstance(donate_argnums, (list, tuple)):
        donated = tuple(donate_argnums)
    job = Job(fn, tuple(arg_specs), _targets.get(target).name, donated)  # type: ignore[arg-type]
    (result,) = estimate_many([job], calibrated=calibrated)
    if isinstance(result, Verdict):
        raise ProgramRefused(result)
    return result


_DUMP_TO = re.compile(r"--xla_jf_dump_to=(\S+)")


def dump_directory() -> str | None:
    """The directory this process's libtpu dumps final bundle schedules into (its
    ``LIBTPU_INIT_ARGS`` asks for ``--xla_jf_dump_to=DIR`` with LLO text), or None.
    libtpu reads the variable once, when it loads: set it before anything loads libtpu
    (:func:`dumping_env` gives the environment of a process that dumps)."""
    args = os.environ.get("LIBTPU_INIT_ARGS", "")
    m = _DUMP_TO.search(args)
    return m.group(1) if m and "--xla_jf_dump_llo_text=true" in args else None


def dumping_env(directory: str | os.PathLike[str]) -> dict[str, str]:
    """This process's environment for a subprocess whose libtpu dumps final bundle
    schedules into ``directory`` (this process's Mosaic compatibility setting kept), for
    :func:`estimate_compiled` there."""
    env = child_env(compat_mode(), dump_to=str(directory))
    env.pop(DUMP_VARIABLE, None)
    return env


def estimate_compiled(
    compile_program: Callable[[], Any],
    target: str | _targets.Target,
    *,
    calibrated: bool = True,
) -> tuple[Any, ProgramTime]:
    """Run ``compile_program()`` (which compiles one program for ``target`` with the
    real compiler in this process, as :func:`emulate.compiler.compile` or a
    ``jax.jit(...).lower(...).compile()`` with shardings and layouts of one's own does)
    and estimate that program from the schedules its compile dumped: ``(compiled,
    ProgramTime)``.

    This process's libtpu must dump (:func:`dump_directory`; start it with
    :func:`dumping_env`). JAX's caches are cleared first, so that the program is
    compiled, and dumped, again even where JAX compiled it before.

    Raises:
      RuntimeError: this process's libtpu does not dump, or the compile dumped no
        top-level program.
      Exception: whatever ``compile_program`` raises.
    """
    import jax

    directory = dump_directory()
    if directory is None:
        raise RuntimeError(
            "estimate_compiled: this process's libtpu does not dump its schedules; start "
            "it with emulate.compiler.dumping_env(DIR) (LIBTPU_INIT_ARGS='--xla_jf_dump_to"
            "=DIR --xla_jf_dump_llo_text=true'), or use emulate.compiler.estimate"
        )
    os.makedirs(directory, exist_ok=True)
    before = set(os.listdir(directory))
    jax.clear_caches()
    compiled = compile_program()
    added = sorted(set(os.listdir(directory)) - before)
    cost = compiled.cost_analysis() if hasattr(compiled, "cost_analysis") else None
    if isinstance(cost, list):
        cost = cost[0] if cost else None
    try:
        return compiled, estimate_dump(
            directory, target, files=added, cost=cost, calibrated=calibrated
        )
    finally:
        _remove(Dumped(directory, tuple(added), {}))
