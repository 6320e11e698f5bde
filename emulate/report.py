"""``inspect(fn, *args)``: one row per matmul / convolution site of a program, and its fate.

For each ``dot_general`` and ``conv_general_dilated`` equation (sub-jaxprs included) the
report gives the source line, the operand dtypes and shapes, whether the target runs it
natively, XLA runs it as it is, or :func:`emulate.polyfill` emulates it (and with which
plan), and an estimated time: the larger of the matrix-unit time from the target's op
rates and the time to move the site's bytes at the target's HBM bandwidth (both shown).
``pallas_call`` equations are listed as left alone: their kernels are not rewritten.

A call of emulate's own matmuls traced inside the function (``x @ q`` on a QArray,
``emulate.einsum``, ``emulate.dot_general``) is one row, "emulated", with its operand
formats and QArray scheme, however many decoded dots it emitted: the front ends mark their
work with a named scope (:mod:`emulate.engine.sites`). The function is traced inside
``emulate.target(target)`` and ``emulate.use_mode(mode)``, so such calls are planned as
``polyfill(fn, target=target, mode=mode)`` would run them.

A row's source is the innermost frame of the call outside emulate, JAX, flax and qwix: the
user's line, not the layer library's. Where the function runs flax linen modules, the
module path (``Model/Dense_0``, from JAX's name stack) is shown with it; for flax NNX
modules among the arguments, inspect names each module's calls by its attribute path
(``Block/layers/0``) while it traces.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core

from emulate import formats, program, routing, targets
from emulate.engine import sites
from emulate.planning.plan import Plan, plan, runs_as_is
from emulate.tables import table

__all__ = ["Row", "Report", "inspect"]


@dataclasses.dataclass(frozen=True)
class Row:
    """One site.

    Attributes:
      primitive: "dot_general", "conv_general_dilated", "ragged_dot_general" or
        "pallas_call".
      source: "file:line (function)" of the user code that made the equation (the
        innermost frame outside emulate, JAX, flax and qwix), then the module path
        in brackets where there is one (``[Model/Dense_0]``); "?" when unknown.
      lhs, rhs: operand dtype names and shapes, e.g. "int8[64,4096]"; a QArray operand
        of an emulate call shows its element format and scheme ("int4[256,8]:INT4_G128").
      status: "native", "native (XLA)", "emulated" or "left alone (pallas_call)".
        "native (XLA)": a pair the matrix unit's Mosaic-level table lacks but that
        :func:`emulate.polyfill` leaves to XLA (:func:`emulate.runs_as_is`: no
        low-precision operand; XLA:TPU runs it itself, as bf16 x bf16 on v2 and v3). A call
        of emulate's own matmuls is "emulated" (or "native" when its plan runs the pair as
        it is).
      plan: the plan for emulated sites (None otherwise).
      flops: 2 * output elements * K (0 for pallas_call).
      seconds: the estimate: the larger of ``compute_seconds`` and ``memory_seconds``
        (None when the target states neither).
      weight_route: a contraction with a weight operand on a target with a kernel for it
        (:mod:`emulate.routing`): the kernel ("pallas.matmul", "pallas.ragged_dot" on a
        TPU, "cpu.gemv" on the CPU), or "xla: " and why the kernel does not take it; ""
        otherwise.
      bytes: what the site moves at least: its operands as stored (a QArray's codes at
        their bit width, scales not counted) and, for a plain dot, its result.
      compute_seconds: flops / the rate of the unit the site runs on (None when the
        target states no rate for it).
      memory_seconds: bytes / the target's HBM bandwidth (per TensorCore, as JAX's table
        states it; None when it states none).
    """

    primitive: str
    source: str
    lhs: str
    rhs: str
    status: str
    plan: Plan | None
    flops: int
    seconds: float | None
    weight_route: str = ""
    bytes: int = 0
    compute_seconds: float | None = None
    memory_seconds: float | None = None


@dataclasses.dataclass(frozen=True)
class Report:
    """The rows of :func:`inspect`; ``str()`` renders them as a table."""

    target: str
    rows: tuple[Row, ...]

    @property
    def emulated(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if r.status == "emulated")

    def __str__(self) -> str:
        head = f"matmul sites on {self.target}: {len(self.rows)} ({len(self.emulated)} emulated)"
        rows = [
            {
                "source": r.source,
                "op": r.primitive.replace("conv_general_dilated", "conv"),
                "lhs": r.lhs,
                "rhs": r.rhs,
                "status": r.status,
                "route": _route_cell(r),
                "compute": _fmt_seconds(r.compute_seconds),
                "memory": _fmt_seconds(r.memory_seconds),
                "est. time": _fmt_seconds(r.seconds),
            }
            for r in self.rows
        ]
        columns = (
            "source",
            "op",
            "lhs",
            "rhs",
            "status",
            "route",
            "compute",
            "memory",
            "est. time",
        )
        notes = [
            f"  {r.source}: {r.weight_route}"
            for r in self.rows
            if r.weight_route.startswith("xla: ")
        ]
        kind = targets.get(self.target).kind if self.target in targets.names() else "tpu"
        why = [_KEPT.get(kind, _KEPT["tpu"]), *notes] if notes else []
        return "\n".join([head, table(rows, columns=columns, rule=False), *why])


#: The heading of the reasons listed under the table, by the target's kind.
_KEPT = {
    "tpu": "kept off the Pallas kernels (pallas.matmul, pallas.ragged_dot, kvcache.attention):",
    "cpu": "kept off the CPU kernel (emulate.cpu.gemv):",
}


def _kernel_label(route: str) -> bool:
    """Whether a site's route is a kernel's label (``pallas.matmul``, ``pallas.ragged_dot``,
    ``kvcache.attention``, ``cpu.gemv``), not "xla: " and a reason, nor empty."""
    return bool(route) and not route.startswith("xla: ")


def _route_cell(r: Row) -> str:
    """The route column: the kernel, or the plan's method (marked where a weight stays
    on the XLA route of a target with a kernel, the reason listed under the table)."""
    if _kernel_label(r.weight_route):
        return r.weight_route
    method = r.plan.method if r.plan else ""
    return f"{method} (xla)" if r.weight_route else method


def _fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def _package_dirs() -> tuple[str, ...]:
    dirs = []
    for name in ("emulate", "jax", "jaxlib", "flax", "qwix"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        for d in (spec.submodule_search_locations or []) if spec else []:
            dirs.append(os.path.realpath(d) + os.sep)
    return tuple(dirs)


_LIBRARIES = _package_dirs()


def _user_frame(eqn: Any) -> Any:
    """The innermost frame of the equation's traceback outside the libraries."""
    try:
        from jax._src import source_info_util  # no public API for the user frames yet

        frames = source_info_util.user_frames(eqn.source_info.traceback)
    except (ImportError, AttributeError):  # source lines are best effort
        return None
    for frame in frames:  # innermost first, JAX's own and the stdlib's left out
        if not os.path.realpath(frame.file_name).startswith(_LIBRARIES):
            return frame
    return None


