"""The route of a contraction with a weight operand: ``emulate.pallas.matmul`` or XLA.

The one owner of that decision (:func:`decide`), for every front end: ``emulate.dot_general``
/ ``matmul`` / ``einsum`` (and so ``x @ q``, ``polyfill`` and the ``emulate.flax`` layers,
which call them). The rule, on a TPU target in mode "fast":

- the *weight* is the operand that is a :class:`emulate.QArray`, a prepared weight
  (:class:`emulate.pallas.KernelQWeight` / :class:`emulate.pallas.KernelWeight`), an
  :class:`emulate.Packed` array, or a low-precision array beside wide-float activations
  (the right-hand operand when both are low-precision);
- the activations are bfloat16, float16 or float32 (any weight), or, beside a plain
  low-precision weight, an exact-class format (integers of at most 8 bits, float4_e2m1fn,
  float6_e2m3fn: :func:`emulate.planning.exactness.exact_class`);
- the weight is 2-D ``(K, N)`` as stored (it contracts along its first axis), the
  activations any rank with one contracting axis, no batch dimensions; the activations'
  other axes are flattened into the kernel's M (leading batch axes, M = 1 decode);
- the kernel accepts it: :func:`emulate.pallas.matmul` traced on the call's abstract
  shapes (``jax.eval_shape``, cached per structure) raises nothing. Its refusal
  (NotImplementedError for a QArray part it does not decode, ValueError for a contraction
  too long for its exact combination ...) is the reason the call keeps the XLA route.

Then the call runs ``lax.platform_dependent``: ``emulate.pallas.matmul`` (Mosaic, never
interpret mode) where the program is lowered for a TPU, the XLA route of
:mod:`emulate.dot` / :mod:`emulate.scaled` everywhere else (under ``jit`` only the chosen
branch is lowered). Otherwise the call takes the XLA route as before; a call without a
weight operand is not a weight contraction and this module leaves it alone. Where no TPU
can be the lowering platform (no TPU backend in the process and JAX's default device not
a TPU: :func:`tpu_may_lower`), "auto" leaves the kernel out (it would be traced for
nothing); :func:`emulate.inspect` and :func:`weight_route` decide as for a TPU
(:func:`planning`), and :func:`emulate.compiler.compile` sets a TPU default device.

The route setting (:func:`use_route`, a ``with`` block like :func:`emulate.use_mode`):

- ``"auto"`` (default): as above;
- ``"kernel"``: as "auto", but a call the rule keeps off the kernel raises ValueError
  naming the argument and the kernel's reason (never a silent 20-50x fallback);
- ``"interpret"``: as "kernel", with the kernel in Pallas' interpret mode on every platform
  (tests of the kernel route on the CPU; slow);
- ``"xla"``: the XLA route for every call.

Numerics: the kernel's (``emulate.pallas.matmul``): exact-class pairs bit-identical to
:func:`emulate.dot_general`; others within mode "fast"'s bound. Gradients, both routes:
those of the XLA route (``jax.jvp`` of it), so they reach the activations, and a QArray's
float scales as :mod:`emulate.engine.grad` says.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import jaxpr_as_fun

from emulate import formats, sharding, targets
from emulate.engine.args import DotArgs, dot_args
from emulate.engine.operands import Operand
from emulate.numerics.storage import Packed
from emulate.planning.exactness import exact_class
from emulate.quantized.array import QArray

__all__ = [
    "ROUTES",
    "WeightRoute",
    "current_route",
    "decide",
    "held_operands",
    "is_prepared",
    "planning",
    "prepared_types",
    "prepare_weights",
    "run",
    "tpu_may_lower",
    "unprepared",
    "use_route",
    "weight_route",
]

#: The route settings (module docstring).
ROUTES = ("auto", "kernel", "interpret", "xla")

_ROUTE: contextvars.ContextVar[str] = contextvars.ContextVar("emulate_route", default="auto")
# Part of jax.jit's key, as the target and mode are (emulate.context): a function jitted
# under one route setting and called under another is traced again.
_KEY = jax.make_user_context(default_value="auto")

_KERNEL_X = formats.WIDE_FLOATS


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
    token = _ROUTE.set(route)
    try:
        with _KEY(route):
            yield route
    finally:
        _ROUTE.reset(token)


def current_route() -> str:
    """The innermost :func:`use_route` block's setting, else "auto"."""
    return _ROUTE.get()


