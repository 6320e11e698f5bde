"""Running a call on the route :func:`emulate.routing.choose` gave it.

On the kernel route the call runs ``lax.platform_dependent``: the op's kernel (its program
traced once, :func:`emulate.routing.program.kernel_program`) where the program is lowered
for the op's platform, the op's XLA route everywhere else (under ``jit`` only the chosen
branch is lowered); in interpret mode the kernel everywhere. Differentiable as the XLA
route is: a ``custom_jvp`` whose tangent is ``jax.jvp`` of the XLA route (the backward pass
never runs the kernel). ``vmap``: batched by JAX where the kernel batches, once per batch
entry (``lax.map``) for an op with ``map_batches``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
from jax import lax
from jax.extend.core import jaxpr_as_fun

from emulate.engine import sites
from emulate.routing.ops import KernelOp
from emulate.routing.program import kernel_program
from emulate.routing.setting import WeightRoute, planning_now

__all__ = ["run", "site_tag"]


def run(call: Any, op: KernelOp, route: WeightRoute) -> jax.Array:
    """Run a call :func:`emulate.routing.choose` gave ``op``'s kernel route: the kernel
    where the program is lowered for ``op.platform`` (everywhere in interpret mode), the
    XLA route elsewhere. A program traced only to be inspected
    (:func:`emulate.routing.setting.planning`) runs the XLA route of an op whose kernel
    compiles when traced (``compiles_when_traced``)."""
    assert route.kernel
    x, w = op.operands(call)
    op = dataclasses.replace(op, interpret=route.interpret)  # type: ignore[type-var]
    if op.compiles_when_traced and planning_now():
        return op.xla(x, w)
    if not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves((x, w))):
        return _forward(op, x, w)  # nothing to differentiate: skip custom_jvp's dispatch
    return _differentiable(op, x, w)


def site_tag(call: Any, op: KernelOp | None, route: WeightRoute | None) -> sites.SiteTag | None:
    """The call's site tag (:mod:`emulate.engine.sites`, what :func:`emulate.inspect` reads)
    with its route: the kernel's label, or "xla: " and why; None for a call without a
    weight operand, or on a target whose platform the op's kernel is not for."""
    if op is None or route is None or call.target.kind != op.platform:
        return None
    label = route.label() if route.kernel else f"xla: {route.reason}"
    return dataclasses.replace(call.tag(), route=label)


@functools.partial(jax.jit, static_argnums=0)
def _forward(op: Any, x: Any, w: Any) -> jax.Array:
    kernel = kernel_program(op, x, w)
    assert not isinstance(kernel, str)  # choose() saw it accepted

    def replay(x: Any, w: Any) -> jax.Array:
        return jaxpr_as_fun(kernel)(*jax.tree.leaves((x, w)))[0]

    def routed(x: Any, w: Any) -> jax.Array:
        if op.interpret:
            return replay(x, w)
        return lax.platform_dependent(x, w, **{op.platform: replay}, default=op.xla)

    return _mapped(routed)(x, w) if op.map_batches else routed(x, w)


def _mapped(f: Callable[[Any, Any], jax.Array]) -> Callable[[Any, Any], jax.Array]:
    """``f`` whose ``vmap`` runs it once per batch entry (``lax.map``): for a kernel that
    Pallas cannot batch itself (the grouped kernel's scalar-prefetched schedule)."""
    g = jax.custom_batching.custom_vmap(f)

    @g.def_vmap
    def _rule(size: int, in_batched: Any, x: Any, w: Any) -> tuple[jax.Array, bool]:
        leaves, tree = jax.tree.flatten((x, w))
        flags = jax.tree.leaves(in_batched)

        def one(batched: list[Any]) -> jax.Array:
            it = iter(batched)
            return f(
                *jax.tree.unflatten(tree, [next(it) if b else v for v, b in zip(leaves, flags)])
            )

        return lax.map(one, [v for v, b in zip(leaves, flags) if b]), True

    return g


_differentiable = jax.custom_jvp(_forward, nondiff_argnums=(0,))


@_differentiable.defjvp
def _jvp(op: Any, primals: tuple[Any, Any], tangents: tuple[Any, Any]):
    out = _differentiable(op, *primals)
    _, t = jax.jvp(op.xla, primals, tangents)
    return out, t
