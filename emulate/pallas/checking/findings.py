"""What Mosaic says about a ``tpu.matmul`` site, and what to do about it.

A :class:`Finding` is a site the target's TPU compiler refuses (kind ``"refused"``), or one
that compiles only because Mosaic's compatibility mode converts it (``"compat-only"``),
with the compiler's message, the fix (:func:`emulate.pallas.dot` or
:func:`emulate.pallas.matmul`, by the kernel route of :mod:`emulate.pallas.compute`) and what
the conversion costs. :func:`diagnose` decides one site without a compiler, by
:meth:`emulate.targets.Target.compiles`: the recorded probe of the real compiler, per
(lhs, rhs, accumulator) element types and compat setting (``basis="recorded"``), and the
target's table where the probe has no such case (``basis="table"``: the pair must be
native, and with compatibility mode off both operands of one type). Where the table
decides, the message is the one Mosaic gives for an unsupported operand; the compiler's
own rule for which operand it names is not public: it names the RHS when both operands have
the same type or the LHS type is a valid LHS on the target (int8 x int8 on a TPU v4 or v7x:
``Unsupported matmul RHS type on target: 'vector<256x256xi8>'``, as reported from real
chips), and the LHS otherwise.
"""

from __future__ import annotations

import dataclasses
import re

from emulate import formats, mosaic, targets
from emulate.mosaic import Verdict
from emulate.pallas.checking.sites import KernelOp, MatmulSite, acc_format, tpu_target

__all__ = [
    "COMPAT_ONLY",
    "MIXED_TYPES",
    "REFUSED",
    "Finding",
    "compat_only_finding",
    "conversion_cost",
    "diagnose",
    "accumulator_fix",
    "fix_text",
    "matmul_in",
    "named_operand",
    "refused_note",
    "site_finding",
]

#: The kinds of :class:`Finding`.
REFUSED = "refused"
COMPAT_ONLY = "compat-only"

#: Mosaic's message for a mixed pair with compatibility mode off.
MIXED_TYPES = "Mosaic matmul invoked with mixed element types, but compatibility mode is disabled."


@dataclasses.dataclass(frozen=True)
class Finding:
    """A ``tpu.matmul`` (or a kernel) that the target's TPU compiler refuses, or one that
    compiles only because Mosaic's compatibility mode converts it.

    Attributes:
      target: the target name.
      site: the :class:`MatmulSite` the message concerns, the :class:`KernelOp` where it
        concerns another operation (a narrow conversion that needs compatibility mode), or
        None where no one site can be told (a kernel Pallas refuses to lower for TPU;
        several candidate sites, listed in ``note``).
      operand: ``"LHS"`` or ``"RHS"`` where the message names an operand, else ``""``.
      message: the compiler's own first line: for kind ``"refused"`` what it said with the
        checked compatibility setting (``"E2001: CompileTimeMosaicUnsupportedRhsType:
        Unsupported matmul RHS type on target: vector<256x256xi8>"``); for kind
        ``"compat-only"`` what it says with compatibility mode off.
      fix: what to change.
      note: more context: for ``"compat-only"``, what the conversion costs numerically;
        for ``"refused"`` with compatibility mode off, what turning it on would do.
      kind: ``"refused"`` (does not compile with the checked setting) or
        ``"compat-only"`` (compiles only because compatibility mode converts it).
      basis: ``"compiler"`` (the real compiler compiled the program), ``"recorded"``
        (the recorded probe, :func:`emulate.mosaic.verdict`), or ``"table"`` (the
        target's table: a target or case that neither the installed libtpu nor the probe
        covers).
      location: ``"path/to/file.py:12"``, the user's source line where ``site`` is None
        (from the traceback of a refusal to lower), else the site's.
    """

    target: str
    site: MatmulSite | KernelOp | None
    operand: str
    message: str
    fix: str
    note: str = ""
    kind: str = REFUSED
    basis: str = "compiler"
    location: str | None = None

    def __post_init__(self) -> None:
        if self.site is not None and self.location is None:
            object.__setattr__(self, "location", self.site.location)

    def __str__(self) -> str:
        site = self.site
        where = self.location or "<unknown location>"
        what = f"kernel {site.kernel!r}" if site else "the program"
        if self.kind == COMPAT_ONLY:
            head = (
                f"{where}: {what} on {self.target}: compiles only in Mosaic's compatibility "
                f"mode (with it off: {self.message})"
            )
        else:
            head = (
                f"{where}: {what} on {self.target}: Mosaic failed to compile TPU kernel: "
                f"{self.message}"
            )
        lines = [head]
        if isinstance(site, MatmulSite):
            lines.append(f"  tpu.matmul {site.lhs_type}, {site.rhs_type} -> {site.acc_type}")
        elif site is not None:
            lines.append(
                f"  {site.name} {', '.join(site.operand_types)} -> {', '.join(site.result_types)}"
            )
        lines.append(f"  fix: {self.fix}")
        if self.note:
            lines.append(f"  note: {self.note}")
        return "\n".join(lines)


