"""One jitted program per plan: the route a plan names, on the platform it is lowered for.

:func:`run_plan` is what every front end calls. A sliced plan (mode "exact" outside the
exact class) runs :func:`emulate.engine.exact.contract`; any other decodes its operands and
contracts them (:func:`emulate.engine.contract.contract_decoded`), tile by tile where the
program is lowered for the CPU and a decoded operand is large
(:mod:`emulate.engine.tiled`). A plan with a fallback (a native pair the host cannot
compile) runs its own route where lowered for its platform and the fallback elsewhere.
Its derivative is :mod:`emulate.engine.grad`'s: the f32 dot of the decoded operands and
their tangents, with the same dimension numbers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from emulate import formats
from emulate.engine import exact, grad, tiled
from emulate.engine.contract import contract_decoded
from emulate.engine.layout import DimensionNumbers, dot_general, result_shape
from emulate.engine.operands import Operand, Precision, decode_to
from emulate.planning.plan import Plan, plan
from emulate.targets import TargetLike

__all__ = ["cache_size", "per_platform", "plan_for", "run_plan"]


def plan_for(
    a: Operand,
    b: Operand,
    target: TargetLike,
    preferred_element_type: formats.FormatLike | None,
    mode: str | None,
) -> Plan:
    """The plan for these operands; ``preferred_element_type`` is the result type a
    validated call names (:mod:`emulate.engine.args` refuses one XLA cannot hold)."""
    return plan(
        a.format, b.format, target=target, preferred_element_type=preferred_element_type, mode=mode
    )


def per_platform(
    p: Plan, run: Callable[[Plan, Operand, Operand], jax.Array], lhs: Operand, rhs: Operand
) -> jax.Array:
    """``run(p, lhs, rhs)``; where the plan has a fallback, chosen when JAX lowers the program:
    the plan on its own platform, the fallback plan everywhere else."""
    if p.fallback is None:
        return run(p, lhs, rhs)
    branches = {p.platform: functools.partial(run, p)}
    return lax.platform_dependent(lhs, rhs, **branches, default=functools.partial(run, p.fallback))


def _untiled(
    q: Plan, lhs: Operand, rhs: Operand, dn: DimensionNumbers, precision: Precision
) -> jax.Array:
    a = decode_to(lhs, q.lhs_compute, q.lhs_scale, target=q.target)
    b = decode_to(rhs, q.rhs_compute, q.rhs_scale, target=q.target)
    return contract_decoded(q, a, b, dn, precision)


def _route(
    q: Plan,
    lhs: Operand,
    rhs: Operand,
    dn: DimensionNumbers,
    precision: Precision,
    tiling: tiled.Settings,
) -> jax.Array:
    shape = result_shape(tuple(lhs.shape), tuple(rhs.shape), dn)
    if math.prod(shape) == 0:  # no sum to take (M, N or a batch of 0): JAX's empty result
        return jnp.zeros(shape, formats.get(q.out).dtype)
    if q.slicing is not None:
        return exact.contract(q, lhs, rhs, dn, precision)
    t = tiled.tiling_for(q, lhs, rhs, dn, tiling)
    untiled = functools.partial(_untiled, q, dn=dn, precision=precision)
    if t is None:
        return untiled(lhs, rhs)
    cpu = functools.partial(tiled.contract, q, t, dimension_numbers=dn, precision=precision)
    return lax.platform_dependent(lhs, rhs, cpu=cpu, default=untiled)


@functools.partial(jax.jit, static_argnames=("p", "dimension_numbers", "precision", "tiling"))
def _run(
    p: Plan,
    lhs: Operand,
    rhs: Operand,
    dimension_numbers: DimensionNumbers,
    precision: Precision,
    tiling: tiled.Settings,
) -> jax.Array:
    def run(q: Plan, a: Operand, b: Operand) -> jax.Array:
        return _route(q, a, b, dimension_numbers, precision, tiling)

    return per_platform(p, run, lhs, rhs)


def _forward(static: tuple, lhs: Operand, rhs: Operand) -> jax.Array:
    p, dimension_numbers, precision, tiling = static
    return _run(p, lhs, rhs, dimension_numbers, precision, tiling)


def _contract_f32(static: tuple, a: jax.Array, b: jax.Array) -> jax.Array:
    _, dimension_numbers, precision, _ = static
    return dot_general(a, b, dimension_numbers, precision, preferred_element_type=jnp.float32)


_differentiable_run = grad.bilinear(_forward, _contract_f32)


def run_plan(
    p: Plan,
    lhs: Operand,
    rhs: Operand,
    dimension_numbers: DimensionNumbers,
    precision: Precision,
    tiling: tiled.Settings = tiled.DEFAULT,
) -> jax.Array:
    """Run plan ``p`` on two operands (one jitted program; the plan, the dimension numbers,
    the precision and the tiling settings are static).

    Differentiable (``grad``, ``jvp``, ``vjp``, under ``vmap``) with
    ``lax.dot_general``'s rule, ``d(a.b) = da.b + a.db``, computed as float32 dots of the
    exactly decoded operands and the tangents (:mod:`emulate.engine.grad`); the
    exactness contract is on the forward value only."""
    return _differentiable_run((p, dimension_numbers, precision, tiling), lhs, rhs)


def cache_size() -> int:
    """How many programs :func:`run_plan` has compiled in this process (its jit cache):
    a repeated call with the same plan, shapes and settings must not add one."""
    return _run._cache_size()  # type: ignore[attr-defined]  # jax's jitted-function API
