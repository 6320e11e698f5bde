"""The drop-in front doors' one skeleton: :func:`call`.

``emulate.dot_general``, ``conv_general_dilated`` and ``ragged_dot_general`` each keep
their explicit signature and docstring for users; their body is
``front.call(DOOR, locals())``, where the :class:`FrontDoor` names what differs:

1. ``precision`` as the front ends pass it on (:func:`emulate.engine.args.precision_arg`);
2. a call emulate has nothing to add to (:func:`emulate.engine.passthrough.passes_through`)
   goes to JAX: the door's ``plain`` step (emulate's own messages where it has them, then
   the ``lax`` function with the same arguments);
3. otherwise the door's validator checks the call once into its record (it takes the
   front end's keyword arguments that it names) and the door's ``emulated`` step runs it
   (its route, :mod:`emulate.routing`, and its XLA route).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax

from emulate.engine.args import precision_arg
from emulate.engine.passthrough import passes_through

__all__ = ["FrontDoor", "call"]


@dataclasses.dataclass(frozen=True)
class FrontDoor:
    """What one front door does besides the skeleton (module docstring).

    Attributes:
      plain: a call passed through: the arguments (precision normalized) -> JAX's result.
      validate: the door's validator; called with the arguments it names.
      emulated: a validated call's record -> the result.
    """

    plain: Callable[[Mapping[str, Any]], jax.Array]
    validate: Callable[..., Any]
    emulated: Callable[[Any], jax.Array]


@functools.cache
def _names(validate: Callable[..., Any]) -> tuple[str, ...]:
    return tuple(inspect.signature(validate).parameters)


def call(door: FrontDoor, arguments: Mapping[str, Any]) -> jax.Array:
    """Run one front-door call, ``arguments`` the front end's own (``locals()``): lhs, rhs,
    lhs_format, rhs_format, target, mode, precision, preferred_element_type and the rest."""
    a = {**arguments, "precision": precision_arg(arguments["precision"])}
    if passes_through(
        a["lhs"], a["rhs"], a["lhs_format"], a["rhs_format"], a["target"], a["mode"],
        a["preferred_element_type"],
    ):  # fmt: skip
        return door.plain(a)
    record = door.validate(**{name: a[name] for name in _names(door.validate)})
    return door.emulated(record)
