"""``emulate.pallas.check``: predict Mosaic's "Unsupported matmul ... type" on any machine.

How it reads the kernels. ``jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",))``
runs JAX's Pallas-to-Mosaic lowering without a TPU. Each ``pallas_call`` becomes a
``stablehlo.custom_call @tpu_custom_call`` whose ``backend_config`` is JSON holding the
kernel's Mosaic module as base64 MLIR bytecode (``custom_call_config.body``), serialized
by the ``mosaic-serde`` pass to a stable dialect version. :func:`matmul_sites` decodes that
body, parses it in an MLIR context with the Mosaic TPU dialect registered and upgrades it
with ``mosaic-serde{serialize=false}``: the steps JAX itself takes to re-version a
serialized kernel (``CustomCallBackendConfig.downgrade_lowered_module_asm``). Reading the
module that JAX ships, rather than intercepting the lowering, sees exactly what the TPU
compiler receives, kernels inside ``jit``, ``shard_map`` or loops included, and keeps the
MLIR source locations (``loc("file.py":12:8)``) of each op.

What it predicts. Each ``tpu.matmul`` in those modules is a site; a site whose operand
pair the target's matrix unit does not run (:meth:`emulate.targets.Target.supports`, JAX's
own table) is a finding, with the message Mosaic's TPU compiler gives for it. Mosaic's
compatibility mode (``--xla_mosaic_compat_mode``, on by default) first converts the integer
operand of an int x float pair to f32, and the check does the same. The compiler's own
rule for which operand it names is not public; the check names the RHS when both operands
have the same type or the LHS type is a valid LHS on the target (int8 x int8 on a TPU v4
or v7x: ``Unsupported matmul RHS type on target: 'vector<256x256xi8>'``, as reported from
real chips), and the LHS otherwise (float8_e4m3fn x bfloat16 on a TPU v5e).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import json
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

import jax

from emulate import compiler, formats, targets

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

#: MLIR element types of ``tpu.matmul`` operands -> emulate format names. Mosaic's
#: integer types are signless: ``i8`` holds int8 and uint8 alike, and its dot reads it as
#: signed.
MLIR_FORMATS: dict[str, str] = {
    "i8": "int8",
    "i4": "int4",
    "bf16": "bfloat16",
    "f16": "float16",
    "f32": "float32",
    "f8E4M3FN": "float8_e4m3fn",
    "f8E5M2": "float8_e5m2",
    "f8E4M3FNUZ": "float8_e4m3fnuz",
    "f8E5M2FNUZ": "float8_e5m2fnuz",
    "f8E4M3B11FNUZ": "float8_e4m3b11fnuz",
    "f8E3M4": "float8_e3m4",
    "f6E2M3FN": "float6_e2m3fn",
    "f6E3M2FN": "float6_e3m2fn",
    "f4E2M1FN": "float4_e2m1fn",
    "f8E8M0FNU": "float8_e8m0fnu",
}

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FILE_LOC = re.compile(r'"([^"]+)":(\d+):(\d+)')
_VECTOR = re.compile(r"vector<(?:[0-9]+x)*([A-Za-z0-9]+)>")


@dataclasses.dataclass(frozen=True)
class MatmulSite:
    """One ``tpu.matmul`` in the Mosaic module of one ``pallas_call``.

    Attributes:
      kernel: the kernel's name (the ``pallas_call``'s ``name``, else its function's).
      lhs_type, rhs_type, acc_type: the MLIR types, e.g. ``"vector<256x256xi8>"``.
      lhs, rhs: the operand format names (``"int8"``), or None for an element type with
        no format (``i32``).
      location: ``"path/to/file.py:12"``, the innermost source line outside ``emulate``
        that produced the op, or None when the module has no file locations.
    """

    kernel: str
    lhs_type: str
    rhs_type: str
    acc_type: str
    lhs: str | None
    rhs: str | None
    location: str | None

    def __str__(self) -> str:
        where = f"{self.location}: " if self.location else ""
        return (
            f"{where}kernel {self.kernel!r}: tpu.matmul {self.lhs_type}, {self.rhs_type} -> "
            f"{self.acc_type}"
        )


#: The kinds of :class:`Finding`.
REFUSED = "refused"
COMPAT_ONLY = "compat-only"

#: How a :class:`Finding` was decided (its ``basis``).
BASES = ("compiler", "recorded", "table")


@dataclasses.dataclass(frozen=True)
class Finding:
    """A ``tpu.matmul`` (or a kernel) that the target's TPU compiler refuses, or one that
    compiles only because Mosaic's compatibility mode converts it.

    Attributes:
      target: the target name.
      site: the :class:`MatmulSite` the message concerns, or None where it names none (a
        kernel Pallas refuses to lower for TPU; an error outside any ``tpu.matmul``).
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
        (the recorded probe, :func:`emulate.compiler.verdict`), or ``"table"`` (JAX's
        matmul table: a target that neither the installed libtpu nor the probe covers).
    """

    target: str
    site: MatmulSite | None
    operand: str
    message: str
    fix: str
    note: str = ""
    kind: str = REFUSED
    basis: str = "compiler"

    def __str__(self) -> str:
        site = self.site
        where = (site.location if site else None) or "<unknown location>"
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
        if site:
            lines.append(f"  tpu.matmul {site.lhs_type}, {site.rhs_type} -> {site.acc_type}")
        lines.append(f"  fix: {self.fix}")
        if self.note:
            lines.append(f"  note: {self.note}")
        return "\n".join(lines)


class RecordedRulesWarning(UserWarning):
    """:func:`check` decided without the real compiler: libtpu is not installed, offers no
    device for the target, or cannot receive the function in a subprocess. Issued once
    per reason per process; each :class:`Finding` also says its ``basis``."""


def _tpu_target(target: targets.TargetLike) -> targets.Target:
    t = targets.current_target(target)
    if t.kind != "tpu":
        raise ValueError(
            f"target: the check predicts Mosaic's TPU compiler, and {t.name} is not a TPU; "
            f"pass one of {', '.join(n for n in targets.names() if n.startswith('tpu_'))}"
        )
    return t


def _walk(op: Any) -> Iterator[Any]:
    """Every operation nested in ``op`` (depth first)."""
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                child = child.operation
                yield child
                yield from _walk(child)


def _string_attr(op: Any, name: str) -> str | None:
    from jaxlib.mlir import ir

    try:
        attr = op.attributes[name]
    except (KeyError, IndexError, ValueError):
        return None
    try:
        return ir.StringAttr(attr).value
    except (TypeError, ValueError):
        return str(attr)


def _mosaic_module(body: bytes) -> Any:
    """Parse a serialized Mosaic module and upgrade it to the current dialect version."""
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib import tpu
    from jaxlib.mlir import ir
    from jaxlib.mlir.passmanager import PassManager

    ctx = jax_mlir.make_ir_context()
    tpu.register_dialect(ctx)
    with ctx, ir.Location.unknown():
        ctx.allow_unregistered_dialects = True
        module = ir.Module.parse(body)
        PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(module.operation)
    return module


def _location(loc: str) -> str | None:
    files = [(path, line) for path, line, _ in _FILE_LOC.findall(loc)]
    if not files:
        return None
    outside = [
        (p, n)
        for p, n in files
        if not os.path.abspath(p).startswith(_PACKAGE_DIR + os.sep) and "/jax/" not in p
    ]
    path, line = (outside or files)[0]
    return f"{path}:{line}"


def _element(vector_type: str) -> str | None:
    m = _VECTOR.fullmatch(vector_type)
    return MLIR_FORMATS.get(m.group(1)) if m else None


#: JAX's device kind and TensorCores per device for each TPU target, as libtpu's
#: compile-only devices report them: what ``pltpu.get_tpu_info()`` reads while a kernel
#: is traced and lowered for the target.
DEVICE_KINDS: dict[str, tuple[str, int]] = {
    "tpu_v2": ("TPU v2", 1),
    "tpu_v3": ("TPU v3", 1),
    "tpu_v4": ("TPU v4", 1),
    "tpu_v4i": ("TPU v4 lite", 1),
    "tpu_v5e": ("TPU v5 lite", 1),
    "tpu_v5p": ("TPU v5", 2),
    "tpu_v6e": ("TPU v6 lite", 1),
    "tpu_v7": ("TPU7", 1),
    "tpu_v7x": ("TPU7x", 1),
    "tpu_v8i": ("TPU8i", 1),
}


@contextlib.contextmanager
def _on_target(t: targets.Target) -> Iterator[None]:
    """``t`` is the current target, and JAX's abstract device is its TPU (so that
    ``pltpu.get_tpu_info()`` answers for it while a kernel is traced and lowered)."""
    kind, cores = DEVICE_KINDS[t.name]
    device = jax.sharding.AbstractDevice(device_kind=kind, num_cores=cores, platform="tpu")
    mesh = jax.sharding.AbstractMesh((), (), abstract_device=device)
    with targets.use_target(t), jax.sharding.use_abstract_mesh(mesh):
        yield


class _LoweringRefused(Exception):
    """JAX or Pallas refused to lower a traced program for TPU (``error``)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _lower(fn: Callable[..., Any], args: tuple[Any, ...], t: targets.Target | None) -> Any:
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")

    def fresh(*a: Any) -> Any:  # a new function object: no trace cached for it
        return fn(*a)

    # Kernels read the current target when they are traced (emulate.pallas.dot); JAX caches
    # traces by function and argument types, so drop them before tracing for this target.
    jax.clear_caches()
    with contextlib.nullcontext() if t is None else _on_target(t):
        traced = jax.jit(fresh).trace(*args)
        try:
            return traced.lower(lowering_platforms=("tpu",))
        except Exception as e:  # noqa: BLE001 - a refusal to lower, reported as such
            raise _LoweringRefused(e) from e


