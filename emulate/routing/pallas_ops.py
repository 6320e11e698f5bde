"""The Pallas TPU kernels as kernel ops (:class:`emulate.routing.ops.KernelOp`).

- :class:`PallasMatmul`: ``emulate.pallas.matmul`` for a ``dot_general`` whose weight is
  2-D ``(K, N)`` as stored (it contracts along its first axis), the activations any rank
  with one contracting axis, no batch dimensions; the activations' other axes are
  flattened into the kernel's M (leading batch axes, M = 1 decode).
- :class:`PallasGrouped`: ``emulate.pallas.ragged_dot`` (the grouped kernel) for
  ``lax.ragged_dot``'s ``(m, k) x (g, k, n)`` with the experts stored ``(G, K, N)``.

Both read the operand pairs of :func:`emulate.routing.ops.operand_refusal`, and refuse
what their kernel raises for when traced on the call's abstract operands
(:func:`emulate.routing.program.kernel_program`). ``emulate.pallas`` (which imports
``jax.experimental.pallas``) is imported only where a kernel is traced.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from emulate import sharding, targets
from emulate.engine.args import DotArgs
from emulate.engine.operands import Operand
from emulate.engine.prepared import unprepared
from emulate.engine.ragged_args import BASIC, RaggedArgs, ragged_args
from emulate.quantized.array import QArray
from emulate.routing.ops import kernel_operand, operand_refusal, weight_side
from emulate.routing.setting import tpu_may_lower

__all__ = ["PallasGrouped", "PallasMatmul", "pallas_unlowered"]

_NO_TPU = (
    "no TPU in this process (no TPU backend, and JAX's default device is not a TPU, as "
    "emulate.compiler makes a compile-only one): the program runs on this host; "
    "emulate.use_route('kernel') puts the kernel in for a TPU lowering anyway"
)

_PARTITIONED = (
    "the program may be partitioned over {} devices, and JAX does not partition a Pallas "
    "kernel: run the contraction inside jax.shard_map (each shard takes the kernel), or "
    "emulate.use_route('kernel') for a program on one device"
)


def pallas_unlowered() -> str | None:
    """Why route "auto" keeps a Pallas kernel out of a program traced now: no TPU may
    lower it, or JAX may partition it (it does not partition a Pallas call)."""
    if not tpu_may_lower():
        return _NO_TPU
    if (devices := sharding.partitioned_over()) > 1:
        return _PARTITIONED.format(devices)
    return None


def _pallas() -> Any:
    import emulate.pallas  # imports jax.experimental.pallas: only when a kernel is traced

    return emulate.pallas


@dataclasses.dataclass(frozen=True)
class PallasMatmul:
    """A ``dot_general`` call on ``emulate.pallas.matmul`` (module docstring): what its
    program is specialized on, its kernel and its XLA route. ``x`` is the activations,
    ``w`` the weight (a QArray, prepared weight or low-precision Operand)."""

    side: str
    dimension_numbers: Any
    precision: Any
    result: str
    wrap_to: str | None
    target: targets.Target
    mode: str
    interpret: bool
    xla_route: Callable[[DotArgs], jax.Array] | None  # None: the kernel's program alone
    kernel_name: ClassVar[str] = "emulate.pallas.matmul"
    platform: ClassVar[str] = "tpu"
    interpretable: ClassVar[bool] = True
    map_batches: ClassVar[bool] = False
    compiles_when_traced: ClassVar[bool] = False

    @classmethod
    def of(
        cls, call: DotArgs, xla_route: Callable[[DotArgs], jax.Array] | None
    ) -> PallasMatmul | None:
        """The op of a validated call; None for a call without a weight operand."""
        side = weight_side(*call.operands)
        if side is None:
            return None
        return cls(
            side, call.dimension_numbers, call.precision, call.result, call.wrap_to,
            call.target, call.mode, False, xla_route,
        )  # fmt: skip

    def operands(self, call: DotArgs) -> tuple[Any, Any]:
        lhs, rhs = call.operands
        return (rhs, lhs) if self.side == "lhs" else (lhs, rhs)

    def refusal(self, call: DotArgs, x: Any, w: Any) -> str | None:
        return operand_refusal(call.mode, call.result, x, w) or self._shape_refusal(w)

    def _shape_refusal(self, w: Any) -> str | None:
        """Why ``emulate.pallas.matmul`` cannot take this call's shapes, or None."""
        (lc, rc), (lb, rb) = self.dimension_numbers
        if lb or rb:
            return "batch dimensions: the kernel multiplies one (K, N) weight"
        wc = rc if self.side == "rhs" else lc
        if len(w.shape) != 2:
            return f"a {len(w.shape)}-D weight {tuple(w.shape)}: the kernel takes a 2-D (K, N) one"
        if wc != (0,):
            return (
                f"the weight contracts along its axis {wc[0] if len(wc) == 1 else wc}: the "
                "kernel reads a (K, N) weight as stored (store it (K, N), e.g. "
                "emulate.flax.load_weights puts kernels in flax's (in, out) order)"
            )
        return None

    def unlowered(self) -> str | None:
        return pallas_unlowered()

    def advice(self, w: Any) -> str:
        if isinstance(w, QArray) and w.format.bits < 8:
            return (
                " (a sub-byte QArray the kernel cannot read as packed is relaid out on every "
                "call: emulate.prepare_weights it once)"
            )
        return ""

    def kernel(self, x: Operand, w: Any) -> jax.Array:
        (lc, rc), _ = self.dimension_numbers
        v, x_format = kernel_operand(x, weight=False)
        v = jnp.moveaxis(v, (rc if self.side == "lhs" else lc)[0], -1)
        free = tuple(v.shape[:-1])  # the activations' other axes: the kernel's M
        wk, w_format = kernel_operand(w, weight=True)
        y = _pallas().matmul(
            v.reshape(math.prod(free), v.shape[-1]), wk, target=self.target,
            out_dtype=self.result, interpret=self.interpret, x_format=x_format,
            w_format=w_format,
        )  # fmt: skip
        y = y.reshape(*free, y.shape[-1])
        if self.side == "lhs":  # dot_general's order: the weight's free axis (N) first
            y = jnp.moveaxis(y, -1, 0)
        return y.astype(self.wrap_to) if self.wrap_to is not None else y

    def xla(self, x: Any, w: Any) -> jax.Array:
        lhs, rhs = (w, x) if self.side == "lhs" else (x, w)
        call = DotArgs(
            unprepared(lhs), unprepared(rhs), self.dimension_numbers, self.precision,
            self.result, self.wrap_to, self.target, self.mode,
        )  # fmt: skip
        assert self.xla_route is not None  # the front end gave it: the op runs
        return self.xla_route(call)