@dataclasses.dataclass(frozen=True)
class WeightRoute:
    """The route of one contraction with a weight operand.

    Attributes:
      route: "kernel" (``emulate.pallas.matmul`` where lowered for a TPU; in interpret
        mode everywhere when ``interpret``) or "xla".
      setting: the route setting it was decided under (:data:`ROUTES`).
      reason: why, in words (the kernel's own message where it refuses the weight).
      weight: "lhs" or "rhs", the weight operand; None for a call without one.
      target: the target's name.
      interpret: the kernel runs in interpret mode on every platform.
    """

    route: str
    setting: str
    reason: str
    weight: str | None
    target: str
    interpret: bool = False

    @property
    def kernel(self) -> bool:
        return self.route == "kernel"

    def label(self) -> str:
        """One word for tables: ``pallas.matmul`` or ``xla``."""
        return "pallas.matmul" if self.kernel else "xla"

    def explain(self) -> str:
        """The decision in plain text (what ``emulate.inspect`` shows per site)."""
        head = f"route on {self.target} (setting {self.setting!r}): {self.label()}"
        return f"{head}\n  {self.reason}"


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
    has (:func:`emulate.inspect` and :func:`weight_route` say what a TPU would run)."""
    token = _PLANNING.set(True)
    try:
        yield
    finally:
        _PLANNING.reset(token)


def _pallas() -> Any:
    import emulate.pallas  # imports jax.experimental.pallas: only when a route needs it

    return emulate.pallas


def prepared_types() -> tuple[type, ...]:
    """The prepared weight types, :class:`emulate.pallas.KernelQWeight` and
    :class:`emulate.pallas.KernelWeight`; none while ``emulate.pallas`` is not loaded
    (there can be no prepared weight then; nothing is imported)."""
    mod = sys.modules.get("emulate.pallas")
    return () if mod is None else (mod.KernelQWeight, mod.KernelWeight)


def is_prepared(x: Any) -> bool:
    """Whether ``x`` is a prepared weight (:func:`prepared_types`)."""
    return isinstance(x, prepared_types())


def unprepared(x: Any) -> Any:
    """A prepared weight as the XLA route reads it: a KernelQWeight as its QArray
    (``emulate.pallas.qweight.as_qarray``: sub-byte codes unpacked to one per byte, float16
    scales bitcast back), a KernelWeight as an Operand of its uint8 codes. Anything else as
    it is."""
    if not is_prepared(x):
        return x
    p = _pallas()
    if isinstance(x, p.KernelWeight):
        from emulate.pallas.weights import kernel_codes

        return Operand(kernel_codes(x), x.format_name)
    from emulate.pallas.qweight import as_qarray

    return as_qarray(x)


def held_operands(lhs: Any, rhs: Any) -> tuple[Any, Any, tuple[Any, Any]]:
    """``(lhs view, rhs view, (lhs prepared or None, rhs prepared or None))``: each prepared
    weight replaced by an abstract view of its QArray or Operand (shapes and dtypes only,
    nothing computed) for the front ends' checks; the prepared weights held aside for
    :func:`run`."""
    held = (lhs if is_prepared(lhs) else None, rhs if is_prepared(rhs) else None)
    views = [
        jax.eval_shape(unprepared, x) if h is not None else x for x, h in zip((lhs, rhs), held)
    ]
    return views[0], views[1], held


def _weight_side(a: Any, b: Any) -> str | None:
    """ "lhs" or "rhs": the operand that is the weight (module docstring); None: none."""

    def quantized(x: Any) -> bool:
        return isinstance(x, QArray) or is_prepared(x)

    def low(x: Any) -> bool:
        return quantized(x) or (isinstance(x, Operand) and x.format.is_low_precision)

    if quantized(b) or (low(b) and not quantized(a)):
        return "rhs"
    if low(a):
        return "lhs"
    return None


def _refusal(call: DotArgs, side: str, x: Any, w: Any) -> str | None:
    """Why the kernel cannot take this call (the rule's checks before the kernel's own), or
    None."""
    if call.mode != "fast":
        return f'mode {call.mode!r}: the kernel gives mode "fast"\'s result, not the exact sum'
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
    (lc, rc), (lb, rb) = call.dimension_numbers
    if lb or rb:
        return "batch dimensions: the kernel multiplies one (K, N) weight"
    wc = rc if side == "rhs" else lc
    if len(w.shape) != 2:
        return f"a {len(w.shape)}-D weight {tuple(w.shape)}: the kernel takes a 2-D (K, N) one"
    if wc != (0,):
        return (
            f"the weight contracts along its axis {wc[0] if len(wc) == 1 else wc}: the kernel "
            "reads a (K, N) weight as stored (store it (K, N), e.g. emulate.flax.load_weights "
            "puts kernels in flax's (in, out) order)"
        )
    if quantized and not formats.get(call.result).is_float:
        return f"result type {call.result}: a QArray weight's kernel product is a float"
    return None


@dataclasses.dataclass(frozen=True)
class _Static:
    """What a routed call's jitted program is specialized on (hashable)."""

    side: str
    dimension_numbers: Any
    precision: Any
    result: str
    wrap_to: str | None
    target: targets.Target
    mode: str
    interpret: bool
    xla: Callable[[DotArgs], jax.Array] | None  # None: the kernel's program alone


