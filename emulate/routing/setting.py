"""The route setting of weight contractions and the record of one route decision.

:func:`use_route` (a ``with`` block, part of ``jax.jit``'s key) chooses between the kernels
(Pallas on a TPU target, the CPU kernel on the CPU) and XLA for every contraction with a
weight operand, and :func:`use_cpu_kernel` lets the CPU kernel in or keeps it out;
:class:`WeightRoute` records what :func:`emulate.routing.choose` (the one owner of the
decision) decided and why; :func:`planning` and :func:`tpu_may_lower` say whether a program
traced now is decided as for a lowering for its target. The rule itself and the settings'
meaning: :mod:`emulate.routing`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import os
from collections.abc import Iterator
from typing import Any

import jax

__all__ = [
    "ROUTES",
    "WeightRoute",
    "cpu_kernel_enabled",
    "current_route",
    "planning",
    "planning_now",
    "tpu_may_lower",
    "use_cpu_kernel",
    "use_route",
]

#: The route settings (:mod:`emulate.routing`'s docstring says what each does).
ROUTES = ("auto", "kernel", "interpret", "xla")

_ROUTE: contextvars.ContextVar[str] = contextvars.ContextVar("emulate_route", default="auto")
# Part of jax.jit's key, as the target and mode are (emulate.context): a function jitted
# under one route setting and called under another is traced again.
_KEY = jax.make_user_context(default_value="auto")


@contextlib.contextmanager
def use_route(route: str) -> Iterator[str]:
    """Make ``route`` ("auto", "kernel", "interpret" or "xla"; module docstring) the route
    setting of every weight contraction inside a ``with`` block, for this thread or asyncio
    task. Blocks nest and restore on exit; the setting is part of ``jax.jit``'s key.

    Raises:
      ValueError: another route (before the block starts).
    """
    if route not in ROUTES:
        raise ValueError(f"route: expected one of {', '.join(map(repr, ROUTES))}, got {route!r}")
    with _setting(_ROUTE, _KEY, route):
        yield route


@contextlib.contextmanager
def _setting(var: contextvars.ContextVar, key: Any, value: Any) -> Iterator[None]:
    """``value`` in ``var`` (this thread or task) and in ``jax.jit``'s key ``key`` for a
    ``with`` block."""
    token = var.set(value)
    try:
        with key(value):
            yield
    finally:
        var.reset(token)


def current_route() -> str:
    """The innermost :func:`use_route` block's setting, else "auto"."""
    return _ROUTE.get()


@dataclasses.dataclass(frozen=True)
class WeightRoute:
    """The route of one contraction with a weight operand.

    Attributes:
      route: "kernel" (the kernel :attr:`kernel_name` where the program is lowered for its
        platform, the XLA route elsewhere; in interpret mode everywhere when
        ``interpret``) or "xla".
      setting: the route setting it was decided under (:data:`ROUTES`).
      reason: why, in words (the kernel's own message where it refuses the weight).
      weight: "lhs" or "rhs", the weight operand; None for a call without one.
      target: the target's name.
      interpret: the kernel runs in interpret mode on every platform.
      kernel_name: the kernel the route was decided for: ``emulate.pallas.matmul``,
        ``emulate.pallas.ragged_dot`` (a grouped matmul) or ``emulate.cpu.gemv`` (the CPU
        kernel) (:mod:`emulate.routing.ops`).
    """

    route: str
    setting: str
    reason: str
    weight: str | None
    target: str
    interpret: bool = False
    kernel_name: str = "emulate.pallas.matmul"

    @property
    def kernel(self) -> bool:
        return self.route == "kernel"

    def label(self) -> str:
        """One word for tables: ``pallas.matmul``, ``pallas.ragged_dot``, ``cpu.gemv`` or
        ``xla``."""
        return self.kernel_name.removeprefix("emulate.") if self.kernel else "xla"

    def explain(self) -> str:
        """The decision in plain text (what ``emulate.inspect`` shows per site)."""
        head = f"route on {self.target} (setting {self.setting!r}): {self.label()}"
        return f"{head}\n  {self.reason}"


def _cpu_kernel_variable() -> bool:
    """The environment variable ``EMULATE_CPU_KERNEL``: "1" (also when unset) or "0"."""
    value = os.environ.get("EMULATE_CPU_KERNEL", "1")
    if value not in ("0", "1"):
        raise ValueError(f"EMULATE_CPU_KERNEL: expected '0' or '1', got {value!r}")
    return value == "1"


_cpu_kernel_variable()  # a bad value fails the import
#: None outside a use_cpu_kernel block: the variable, read once at the first decision
#: (so a conftest.py, or any code before the first contraction, may set it)
_CPU_KERNEL: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "emulate_cpu_kernel", default=None
)
_CPU_KEY = jax.make_user_context(default_value=None)
_cpu_kernel_default = functools.cache(_cpu_kernel_variable)


@contextlib.contextmanager
def use_cpu_kernel(enabled: bool) -> Iterator[bool]:
    """Let (True) or keep (False) the CPU kernel (:mod:`emulate.cpu`) take the QArray
    contractions it takes on the CPU (few rows of activations), inside a ``with`` block,
    for this thread or asyncio task; part of ``jax.jit``'s key. The default is the
    environment variable ``EMULATE_CPU_KERNEL`` ("1", the default, or "0"), read once when
    the first contraction is decided (a bad value also fails ``import emulate``). The
    route setting "xla" (:func:`use_route`) keeps it out too.

    Raises:
      TypeError: ``enabled`` is not a bool.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled: expected a bool, got {type(enabled).__name__} {enabled!r}")
    with _setting(_CPU_KERNEL, _CPU_KEY, enabled):
        yield enabled


def cpu_kernel_enabled() -> bool:
    """Whether the CPU kernel may take a contraction traced now (:func:`use_cpu_kernel`,
    and a route setting other than "xla")."""
    enabled = _CPU_KERNEL.get()
    if enabled is None:
        enabled = _cpu_kernel_default()
    return enabled and _ROUTE.get() != "xla"


_PLANNING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "emulate_route_planning", default=False
)


def tpu_may_lower() -> bool:
    """Whether a program traced now may be lowered for a TPU: this process has a TPU
    backend, or JAX's default device is a TPU device (``jax.default_device``; what
    :func:`emulate.compiler.compile` sets for a compile-only device). Where neither holds,
    route "auto" keeps the kernel out of the program: it would only be traced, never run."""
    dev = getattr(jax.config, "jax_default_device", None)  # set by jax.default_device
    if getattr(dev, "platform", None) == "tpu":
        return True
    return jax.default_backend() == "tpu"


@contextlib.contextmanager
def planning() -> Iterator[None]:
    """Decide every route as for a TPU lowering inside the block, whatever this process
    has (:func:`emulate.inspect` and :func:`emulate.weight_route` say what a TPU would run)."""
    token = _PLANNING.set(True)
    try:
        yield
    finally:
        _PLANNING.reset(token)


def planning_now() -> bool:
    """Whether a :func:`planning` block is open."""
    return _PLANNING.get()
