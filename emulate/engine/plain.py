"""The plain steps: a call :func:`emulate.engine.passthrough.passes_through` hands to JAX,
after emulate's own messages where it has them (a type that is none, dimension numbers,
group sizes). One owner for the front doors (:mod:`emulate.engine.front`) and for the
route queries (:mod:`emulate.routing.query`), which answer "no route" for such a call and
raise what the front end raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax import lax

from emulate.engine import args
from emulate.engine.ragged_args import ragged_shape
from emulate.group_sizes import as_group_sizes, check_group_sizes

__all__ = ["plain_dot", "plain_ragged"]


def plain_dot(a: Mapping[str, Any]) -> jax.Array:
    """``lax.dot_general`` of a front-end call's arguments ``a`` (plain arrays or scalars),
    after emulate's messages for a type that is none and for dimension numbers."""
    args.preferred(a["preferred_element_type"])
    lhs, rhs = a["lhs"], a["rhs"]
    dn = args.dot_dimension_numbers(
        a["dimension_numbers"], args.shape_of(lhs), args.shape_of(rhs), "lhs, rhs: as JAX's"
    )
    return lax.dot_general(
        lhs, rhs, dn, a["precision"], a["preferred_element_type"],
        out_sharding=a.get("out_sharding"),
    )  # fmt: skip


def plain_ragged(a: Mapping[str, Any]) -> jax.Array:
    """``lax.ragged_dot_general`` of a front-end call's arguments ``a``, after the
    group-size check every route makes (a list of sizes as an array; concrete sizes >= 0)
    and JAX's shape rule (JAX checks the rest: types, dimension numbers)."""
    lhs, rhs, rdn = a["lhs"], a["rhs"], a["ragged_dot_dimension_numbers"]
    gs = as_group_sizes(a["group_sizes"])
    if isinstance(rdn, lax.RaggedDotDimensionNumbers):
        ragged_shape(np.shape(lhs), np.shape(rhs), np.shape(gs), rdn)
        check_group_sizes(gs)
    return lax.ragged_dot_general(lhs, rhs, gs, rdn, a["precision"], a["preferred_element_type"])