def _under_target(fn: Callable[..., Any], target: str, *args: Any) -> Any:
    """``fn(*args)`` with ``target`` current: the job :func:`check` hands the compiler
    (module level, so that it pickles by reference for a compat subprocess)."""
    with targets.use_target(target):
        return fn(*args)


def matmul_sites(
    fn: Callable[..., Any], *args: Any, target: targets.TargetLike = None
) -> list[MatmulSite]:
    """Every ``tpu.matmul`` of every ``pallas_call`` in ``fn(*args)``, lowered for TPU.

    Args:
      fn: any JAX-traceable function; ``args`` are arrays or ``jax.ShapeDtypeStruct``.
      target: made the current target while ``fn`` is traced (kernels that read it, such as
        :func:`emulate.pallas.dot` or :func:`emulate.pallas.matmul`, lower for it); default:
        leave the current target as it is.

    With a target, JAX's abstract device is that TPU while ``fn`` is traced and lowered,
    so kernels that call ``pltpu.get_tpu_info()`` (integer division in a kernel body,
    ``emit_pipeline``, ``pl.kernel``) lower for it on any machine.

    Side effect: ``jax.clear_caches()``, so that no trace made for another target is
    reused.

    Raises:
      Exception: whatever JAX or Pallas raises when ``fn`` does not trace or lower for TPU.
    """
    t = None if target is None else targets.get(target)
    try:
        lowered = _lower(fn, args, t)
    except _LoweringRefused as e:
        raise e.error from None
    return _sites_of(lowered)


