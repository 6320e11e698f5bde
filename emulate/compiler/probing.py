"""The probe: which one-line Pallas matmuls the real compiler compiles, per generation.

:func:`probe` compiles ``o_ref[...] = jnp.dot(x_ref[...], w_ref[...],
preferred_element_type=acc)`` for every offered generation x (lhs, rhs) x accumulator of
:func:`probe_cases`, compatibility mode on and off (one subprocess per setting compiles
every case); :func:`compiles` compiles one such case. The recorded result ships in
``emulate/data/mosaic_probe.json`` and is read by :mod:`emulate.mosaic`, which needs neither
libtpu nor a compiler. :func:`disagreements` sets a probe beside JAX's own table
(``get_tpu_info_for_chip(chip, 1).is_matmul_supported``); :func:`differences` lists the
cases where two probes (a fresh one and the recorded one) differ; :func:`report` says both
in words. Reprobe with ``python -m emulate targets --probe [--out PATH]``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import time
from collections.abc import Sequence
from typing import Any, Final

import jax
import numpy as np

from emulate import formats as _formats
from emulate import targets as _targets
from emulate.compiler.compiling import check_both, check_many
from emulate.compiler.devices import TOPOLOGIES, device, generations, libtpu_version
from emulate.compiler.jobs import Job
from emulate.mosaic import Probe, ProbeCase, ProbeRow, Verdict, natural_accumulator, recorded

__all__ = [
    "Disagreement",
    "compiles",
    "differences",
    "disagreements",
    "probe",
    "probe_cases",
    "report",
]

_PROBE_SHAPE: Final[tuple[int, int]] = (128, 128)
_PROBE_KERNEL = "o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=acc)"


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


def compiles(
    target: str | _targets.Target,
    lhs: _formats.FormatLike,
    rhs: _formats.FormatLike,
    *,
    acc: _formats.FormatLike | None = None,
    compat: bool = False,
) -> Verdict:
    """The real compiler's verdict on the probe's kernel for ``lhs x rhs`` accumulating in
    ``acc`` (default :func:`natural_accumulator`) on ``target``, with compatibility mode
    ``compat`` (default off). The same question :meth:`emulate.targets.Target.compiles`
    answers from the recorded probe; this one compiles (a second, in a subprocess for the
    compat setting other than this process's).

    Raises:
      CompilerUnavailable: libtpu is not installed or does not load.
      ValueError, TypeError: an unknown target or one without a compile-only device; an
        operand or accumulator that is not a format.
    """
    case = ProbeCase.of(_targets.get(target).name, lhs, rhs, acc=acc, compat=compat)
    return check_many([_probe_job(case)], compat=case.compat)[0]


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
    a, b = new.verdicts(), old.verdicts()
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