def _x_matrix(x: Operand, c: int) -> tuple[jax.Array, str | None, tuple[int, ...]]:
    """The activations as the kernel's (M, K) operand, their format for raw codes (None
    for wide floats), and the free axes' sizes (the result's leading shape)."""
    v = x.value if x.format_name in _KERNEL_X else x.unpacked()
    v = jnp.moveaxis(v, c, -1)
    free = tuple(v.shape[:-1])
    return (
        v.reshape(math.prod(free), v.shape[-1]),
        (None if x.format_name in _KERNEL_X else x.format_name),
        free,
    )


def _kernel_weight(w: Any) -> tuple[Any, str | None]:
    """The weight as ``emulate.pallas.matmul`` takes it, and its format for raw codes."""
    if isinstance(w, Operand):
        v = w.value
        if isinstance(v, Packed):
            return v, None
        return w.unpacked(), w.format_name
    return w, None


def _kernel(s: _Static, x: Operand, w: Any, interpret: bool) -> jax.Array:
    (lc, rc), _ = s.dimension_numbers
    c = (rc if s.side == "lhs" else lc)[0]
    xm, x_format, free = _x_matrix(x, c)
    wk, w_format = _kernel_weight(w)
    y = _pallas().matmul(
        xm, wk, target=s.target, out_dtype=s.result, interpret=interpret,
        x_format=x_format, w_format=w_format,
    )  # fmt: skip
    y = y.reshape(*free, y.shape[-1])
    if s.side == "lhs":  # dot_general's order: the weight's free axis (N) first
        y = jnp.moveaxis(y, -1, 0)
    return y.astype(s.wrap_to) if s.wrap_to is not None else y


def _xla(s: _Static, x: Any, w: Any) -> jax.Array:
    lhs, rhs = (w, x) if s.side == "lhs" else (x, w)
    call = DotArgs(
        unprepared(lhs), unprepared(rhs), s.dimension_numbers, s.precision, s.result,
        s.wrap_to, s.target, s.mode,
    )  # fmt: skip
    assert s.xla is not None  # run() gives the front end's XLA route
    return s.xla(call)


@functools.partial(jax.jit, static_argnums=0)
def _forward(s: _Static, x: Any, w: Any) -> jax.Array:
    kernel = _kernel_program(s, x, w)
    assert not isinstance(kernel, str)  # decide() saw it accepted

    def replay(x: Any, w: Any) -> jax.Array:
        return jaxpr_as_fun(kernel)(*jax.tree.leaves((x, w)))[0]

    if s.interpret:
        return replay(x, w)
    return lax.platform_dependent(x, w, tpu=replay, default=functools.partial(_xla, s))