def _scopes(eqn: Any) -> list[str]:
    """The names on the equation's name stack (scopes and transforms), outermost first."""
    stack = getattr(getattr(eqn.source_info, "name_stack", None), "stack", ())
    return [getattr(s, "name", "") for s in stack]


def _site_tag(eqn: Any) -> sites.SiteTag | None:
    for name in _scopes(eqn):
        tag = sites.parse(name)
        if tag is not None:
            return tag
    return None


def _source(eqn: jex_core.JaxprEqn, prefix: tuple[str, ...] = ()) -> str:
    frame = _user_frame(eqn)
    where = (
        "?" if frame is None else f"{frame.file_name}:{frame.start_line} ({frame.function_name})"
    )
    module = [
        n
        for n in prefix + tuple(_scopes(eqn))
        if n and not n.startswith(sites.PREFIX) and n not in _TRANSFORMS
    ]
    return where + (f" [{'/'.join(module)}]" if module else "")


# Transform entries of JAX's name stack (they are not module names).
_TRANSFORMS = frozenset({"jvp", "transpose", "vmap", "pjit", "jit", "remat", "checkpoint"})


def _describe(aval: Any) -> str:
    return f"{np.dtype(aval.dtype).name}[{','.join(map(str, aval.shape))}]"


def _flops(eqn: Any) -> int:
    out = eqn.outvars[0].aval
    lhs, rhs = (v.aval for v in eqn.invars[:2])
    if eqn.primitive.name == "dot_general":
        (lc, _), _ = eqn.params["dimension_numbers"]
        k = math.prod(lhs.shape[d] for d in lc)
    elif eqn.primitive.name in program.RAGGED_PRIMITIVES:  # each row against its group
        (lc, _), _ = eqn.params["ragged_dot_dimension_numbers"].dot_dimension_numbers
        k = math.prod(lhs.shape[d] for d in lc)
    elif eqn.primitive.name in program.SCALED_PRIMITIVES:  # (B, M, K) x (B, N, K)
        k = lhs.shape[-1]
    else:
        dn = eqn.params["dimension_numbers"]
        k = math.prod(rhs.shape[d] for d in dn.rhs_spec[1:])
    return 2 * math.prod(out.shape) * k


