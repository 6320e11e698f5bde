"""``emulate.pallas.check``: predict Mosaic's "Unsupported matmul ... type" on any machine.

:func:`check` lowers a function for TPU without a TPU and finds its ``tpu.matmul`` sites in
the Mosaic modules JAX ships (:mod:`emulate.pallas.checking.sites`). Then it decides (each finding's
``basis``, :func:`basis` per target):

- ``"compiler"``: with libtpu installed and a compile-only device for the target
  (:func:`emulate.compiler.generations`), the real XLA:TPU and Mosaic compilers compile the
  program (:func:`emulate.compiler.check_many`; nothing runs), and a refusal is reported
  with Mosaic's own message at the ``tpu.matmul`` it concerns.
- ``"recorded"`` and ``"table"``: otherwise each site is decided by
  :func:`emulate.pallas.checking.findings.diagnose`, that is by
  :meth:`emulate.targets.Target.compiles`: the recorded probe of the real compiler where
  it has the case, else the target's table. A :class:`RecordedRulesWarning` says so once
  per reason per process.

Which matmuls compile only because Mosaic's compatibility mode (``--xla_mosaic_compat_mode``,
on by default) converts them always comes from the recorded probe
(:mod:`emulate.pallas.checking.findings`); which other operations (narrow conversions and
comparisons) need it, from the compiler (:mod:`emulate.pallas.checking.op_rules`), so only with
basis ``"compiler"``. A program with no ``tpu.matmul`` warns why
(:class:`NoMatmulWarning`); :func:`reports` returns what :func:`check` found per job with
the basis actually used (:class:`KernelReport`), for ``emulate check-kernel``.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from emulate import compiler, mosaic, targets
from emulate.pallas.checking import op_rules
from emulate.pallas.checking.findings import (
    COMPAT_ONLY,
    REFUSED,
    Finding,
    compat_only_finding,
    diagnose,
    fix_text,
    matmul_in,
    named_operand,
    refused_note,
    site_finding,
)
from emulate.pallas.checking.sites import (
    DEVICE_KINDS,
    MLIR_FORMATS,
    KernelOp,
    KernelScan,
    LoweringRefused,
    MatmulSite,
    interpreted_kernels,
    matmul_sites,
    scan,
    tpu_target,
    trace_and_lower,
)

__all__ = [
    "COMPAT_ONLY",
    "DEVICE_KINDS",
    "MLIR_FORMATS",
    "REFUSED",
    "Finding",
    "KernelReport",
    "KernelScan",
    "MatmulSite",
    "NoMatmulWarning",
    "RecordedRulesWarning",
    "basis",
    "check",
    "check_many",
    "diagnose",
    "matmul_sites",
    "reports",
]


class RecordedRulesWarning(UserWarning):
    """:func:`check` decided without the real compiler: libtpu is not installed, offers no
    device for the target, or cannot receive the function in a subprocess. Issued once
    per reason per process; each :class:`Finding` also says its ``basis``."""


class NoMatmulWarning(UserWarning):
    """:func:`check` found no ``tpu.matmul`` to check (:attr:`KernelReport.empty`)."""


@dataclasses.dataclass(frozen=True)
class KernelReport:
    """What :func:`reports` found for one ``(fn, args, target)`` job.

    Attributes:
      target: the target name.
      basis: how it was decided: ``"compiler"``, ``"recorded"`` (the compiler was
        unavailable, or could not receive ``fn`` for the other compatibility setting, and
        the recorded probe decided) or ``"table"``.
      compat: the compatibility setting checked.
      matmuls: the ``tpu.matmul`` sites (empty when Pallas refused to lower the program).
      findings: as :func:`check` returns them.
      empty: where ``matmuls`` is empty and Pallas lowered the program, why there is
        nothing to check (a ``pallas_call`` in interpret mode, no kernel, no dot); else "".
    """

    target: str
    basis: str
    compat: bool
    matmuls: tuple[MatmulSite, ...]
    findings: tuple[Finding, ...]
    empty: str = ""


def _why_empty(jaxpr: Any, found: KernelScan) -> str:
    if found.matmuls:
        return ""
    interpreted = interpreted_kernels(jaxpr)
    if interpreted:
        names = "; ".join(interpreted)
        return (
            f"no tpu.matmul to check: the pallas_call of {names} runs in interpret mode "
            "(interpret=...), which turns the kernel into plain XLA operations that Mosaic "
            "never sees; check the kernel with interpret=False"
        )
    if not found.kernels:
        return (
            "no tpu.matmul to check: fn calls no pallas_call (XLA-level dots compile on "
            "every TPU; XLA converts their operands itself)"
        )
    names = ", ".join(repr(n) for n in dict.fromkeys(found.kernels))
    return f"no tpu.matmul to check: the kernels {names} contain no dot"


def _under_target(fn: Callable[..., Any], target: str, *args: Any) -> Any:
    """``fn(*args)`` with ``target`` current: the job :func:`check` hands the compiler
    (module level, so that it pickles by reference for a compat subprocess)."""
    with targets.use_target(target):
        return fn(*args)


# ------------------------------------------------------------------ deciding: which basis

_warned: set[str] = set()


def _say_once(key: str, text: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(text, RecordedRulesWarning, stacklevel=_caller_level())


def _caller_level() -> int:
    """The stacklevel of the first frame outside this module (the caller of check)."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame, level = frame.f_back, level + 1
    return level