def _is_int(fmt: str | None) -> bool:
    return fmt is not None and formats.get(fmt).is_integer


def named_operand(message: str) -> str:
    """``"LHS"`` or ``"RHS"`` where a compiler message names one operand's type, else ``""``."""
    m = re.search(r"\b(LHS|RHS|lhs|rhs) type\b", message)
    return m.group(1).upper() if m and "lhs/rhs" not in message else ""


_ACC_32 = ("i32>", "f32>")
_OPERATION = re.compile(r'"tpu\.matmul"\(.*:\s*\(([^()]*)\)\s*->')


def matmul_in(text: str) -> tuple[str, str, str] | None:
    """The (lhs, rhs, acc) MLIR types of the ``tpu.matmul`` a compiler or Pallas error
    prints (``"tpu.matmul"(...) <{...}> : (lhs, rhs, acc) -> result``), or None."""
    m = _OPERATION.search(text)
    if m is None:
        return None
    types = tuple(x.strip() for x in m.group(1).split(", "))
    return (types[0], types[1], types[2]) if len(types) >= 3 else None


def accumulator_fix(acc_type: str) -> str:
    """The fix for a ``tpu.matmul`` whose accumulator is not 32-bit (a dot without
    ``preferred_element_type``, summing bf16 operands in bf16)."""
    return (
        f"pass preferred_element_type=jnp.float32 to this dot (jnp.int32 for integer "
        f"operands) and cast the result afterwards: Mosaic's matmul accumulates in 32 bits, "
        f"and this one asks for {acc_format(acc_type) or acc_type}"
    )


def fix_text(
    t: targets.Target, site: MatmulSite | KernelOp | None, message: str = "", detail: str = ""
) -> str:
    """What to change at ``site`` (None: a finding without a site; ``message`` and
    ``detail``, the compiler's or Pallas's text, then tell the cause) on ``t``: one fix
    per cause (the accumulator type, the operand types, a non-matmul operation)."""
    from emulate.pallas import compute
    from emulate.pallas.checking import op_rules

    if isinstance(site, KernelOp):
        return op_rules.op_fix(site)
    generic = (
        "convert the operands to a pair the target runs (bfloat16 or float32) before the "
        "dot, or use emulate.pallas.matmul"
    )
    if site is None:
        printed = matmul_in(detail) or matmul_in(message)
        if printed and not printed[2].endswith(_ACC_32):
            return accumulator_fix(printed[2])
        if "acc to be 32-bit" in message:
            return accumulator_fix("a narrower type")
        return "see the message; " + generic
    if not site.acc_type.endswith(_ACC_32):
        return accumulator_fix(site.acc_type)
    acc = "int32" if site.acc_type.endswith("i32>") else "float32"
    try:
        if site.lhs is None or site.rhs is None:  # an element type with no format (i32)
            raise ValueError("no format")
        r = compute.in_kernel(site.lhs, site.rhs, target=t, preferred_element_type=acc)
    except (TypeError, ValueError, NotImplementedError):
        return generic
    how = "exact" if r.exact else 'within the bound of mode "fast"'
    return (
        f"call emulate.pallas.dot(a, b, preferred_element_type=jnp.{acc}) here instead of "
        f"jnp.dot / lax.dot_general: on {t.name} it decodes the operands in registers to "
        f"{r.lhs_compute} x {r.rhs_compute} with a {r.accumulator} accumulator ({how}); or "
        "run the whole weight matmul with emulate.pallas.matmul"
    )


def conversion_cost(site: MatmulSite, off_message: str) -> str:
    """What compatibility mode's conversion of ``site`` costs (public Mosaic source,
    ``canonicalize_mosaic.cc``: ``canonicalize_matmul``)."""
    lhs, rhs, acc = site.lhs or "", site.rhs or "", acc_format(site.acc_type) or ""
    if "Automatic int->float" in off_message:  # TPU v7: no integer or float4 matmul
        steps = []
        for fmt in dict.fromkeys((lhs, rhs)):
            if fmt == "int8":
                steps.append("int8 to bf16")
            elif fmt in ("int4", "float4_e2m1fn"):
                steps.append(f"{fmt} to float8_e4m3fn")
        if lhs.startswith("float8") and rhs in ("bfloat16", "float32"):
            steps.append(f"the {lhs} LHS to bf16")
        text = "compatibility mode converts " + (", ".join(steps) or "the operands")
        text += " (exact)"
        if acc == "int32":
            return (
                text + " and sums in f32 instead of int32, converting the result back: the "
                "sum is exact only while every partial sum stays below 2**24 in magnitude "
                "(for full-range int8 x int8, K up to 1024)"
            )
        return text + "; the products are summed in the f32 accumulator the kernel asks for"
    if "mixed element types" in off_message:
        if _is_int(lhs) or _is_int(rhs):
            return (
                "compatibility mode converts the integer operand to f32 (exact) and runs an "
                "f32 matmul: several bf16 passes on the matrix unit, slower than the "
                "narrow pair"
            )
        return (
            f"compatibility mode lets a {lhs} x {rhs} matmul through; Mosaic's public source "
            "does not say which common type it converts them to, so the wider operand may "
            "be rounded to the narrower type"
        )
    return "compatibility mode rewrites this matmul before the matrix unit runs it"