def inspect(
    fn: Callable[..., Any],
    *args: Any,
    target: targets.TargetLike = None,
    mode: str | None = None,
) -> Report:
    """Trace ``fn(*args)`` and report every matmul / convolution site for ``target``.

    Args:
      fn: the function, as you would pass it to :func:`emulate.polyfill`.
      args: example arguments (arrays or ``jax.ShapeDtypeStruct``).
      target: target name or Target; default the current target.
      mode: the mode the emulated sites would run in; default the current mode.

    Returns:
      A :class:`Report`; ``print(report)`` shows the table.
    """
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    if mode not in (None, "fast", "exact"):
        raise ValueError(f"mode: expected one of None, 'fast', 'exact', got {mode!r}")
    t = targets.current_target(target)
    m = targets.current_mode(mode)
    with (
        targets.use_target(t),
        targets.use_mode(m),
        routing.planning(),
        _nnx_module_scopes(fn, args) as traced,
    ):
        closed = jax.make_jaxpr(traced)(*args)
    return Report(t.name, tuple(_rows(closed.jaxpr, t, m, ())))


def _nnx_paths(args: Any, nnx: Any, names: dict[int, str]) -> set[type]:
    """Fill ``names`` (module id -> scope name: its attribute path below the nearest
    enclosing module, the class name for a root) for the NNX modules among ``args``;
    return their classes."""
    containers = tuple(c for c in (getattr(nnx, "List", None), getattr(nnx, "Dict", None)) if c)
    classes: set[type] = set()
    for arg in args:
        if not isinstance(arg, nnx.Module):
            continue
        found = {p: n for p, n in nnx.iter_graph(arg) if isinstance(n, nnx.Module)}
        for path, node in found.items():
            classes.add(type(node))
            parents = [
                q
                for q in found
                if len(q) < len(path)
                and path[: len(q)] == q
                and not isinstance(found[q], containers)
            ]
            rel = path[len(max(parents, key=len)) :] if parents else path
            names.setdefault(id(node), "/".join(map(str, rel)) if rel else type(node).__name__)
    return classes


@contextlib.contextmanager
def _nnx_module_scopes(fn: Callable[..., Any], args: Any) -> Iterator[Callable[..., Any]]:
    """``fn`` for inspect to trace, where each flax NNX module among its arguments runs
    its ``__call__`` inside a JAX named scope of its attribute path (as linen modules do
    on their own), so that rows can name the layer. The classes' ``__call__`` are wrapped
    for the block and restored after; calls of other instances get no scope."""
    nnx = sys.modules.get("flax.nnx")  # only when the caller uses flax NNX already
    if nnx is None:
        yield fn
        return
    names: dict[int, str] = {}
    classes = _nnx_paths(args, nnx, {})  # the classes to wrap; names come at trace time

    def traced(*a: Any) -> Any:
        # the traced arguments are new module objects (unflattened from their leaves)
        _nnx_paths(a, nnx, names)
        return fn(*a)

    saved: dict[type, Any] = {}
    for cls in classes:
        saved[cls] = vars(cls).get("__call__")
        original = cls.__call__

        def call(self: Any, *a: Any, __original: Any = original, **kw: Any) -> Any:
            name = names.get(id(self))
            if name is None:
                return __original(self, *a, **kw)
            with jax.named_scope(name):
                return __original(self, *a, **kw)

        cls.__call__ = call  # type: ignore[method-assign]
    try:
        yield traced
    finally:
        for cls, before in saved.items():
            if before is None:
                delattr(cls, "__call__")
            else:
                cls.__call__ = before  # type: ignore[method-assign]


_SITE_PRIMITIVES = program.MATMUL_PRIMITIVES + program.RAGGED_PRIMITIVES + program.SCALED_PRIMITIVES


def _contains_matmul(eqn: Any) -> bool:
    names = _SITE_PRIMITIVES
    if eqn.primitive.name in names:
        return True
    return any(
        e.primitive.name in names
        for sub in program.sub_jaxprs(eqn.params)
        for e in program.walk(sub)
    )


def _site_row(eqn: Any, tag: sites.SiteTag, prefix: tuple[str, ...]) -> Row:
    p: Plan | None
    lhs_fmt, rhs_fmt = (s.split("[")[0] for s in (tag.lhs, tag.rhs))
    qarray = ":" in tag.lhs or ":" in tag.rhs
    try:
        p = plan(
            lhs_fmt,
            rhs_fmt,
            target=tag.target,
            preferred_element_type="float32" if qarray else tag.out,
            mode=tag.mode,
        )
    except (TypeError, ValueError, NotImplementedError):  # e.g. a custom Target's name
        p = None
    status = "native" if p is not None and p.method == "native" and not qarray else "emulated"
    try:
        bw = targets.get(tag.target).mem_bw_bytes_per_second
    except ValueError:  # a custom Target's name
        bw = None
    moved = _text_bytes(tag.lhs) + _text_bytes(tag.rhs)
    rate = p.rate if p is not None else None
    row = _row(
        tag.op, _source(eqn, prefix), tag.lhs, tag.rhs, status, p, tag.flops, rate, moved, bw
    )
    return dataclasses.replace(row, weight_route=tag.route)


