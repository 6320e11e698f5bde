"""Matmul sites of a JAX program: every ``dot_general``, ``conv_general_dilated``, grouped
matmul (``ragged_dot_general``) and block-scaled matmul (``jax.nn.scaled_matmul``) in a
jaxpr, sub-jaxprs included (jit, scan, while, cond, remat, custom_jvp/vjp, shard_map, ...).

Sub-jaxprs are found by walking every equation parameter that holds a ``Jaxpr`` or
``ClosedJaxpr`` (or a sequence of them), not a fixed list of primitive names, so the walk
survives JAX renaming its higher-order primitives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core

from emulate import targets
from emulate.planning.plan import runs_as_is

__all__ = [
    "MATMUL_PRIMITIVES",
    "OPAQUE_PRIMITIVES",
    "RAGGED_PRIMITIVES",
    "SCALED_PRIMITIVES",
    "Site",
    "sites",
    "sub_jaxprs",
    "unsupported_sites",
    "walk",
]

MATMUL_PRIMITIVES = ("dot_general", "conv_general_dilated")

#: Grouped matmuls (``lax.ragged_dot`` / ``ragged_dot_general``): operands lhs and rhs as a
#: dot's, then ``group_sizes``.
RAGGED_PRIMITIVES = ("ragged_dot_general",)

#: Block-scaled matmuls (``jax.nn.scaled_matmul``): lowered by JAX only on CUDA and ROCm,
#: so every one of them is a site to emulate.
SCALED_PRIMITIVES = ("scaled_matmul_wrapper",)


@dataclasses.dataclass(frozen=True)
class Site:
    """One matmul or convolution equation: its primitive, operand dtypes and shapes."""

    primitive: str
    lhs_dtype: str
    rhs_dtype: str
    lhs_shape: tuple[int, ...]
    rhs_shape: tuple[int, ...]
    equation: Any = dataclasses.field(compare=False, repr=False)


def sub_jaxprs(params: dict[str, Any]) -> Iterator[jex_core.Jaxpr]:
    """Every Jaxpr held by an equation's parameters (ClosedJaxprs unwrapped)."""
    for value in params.values():
        items = value if isinstance(value, (tuple, list)) else (value,)
        for item in items:
            if isinstance(item, jex_core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jex_core.Jaxpr):
                yield item


#: Primitives whose sub-jaxprs are kernels for another compiler (Mosaic, Triton): their
#: matmuls are not XLA dots, so the walk does not enter them.
OPAQUE_PRIMITIVES = ("pallas_call",)


def walk(jaxpr: jex_core.Jaxpr) -> Iterator[Any]:
    """Every equation of ``jaxpr`` and of its sub-jaxprs, depth first, in program order.

    The kernels of ``pallas_call`` equations are not entered (see ``OPAQUE_PRIMITIVES``).
    """
    for eqn in jaxpr.eqns:
        yield eqn
        if eqn.primitive.name in OPAQUE_PRIMITIVES:
            continue
        for sub in sub_jaxprs(eqn.params):
            yield from walk(sub)


def sites(program: jex_core.Jaxpr | jex_core.ClosedJaxpr) -> list[Site]:
    """The matmul sites of a (Closed)Jaxpr, in program order, sub-jaxprs included."""
    jaxpr = program.jaxpr if isinstance(program, jex_core.ClosedJaxpr) else program
    found = []
    for eqn in walk(jaxpr):
        if eqn.primitive.name in MATMUL_PRIMITIVES + RAGGED_PRIMITIVES + SCALED_PRIMITIVES:
            lhs, rhs = (v.aval for v in eqn.invars[:2])
            found.append(
                Site(
                    eqn.primitive.name,
                    np.dtype(lhs.dtype).name,
                    np.dtype(rhs.dtype).name,
                    tuple(lhs.shape),
                    tuple(rhs.shape),
                    eqn,
                )
            )
    return found


def unsupported_sites(
    fn: Callable[..., Any], *args: Any, target: targets.TargetLike = None
) -> list[Site]:
    """The sites of ``fn(*args)`` whose operand pair ``target`` does not run natively."""
    t = targets.current_target(target)
    closed = jax.make_jaxpr(fn)(*args)
    return [s for s in sites(closed) if needs_emulation(s, t)]


def needs_emulation(site: Site, target: targets.TargetLike) -> bool:
    """Whether ``target`` cannot run ``site`` as it is (a block-scaled matmul never can)."""
    t = targets.current_target(target)
    return site.primitive in SCALED_PRIMITIVES or not runs_as_is(
        site.lhs_dtype, site.rhs_dtype, target=t
    )