def _compiler_here() -> bool:
    """Whether the real compiler runs here (libtpu installed and loads)."""
    return compiler.libtpu_version() is not None and compiler.available()


def _compiler_offers(t: targets.Target) -> bool:
    """Whether the real compiler runs here and has a compile-only device for ``t``."""
    return _compiler_here() and t.name in compiler.generations()


def _without_compiler(t: targets.Target) -> str:
    """``"recorded"`` where the recorded probe covers ``t``, else ``"table"``."""
    return "recorded" if t.name in mosaic.recorded().topologies else "table"


def basis(target: targets.TargetLike) -> str:
    """How :func:`check` decides for ``target`` here: ``"compiler"`` where libtpu is
    installed and offers the target; else ``"recorded"`` where the recorded probe covers
    it; else ``"table"`` (the target's table)."""
    t = tpu_target(target)
    return "compiler" if _compiler_offers(t) else _without_compiler(t)


def _announce(t: targets.Target, how: str) -> None:
    if how == "compiler":
        return
    rules = (
        f"the recorded rules (libtpu {mosaic.recorded().libtpu})"
        if how == "recorded"
        else "the target's table (the recorded probe has no verdicts for it)"
    )
    rules += "; operations other than tpu.matmul (narrow conversions) are not checked"
    if not _compiler_here():
        _say_once(
            "no-libtpu",
            "emulate.pallas.check: the real TPU compiler is not available here (pip install "
            f"'jax[tpu]'); deciding by {rules}",
        )
    else:
        _say_once(
            f"no-topology:{t.name}",
            f"emulate.pallas.check: libtpu {compiler.libtpu_version()} offers no compile-only "
            f"device for {t.name}; deciding by {rules}",
        )


# ------------------------------------------------------------------ the compiler's verdict

# The operation a compiler error prints after "The MLIR operation involved:".
_PRINTED_OP = re.compile(r'"(\w+)\.(\w+)"\(.*:\s*\(([^()]*)\)\s*->\s*(\S+)')


def _elements(types: Sequence[str]) -> tuple[str, ...]:
    return tuple(t.rsplit("x", 1)[-1].rstrip(">") if t.startswith("vector<") else t for t in types)


def _one_place(candidates: Sequence[Any], what: str) -> tuple[Any, str]:
    """The first candidate when all share one source line; else None and a note that
    lists the lines."""
    places = list(dict.fromkeys(c.location for c in candidates))
    if len(places) == 1:
        return candidates[0], ""
    if not candidates:
        return None, ""
    return None, (
        f"the error concerns one of {len(candidates)} {what} with these element types, at "
        + ", ".join(str(p) for p in places)
    )


def site_of(verdict: mosaic.Verdict, found: KernelScan) -> tuple[MatmulSite | KernelOp | None, str]:
    """The site a compiler error concerns, and a note where it is ambiguous: the
    ``tpu.matmul`` the error prints (by its operand and accumulator types; Mosaic prints
    the op after tiling, so by element types where no shape matches, placed when all such
    sites share one source line), else the other operation it prints (by name and element
    types), else the site whose operand type the message names, else the only site."""
    sites = list(found.matmuls)
    printed = matmul_in(verdict.detail)
    if printed:
        exact = [s for s in sites if (s.lhs_type, s.rhs_type, s.acc_type) == printed]
        same = [
            s
            for s in sites
            if _elements((s.lhs_type, s.rhs_type, s.acc_type)) == _elements(printed)
        ]
        site, note = _one_place(exact or same, "tpu.matmul")
        if site is not None or note:
            return site, note
    else:
        m = _PRINTED_OP.search(verdict.detail)
        if m and (m.group(1), m.group(2)) != ("tpu", "matmul"):
            operands = [x.strip() for x in m.group(3).split(", ") if x.strip()]
            want = (_elements(operands[:1]), _elements([m.group(4)]))
            ops = [
                op
                for op in found.ops
                if op.name.split(".", 1)[-1] == m.group(2)
                and (_elements(op.operand_types[:1]), _elements(op.result_types[:1])) == want
            ]
            site, note = _one_place(ops, m.group(2))
            if site is not None or note:
                return site, note
    named = named_operand(verdict.message)
    for s in sites:
        vtypes = {"LHS": [s.lhs_type], "RHS": [s.rhs_type]}.get(named, [s.lhs_type, s.rhs_type])
        if any(re.search(rf"\b{re.escape(v)}", verdict.message) for v in vtypes):
            return s, ""
    if len(sites) == 1 and verdict.stage == "compile" and not _PRINTED_OP.search(verdict.detail):
        return sites[0], ""
    return None, ""


