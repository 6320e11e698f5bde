"""The route a front end would give a call, asked without running it:
:func:`weight_route` (``dot_general``) and :func:`ragged_dot_route` (``ragged_dot_general``).
Each traces the front end's validator on the arguments (arrays or
``jax.ShapeDtypeStruct`` s) under :func:`~emulate.routing.setting.planning` and asks
:func:`~emulate.routing.choose` for the op the front end would run, so the answer is the
front end's, decided as for a lowering for the target. A call the front end hands to JAX
as it is (:func:`~emulate.engine.passthrough.passes_through`: bool or complex operands, an
integer result of floats) has no route: None, after the front end's plain step traced on
the arguments (:mod:`emulate.engine.plain`), so the query raises what the call raises.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import targets
from emulate.engine.args import dot_args
from emulate.engine.passthrough import passes_through
from emulate.engine.plain import plain_dot, plain_ragged
from emulate.engine.ragged_args import BASIC, ragged_args
from emulate.formats import FormatLike
from emulate.group_sizes import as_group_sizes, check_group_sizes
from emulate.routing.choose import choose, dot_op, ragged_op
from emulate.routing.setting import WeightRoute, planning

__all__ = ["ragged_dot_route", "weight_route"]


def weight_route(
    lhs: Any,
    rhs: Any,
    dimension_numbers: Any = None,
    *,
    preferred_element_type: Any = None,
    target: targets.TargetLike = None,
    mode: str | None = None,
) -> WeightRoute | None:
    """The route :func:`emulate.dot_general` would give this call (arguments as its; arrays
    or ``jax.ShapeDtypeStruct`` s in the operands), without running it; None for a call
    without a weight operand. ``print(r.explain())`` says why: ``emulate.pallas.matmul``
    on a TPU target, the CPU kernel (``emulate.cpu.gemv``) on the CPU, or XLA.

    Raises:
      ValueError: under the "kernel" / "interpret" setting, as :func:`emulate.routing.choose`;
        what :func:`emulate.dot_general` raises for the arguments.
    """
    found: list[WeightRoute | None] = []

    def probe(a: Any, b: Any) -> jax.Array:  # traced: the operands may be abstract
        if passes_through(a, b, None, None, target, mode, preferred_element_type):
            pet = preferred_element_type
            plain = {"lhs": a, "rhs": b, "dimension_numbers": dimension_numbers}
            plain_dot({**plain, "precision": None, "preferred_element_type": pet})
            found.append(None)
            return jnp.zeros(())
        call = dot_args(
            a, b, dimension_numbers, None, preferred_element_type, target=target, mode=mode
        )
        found.append(choose(call, dot_op(call)))
        return jnp.zeros(())

    with planning():
        _abstractly(probe, lhs, rhs)
    return found[0]


def ragged_dot_route(
    lhs: Any,
    rhs: Any,
    group_sizes: Any,
    ragged_dot_dimension_numbers: lax.RaggedDotDimensionNumbers = BASIC,
    *,
    preferred_element_type: FormatLike | None = None,
    target: targets.TargetLike = None,
    mode: str | None = None,
) -> WeightRoute | None:
    """The route :func:`emulate.ragged_dot_general` would give this call (arguments as its;
    arrays or ``jax.ShapeDtypeStruct`` s), decided as for a TPU lowering, without running
    it: ``emulate.pallas.ragged_dot`` (``route.label()`` is "pallas.ragged_dot") or XLA
    with the reason; None for a call without a weight operand. ``print(r.explain())``
    says why, as :func:`weight_route` does for ``dot_general``.

    Raises:
      ValueError: under the "kernel" / "interpret" setting, a call the grouped kernel
        cannot take; what :func:`emulate.ragged_dot_general` raises for the arguments
        (concrete negative group sizes included).
    """
    found: list[WeightRoute | None] = []

    def probe(a: Any, b: Any, g: Any) -> jax.Array:  # traced: the operands may be abstract
        if passes_through(a, b, None, None, target, mode, preferred_element_type):
            plain_ragged({"lhs": a, "rhs": b, "group_sizes": g, "precision": None,
                          "ragged_dot_dimension_numbers": ragged_dot_dimension_numbers,
                          "preferred_element_type": preferred_element_type})  # fmt: skip
            found.append(None)
            return jnp.zeros(())
        call = ragged_args(
            a, b, g, ragged_dot_dimension_numbers, None, preferred_element_type,
            target=target, mode=mode,
        )  # fmt: skip
        found.append(choose(call, ragged_op(call)))
        return jnp.zeros(())

    sizes = group_sizes
    if not isinstance(group_sizes, jax.ShapeDtypeStruct):  # concrete: checked as the call's
        sizes = as_group_sizes(group_sizes)
        check_group_sizes(sizes)
    with planning():
        _abstractly(probe, lhs, rhs, sizes)
    return found[0]


def _abstractly(probe: Any, *values: Any) -> None:
    """``jax.eval_shape`` of ``probe(*values)`` with the arrays (and ``ShapeDtypeStruct`` s)
    abstract; any other value (a list, a scalar, None, a QArray's pytree is an array's) as
    it is, so the probe sees what the front end would (``eval_shape`` would make a list of
    numbers a list of tracers)."""
    abstract = [isinstance(v, (jax.Array, np.ndarray, jax.ShapeDtypeStruct)) or
                not _plain_value(v) for v in values]  # fmt: skip
    given = [v for v, a in zip(values, abstract) if a]

    def run(*xs: Any) -> Any:
        it = iter(xs)
        return probe(*(next(it) if a else v for v, a in zip(values, abstract)))

    jax.eval_shape(run, *given)


def _plain_value(v: Any) -> bool:
    """A value JAX reads by its own rules (a Python number, list or tuple, None)."""
    return v is None or isinstance(v, (int, float, complex, bool, list, tuple, str))
