"""What Mosaic, the TPU kernel compiler, accepts: the recorded probe of the real compiler.

:mod:`emulate.compiler` compiles a one-line Pallas matmul
``o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=acc)`` for every
TPU generation the installed libtpu offers, operand pair and accumulator, with Mosaic's
compatibility mode on and off, and records each verdict. This module holds those records
and the copy shipped with the package (``emulate/data/mosaic_probe.json``), so that the
target profiles (:mod:`emulate.targets`), the plans and the kernel check read the
compiler's own rules without a compiler: it needs neither JAX nor libtpu.

A pair is *native* on a generation when it compiles with compatibility mode off at its
natural accumulator (:func:`natural_accumulator`): Mosaic converted nothing. A pair that
compiles only with compatibility mode on was converted by the compiler (int8 to bf16 with
an f32 sum on a TPU v7x, say), which a polyfill must not rely on.

:func:`verdict` is the one reading of a recorded verdict: ``lhs x rhs`` accumulating in
``acc`` on a target, compat on or off. :meth:`emulate.targets.Target.compiles` answers the
same question for any target (from these records where they have the case, else from the
profile's table), and :func:`emulate.compiler.compiles` asks the real compiler.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from emulate import formats, tables

__all__ = [
    "PROBE_PATH",
    "Probe",
    "ProgramFacts",
    "ProbeCase",
    "ProbeRow",
    "Verdict",
    "compat_only_pairs",
    "native_pairs",
    "natural_accumulator",
    "recorded",
    "render",
    "verdict",
]

#: The recorded probe shipped with the package.
PROBE_PATH: Final[Path] = Path(__file__).parent / "data" / "mosaic_probe.json"

_FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class ProgramFacts:
    """What a compiled TPU program holds, read from its HLO text and buffer assignment.

    Attributes:
      tpu_custom_calls: the ``tpu_custom_call`` instructions (Pallas / Mosaic kernels).
      xla_contractions: the ``dot(`` and ``convolution(`` instructions XLA:TPU kept.
      temp_bytes: the program's temporary buffers, bytes (``memory_analysis()``'s
        ``temp_size_in_bytes``; -1 where the compiler gives no memory analysis).
    """

    tpu_custom_calls: int
    xla_contractions: int
    temp_bytes: int


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the compiler (or JAX before it) said about one program.

    Attributes:
      ok: True when the program compiled.
      stage: ``""`` when ok; ``"lower"`` when JAX or Pallas refused it before the compiler
        ran (uint8 operands of a Pallas dot, say); ``"compile"`` when XLA:TPU or Mosaic
        refused it; ``"crash"`` when the compiling process died.
      message: the first meaningful line of the error, without the boilerplate prefixes
        ``INTERNAL:`` and ``Mosaic failed to compile TPU kernel:``; ``""`` when ok.
      detail: the whole error text (not compared, not recorded by the probe).
      program: the compiled program's facts when ok and compiled by
        :mod:`emulate.compiler` (not compared, not recorded by the probe); else None.
    """

    ok: bool
    stage: str = ""
    message: str = ""
    detail: str = dataclasses.field(default="", compare=False, repr=False)
    program: ProgramFacts | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def verdict(self) -> str:
        """``"compiles"`` or ``"refused"``."""
        return "compiles" if self.ok else "refused"


@dataclasses.dataclass(frozen=True, order=True)
class ProbeCase:
    """One probe compile: ``lhs x rhs`` with accumulator ``acc`` on ``target``."""

    target: str
    lhs: str
    rhs: str
    acc: str
    compat: bool

    @classmethod
    def of(
        cls,
        target: str,
        lhs: formats.FormatLike,
        rhs: formats.FormatLike,
        *,
        acc: formats.FormatLike | None = None,
        compat: bool = False,
    ) -> ProbeCase:
        """The case for formats given as names, aliases or dtypes; ``acc`` defaults to
        :func:`natural_accumulator`. ValueError or TypeError (naming ``lhs``, ``rhs`` or
        ``acc``) for one that is not a format."""
        lhs_name, rhs_name = _format_name("lhs", lhs), _format_name("rhs", rhs)
        natural = natural_accumulator(lhs_name, rhs_name)
        acc_name = natural if acc is None else _format_name("acc", acc)
        return cls(target, lhs_name, rhs_name, acc_name, bool(compat))


@dataclasses.dataclass(frozen=True)
class ProbeRow:
    """A probe case and the compiler's verdict on it."""

    case: ProbeCase
    verdict: Verdict


@dataclasses.dataclass(frozen=True)
class Probe:
    """A full probe: the verdicts and the versions they were measured with.

    Attributes:
      libtpu, jax, jaxlib: versions of the compiler and of JAX.
      shape: the operands' shape (both ``shape``; the output too).
      kernel: the kernel body that was compiled.
      seconds: wall-clock time of the whole probe.
      topologies: the target -> topology names that were compiled for.
      rows: one row per case, sorted by case.
    """

    libtpu: str
    jax: str
    jaxlib: str
    shape: tuple[int, int]
    kernel: str
    seconds: float
    topologies: Mapping[str, str]
    rows: tuple[ProbeRow, ...]

    def lookup(self, case: ProbeCase) -> Verdict:
        """The verdict of ``case``; KeyError if it was not probed."""
        return self.verdicts()[case]

    def verdicts(self) -> Mapping[ProbeCase, Verdict]:
        """Every probed case and its verdict (built once per probe, then cached)."""
        index: dict[ProbeCase, Verdict] | None = self.__dict__.get("_index_cache")
        if index is None:
            index = {r.case: r.verdict for r in self.rows}
            object.__setattr__(self, "_index_cache", index)
        return index

    def to_json(self) -> str:
        """The JSON text :meth:`from_json` reads: messages deduplicated, one row a line."""
        messages: list[tuple[str, str]] = []
        where: dict[tuple[str, str], int] = {}
        rows = []
        for r in self.rows:
            c, v = r.case, r.verdict
            ref = None
            if not v.ok:
                key = (v.stage, v.message)
                ref = where.setdefault(key, len(messages))
                if ref == len(messages):
                    messages.append(key)
            rows.append([c.target, c.lhs, c.rhs, c.acc, c.compat, ref])
        head = {
            "format": _FORMAT_VERSION,
            "libtpu": self.libtpu,
            "jax": self.jax,
            "jaxlib": self.jaxlib,
            "shape": list(self.shape),
            "kernel": self.kernel,
            "seconds": round(self.seconds, 1),
            "topologies": dict(self.topologies),
            "row_fields": ["target", "lhs", "rhs", "acc", "compat", "message (null: compiles)"],
        }
        lines = ["{"] + [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
        lines.append(' "messages": [')
        lines += [
            f"  {json.dumps({'stage': s, 'message': m})}{',' if i < len(messages) - 1 else ''}"
            for i, (s, m) in enumerate(messages)
        ]
        lines.append(" ],")
        lines.append(' "rows": [')
        lines += [
            f"  {json.dumps(r)}{',' if i < len(rows) - 1 else ''}" for i, r in enumerate(rows)
        ]
        lines.append(" ]")
        lines.append("}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Probe:
        """Read :meth:`to_json`'s text. ValueError for another format version."""
        data = json.loads(text)
        if data.get("format") != _FORMAT_VERSION:
            raise ValueError(
                f"probe: expected format {_FORMAT_VERSION}, got {data.get('format')!r}"
            )
        messages = [Verdict(False, m["stage"], m["message"]) for m in data["messages"]]
        rows = tuple(
            ProbeRow(
                ProbeCase(t, lhs, rhs, acc, bool(compat)),
                Verdict(True) if ref is None else messages[ref],
            )
            for t, lhs, rhs, acc, compat, ref in data["rows"]
        )
        return cls(
            libtpu=data["libtpu"],
            jax=data["jax"],
            jaxlib=data["jaxlib"],
            shape=(int(data["shape"][0]), int(data["shape"][1])),
            kernel=data["kernel"],
            seconds=float(data["seconds"]),
            topologies=dict(data["topologies"]),
            rows=rows,
        )


def natural_accumulator(lhs: str, rhs: str) -> str:
    """``"int32"`` for two integer operands, ``"float32"`` otherwise (the accumulator of a
    native dot, :func:`emulate.formats.dot_accumulator`)."""
    return formats.dot_accumulator(lhs, rhs)


@functools.cache
def recorded() -> Probe:
    """The probe shipped with the package (``emulate/data/mosaic_probe.json``), cached.

    Needs neither libtpu nor a compiler. Its ``libtpu`` and ``jax`` fields say what it was
    measured with.
    """
    return Probe.from_json(PROBE_PATH.read_text(encoding="utf-8"))


def _format_name(arg: str, fmt: formats.FormatLike) -> str:
    return formats.get(fmt, arg=arg).name


def verdict(
    target: str,
    lhs: formats.FormatLike,
    rhs: formats.FormatLike,
    *,
    acc: formats.FormatLike | None = None,
    compat: bool = False,
    probe: Probe | None = None,
) -> Verdict | None:
    """The recorded verdict for ``lhs x rhs`` accumulating in ``acc`` on ``target``, with
    Mosaic's compatibility mode ``compat``; None where the probe has no such case (a target
    it did not probe, a pair or accumulator outside
    :func:`emulate.compiler.probe_cases`).

    Args:
      target: a canonical TPU target name (``"tpu_v5e"``; :meth:`Target.compiles
        <emulate.targets.Target.compiles>` takes aliases and Targets).
      lhs, rhs: formats as names, aliases or dtypes.
      acc: the accumulator format; default :func:`natural_accumulator`.
      compat: the compatibility-mode setting; default off (what a native pair needs).
      probe: read this probe instead of :func:`recorded`.

    Raises:
      ValueError, TypeError: an operand or accumulator that is not a format (the message
        names ``lhs``, ``rhs`` or ``acc``).
    """
    case = ProbeCase.of(target, lhs, rhs, acc=acc, compat=compat)
    return (probe or recorded()).verdicts().get(case)


def _pairs(target: str, probe: Probe | None, compat: bool) -> frozenset[tuple[str, str]]:
    """The probed pairs of ``target`` that compile at their natural accumulator."""
    data = probe or recorded()
    pairs = {(r.case.lhs, r.case.rhs) for r in data.rows if r.case.target == target}
    return frozenset(
        p for p in pairs if (v := verdict(target, *p, compat=compat, probe=data)) and v.ok
    )


def native_pairs(target: str, probe: Probe | None = None) -> frozenset[tuple[str, str]] | None:
    """The (lhs, rhs) format pairs that compile on ``target`` (a canonical TPU target name)
    with compatibility mode off at their natural accumulator; None when the probe has no
    verdicts for ``target`` (a generation the probing libtpu offered no device for)."""
    data = probe or recorded()
    if target not in data.topologies:
        return None
    return _pairs(target, data, compat=False)


def compat_only_pairs(target: str, probe: Probe | None = None) -> frozenset[tuple[str, str]] | None:
    """The pairs that compile on ``target`` only because compatibility mode converts them
    (natural accumulator); None when the probe has no verdicts for ``target``."""
    data = probe or recorded()
    if target not in data.topologies:
        return None
    return _pairs(target, data, compat=True) - _pairs(target, data, compat=False)


def render(probe: Probe | None = None) -> str:
    """The probe as a plain-text table: one row per probed pair at its natural accumulator,
    one column per generation; ``N`` compiles with compatibility mode off, ``c`` only with
    it on (the compiler converted the operands), ``-`` refused. A legend follows."""
    data = probe or recorded()
    targets = list(data.topologies)
    verdicts: dict[tuple[str, str, str, bool], Verdict] = {}
    pairs: dict[tuple[str, str], None] = {}
    for r in data.rows:
        c = r.case
        if c.acc == natural_accumulator(c.lhs, c.rhs):
            verdicts[c.target, c.lhs, c.rhs, c.compat] = r.verdict
            pairs[c.lhs, c.rhs] = None

    def cell(t: str, lhs: str, rhs: str) -> str:
        off, on = verdicts.get((t, lhs, rhs, False)), verdicts.get((t, lhs, rhs, True))
        if off is not None and off.ok:
            return "N"
        return "c" if on is not None and on.ok else "-"

    rows = [
        {
            "lhs x rhs": f"{tables.short_format(a)} x {tables.short_format(b)}",
            **{tables.short_target(t): cell(t, a, b) for t in targets},
        }
        for a, b in pairs
    ]
    legend = (
        f"libtpu {data.libtpu}, jax {data.jax}; one {data.shape[0]}x{data.shape[1]} Pallas "
        "matmul per cell,\nnatural accumulator (int32 for two integers, else f32). N: compiles "
        "with compatibility\nmode off; c: compiles only with it on (the compiler converts the "
        "operands); -: refused."
    )
    return tables.table(rows, rule=False) + "\n\n" + legend + "\n"