def _sites_of(lowered: Any) -> list[MatmulSite]:
    sites: list[MatmulSite] = []
    for op in _walk(lowered.compiler_ir("stablehlo").operation):
        if op.name != "stablehlo.custom_call":
            continue
        if _string_attr(op, "call_target_name") != "tpu_custom_call":
            continue
        config = json.loads(_string_attr(op, "backend_config") or "{}")
        body = config.get("custom_call_config", {}).get("body")
        if body is None:
            raise RuntimeError(
                "fn: a tpu_custom_call without a serialized Mosaic body; this JAX version "
                f"({jax.__version__}) stores kernels in a way emulate.pallas.check cannot read"
            )
        kernel = _string_attr(op, "kernel_name") or "kernel"
        module = _mosaic_module(base64.b64decode(body))
        for inner in _walk(module.operation):
            if inner.name != "tpu.matmul":
                continue
            lhs, rhs, acc = (str(v.type) for v in list(inner.operands)[:3])
            sites.append(
                MatmulSite(
                    kernel=kernel,
                    lhs_type=lhs,
                    rhs_type=rhs,
                    acc_type=acc,
                    lhs=_element(lhs),
                    rhs=_element(rhs),
                    location=_location(str(inner.location)),
                )
            )
    return sites


def _is_int(fmt: str | None) -> bool:
    return fmt is not None and formats.get(fmt).is_integer