def _op_findings(t: targets.Target, found: KernelScan, skip: object) -> list[Finding]:
    """Compat-only findings for the non-matmul operations (the real compiler decides)."""
    try:
        ops = op_rules.compat_only_ops(found.ops, t)
    except (compiler.CompilerUnavailable, TypeError, ValueError) as e:
        _say_once(
            "no-op-rules",
            f"emulate.pallas.check: cannot check operations other than tpu.matmul ({e})",
        )
        return []
    return [
        Finding(t.name, op, "", message, op_rules.op_fix(op), op_rules.op_cost(op), COMPAT_ONLY)
        for op, message in ops
        if op is not skip
    ]


def _op_compat_only(op: KernelOp, t: targets.Target) -> bool:
    """Whether the compiler compiles ``op`` alone with compatibility mode on, not off."""
    try:
        return any(found is op for found, _ in op_rules.compat_only_ops([op], t))
    except (compiler.CompilerUnavailable, TypeError, ValueError):
        return False


def compiler_findings(
    t: targets.Target,
    verdict: mosaic.Verdict,
    found: KernelScan,
    compat: bool,
    refused: LoweringRefused | None,
) -> list[Finding]:
    results: list[Finding] = []
    refused_site: MatmulSite | KernelOp | None = None
    if not verdict.ok:
        refused_site, ambiguous = site_of(verdict, found)
        if isinstance(refused_site, KernelOp):
            note = ""
            if not compat and _op_compat_only(refused_site, t):
                note = "compiles with compatibility mode on (the default), where " + (
                    op_rules.op_cost(refused_site)
                )
        else:
            note = refused_note(t, refused_site, compat)
        results.append(
            Finding(
                target=t.name,
                site=refused_site,
                operand=named_operand(verdict.message),
                message=verdict.message,
                fix=fix_text(t, refused_site, verdict.message, verdict.detail),
                note="; ".join(n for n in (note, ambiguous) if n),
                location=refused.location if refused and refused_site is None else None,
            )
        )
    if compat:
        for s in found.matmuls:
            if s is not refused_site and (f := compat_only_finding(t, s, "compiler")):
                results.append(f)
        results += _op_findings(t, found, refused_site)
    return results


def _lowering_finding(t: targets.Target, refused: LoweringRefused, how: str) -> Finding:
    error = refused.error
    message = compiler.first_line(str(error)) or type(error).__name__
    return Finding(
        t.name,
        None,
        named_operand(message),
        message,
        fix_text(t, None, message, str(error)),
        basis=how,
        location=refused.location,
    )


Job = tuple[Callable[..., Any], Sequence[Any], targets.TargetLike]


