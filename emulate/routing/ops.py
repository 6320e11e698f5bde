"""The kernel ops: what :func:`emulate.routing.choose` decides about and
:func:`emulate.routing.run` runs.

A :class:`KernelOp` is one kernel that may take a validated call's weight contraction,
described by what its program is specialized on (a hashable frozen dataclass: the key of
the traced kernel and of ``jax.jit``), how it reads the call (:meth:`KernelOp.operands`),
what it refuses, and how to run it and the call's XLA route. Its implementations:

- :class:`emulate.routing.pallas_ops.PallasMatmul`: ``emulate.pallas.matmul`` for a
  ``dot_general`` on a TPU target;
- :class:`emulate.routing.pallas_ops.PallasGrouped`: ``emulate.pallas.ragged_dot`` (the
  grouped kernel) for a ``ragged_dot`` on a TPU target;
- :class:`emulate.routing.cpu_op.CpuGemv`: the CPU kernel (:mod:`emulate.cpu`) for a
  ``dot_general`` on the CPU target.

Another kernel (an attention kernel over a quantized KV cache, say) is one more frozen
dataclass with these members, built by its front end from its own call record; nothing in
:func:`~emulate.routing.choose` or :func:`~emulate.routing.run` changes. This module holds
the protocol and the rules the kernels share: which operand is the weight, and the operand
pairs every weight kernel reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import jax

from emulate import formats, targets
from emulate.engine.operands import Operand
from emulate.engine.prepared import is_prepared
from emulate.numerics.storage import Packed
from emulate.planning.exactness import exact_class
from emulate.quantized.array import QArray

__all__ = [
    "PLATFORMS",
    "Call",
    "KernelOp",
    "kernel_operand",
    "operand_refusal",
    "weight_side",
]

#: How messages name the platform a kernel lowers for (``lax.platform_dependent``'s keys).
PLATFORMS = {"tpu": "a TPU", "cpu": "the CPU"}

_KERNEL_X = formats.WIDE_FLOATS


class Call(Protocol):
    """A validated call record a kernel op reads (:class:`emulate.engine.args.DotArgs`,
    :class:`emulate.engine.ragged_args.RaggedArgs`, ...): its target, and itself as the
    XLA route takes it."""

    @property
    def target(self) -> targets.Target: ...

    def read_back(self) -> Any: ...


class KernelOp(Protocol):
    """One kernel that may run a call's weight contraction (module docstring). Ops are
    frozen dataclasses: :func:`dataclasses.replace` sets :attr:`interpret` and clears
    :attr:`xla_route` for the key of the traced kernel.

    Attributes:
      kernel_name: the kernel, as routes and messages name it (``emulate.pallas.matmul``).
      platform: the platform it lowers for, a key of :data:`PLATFORMS` (the key of its
        branch in ``lax.platform_dependent``).
      interpretable: whether it has an interpret mode that runs on every platform
        (Pallas'), which the route setting "interpret" asks for.
      map_batches: ``vmap`` runs it once per batch entry (``lax.map``) where its kernel
        cannot be batched.
      compiles_when_traced: tracing the kernel compiles it (numba): its refusals are
        known without tracing, and a program traced only to be inspected
        (:func:`emulate.routing.setting.planning`) runs its XLA route.
      side: "lhs" or "rhs", the call's weight operand.
      interpret: run in interpret mode (set by :func:`emulate.routing.run`).
      xla_route: the front end's XLA route, called with the call read back (None in the
        key of the traced kernel).
    """

    kernel_name: ClassVar[str]
    platform: ClassVar[str]
    interpretable: ClassVar[bool]
    map_batches: ClassVar[bool]
    compiles_when_traced: ClassVar[bool]

    @property
    def side(self) -> str: ...

    @property
    def interpret(self) -> bool: ...

    @property
    def xla_route(self) -> Callable[[Any], jax.Array] | None: ...

    def operands(self, call: Any) -> tuple[Any, Any]:
        """``(x, w)``: what the kernel and the XLA route take from the call, the weight
        ``w`` as given (a prepared weight as it is)."""
        ...

    def refusal(self, call: Any, x: Any, w: Any) -> str | None:
        """Why the kernel cannot take this call (its operands ``x``, ``w`` from
        :meth:`operands`), known without tracing it (operand pairs, shapes, a switch), or
        None."""
        ...

    def unlowered(self) -> str | None:
        """Why route "auto" leaves the kernel out of a program traced now, though it could
        take the call (the program will not be lowered for its platform), or None."""
        ...

    def advice(self, w: Any) -> str:
        """What the route's reason adds about the weight on the kernel route ("" for
        nothing)."""
        ...

    def kernel(self, x: Any, w: Any) -> jax.Array:
        """The kernel's result: the call's, of the call's result type."""
        ...

    def xla(self, x: Any, w: Any) -> jax.Array:
        """The call's XLA route on the same operands (a prepared weight read back)."""
        ...


def weight_side(a: Any, b: Any) -> str | None:
    """ "lhs" or "rhs": the operand of a contraction that is the weight; None: none.

    The weight is the operand that is a QArray, a prepared weight, a Packed array, or a
    low-precision array beside wide-float activations (the right-hand operand when both are
    low-precision)."""

    def quantized(x: Any) -> bool:
        return isinstance(x, QArray) or is_prepared(x)

    def low(x: Any) -> bool:
        return quantized(x) or (isinstance(x, Operand) and x.format.is_low_precision)

    if quantized(b) or (low(b) and not quantized(a)):
        return "rhs"
    if low(a):
        return "lhs"
    return None


def operand_refusal(mode: str, result: str, x: Any, w: Any) -> str | None:
    """Why no Pallas kernel takes activations ``x`` beside weight ``w`` in mode ``mode``
    with result type ``result``, whatever their shapes, or None. Every Pallas kernel of
    the route reads the same operand pairs (:func:`emulate.pallas.matmul`'s): wide-float
    activations beside any weight, or an exact-class pair."""
    if mode != "fast":
        return f'mode {mode!r}: the kernel gives mode "fast"\'s result, not the exact sum'
    if isinstance(x, QArray) or is_prepared(x):
        return "both operands are quantized weights; the kernel takes one"
    quantized = isinstance(w, QArray) or is_prepared(w)
    xf = x.format_name
    if xf not in _KERNEL_X and (quantized or not exact_class(xf, w.format_name)):
        return (
            f"activations of {xf} beside a {w.format_name} "
            f"{'QArray' if quantized else 'weight'}: the kernel takes bfloat16, float16 or "
            "float32 activations, or an exact-class pair (integers, float4_e2m1fn)"
        )
    if quantized and not formats.get(result).is_float:
        return f"result type {result}: a QArray weight's kernel product is a float"
    return None


def kernel_operand(v: Any, *, weight: bool) -> tuple[Any, str | None]:
    """An Operand as the Pallas kernels take it, and its format for raw codes (None: none):
    wide float activations as their values; a Packed weight as it is; other low-precision
    operands as one code a byte. A QArray or prepared weight as it is."""
    if not isinstance(v, Operand):
        return v, None
    if v.format_name in _KERNEL_X and not weight:
        return v.value, None
    if weight and isinstance(v.value, Packed):
        return v.value, None
    return v.unpacked(), v.format_name
