"""``emulate.pallas.check``: predict Mosaic's "Unsupported matmul ... type" on any machine.

:func:`check` lowers a function for TPU without a TPU and finds its ``tpu.matmul`` sites in
the Mosaic modules JAX ships (:mod:`emulate.pallas.sites`). Then it decides (each finding's
``basis``, :func:`basis` per target):

- ``"compiler"``: with libtpu installed and a compile-only device for the target
  (:func:`emulate.compiler.generations`), the real XLA:TPU and Mosaic compilers compile the
  program (:func:`emulate.compiler.check_many`; nothing runs), and a refusal is reported
  with Mosaic's own message at the ``tpu.matmul`` it concerns.
- ``"recorded"`` and ``"table"``: otherwise each site is decided by
  :func:`emulate.pallas.findings.diagnose`, that is by
  :meth:`emulate.targets.Target.compiles`: the recorded probe of the real compiler where
  it has the case, else the target's table. A :class:`RecordedRulesWarning` says so once
  per reason per process.

Which sites compile only because Mosaic's compatibility mode (``--xla_mosaic_compat_mode``,
on by default) converts them always comes from the recorded probe
(:mod:`emulate.pallas.findings`).
"""

from __future__ import annotations

import functools
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from emulate import compiler, mosaic, targets
from emulate.pallas.findings import (
    COMPAT_ONLY,
    REFUSED,
    Finding,
    compat_only_finding,
    diagnose,
    fix_text,
    named_operand,
    refused_note,
    site_finding,
)
from emulate.pallas.sites import (
    DEVICE_KINDS,
    MLIR_FORMATS,
    LoweringRefused,
    MatmulSite,
    element_format,
    lower,
    matmul_sites,
    sites_of,
    tpu_target,
)

__all__ = [
    "COMPAT_ONLY",
    "DEVICE_KINDS",
    "MLIR_FORMATS",
    "REFUSED",
    "Finding",
    "MatmulSite",
    "RecordedRulesWarning",
    "basis",
    "check",
    "check_many",
    "diagnose",
    "matmul_sites",
]


class RecordedRulesWarning(UserWarning):
    """:func:`check` decided without the real compiler: libtpu is not installed, offers no
    device for the target, or cannot receive the function in a subprocess. Issued once
    per reason per process; each :class:`Finding` also says its ``basis``."""


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

# The op as Mosaic prints it: operands, then any attributes (``<{dimension_numbers = ...,
# transpose_lhs = false}>``), then `` : (lhs, rhs, acc) -> result``.
_OPERATION_TYPES = re.compile(r'"tpu\.matmul"\(.*:\s*\(([^()]*)\)\s*->')


def _site_of(verdict: mosaic.Verdict, sites: list[MatmulSite]) -> MatmulSite | None:
    """The site a compiler error concerns: the ``tpu.matmul`` the error text shows (by its
    operand types), else the one whose operand type the message names, else the only
    site; None when none can be told."""
    m = _OPERATION_TYPES.search(verdict.detail)
    if m:
        types = tuple(x.strip() for x in m.group(1).split(", "))
        for s in sites:
            if (s.lhs_type, s.rhs_type, s.acc_type) == types[:3]:
                return s
        same = [s for s in sites if (s.lhs, s.rhs) == tuple(map(element_format, types[:2]))]
        if len({(s.lhs_type, s.rhs_type, s.acc_type) for s in same}) == 1:
            return same[0]  # Mosaic reports the op after tiling: same types, other shape
    named = named_operand(verdict.message)
    for s in sites:
        vtypes = {"LHS": [s.lhs_type], "RHS": [s.rhs_type]}.get(named, [s.lhs_type, s.rhs_type])
        if any(re.search(rf"\b{re.escape(v)}", verdict.message) for v in vtypes):
            return s
    if len(sites) == 1 and verdict.stage == "compile":
        return sites[0]
    return None


def _from_compiler(
    t: targets.Target, verdict: mosaic.Verdict, sites: list[MatmulSite], compat: bool
) -> list[Finding]:
    found: list[Finding] = []
    refused_site = None
    if not verdict.ok:
        refused_site = _site_of(verdict, sites)
        found.append(
            Finding(
                target=t.name,
                site=refused_site,
                operand=named_operand(verdict.message),
                message=verdict.message,
                fix=fix_text(t, refused_site),
                note=refused_note(t, refused_site, compat),
            )
        )
    if compat:
        for s in sites:
            if s is not refused_site and (f := compat_only_finding(t, s, "compiler")):
                found.append(f)
    return found


def _lowering_finding(t: targets.Target, error: Exception, how: str) -> Finding:
    message = compiler.first_line(str(error)) or type(error).__name__
    return Finding(t.name, None, named_operand(message), message, fix_text(t, None), basis=how)


Job = tuple[Callable[..., Any], Sequence[Any], targets.TargetLike]


def check_many(jobs: Sequence[Job], *, compat: bool = True) -> list[list[Finding]]:
    """:func:`check` for each ``(fn, args, target)`` job, in order, compiling them together:
    one compiler subprocess for all the jobs when ``compat`` differs from this process's
    compatibility mode (:func:`emulate.compiler.check_many`)."""
    prepared = []
    for fn, args, target in jobs:
        t = tpu_target(target)
        try:
            sites, refused = sites_of(lower(fn, tuple(args), t)), None
        except LoweringRefused as e:
            sites, refused = [], e.error
        prepared.append((fn, tuple(args), t, sites, refused))
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
    results = []
    for i, (_, _, t, sites, refused) in enumerate(prepared):
        if i in verdicts:
            results.append(_from_compiler(t, verdicts[i], sites, compat))
            continue
        if i not in announced:
            _announce(t, how[i])
        if refused is not None:
            results.append([_lowering_finding(t, refused, how[i])])
            continue
        found = (site_finding(t, s, compat) for s in sites)
        results.append([f for f in found if f is not None])
    return results


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