_ACC_FORMATS = {"i32": "int32", "f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def _acc_format(vector_type: str) -> str | None:
    m = _VECTOR.fullmatch(vector_type)
    return _ACC_FORMATS.get(m.group(1)) if m else None


def _named_operand(message: str) -> str:
    m = re.search(r"\b(LHS|RHS|lhs|rhs) type\b", message)
    return m.group(1).upper() if m and "lhs/rhs" not in message else ""


def _fix(t: targets.Target, site: MatmulSite | None) -> str:
    from emulate.pallas import route

    generic = (
        "convert the operands to a pair the target runs (bfloat16 or float32) before the "
        "dot, or use emulate.pallas.matmul"
    )
    if site is None:
        return "see the message; " + generic
    acc = "int32" if site.acc_type.endswith("i32>") else "float32"
    try:
        if site.lhs is None or site.rhs is None:  # an element type with no format (i32)
            raise ValueError("no format")
        r = route.route(site.lhs, site.rhs, target=t, preferred_element_type=acc)
    except (TypeError, ValueError, NotImplementedError):
        return generic
    how = "exact" if r.exact else 'within the bound of mode "fast"'
    return (
        f"call emulate.pallas.dot(a, b, preferred_element_type=jnp.{acc}) here instead of "
        f"jnp.dot / lax.dot_general: on {t.name} it decodes the operands in registers to "
        f"{r.lhs_compute} x {r.rhs_compute} with a {r.accumulator} accumulator ({how}); or "
        "run the whole weight matmul with emulate.pallas.matmul"
    )


def _cost(site: MatmulSite, off_message: str) -> str:
    """What compatibility mode's conversion of ``site`` costs (public Mosaic source,
    ``canonicalize_mosaic.cc``: ``canonicalize_matmul``)."""
    lhs, rhs, acc = site.lhs or "", site.rhs or "", _acc_format(site.acc_type) or ""
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


def _recorded_rule(t: targets.Target, site: MatmulSite, compat: bool) -> Any:
    """The recorded verdict for the site's (lhs, rhs, accumulator), or None if unprobed."""
    acc = _acc_format(site.acc_type)
    if site.lhs is None or site.rhs is None or acc is None:
        return None
    try:
        return compiler.verdict(t, site.lhs, site.rhs, acc, compat=compat)
    except ValueError:
        return None


def _compat_only(t: targets.Target, site: MatmulSite, basis: str) -> Finding | None:
    """A ``"compat-only"`` finding if the recorded probe says ``site`` compiles with
    compatibility mode on and not with it off."""
    on, off = _recorded_rule(t, site, True), _recorded_rule(t, site, False)
    if on is None or off is None or not on.ok or off.ok:
        return None
    return _recorded_finding(t, site, off.message, _cost(site, off.message), basis, COMPAT_ONLY)


def _refused_note(t: targets.Target, site: MatmulSite | None, compat: bool) -> str:
    if compat or site is None:
        return ""
    on, off = _recorded_rule(t, site, True), _recorded_rule(t, site, False)
    if on is None or off is None or not on.ok:
        return ""
    return "compiles with compatibility mode on (the default), where " + _cost(site, off.message)


def _blame(t: targets.Target, lhs: str | None, rhs: str | None) -> str:
    if lhs == rhs:
        return "RHS"
    if lhs is None or not any(pair[0] == lhs for pair in t.native_pairs):
        return "LHS"
    return "RHS"


def _table_rule(t: targets.Target, site: MatmulSite, compat: bool) -> Finding | None:
    """JAX's table, for a target neither libtpu nor the probe covers: the pair must be
    native; compatibility mode first converts the integer side of an int x float pair to
    f32, and without it mixed element types are refused."""
    lhs, rhs = site.lhs, site.rhs
    if lhs and rhs and lhs != rhs and not compat:
        message = (
            "Mosaic matmul invoked with mixed element types, but compatibility mode is disabled."
        )
        return Finding(t.name, site, "", message, _fix(t, site), basis="table")
    float_acc = not site.acc_type.endswith(("i32>", "i8>", "i16>"))
    if lhs and rhs and float_acc and _is_int(lhs) != _is_int(rhs):
        lhs, rhs = ("float32", rhs) if _is_int(lhs) else (lhs, "float32")
    if lhs is not None and rhs is not None and t.supports(lhs, rhs):
        return None
    operand = _blame(t, lhs, rhs)
    vtype = site.lhs_type if operand == "LHS" else site.rhs_type
    code = "CompileTimeMosaicUnsupported" + operand.capitalize() + "Type"
    message = f"E2001: {code}: Unsupported matmul {operand} type on target: {vtype}"
    return Finding(t.name, site, operand, message, _fix(t, site), basis="table")


def _site_rule(t: targets.Target, site: MatmulSite, compat: bool) -> Finding | None:
    """The recorded rule for one site (JAX's table where the probe has no verdict)."""
    v = _recorded_rule(t, site, compat)
    if v is None:
        return _table_rule(t, site, compat)
    if v.ok:
        return _compat_only(t, site, "recorded") if compat else None
    return _recorded_finding(t, site, v.message, _refused_note(t, site, compat), "recorded")


def _recorded_finding(
    t: targets.Target, site: MatmulSite, message: str, note: str, basis: str, kind: str = REFUSED
) -> Finding:
    """A finding with the compiler's ``message`` at ``site``, the operand it names."""
    return Finding(
        target=t.name,
        site=site,
        operand=_named_operand(message),
        message=message,
        fix=_fix(t, site),
        note=note,
        kind=kind,
        basis=basis,
    )


def diagnose(
    site: MatmulSite, target: targets.TargetLike, *, compat: bool = True
) -> Finding | None:
    """The :class:`Finding` for one site on ``target`` by the recorded rules (no compiler):
    ``"refused"``, ``"compat-only"`` (with ``compat``), or None if it compiles natively.

    The recorded probe (:func:`emulate.compiler.verdict`) decides for the site's lhs, rhs
    and accumulator element types; for a target or a case the probe lacks, JAX's matmul
    table does (``basis="table"``).
    """
    return _site_rule(_tpu_target(target), site, compat)


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


def basis(target: targets.TargetLike) -> str:
    """How :func:`check` decides for ``target`` here: ``"compiler"`` where libtpu is
    installed and offers the target; else ``"recorded"`` where the recorded probe covers
    it; else ``"table"`` (JAX's matmul table)."""
    t = _tpu_target(target)
    if _compiler_offers(t):
        return "compiler"
    return "recorded" if t.name in compiler.recorded().topologies else "table"


def _announce(t: targets.Target, how: str) -> None:
    if how == "compiler":
        return
    rules = (
        f"the recorded rules (libtpu {compiler.recorded().libtpu})"
        if how == "recorded"
        else "JAX's matmul table (the recorded probe has no verdicts for it)"
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


def _site_of(verdict: Any, sites: list[MatmulSite]) -> MatmulSite | None:
    """The site a compiler error concerns: the ``tpu.matmul`` the error text shows (by its
    operand types), else the one whose operand type the message names, else the only
    site; None when none can be told."""
    m = _OPERATION_TYPES.search(verdict.detail)
    if m:
        types = tuple(x.strip() for x in m.group(1).split(", "))
        for s in sites:
            if (s.lhs_type, s.rhs_type, s.acc_type) == types[:3]:
                return s
        elements = tuple(_VECTOR.sub(r"\1", x) for x in types[:3])
        same = [s for s in sites if (s.lhs, s.rhs) == tuple(map(MLIR_FORMATS.get, elements[:2]))]
        if len({(s.lhs_type, s.rhs_type, s.acc_type) for s in same}) == 1:
            return same[0]  # Mosaic reports the op after tiling: same types, other shape
    named = _named_operand(verdict.message)
    for s in sites:
        vtypes = {"LHS": [s.lhs_type], "RHS": [s.rhs_type]}.get(named, [s.lhs_type, s.rhs_type])
        if any(re.search(rf"\b{re.escape(v)}", verdict.message) for v in vtypes):
            return s
    if len(sites) == 1 and verdict.stage == "compile":
        return sites[0]
    return None


def _from_compiler(
    t: targets.Target, verdict: Any, sites: list[MatmulSite], compat: bool
) -> list[Finding]:
    found: list[Finding] = []
    refused_site = None
    if not verdict.ok:
        refused_site = _site_of(verdict, sites)
        found.append(
            Finding(
                target=t.name,
                site=refused_site,
                operand=_named_operand(verdict.message),
                message=verdict.message,
                fix=_fix(t, refused_site),
                note=_refused_note(t, refused_site, compat),
            )
        )
    if compat:
        for s in sites:
            if s is not refused_site and (f := _compat_only(t, s, "compiler")):
                found.append(f)
    return found


def _lowering_finding(t: targets.Target, error: Exception, how: str) -> Finding:
    message = compiler.first_line(str(error)) or type(error).__name__
    return Finding(t.name, None, _named_operand(message), message, _fix(t, None), basis=how)


Job = tuple[Callable[..., Any], Sequence[Any], targets.TargetLike]


def check_many(jobs: Sequence[Job], *, compat: bool = True) -> list[list[Finding]]:
    """:func:`check` for each ``(fn, args, target)`` job, in order, compiling them together:
    one compiler subprocess for all the jobs when ``compat`` differs from this process's
    compatibility mode (:func:`emulate.compiler.check_many`)."""
    prepared = []
    for fn, args, target in jobs:
        t = _tpu_target(target)
        try:
            sites, refused = _sites_of(_lower(fn, tuple(args), t)), None
        except _LoweringRefused as e:
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
                how[i] = (
                    "recorded" if prepared[i][2].name in compiler.recorded().topologies else "table"
                )
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
        found = (_site_rule(t, s, compat) for s in sites)
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
    decides per site (:func:`emulate.compiler.verdict`: lhs, rhs and accumulator element
    types, and ``compat``; the message is the probe's, of its 128x128 kernel), or JAX's
    matmul table for a target the probe lacks; a
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
