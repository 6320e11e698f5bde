"""``inspect(fn, *args)``: one row per matmul / convolution site of a program, and its fate.

For each ``dot_general`` and ``conv_general_dilated`` equation (sub-jaxprs included) the
report gives the source line, the operand dtypes and shapes, whether the target runs it
natively or :func:`emulate.polyfill` emulates it (and with which plan), and an estimated
matrix-unit time from the target's op rates. ``pallas_call`` equations are listed as left
alone: their kernels are not rewritten.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core

from emulate import formats, program, targets
from emulate.planning.plan import Plan, plan
from emulate.tables import table

__all__ = ["Row", "Report", "inspect"]


@dataclasses.dataclass(frozen=True)
class Row:
    """One site.

    Attributes:
      primitive: "dot_general", "conv_general_dilated" or "pallas_call".
      source: "file:line (function)" of the user code that made the equation, or "?".
      lhs, rhs: operand dtype names and shapes, e.g. "int8[64,4096]".
      status: "native", "emulated" or "left alone (pallas_call)".
      plan: the plan for emulated sites (None otherwise).
      flops: 2 * output elements * K (0 for pallas_call).
      seconds: flops / the rate of the unit the site runs on (None when the target
        states no rate for it).
    """

    primitive: str
    source: str
    lhs: str
    rhs: str
    status: str
    plan: Plan | None
    flops: int
    seconds: float | None


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
                "route": r.plan.method if r.plan else "",
                "est. time": _fmt_seconds(r.seconds),
            }
            for r in self.rows
        ]
        columns = ("source", "op", "lhs", "rhs", "status", "route", "est. time")
        return head + "\n" + table(rows, columns=columns, rule=False)


def _fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def _source(eqn: jex_core.JaxprEqn) -> str:
    try:
        from jax._src import source_info_util  # no public API for the user frame yet

        frame = source_info_util.user_frame(eqn.source_info.traceback)
    except (ImportError, AttributeError):  # source lines are best effort
        frame = None
    if frame is None:
        return "?"
    return f"{frame.file_name}:{frame.start_line} ({frame.function_name})"


def _describe(aval: Any) -> str:
    return f"{np.dtype(aval.dtype).name}[{','.join(map(str, aval.shape))}]"


def _flops(eqn: Any) -> int:
    out = eqn.outvars[0].aval
    lhs, rhs = (v.aval for v in eqn.invars[:2])
    if eqn.primitive.name == "dot_general":
        (lc, _), _ = eqn.params["dimension_numbers"]
        k = math.prod(lhs.shape[d] for d in lc)
    elif eqn.primitive.name in program.SCALED_PRIMITIVES:  # (B, M, K) x (B, N, K)
        k = lhs.shape[-1]
    else:
        dn = eqn.params["dimension_numbers"]
        k = math.prod(rhs.shape[d] for d in dn.rhs_spec[1:])
    return 2 * math.prod(out.shape) * k


def inspect(
    fn: Callable[..., Any], *args: Any, target: targets.TargetLike = None, mode: str = "fast"
) -> Report:
    """Trace ``fn(*args)`` and report every matmul / convolution site for ``target``.

    Args:
      fn: the function, as you would pass it to :func:`emulate.polyfill`.
      args: example arguments (arrays or ``jax.ShapeDtypeStruct``).
      target: target name or Target; default the current target.
      mode: the mode the emulated sites would run in.

    Returns:
      A :class:`Report`; ``print(report)`` shows the table.
    """
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    if mode not in ("fast", "exact"):
        raise ValueError(f"mode: expected one of 'fast', 'exact', got {mode!r}")
    t = targets.current_target(target)
    closed = jax.make_jaxpr(fn)(*args)
    rows = []
    p: Plan | None
    for eqn in program.walk(closed.jaxpr):
        name = eqn.primitive.name
        if name == "pallas_call":
            rows.append(Row(name, _source(eqn), "", "", "left alone (pallas_call)", None, 0, None))
            continue
        if name not in program.MATMUL_PRIMITIVES + program.SCALED_PRIMITIVES:
            continue
        lhs, rhs = (v.aval for v in eqn.invars[:2])
        flops = _flops(eqn)
        if name in program.SCALED_PRIMITIVES:
            p = plan(lhs.dtype, rhs.dtype, target=t, preferred_element_type="float32", mode=mode)
            seconds = flops / p.rate if p.rate else None
            status = "emulated"
            rows.append(
                Row(name, _source(eqn), _describe(lhs), _describe(rhs), status, p, flops, seconds)
            )
            continue
        if t.supports(np.dtype(lhs.dtype), np.dtype(rhs.dtype)):
            a, b = formats.get(lhs.dtype), formats.get(rhs.dtype)
            rate = t.native_rate(a, b)
            status, p = "native", None
        else:
            p = plan(
                lhs.dtype,
                rhs.dtype,
                target=t,
                preferred_element_type=eqn.params.get("preferred_element_type"),
                mode=mode,
            )
            rate, status = p.rate, "emulated"
        seconds = flops / rate if rate else None
        rows.append(
            Row(name, _source(eqn), _describe(lhs), _describe(rhs), status, p, flops, seconds)
        )
    return Report(t.name, tuple(rows))