def _recorded(t: targets.Target, site: MatmulSite, compat: bool) -> Verdict | None:
    """The recorded verdict for the site's (lhs, rhs, accumulator), or None if unprobed."""
    acc = acc_format(site.acc_type)
    if site.lhs is None or site.rhs is None or acc is None:
        return None
    return mosaic.verdict(t.name, site.lhs, site.rhs, acc=acc, compat=compat)


def compat_only_finding(t: targets.Target, site: MatmulSite, basis: str) -> Finding | None:
    """A ``"compat-only"`` finding if the recorded probe says ``site`` compiles with
    compatibility mode on and not with it off."""
    on, off = _recorded(t, site, True), _recorded(t, site, False)
    if on is None or off is None or not on.ok or off.ok:
        return None
    return _recorded_finding(
        t, site, off.message, conversion_cost(site, off.message), basis, COMPAT_ONLY
    )


def refused_note(t: targets.Target, site: MatmulSite | None, compat: bool) -> str:
    """For a site refused with compatibility mode off: what turning it on would do."""
    if compat or site is None:
        return ""
    on, off = _recorded(t, site, True), _recorded(t, site, False)
    if on is None or off is None or not on.ok:
        return ""
    return "compiles with compatibility mode on (the default), where " + conversion_cost(
        site, off.message
    )


def _blame(t: targets.Target, lhs: str | None, rhs: str | None) -> str:
    if lhs == rhs:
        return "RHS"
    if lhs is None or not any(pair[0] == lhs for pair in t.native_pairs):
        return "LHS"
    return "RHS"


def _table_rule(t: targets.Target, site: MatmulSite, compat: bool) -> Finding | None:
    """The target's table, for a site the probe has no verdict for
    (:meth:`emulate.targets.Target.compiles` without a record)."""
    lhs, rhs = site.lhs, site.rhs
    acc = acc_format(site.acc_type)
    if lhs is not None and rhs is not None and t.compiles(lhs, rhs, acc=acc, compat=compat):
        return None
    if lhs and rhs and lhs != rhs and not compat:
        return Finding(t.name, site, "", MIXED_TYPES, fix_text(t, site), basis="table")
    operand = _blame(t, lhs, rhs)
    vtype = site.lhs_type if operand == "LHS" else site.rhs_type
    code = "CompileTimeMosaicUnsupported" + operand.capitalize() + "Type"
    message = f"E2001: {code}: Unsupported matmul {operand} type on target: {vtype}"
    return Finding(t.name, site, operand, message, fix_text(t, site), basis="table")


def site_finding(t: targets.Target, site: MatmulSite, compat: bool) -> Finding | None:
    """:func:`diagnose` for a TPU :class:`~emulate.targets.Target`."""
    v = _recorded(t, site, compat)
    if v is None:
        return _table_rule(t, site, compat)
    if v.ok:
        return compat_only_finding(t, site, "recorded") if compat else None
    return _recorded_finding(t, site, v.message, refused_note(t, site, compat), "recorded")


def _recorded_finding(
    t: targets.Target, site: MatmulSite, message: str, note: str, basis: str, kind: str = REFUSED
) -> Finding:
    """A finding with the compiler's ``message`` at ``site``, the operand it names."""
    return Finding(
        target=t.name,
        site=site,
        operand=named_operand(message),
        message=message,
        fix=fix_text(t, site),
        note=note,
        kind=kind,
        basis=basis,
    )


def diagnose(
    site: MatmulSite, target: targets.TargetLike, *, compat: bool = True
) -> Finding | None:
    """The :class:`Finding` for one site on ``target`` by the recorded rules (no compiler):
    ``"refused"``, ``"compat-only"`` (with ``compat``), or None if it compiles natively.

    The recorded probe (:func:`emulate.mosaic.verdict`) decides for the site's lhs, rhs
    and accumulator element types; for a target or a case the probe lacks, the target's
    table does (``basis="table"``; see :meth:`emulate.targets.Target.compiles`).
    """
    return site_finding(tpu_target(target), site, compat)
