"""The route of a call with a weight operand: :func:`choose`, the one owner of that
decision for every front end and target; and the kernel op each front end's call is
decided for (:func:`dot_op`, :func:`ragged_op`).

The rule (the package docstring says what the settings mean), in this order:

1. the route setting "xla": the XLA route;
2. a target whose kind is not the platform the op's kernel lowers for: the XLA route
   ("target cpu is not a TPU");
3. an operand whose type is sharded along an Explicit mesh axis
   (``jax.typeof(x).sharding``): the kernels take whole operands, and JAX partitions the
   XLA route as it partitions its own dot (the result's sharding is JAX's);
   then the op's own refusal, known without tracing (operand pairs, shapes, the CPU
   kernel's switch and rows: :meth:`~emulate.routing.ops.KernelOp.refusal`);
4. under "auto", outside :func:`~emulate.routing.setting.planning`: where the program will
   not be lowered for the kernel's platform (no TPU may lower it, or JAX may partition it;
   the CPU kernel where JAX's backend is not the CPU), the XLA route;
5. the kernel's refusal when traced on the call's abstract operands (not for a kernel
   that compiles when traced);
6. otherwise the kernel route.

Under "kernel" and "interpret" a call kept off the kernel by 2, 3 or 5 raises ValueError
naming the argument and the reason (never a silent fallback).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from emulate.engine.args import DotArgs
from emulate.engine.ragged_args import RaggedArgs
from emulate.routing.cpu_op import CpuGemv
from emulate.routing.ops import PLATFORMS, KernelOp
from emulate.routing.pallas_ops import PallasGrouped, PallasMatmul
from emulate.routing.program import kernel_program
from emulate.routing.setting import WeightRoute, current_route, planning_now

__all__ = ["choose", "dot_op", "ragged_op"]


def dot_op(
    call: DotArgs, xla_route: Callable[[DotArgs], jax.Array] | None = None
) -> PallasMatmul | CpuGemv | None:
    """The kernel a ``dot_general`` call is decided for: the CPU kernel on a CPU target,
    ``emulate.pallas.matmul`` on any other (which a target that is no TPU keeps off);
    ``xla_route``: the front end's XLA route, which :func:`emulate.routing.run` needs (None:
    the op is only decided about). None for a call without a weight operand."""
    if call.target.kind == "cpu":
        return CpuGemv.of(call, xla_route)
    return PallasMatmul.of(call, xla_route)


def ragged_op(
    call: RaggedArgs, xla_route: Callable[[RaggedArgs], jax.Array] | None = None
) -> PallasGrouped | None:
    """The kernel a ``ragged_dot_general`` call is decided for: ``emulate.pallas.ragged_dot``
    (the grouped kernel; no other target has one); ``xla_route`` as in :func:`dot_op`. None
    for a call without a weight operand."""
    return PallasGrouped.of(call, xla_route)


def choose(call: Any, op: KernelOp | None) -> WeightRoute | None:
    """The route of a validated call for the kernel ``op`` (from :func:`dot_op`,
    :func:`ragged_op` or another front end's op; None: the call has no weight operand,
    and no route): the route setting, the target, the op's refusals and whether the
    program will be lowered for the kernel's platform decide (module docstring).

    Raises:
      ValueError: under the "kernel" or "interpret" setting, a call the kernel cannot take,
        naming the argument (the weight, ``target`` or ``mode``) and the reason.
    """
    if op is None:
        return None
    setting, name, side, target = current_route(), op.kernel_name, op.side, call.target
    interpret = setting == "interpret" and op.interpretable

    def xla(reason: str, arg: str) -> WeightRoute:
        if setting in ("kernel", "interpret"):
            raise ValueError(
                f"{arg}: route {setting!r} asks for {name}, which cannot take this call: "
                f"{reason}; use emulate.use_route('auto') or ('xla') for the XLA route"
            )
        return WeightRoute("xla", setting, reason, side, target.name, kernel_name=name)

    if setting == "xla":
        return xla("the route setting is 'xla'", side)
    if target.kind != op.platform:
        return xla(f"target {target.name} is not {PLATFORMS[op.platform]}", "target")
    x, w = op.operands(call)
    sharded = _explicitly_sharded(x, w, side)
    if sharded is not None:
        return xla(*sharded)
    why = op.refusal(call, x, w)
    if why is None and setting == "auto" and not planning_now():
        if (elsewhere := op.unlowered()) is not None:
            return xla(elsewhere, side)
    if why is None and not op.compiles_when_traced:
        traced = dataclasses.replace(op, interpret=interpret)  # type: ignore[type-var]
        got = kernel_program(traced, x, w)
        why = got if isinstance(got, str) else None
    if why is not None:
        return xla(why, "mode" if why.startswith("mode") else side)
    where = (
        "in Pallas' interpret mode on every platform"
        if interpret
        else f"where the program is lowered for {PLATFORMS[op.platform]}; the XLA route elsewhere"
    )
    reason = f"{side} read as stored by {name} {where}{op.advice(w)}"
    return WeightRoute("kernel", setting, reason, side, target.name, interpret, name)


def _explicitly_sharded(x: Any, w: Any, side: str) -> tuple[str, str] | None:
    """``(reason, argument)`` for the first of ``x`` (the activations) and ``w`` (the
    weight, the call's ``side``) with a leaf whose type is sharded along a mesh axis (only
    Explicit axes appear in a type), else None."""
    for arg, operand in (("lhs" if side == "rhs" else "rhs", x), (side, w)):
        for leaf in jax.tree.leaves(operand):
            aval = jax.typeof(leaf)
            spec = aval.sharding.spec
            axes = [a for e in spec for a in (e if isinstance(e, tuple) else (e,)) if a]
            if axes:
                return (
                    f"{aval.str_short()} is sharded along Explicit mesh axis "
                    f"{axes[0]!r}: the kernels take unsharded operands",
                    arg,
                )
    return None