def reports(jobs: Sequence[Job], *, compat: bool = True) -> list[KernelReport]:
    """A :class:`KernelReport` for each ``(fn, args, target)`` job, in order, compiling
    them together: one compiler subprocess for all the jobs when ``compat`` differs from
    this process's compatibility mode (:func:`emulate.compiler.check_many`). Warns as
    :func:`check` does when it falls back to the recorded rules; raises as it does."""
    prepared = []
    for fn, args, target in jobs:
        t = tpu_target(target)
        try:
            jaxpr, lowered = trace_and_lower(fn, tuple(args), t)
            found, refused = scan(lowered), None
            empty = _why_empty(jaxpr, found)
        except LoweringRefused as e:
            found, refused, empty = KernelScan((), (), ()), e, ""
        prepared.append((fn, tuple(args), t, found, refused, empty))
    how = [basis(p[2]) for p in prepared]
    todo = [i for i, h in enumerate(how) if h == "compiler"]
    verdicts: dict[int, Any] = {}
    announced: set[int] = set()
    if todo:
        cjobs = [
            compiler.Job(
                functools.partial(_under_target, prepared[i][0], prepared[i][2].name),
                prepared[i][1],
                prepared[i][2].name,
            )
            for i in todo
        ]
        try:
            verdicts = dict(zip(todo, compiler.check_many(cjobs, compat=compat), strict=True))
        except (TypeError, compiler.CompilerUnavailable) as e:
            _say_once(
                "no-subprocess",
                f"emulate.pallas.check: cannot compile with compat={compat} ({e}); deciding "
                "by the recorded rules",
            )
            announced.update(todo)
            for i in todo:
                how[i] = _without_compiler(prepared[i][2])
    if compat and verdicts:
        # every kernel's non-matmul operations in one compile (per setting), not one each
        try:
            op_rules.prefetch([(prepared[i][3].ops, prepared[i][2]) for i in verdicts])
        except (compiler.CompilerUnavailable, TypeError, ValueError):
            pass  # each kernel's _op_findings says why, once
    results = []
    for i, (_, _, t, found, refused, empty) in enumerate(prepared):
        if i in verdicts:
            findings = compiler_findings(t, verdicts[i], found, compat, refused)
        else:
            if i not in announced:
                _announce(t, how[i])
            if refused is not None:
                findings = [_lowering_finding(t, refused, how[i])]
            else:
                each = (site_finding(t, s, compat) for s in found.matmuls)
                findings = [f for f in each if f is not None]
        results.append(KernelReport(t.name, how[i], compat, found.matmuls, tuple(findings), empty))
    return results


def check_many(jobs: Sequence[Job], *, compat: bool = True) -> list[list[Finding]]:
    """:func:`check` for each ``(fn, args, target)`` job, in order, compiling them together:
    one compiler subprocess for all the jobs when ``compat`` differs from this process's
    compatibility mode (:func:`emulate.compiler.check_many`)."""
    found = reports(jobs, compat=compat)
    for r in found:
        if r.empty:
            warnings.warn(f"{r.target}: {r.empty}", NoMatmulWarning, stacklevel=_caller_level())
    return [list(r.findings) for r in found]


def check(
    fn: Callable[..., Any],
    *args: Any,
    target: targets.TargetLike = None,
    compat: bool = True,
) -> list[Finding]:
    """Compile ``fn(*args)`` for the TPU ``target`` and report what the compiler refuses,
    and the matmuls that compile only because compatibility mode converts them.

    How it decides (each finding's ``basis``): with libtpu installed and a compile-only
    device for the target (:func:`emulate.compiler.generations`), the real XLA:TPU and
    Mosaic compilers compile the program (nothing runs) and a refusal is reported with
    Mosaic's own message at the ``tpu.matmul`` it concerns. Otherwise the recorded probe
    decides per site (:meth:`emulate.targets.Target.compiles`: lhs, rhs and accumulator
    element types, and ``compat``; the message is the probe's, of its 128x128 kernel), or
    the target's table for a target or case the probe lacks; a
    :class:`RecordedRulesWarning` says so once per process. Which matmuls are compat-only
    always comes from the recorded probe.

    Args:
      fn: a function that calls ``pallas_call`` (directly or through jit, vmap, ...).
      *args: its arguments, as arrays or ``jax.ShapeDtypeStruct``.
      target: a TPU target name or Target; default the current target, which must be a
        TPU. It is the current target while ``fn`` is traced, and JAX's device is that
        TPU while ``fn`` is traced and lowered (``pltpu.get_tpu_info()`` answers for it).
      compat: Mosaic's compatibility mode (``--xla_mosaic_compat_mode``, on by default).
        The setting other than this process's compiles in a subprocess, which needs
        ``fn`` to pickle by reference (a module-level function); otherwise the recorded
        rules decide.

    Returns:
      The findings, refusals first: the compiler stops at its first error, so at most one
      ``"refused"`` finding comes from it (the recorded rules report every refused site);
      then one ``"compat-only"`` finding per such site (only with ``compat``). Empty when
      everything compiles natively. ``str(finding)`` reads like the compiler's error
      plus the source line and the fix.

    Raises:
      TypeError: ``fn`` is not callable.
      ValueError: an unknown or non-TPU target.
      Exception: whatever ``fn`` raises while it is traced. (A program JAX or Pallas
        refuses to lower for TPU is a finding with no site, not an exception.)
    """
    return check_many([(fn, args, target)], compat=compat)[0]