def _text_bytes(operand: str) -> int:
    """Stored bytes of an operand text ``FORMAT[d0,d1,...]`` (``:SCHEME`` ignored): its
    elements at the format's bit width."""
    name, _, dims = operand.split(":")[0].partition("[")
    try:
        bits = formats.get(name).bits
    except (KeyError, ValueError):
        return 0
    shape = [int(d) for d in dims.rstrip("]").split(",") if d]
    return math.prod(shape) * bits // 8


def _aval_bytes(aval: Any) -> int:
    return math.prod(aval.shape) * np.dtype(aval.dtype).itemsize


def _row(
    op: str, src: str, lhs: str, rhs: str, status: str, p: Plan | None, flops: int,
    rate: float | None, moved: int, bw: float | None,
) -> Row:  # fmt: skip
    compute = flops / rate if rate else None
    memory = moved / bw if bw and moved else None
    known = [v for v in (compute, memory) if v is not None]
    seconds = max(known) if known else None
    return Row(
        op, src, lhs, rhs, status, p, flops, seconds,
        bytes=moved, compute_seconds=compute, memory_seconds=memory,
    )  # fmt: skip


def _rows(jaxpr: Any, t: targets.Target, mode: str, prefix: tuple[str, ...]) -> Iterator[Row]:
    """The rows of ``jaxpr``'s equations in program order; an emulate call's equations
    (its named scope) make one row, at its first equation that holds a matmul."""
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        tag = _site_tag(eqn)
        if tag is not None:
            if _contains_matmul(eqn) or _kernel_label(tag.route):
                yield _site_row(eqn, tag, prefix)
            continue
        if name == "pallas_call":
            yield Row(name, _source(eqn, prefix), "", "", "left alone (pallas_call)", None, 0, None)
            continue
        if name in _SITE_PRIMITIVES:
            yield _primitive_row(eqn, t, mode, prefix)
            continue
        inner = prefix + tuple(n for n in _scopes(eqn) if n)
        for sub in program.sub_jaxprs(eqn.params):
            yield from _rows(sub, t, mode, inner)


def _primitive_row(eqn: Any, t: targets.Target, mode: str, prefix: tuple[str, ...]) -> Row:
    name = eqn.primitive.name
    lhs, rhs = (v.aval for v in eqn.invars[:2])
    flops = _flops(eqn)
    p: Plan | None
    src = _source(eqn, prefix)
    moved = sum(_aval_bytes(v.aval) for v in (*eqn.invars[:2], eqn.outvars[0]))
    bw = t.mem_bw_bytes_per_second
    if name in program.SCALED_PRIMITIVES:
        p = plan(lhs.dtype, rhs.dtype, target=t, preferred_element_type="float32", mode=mode)
        return _row(
            name, src, _describe(lhs), _describe(rhs), "emulated", p, flops, p.rate, moved, bw
        )
    rate: float | None
    if t.supports(np.dtype(lhs.dtype), np.dtype(rhs.dtype)):
        rate = t.native_rate(formats.get(lhs.dtype), formats.get(rhs.dtype))
        status, p = "native", None
    elif runs_as_is(np.dtype(lhs.dtype), np.dtype(rhs.dtype), target=t):
        # JAX's own types (bf16 x bf16 on v2/v3): polyfill leaves the dot to XLA
        rate = _xla_rate(t, lhs.dtype, rhs.dtype)
        status, p = "native (XLA)", None
    else:
        p = plan(
            lhs.dtype,
            rhs.dtype,
            target=t,
            preferred_element_type=eqn.params.get("preferred_element_type"),
            mode=mode,
        )
        rate, status = p.rate, "emulated"
    return _row(name, src, _describe(lhs), _describe(rhs), status, p, flops, rate, moved, bw)


def _xla_rate(t: targets.Target, *dtypes: Any) -> float | None:
    """The rate of a dot XLA runs itself: bf16 for 16-bit floats (the matrix unit's
    multipliers on every TPU), float32 for anything wider, where the target states one."""
    wide = any(np.dtype(d).itemsize > 2 for d in dtypes)
    return t.rate("float32" if wide else "bfloat16") or None