_differentiable = jax.custom_jvp(_forward, nondiff_argnums=(0,))


@_differentiable.defjvp
def _jvp(s: _Static, primals: tuple[Any, Any], tangents: tuple[Any, Any]):
    out = _differentiable(s, *primals)
    _, t = jax.jvp(functools.partial(_xla, s), primals, tangents)
    return out, t


def _kernel_program(s: _Static, x: Any, w: Any) -> Any:
    """``emulate.pallas.matmul`` of this call traced once on its abstract operands (a
    ClosedJaxpr of the leaves of ``(x, w)``, which the routed program replays: the kernel
    is not traced again), or the kernel's refusal as text. Cached per static arguments,
    operand structure and shapes."""
    s = dataclasses.replace(s, xla=None)
    try:
        avals = tuple((tuple(v.shape), str(v.dtype)) for v in jax.tree.leaves((x, w)))
        key: Any = (s, jax.tree.structure((x, w)), avals)
        hash(key)
    except TypeError:  # an unhashable part (a codebook's table): no cache
        key = None
    if key is not None and key in _PROGRAMS:
        return _PROGRAMS[key]
    treedef = jax.tree.structure((x, w))

    def flat(*leaves: Any) -> jax.Array:
        xs, ws = jax.tree.unflatten(treedef, leaves)
        return _kernel(s, xs, ws, interpret=s.interpret)

    try:
        # the TPU branch of the routed program: the kernel is built as for a TPU
        with contextlib.nullcontext() if s.interpret else targets.tpu_branch():
            got: Any = jax.make_jaxpr(flat)(*jax.tree.leaves((x, w)))
    except (NotImplementedError, ValueError, TypeError) as e:
        got = f"emulate.pallas.matmul refuses it: {e}"
    if key is not None:
        _PROGRAMS[key] = got
    return got


_PROGRAMS: dict[Any, Any] = {}


def decide(call: DotArgs, held: tuple[Any, Any] = (None, None)) -> WeightRoute | None:
    """The route of a validated call (``held``: prepared weights standing for the call's
    views, :func:`held_operands`); None for a call that has no weight operand.

    Raises:
      ValueError: under the "kernel" or "interpret" setting, a call the kernel cannot take,
        naming the argument (the weight, ``target`` or ``mode``) and the reason.
    """
    lhs = held[0] if held[0] is not None else call.lhs
    rhs = held[1] if held[1] is not None else call.rhs
    side = _weight_side(lhs, rhs)
    if side is None:
        return None
    setting, t = current_route(), call.target
    interpret = setting == "interpret"

    def xla(reason: str, arg: str) -> WeightRoute:
        if setting in ("kernel", "interpret"):
            raise ValueError(
                f"{arg}: route {setting!r} asks for emulate.pallas.matmul, which cannot take "
                f"this call: {reason}; use emulate.use_route('auto') or ('xla') for the XLA "
                "route"
            )
        return WeightRoute("xla", setting, reason, side, t.name)

    if setting == "xla":
        return WeightRoute("xla", setting, "the route setting is 'xla'", side, t.name)
    if t.kind != "tpu":
        return xla(f"target {t.name} is not a TPU", "target")
    w, x = (rhs, lhs) if side == "rhs" else (lhs, rhs)
    why = _refusal(call, side, x, w)
    if why is None and setting == "auto" and not _PLANNING.get():
        if not tpu_may_lower():
            return WeightRoute("xla", setting, _NO_TPU, side, t.name)
        if (devices := sharding.partitioned_over()) > 1:
            return WeightRoute("xla", setting, _PARTITIONED.format(devices), side, t.name)
    if why is None:
        got = _kernel_program(_static(call, side, interpret, None), x, w)
        why = got if isinstance(got, str) else None
    if why is not None:
        return xla(why, "mode" if why.startswith("mode") else side)
    where = (
        "in Pallas' interpret mode on every platform"
        if interpret
        else "where the program is lowered for a TPU; the XLA route elsewhere"
    )
    reason = f"{side} read as stored by emulate.pallas.matmul {where}"
    if isinstance(w, QArray) and w.format.bits < 8:
        reason += (
            " (a sub-byte QArray the kernel cannot read as packed is relaid out on every "
            "call: emulate.prepare_weights it once)"
        )
    return WeightRoute("kernel", setting, reason, side, t.name, interpret)


