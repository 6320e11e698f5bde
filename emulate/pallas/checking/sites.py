"""The ``tpu.matmul`` sites of a function, read from the Mosaic modules JAX ships.

``jax.jit(fn).trace(*args).lower(lowering_platforms=("tpu",))`` runs JAX's Pallas-to-Mosaic
lowering without a TPU. Each ``pallas_call`` becomes a ``stablehlo.custom_call
@tpu_custom_call`` whose ``backend_config`` is JSON holding the kernel's Mosaic module as
base64 MLIR bytecode (``custom_call_config.body``), serialized by the ``mosaic-serde`` pass
to a stable dialect version. :func:`matmul_sites` decodes that body, parses it in an MLIR
context with the Mosaic TPU dialect registered and upgrades it with
``mosaic-serde{serialize=false}``: the steps JAX itself takes to re-version a serialized
kernel (``CustomCallBackendConfig.downgrade_lowered_module_asm``). Reading the module that
JAX ships, rather than intercepting the lowering, sees exactly what the TPU compiler
receives, kernels inside ``jit``, ``shard_map`` or loops included, and keeps the MLIR source
locations (``loc("file.py":12:8)``) of each op.

While a function is traced and lowered for a target, that target is emulate's current
target and JAX's abstract device is its TPU (:data:`DEVICE_KINDS`), so kernels that call
``pltpu.get_tpu_info()`` lower for it on any machine.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import jax

from emulate import targets

__all__ = [
    "DEVICE_KINDS",
    "MLIR_FORMATS",
    "KernelOp",
    "KernelScan",
    "LoweringRefused",
    "MatmulSite",
    "acc_format",
    "element_format",
    "error_location",
    "interpreted_kernels",
    "lower",
    "matmul_sites",
    "scan",
    "sites_of",
    "tpu_target",
    "trace_and_lower",
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


@dataclasses.dataclass(frozen=True)
class KernelOp:
    """One operation other than ``tpu.matmul`` in the Mosaic module of one ``pallas_call``
    (a conversion, a comparison, a load, ...), as JAX ships it, before Mosaic canonicalizes
    it (``arith.fptosi`` here is ``tpu.fptosi`` in Mosaic's error messages).

    Attributes:
      kernel: the kernel's name.
      name: the MLIR operation name, e.g. ``"arith.fptosi"``.
      operand_types, result_types: the MLIR types, e.g. ``("vector<256x256xbf16>",)``.
      location: ``"path/to/file.py:12"`` as for :class:`MatmulSite`, or None.
    """

    kernel: str
    name: str
    operand_types: tuple[str, ...]
    result_types: tuple[str, ...]
    location: str | None

    def __str__(self) -> str:
        where = f"{self.location}: " if self.location else ""
        return (
            f"{where}kernel {self.kernel!r}: {self.name} {', '.join(self.operand_types)} -> "
            f"{', '.join(self.result_types)}"
        )


@dataclasses.dataclass(frozen=True)
class KernelScan:
    """What the Mosaic modules of a program lowered for TPU hold.

    Attributes:
      kernels: the name of each ``pallas_call`` that reached Mosaic, in program order.
      matmuls: every ``tpu.matmul``.
      ops: every other operation with a source location (constants and function
        boundaries left out).
    """

    kernels: tuple[str, ...]
    matmuls: tuple[MatmulSite, ...]
    ops: tuple[KernelOp, ...]


_ACC_FORMATS = {"i32": "int32", "f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def acc_format(vector_type: str) -> str | None:
    """The accumulator format of an MLIR vector type (``"vector<8x128xi32>"`` -> ``"int32"``),
    or None for an element type that is no accumulator format."""
    m = _VECTOR.fullmatch(vector_type)
    return _ACC_FORMATS.get(m.group(1)) if m else None


def element_format(vector_type: str) -> str | None:
    """The operand format of an MLIR vector type (``"vector<8x128xf8E4M3FN>"`` ->
    ``"float8_e4m3fn"``), or None for an element type with no format (``i32``)."""
    m = _VECTOR.fullmatch(vector_type)
    return MLIR_FORMATS.get(m.group(1)) if m else None


def tpu_target(target: targets.TargetLike) -> targets.Target:
    """The TPU target ``target`` names (default the current one); ValueError for another."""
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
    outside = [(p, n) for p, n in files if _outside(p)]
    path, line = (outside or files)[0]
    return f"{path}:{line}"


def _outside(path: str) -> bool:
    return not os.path.abspath(path).startswith(_PACKAGE_DIR + os.sep) and "/jax/" not in path


def error_location(error: BaseException) -> str | None:
    """``"path/to/file.py:12"``: the innermost frame of ``error``'s traceback outside
    ``emulate`` and JAX (JAX adds the kernel's source line of a refused MLIR operation to
    the traceback of a Pallas lowering error), or None."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    outside = [f for f in frames if _outside(f.filename) and not f.filename.startswith("<")]
    return f"{outside[-1].filename}:{outside[-1].lineno}" if outside else None


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


class LoweringRefused(Exception):
    """JAX or Pallas refused to lower a traced program for TPU (``error``, what they raised;
    ``location``, the user's source line it concerns, :func:`error_location`; ``jaxpr``,
    the traced program)."""

    def __init__(self, error: Exception, jaxpr: Any = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.location = error_location(error)
        self.jaxpr = jaxpr


def lower(fn: Callable[..., Any], args: tuple[Any, ...], t: targets.Target | None) -> Any:
    """``fn(*args)`` traced with ``t`` current (:data:`DEVICE_KINDS`) and lowered for TPU,
    after ``jax.clear_caches()``. TypeError for a ``fn`` that is not callable;
    :class:`LoweringRefused` when JAX or Pallas refuse to lower it."""
    return trace_and_lower(fn, args, t)[1]


def trace_and_lower(
    fn: Callable[..., Any], args: tuple[Any, ...], t: targets.Target | None
) -> tuple[Any, Any]:
    """(the jaxpr, the lowered program) of :func:`lower`."""
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
            return traced.jaxpr, traced.lower(lowering_platforms=("tpu",))
        except Exception as e:  # noqa: BLE001 - a refusal to lower, reported as such
            raise LoweringRefused(e, traced.jaxpr) from e


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
        lowered = lower(fn, args, t)
    except LoweringRefused as e:
        raise e.error from None
    return sites_of(lowered)


def sites_of(lowered: Any) -> list[MatmulSite]:
    """Every ``tpu.matmul`` of every ``pallas_call`` in a program lowered for TPU."""
    return list(scan(lowered).matmuls)


_SKIPPED_OPS = ("arith.constant", "func.func", "func.return")


def scan(lowered: Any) -> KernelScan:
    """The kernels, ``tpu.matmul`` sites and other operations of every ``pallas_call`` in a
    program lowered for TPU (:class:`KernelScan`)."""
    kernels: list[str] = []
    sites: list[MatmulSite] = []
    ops: list[KernelOp] = []
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
        kernels.append(kernel)
        module = _mosaic_module(base64.b64decode(body))
        for inner in _walk(module.operation):
            if inner.name in _SKIPPED_OPS:
                continue
            location = _location(str(inner.location))
            if inner.name != "tpu.matmul":
                if location is not None:
                    ops.append(
                        KernelOp(
                            kernel,
                            inner.name,
                            tuple(str(v.type) for v in inner.operands),
                            tuple(str(r.type) for r in inner.results),
                            location,
                        )
                    )
                continue
            lhs, rhs, acc = (str(v.type) for v in list(inner.operands)[:3])
            sites.append(
                MatmulSite(
                    kernel=kernel,
                    lhs_type=lhs,
                    rhs_type=rhs,
                    acc_type=acc,
                    lhs=element_format(lhs),
                    rhs=element_format(rhs),
                    location=location,
                )
            )
    return KernelScan(tuple(kernels), tuple(sites), tuple(ops))


def _jaxprs(value: Any) -> Iterator[Any]:
    """The jaxprs a primitive's parameter holds (directly, closed, or in a sequence)."""
    from jax.extend import core as jex_core

    if isinstance(value, jex_core.ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, jex_core.Jaxpr):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _jaxprs(v)


def interpreted_kernels(jaxpr: Any) -> list[str]:
    """The kernels of the ``pallas_call`` equations in ``jaxpr`` (and the jaxprs nested in
    it) that run in interpret mode, as ``"name at path/to/file.py:12"`` (the kernel
    function and its source line): they become plain JAX operations, never Mosaic."""
    found: list[str] = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call" and eqn.params.get("interpret"):
            inner = eqn.params.get("jaxpr")
            info = getattr(getattr(inner, "debug_info", None), "func_src_info", None)
            found.append(eqn.params.get("name") or info or "kernel")
        for value in eqn.params.values():
            for inner in _jaxprs(value):
                found += interpreted_kernels(inner)
    return found
