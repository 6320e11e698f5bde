"""Deprecated: the route of a weight contraction moved to :mod:`emulate.routing`.

Every name this module had still resolves, with a DeprecationWarning naming its new home;
``choose``, ``run`` and ``run_op`` take the new signatures (:func:`emulate.routing.choose`
``(call, op)``, :func:`emulate.routing.run` ``(call, op, route)``), and ``decide``,
``held_operands``, ``operand_refusal`` and ``prepared_types`` keep their old ones.
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from typing import Any

from emulate import moved, routing
from emulate.engine.args import DotArgs
from emulate.routing import ops, setting

#: old name -> (new home, the object)
_MOVED: dict[str, tuple[str, Any]] = {
    "ROUTES": ("emulate.routing.ROUTES", routing.ROUTES),
    "WeightRoute": ("emulate.routing.WeightRoute", routing.WeightRoute),
    "choose": ("emulate.routing.choose (call, op)", routing.choose),
    "current_route": ("emulate.routing.current_route", routing.current_route),
    "is_prepared": ("emulate.routing.is_prepared", routing.is_prepared),
    "kernel_operand": ("emulate.routing.ops.kernel_operand", ops.kernel_operand),
    "planning": ("emulate.routing.planning", routing.planning),
    "prepare_weights": ("emulate.routing.prepare_weights", routing.prepare_weights),
    "run": ("emulate.routing.run (call, op, route)", routing.run),
    "run_op": ("emulate.routing.run (call, op, route)", routing.run),
    "tpu_may_lower": ("emulate.routing.tpu_may_lower", setting.tpu_may_lower),
    "unprepared": ("emulate.routing.unprepared", routing.unprepared),
    "use_route": ("emulate.routing.use_route", routing.use_route),
    "weight_route": ("emulate.routing.weight_route", routing.weight_route),
    "weight_side": ("emulate.routing.ops.weight_side", ops.weight_side),
}


def _decide(call: DotArgs, held: tuple[Any, Any] = (None, None)) -> routing.WeightRoute | None:
    """The old ``decide(call, held)``: :func:`emulate.routing.choose` for the call's
    :func:`emulate.routing.dot_op` (``held``: prepared weights standing for the views)."""
    if held != (None, None):
        call = dataclasses.replace(call, prepared=held)
    return routing.choose(call, routing.dot_op(call))


def _held_operands(lhs: Any, rhs: Any) -> tuple[Any, Any, tuple[Any, Any]]:
    """The old ``held_operands``: views and the prepared weights held aside."""
    from emulate.engine.prepared import view

    held = tuple(x if routing.is_prepared(x) else None for x in (lhs, rhs))
    return view(lhs), view(rhs), held  # type: ignore[return-value]


def _operand_refusal(call: DotArgs, x: Any, w: Any) -> str | None:
    """The old ``operand_refusal(call, x, w)``."""
    return ops.operand_refusal(call.mode, call.result, x, w)


def _prepared_types() -> tuple[type, ...]:
    """The old ``prepared_types()``: the prepared weight types while ``emulate.pallas`` is
    loaded (:class:`emulate.engine.prepared.Prepared` is their protocol)."""
    mod = sys.modules.get("emulate.pallas")
    return () if mod is None else (mod.KernelQWeight, mod.KernelWeight)


_KEPT = {
    "decide": ("emulate.routing.choose(call, emulate.routing.dot_op(call))", _decide),
    "held_operands": ("emulate.engine.args.dot_args (it keeps them)", _held_operands),
    "operand_refusal": ("emulate.routing.ops.operand_refusal", _operand_refusal),
    "prepared_types": ("emulate.engine.prepared.Prepared", _prepared_types),
}


def __getattr__(name: str) -> Any:
    if name in _MOVED or name in _KEPT:
        new, value = _MOVED.get(name) or _KEPT[name]
        warnings.warn(
            f"emulate.kernel_route.{name} is deprecated: use {new}",
            DeprecationWarning,
            stacklevel=2,
        )
        return value
    return _older(name)  # names moved before (emulate.moved), or AttributeError


_older = moved.module_getattr(__name__)
