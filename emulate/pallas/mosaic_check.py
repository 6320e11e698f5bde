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
import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import jax

from emulate import formats, targets

__all__ = ["Finding", "MatmulSite", "check", "diagnose", "matmul_sites", "MLIR_FORMATS"]

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


@dataclasses.dataclass(frozen=True)
class Finding:
    """A ``tpu.matmul`` that the target's TPU compiler would reject.

    Attributes:
      target: the target name.
      site: the :class:`MatmulSite`.
      operand: ``"LHS"`` or ``"RHS"``, the operand the compiler names.
      message: the compiler's message, e.g.
        ``"Unsupported matmul RHS type on target: 'vector<256x256xi8>'"``.
      fix: what to change.
      note: more context (compatibility-mode behaviour), or "".
    """

    target: str
    site: MatmulSite
    operand: str
    message: str
    fix: str
    note: str = ""

    def __str__(self) -> str:
        where = self.site.location or "<unknown location>"
        lines = [
            f"{where}: kernel {self.site.kernel!r} on {self.target}: "
            f"Mosaic failed to compile TPU kernel: {self.message}",
            f"  tpu.matmul {self.site.lhs_type}, {self.site.rhs_type} -> {self.site.acc_type}",
            f"  fix: {self.fix}",
        ]
        if self.note:
            lines.append(f"  note: {self.note}")
        return "\n".join(lines)


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


def _lower(fn: Callable[..., Any], args: tuple[Any, ...], t: targets.Target | None) -> Any:
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")

    def fresh(*a: Any) -> Any:  # a new function object: no trace cached for it
        return fn(*a)

    # Kernels read the current target when they are traced (emulate.pallas.dot); JAX caches
    # traces by function and argument types, so drop them before tracing for this target.
    jax.clear_caches()
    if t is None:
        return jax.jit(fresh).trace(*args).lower(lowering_platforms=("tpu",))
    with targets.use_target(t):
        return jax.jit(fresh).trace(*args).lower(lowering_platforms=("tpu",))


def matmul_sites(
    fn: Callable[..., Any], *args: Any, target: targets.TargetLike = None
) -> list[MatmulSite]:
    """Every ``tpu.matmul`` of every ``pallas_call`` in ``fn(*args)``, lowered for TPU.

    Args:
      fn: any JAX-traceable function; ``args`` are arrays or ``jax.ShapeDtypeStruct``.
      target: made the current target while ``fn`` is traced (kernels that read it, such as
        :func:`emulate.pallas.dot` or :func:`emulate.pallas.matmul`, lower for it); default:
        leave the current target as it is.

    Side effect: ``jax.clear_caches()``, so that no trace made for another target is
    reused.
    """
    t = None if target is None else targets.get(target)
    lowered = _lower(fn, args, t)
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


def _blame(t: targets.Target, lhs: str | None, rhs: str | None) -> str:
    if lhs == rhs:
        return "RHS"
    if lhs is None or not any(pair[0] == lhs for pair in t.native_pairs):
        return "LHS"
    return "RHS"


def _fix(t: targets.Target, site: MatmulSite) -> str:
    from emulate.pallas import route

    acc = "int32" if site.acc_type.endswith("i32>") else "float32"
    try:
        if site.lhs is None or site.rhs is None:  # an element type with no format (i32)
            raise ValueError("no format")
        r = route.route(site.lhs, site.rhs, target=t, preferred_element_type=acc)
    except (TypeError, ValueError, NotImplementedError):
        return (
            "convert the operands to a pair the target runs (bfloat16 or float32) before the "
            "dot, or use emulate.pallas.matmul"
        )
    how = "exact" if r.exact else 'within the bound of mode "fast"'
    return (
        f"call emulate.pallas.dot(a, b, preferred_element_type=jnp.{acc}) here instead of "
        f"jnp.dot / lax.dot_general: on {t.name} it decodes the operands in registers to "
        f"{r.lhs_compute} x {r.rhs_compute} with a {r.accumulator} accumulator ({how}); or "
        "run the whole weight matmul with emulate.pallas.matmul"
    )


def _note(t: targets.Target, site: MatmulSite) -> str:
    if t.generation != 7:
        return ""
    if any(_is_int(f) or f == "float4_e2m1fn" for f in (site.lhs, site.rhs)):
        return (
            "on TPU v7 Mosaic's compatibility mode (--xla_mosaic_compat_mode) may convert "
            "integer and float4 operands itself (int8 to bf16, an int32 accumulator to f32); "
            "the kernel then compiles, but an int32 sum is exact only while each dot's K "
            "stays within 2**24 / max|product| (1024 for int8 x int8)"
        )
    if (site.lhs or "").startswith("float8") and site.rhs in ("bfloat16", "float32"):
        return (
            "on TPU v7 Mosaic's compatibility mode (--xla_mosaic_compat_mode) may widen a "
            "float8 LHS to bf16 itself when the RHS is bf16 or f32"
        )
    return ""


def diagnose(site: MatmulSite, target: targets.TargetLike) -> Finding | None:
    """The :class:`Finding` for one site on ``target``, or None if the target runs it."""
    t = _tpu_target(target)
    lhs, rhs = site.lhs, site.rhs
    float_acc = not site.acc_type.endswith(("i32>", "i8>", "i16>"))
    if lhs and rhs and float_acc and _is_int(lhs) != _is_int(rhs):
        # Compatibility mode: the integer side of an int x float pair becomes f32.
        lhs, rhs = ("float32", rhs) if _is_int(lhs) else (lhs, "float32")
    if lhs is not None and rhs is not None and t.supports(lhs, rhs):
        return None
    operand = _blame(t, lhs, rhs)
    vtype = site.lhs_type if operand == "LHS" else site.rhs_type
    return Finding(
        target=t.name,
        site=site,
        operand=operand,
        message=f"Unsupported matmul {operand} type on target: '{vtype}'",
        fix=_fix(t, site),
        note=_note(t, site),
    )


def check(fn: Callable[..., Any], *args: Any, target: targets.TargetLike = None) -> list[Finding]:
    """Lower ``fn(*args)`` for TPU and report each ``tpu.matmul`` that ``target`` cannot run.

    Runs on any machine (no TPU needed): the Pallas kernels in ``fn`` are lowered to Mosaic
    for platform "tpu" and their ``tpu.matmul`` operand types checked against the target's
    native pairs (see the module docstring for how, and for the compiler's rules it models).

    Args:
      fn: a function that calls ``pallas_call`` (directly or through jit, vmap, ...).
      *args: its arguments, as arrays or ``jax.ShapeDtypeStruct``.
      target: a TPU target name or Target; default the current target, which must be a
        TPU. It is also made the current target while ``fn`` is traced.

    Returns:
      One :class:`Finding` per rejected ``tpu.matmul``, in module order; empty when every
      matmul runs on the target. ``str(finding)`` reads like the compiler's error plus the
      source line and the fix.

    Raises:
      TypeError: ``fn`` is not callable.
      ValueError: an unknown or non-TPU target.
    """
    t = _tpu_target(target)
    found = (diagnose(site, t) for site in matmul_sites(fn, *args, target=t))
    return [f for f in found if f is not None]
