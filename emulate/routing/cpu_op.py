"""The CPU kernel as a kernel op (:class:`emulate.routing.ops.KernelOp`): :class:`CpuGemv`.

On the CPU target a ``dot_general`` of one QArray weight and few rows of activations, in
mode "fast", may run the numba-compiled kernel of :mod:`emulate.cpu`, which reads the
weight as stored and decodes each block next to its dot product
(:func:`emulate.cpu.call.contract`); which weights and how many rows it takes is its own
rule (:func:`emulate.cpu.route.kernel_form`). The activations are decoded to float32
first, the result is float32 rounded once into the call's result type; an act-order
QArray's permutation moves to the activations (or the result) first, as on the XLA route
(:func:`emulate.engine.qoperands.without_perm`). A prepared weight is read back to its
QArray first (:func:`emulate.engine.prepared.unprepared`).

Numerics: float32 products summed in float32 in the kernel's order, within mode "fast"'s
bound (:mod:`emulate.cpu.gemv`); gradients are the XLA route's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from emulate import targets
from emulate.cpu import call as cpu_call
from emulate.cpu import route as cpu_route
from emulate.engine.args import DotArgs
from emulate.engine.operands import Operand
from emulate.engine.qoperands import wide_values, without_perm
from emulate.numerics import accumulate
from emulate.quantized.array import QArray
from emulate.routing.ops import weight_side
from emulate.routing.setting import cpu_kernel_enabled, tpu_may_lower

__all__ = ["CpuGemv"]

_SWITCHED_OFF = (
    "the CPU kernel is switched off (emulate.use_cpu_kernel(False), or the environment "
    "variable EMULATE_CPU_KERNEL=0): emulate.use_cpu_kernel(True) lets it in"
)


@dataclasses.dataclass(frozen=True)
class CpuGemv:
    """A ``dot_general`` call on the CPU kernel (module docstring): what its program is
    specialized on, its kernel and its XLA route. ``x`` is the activations (an Operand),
    ``w`` the QArray weight."""

    side: str
    dimension_numbers: Any
    precision: Any
    result: str
    target: targets.Target
    mode: str
    interpret: bool
    xla_route: Callable[[DotArgs], jax.Array] | None
    kernel_name: ClassVar[str] = "emulate.cpu.gemv"
    platform: ClassVar[str] = "cpu"
    interpretable: ClassVar[bool] = False
    map_batches: ClassVar[bool] = False  # the FFI call runs once per batch entry itself
    compiles_when_traced: ClassVar[bool] = True  # numba compiles the kernel when traced

    @classmethod
    def of(cls, call: DotArgs, xla_route: Callable[[DotArgs], jax.Array] | None) -> CpuGemv | None:
        """The op of a validated call; None for a call without a weight operand."""
        side = weight_side(*call.operands)
        if side is None:
            return None
        return cls(
            side, call.dimension_numbers, call.precision, call.result, call.target,
            call.mode, False, xla_route,
        )  # fmt: skip

    def operands(self, call: DotArgs) -> tuple[Any, Any]:
        c = call.read_back()  # the kernel reads a QArray
        return (c.rhs, c.lhs) if self.side == "lhs" else (c.lhs, c.rhs)

    def refusal(self, call: DotArgs, x: Operand, w: Any) -> str | None:
        if not cpu_kernel_enabled():
            return _SWITCHED_OFF
        if call.mode != "fast":
            return f'mode {call.mode!r}: the CPU kernel gives mode "fast"\'s result'
        if isinstance(call.lhs, QArray) == isinstance(call.rhs, QArray):  # views: read back
            quantized = "two QArrays" if isinstance(call.lhs, QArray) else "no QArray"
            return f"{quantized}: the CPU kernel takes one QArray weight"
        got = self._form(x, w)
        return got if isinstance(got, str) else None

    def _form(self, x: Operand, w: QArray) -> Any:
        """The kernel's form for the call (:func:`emulate.cpu.route.kernel_form`), or why
        not: the weight read without its permutation (it moves to the activations)."""
        if w.perm is not None:
            w = dataclasses.replace(w, perm=None, perm_axis=None)
        side = 0 if self.side == "lhs" else 1
        integer = x.format.is_integer  # integer x integer: exact in int32, not the kernel's
        return cpu_route.kernel_form(w, side, x.shape, self.dimension_numbers, integer)

    def unlowered(self) -> str | None:
        if jax.default_backend() != "cpu":
            return f"JAX's default backend is {jax.default_backend()}: the program runs there"
        if tpu_may_lower():
            return "a TPU may lower this program (JAX's default device is a TPU)"
        return None

    def advice(self, w: Any) -> str:
        return ""

    def kernel(self, x: Operand, w: QArray) -> jax.Array:
        dn = self.dimension_numbers
        lhs, rhs = (w, x) if self.side == "lhs" else (x, w)
        lhs, rhs, restore = without_perm(lhs, rhs, dn)
        q, other = (lhs, rhs) if self.side == "lhs" else (rhs, lhs)
        side = 0 if self.side == "lhs" else 1
        form = cpu_route.kernel_form(q, side, other.shape, dn, other.format.is_integer)
        assert not isinstance(form, str)  # choose() saw it taken
        vo = wide_values(other)
        oc = dn[0][1 - side][0]
        k = vo.shape[oc]
        rows = jnp.moveaxis(vo, oc, -1).reshape(-1, k).astype(jnp.float32)
        y = cpu_call.contract(q, rows, form)
        y = y.reshape(tuple(n for d, n in enumerate(vo.shape) if d != oc) + (y.shape[1],))
        acc = jnp.moveaxis(y, -1, 0) if side == 0 else y
        return restore(accumulate.round_accumulator(acc, self.result))

    def xla(self, x: Any, w: Any) -> jax.Array:
        lhs, rhs = (w, x) if self.side == "lhs" else (x, w)
        call = DotArgs(
            lhs, rhs, self.dimension_numbers, self.precision, self.result, None,
            self.target, self.mode,
        )  # fmt: skip
        assert self.xla_route is not None  # the front end gave it: the op runs
        return self.xla_route(call)