def _static(call: DotArgs, side: str, interpret: bool, xla: Callable | None) -> _Static:
    return _Static(
        side, call.dimension_numbers, call.precision, call.result, call.wrap_to,
        call.target, call.mode, interpret, xla,
    )  # fmt: skip


def run(
    call: DotArgs,
    route: WeightRoute,
    held: tuple[Any, Any],
    xla: Callable[[DotArgs], jax.Array],
) -> jax.Array:
    """Run a call :func:`decide` gave the kernel route: ``emulate.pallas.matmul`` where
    lowered for a TPU (everywhere in interpret mode), ``xla(call)`` (the front end's XLA
    route, given the call with QArray / Operand operands) elsewhere."""
    assert route.kernel and route.weight is not None
    lhs = held[0] if held[0] is not None else call.lhs
    rhs = held[1] if held[1] is not None else call.rhs
    x, w = (rhs, lhs) if route.weight == "lhs" else (lhs, rhs)
    s = _static(call, route.weight, route.interpret, xla)
    if not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves((x, w))):
        return _forward(s, x, w)  # nothing to differentiate: skip custom_jvp's dispatch
    return _differentiable(s, x, w)


def weight_route(
    lhs: Any,
    rhs: Any,
    dimension_numbers: Any = None,
    *,
    preferred_element_type: Any = None,
    target: targets.TargetLike = None,
    mode: str | None = None,
) -> WeightRoute | None:
    """The route :func:`emulate.dot_general` would give this call (arguments as its; arrays
    or ``jax.ShapeDtypeStruct`` s in the operands), without running it; None for a call
    without a weight operand. ``print(r.explain())`` says why.

    Raises:
      ValueError: under the "kernel" / "interpret" setting, as :func:`decide`; what
        :func:`emulate.dot_general` raises for the arguments.
    """
    found: list[WeightRoute | None] = []

    def probe(a: Any, b: Any) -> jax.Array:  # traced: the operands may be abstract
        lv, rv, held = held_operands(a, b)
        call = dot_args(
            lv, rv, dimension_numbers, None, preferred_element_type, target=target, mode=mode
        )
        found.append(decide(call, held))
        return jnp.zeros(())

    with planning():
        jax.eval_shape(probe, lhs, rhs)
    return found[0]


def prepare_weights(tree: Any, *, target: targets.TargetLike = None) -> Any:
    """``tree`` with every QArray and Packed weight the kernel route takes replaced, once,
    by its prepared form (:func:`emulate.pallas.prepare_weight`: a
    :class:`emulate.pallas.KernelQWeight` or :class:`emulate.pallas.KernelWeight` of the
    same bytes, sub-byte codes in the K-planar layout), so that no call relayouts it.

    A leaf is prepared when the target is a TPU and it is a 2-D ``(K, N)`` QArray with
    parts the kernel decodes, or a 2-D Packed array packed along K (``emulate.pack(w,
    axis=0)``); any other leaf (stacked experts, an embedding table read by
    row, a scheme the kernel refuses, every leaf on a non-TPU target) is returned as it
    is. The result is a pytree like ``tree``; every front end takes the prepared weights
    (on the XLA route through their QArray, as read back).
    """
    t = targets.current_target(target)
    if t.kind != "tpu":
        return tree

    def prepare(x: Any) -> Any:
        packed = isinstance(x, Packed) and x.ndim == 2 and x.axis == -2
        if not (packed or isinstance(x, QArray)) or len(x.shape) != 2:
            return x
        try:
            return _pallas().prepare_weight(x)
        except (NotImplementedError, ValueError):
            return x

    return jax.tree.map(prepare, tree, is_leaf=lambda v: isinstance(v, (QArray, Packed)))