@dataclasses.dataclass(frozen=True)
class PallasGrouped:
    """A ``lax.ragged_dot`` call ``(m, k) x (g, k, n)`` on ``emulate.pallas.ragged_dot``
    (module docstring): what its program is specialized on, its kernel and its XLA route.
    ``x`` is ``(lhs, group_sizes)``, ``w`` the experts."""

    side: str
    precision: Any
    preferred: Any
    result: str
    wrap_to: str | None
    target: targets.Target
    mode: str
    interpret: bool
    xla_route: Callable[[RaggedArgs], jax.Array] | None
    kernel_name: ClassVar[str] = "emulate.pallas.ragged_dot"
    platform: ClassVar[str] = "tpu"
    interpretable: ClassVar[bool] = True
    map_batches: ClassVar[bool] = True  # vmap: once per batch entry (Pallas cannot batch it)
    compiles_when_traced: ClassVar[bool] = False

    @classmethod
    def of(
        cls, call: RaggedArgs, xla_route: Callable[[RaggedArgs], jax.Array] | None
    ) -> PallasGrouped | None:
        """The op of a validated call; None for a call without a weight operand."""
        d = call.dot
        side = weight_side(*d.operands)
        if side is None:
            return None
        return cls(
            side, d.precision, call.preferred, d.result, d.wrap_to, d.target, d.mode, False,
            xla_route,
        )  # fmt: skip

    def operands(self, call: RaggedArgs) -> tuple[Any, Any]:
        lhs, rhs = call.dot.operands
        x, w = (rhs, lhs) if self.side == "lhs" else (lhs, rhs)
        return (x, call.group_sizes), w

    def refusal(self, call: RaggedArgs, x: tuple[Operand, Any], w: Any) -> str | None:
        d = call.dot
        return operand_refusal(d.mode, d.result, x[0], w) or self._shape_refusal(call)

    def _shape_refusal(self, call: RaggedArgs) -> str | None:
        """Why the grouped kernel cannot take this call's shapes, or None: it takes
        ``lax.ragged_dot``'s ``(m, k) x (g, k, n)``, the experts as stored ``(G, K, N)``."""
        if call.mode != "noncontracting":
            return (
                f"a ragged {call.mode} dimension: the grouped kernel takes rows sorted by "
                "group, lax.ragged_dot's (m, k) x (g, k, n)"
            )
        if self.side != "rhs":
            return "the weight is lhs: the grouped kernel's experts are rhs (g, k, n)"
        (lc, rc), (lb, rb) = call.dot.dimension_numbers
        if lb or rb:
            return (
                "batch dimensions: the grouped kernel multiplies (m, k) rows by (G, K, N) experts"
            )
        if len(call.dot.lhs.shape) != 2 or tuple(lc) != (1,):
            return (
                f"lhs of shape {tuple(call.dot.lhs.shape)} contracting along axis "
                f"{tuple(lc)}: the grouped kernel takes (m, k) rows"
            )
        if call.rhs_group != 0 or tuple(rc) != (1,):
            return (
                f"experts of shape {tuple(call.dot.rhs.shape)} grouped along axis "
                f"{call.rhs_group} contracting along axis {tuple(rc)}: the grouped kernel "
                "reads (G, K, N) experts as stored (store them so once, e.g. "
                "emulate.quantized.array.transpose(w, (0, 2, 1)) for (E, out, in) "
                "checkpoint tensors)"
            )
        return None

    def unlowered(self) -> str | None:
        return pallas_unlowered()

    def advice(self, w: Any) -> str:
        return ""

    def kernel(self, x: tuple[Operand, Any], w: Any) -> jax.Array:
        from emulate.pallas import gmm_kernel  # only where the kernel route is taken

        rows, group_sizes = x
        v, x_format = kernel_operand(rows, weight=False)
        wk, w_format = kernel_operand(w, weight=True)
        y = gmm_kernel.ragged_dot(
            v, wk, group_sizes, target=self.target, out_dtype=self.result,
            interpret=self.interpret, x_format=x_format, w_format=w_format,
        )  # fmt: skip
        return y.astype(self.wrap_to) if self.wrap_to is not None else y

    def xla(self, x: tuple[Operand, Any], w: Any) -> jax.Array:
        rows, group_sizes = x
        call = ragged_args(
            rows, unprepared(w), group_sizes, BASIC, self.precision, self.preferred,
            target=self.target, mode=self.mode,
        )  # fmt: skip
        assert self.xla_route is not None  # the front end gave it: the op runs
        return self.xla_route(call)
