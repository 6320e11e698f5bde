"""The route of a contraction with a weight operand: a Pallas kernel or XLA.

The one owner of that decision (:func:`choose`), for every front end: ``emulate.dot_general``
/ ``matmul`` / ``einsum`` (and so ``x @ q``, ``polyfill`` and the ``emulate.flax`` layers,
which call them) through :func:`decide`, with ``emulate.pallas.matmul`` as the kernel; and
``emulate.ragged_dot`` / ``ragged_dot_general`` (and ``polyfill`` of ``lax.ragged_dot``)
through :func:`emulate.ragged.weight_route_of`, with ``emulate.pallas.ragged_dot`` (the
grouped kernel) as the kernel, where the call is ``lax.ragged_dot``'s ``(m, k) x (g, k,
n)`` with the experts stored ``(G, K, N)``. The front end says why its kernel cannot take
the call's shapes; the rest of the rule is here. The rule, on a TPU target in mode "fast":

- the *weight* is the operand that is a :class:`emulate.QArray`, a prepared weight
  (:class:`emulate.pallas.KernelQWeight` / :class:`emulate.pallas.KernelWeight`), an
  :class:`emulate.Packed` array, or a low-precision array beside wide-float activations
  (the right-hand operand when both are low-precision);
- the activations are bfloat16, float16 or float32 (any weight), or, beside a plain
  low-precision weight, an exact-class format (integers of at most 8 bits, float4_e2m1fn,
  float6_e2m3fn: :func:`emulate.planning.exactness.exact_class`);
- (``emulate.pallas.matmul``) the weight is 2-D ``(K, N)`` as stored (it contracts along
  its first axis), the activations any rank with one contracting axis, no batch
  dimensions; the activations' other axes are flattened into the kernel's M (leading batch
  axes, M = 1 decode);
- the kernel accepts it: the kernel traced on the call's abstract shapes (cached per
  structure) raises nothing. Its refusal (NotImplementedError for a QArray part it does
  not decode, ValueError for a contraction too long for its exact combination ...) is the
  reason the call keeps the XLA route.

Then the call runs ``lax.platform_dependent``: the kernel (Mosaic, never interpret mode)
where the program is lowered for a TPU, the XLA route of :mod:`emulate.dot` /
:mod:`emulate.scaled` / :mod:`emulate.ragged` everywhere else (under ``jit`` only the
chosen branch is lowered). Otherwise the call takes the XLA route as before; a call without a
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

Numerics: the kernel's (``emulate.pallas.matmul`` / ``ragged_dot``): exact-class pairs
bit-identical to the XLA route (:func:`emulate.dot_general` / :func:`emulate.ragged_dot`);
others within mode "fast"'s bound. Gradients, both routes: those of the XLA route
(``jax.jvp`` of it, a ``custom_jvp``: the backward pass never runs the kernel), so they
reach the activations, and a QArray's float scales as :mod:`emulate.engine.grad` says.
``vmap``: Pallas batches ``emulate.pallas.matmul`` itself; the grouped kernel runs once
per batch entry (``lax.map``; its scalar-prefetched schedule does not batch).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import jaxpr_as_fun

from emulate import formats, moved, sharding, targets
from emulate.engine.args import DotArgs, dot_args
from emulate.engine.operands import Operand
from emulate.numerics.storage import Packed, pack
from emulate.planning.exactness import exact_class
from emulate.quantized.array import QArray
from emulate.quantized.layout import layout_of
from emulate.route_setting import (
    ROUTES,
    WeightRoute,
    current_route,
    planning,
    planning_now,
    tpu_may_lower,
    use_route,
)

__all__ = [
    "ROUTES",
    "choose",
    "current_route",
    "decide",
    "held_operands",
    "is_prepared",
    "kernel_operand",
    "operand_refusal",
    "planning",
    "prepare_weights",
    "prepared_types",
    "run",
    "run_op",
    "tpu_may_lower",
    "unprepared",
    "use_route",
    "weight_route",
    "weight_side",
    "WeightRoute",
]

_KERNEL_X = formats.WIDE_FLOATS


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
    scales bitcast back), a KernelWeight as an Operand of its uint8 codes; stacked experts
    (:func:`emulate.pallas.prepare_experts`) as the stacked QArray or Operand. Anything else
    as it is."""
    if not is_prepared(x):
        return x
    if len(jax.tree.leaves(x)[0].shape) > 2:  # stacked experts (prepare_experts): each
        q = jax.vmap(unprepared)(x)
        if isinstance(q, QArray) and layout_of(q).codes.packed_axis is None and q.format.bits < 8:
            # packed along K as emulate.quantize stores them: the XLA route's operand (a
            # float4 array in its tiled loop crashes XLA:CPU's elemental emitter, jax 0.10.2)
            q = dataclasses.replace(q, codes=pack(q.codes, axis=-2))
        return q
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


def weight_side(a: Any, b: Any) -> str | None:
    """ "lhs" or "rhs": the operand of a contraction that is the weight (module
    docstring); None: none."""

    def quantized(x: Any) -> bool:
        return isinstance(x, QArray) or is_prepared(x)

    def low(x: Any) -> bool:
        return quantized(x) or (isinstance(x, Operand) and x.format.is_low_precision)

    if quantized(b) or (low(b) and not quantized(a)):
        return "rhs"
    if low(a):
        return "lhs"
    return None


def operand_refusal(call: DotArgs, x: Any, w: Any) -> str | None:
    """Why no kernel takes activations ``x`` beside weight ``w`` in this call, whatever
    their shapes (mode, operand formats, result type), or None. Every kernel of the route
    reads the same operand pairs (:func:`emulate.pallas.matmul`'s)."""
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
    if quantized and not formats.get(call.result).is_float:
        return f"result type {call.result}: a QArray weight's kernel product is a float"
    return None


def _refusal(call: DotArgs, side: str, w: Any) -> str | None:
    """Why ``emulate.pallas.matmul`` cannot take this call's shapes, or None."""
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
    return None


def kernel_operand(v: Any, *, weight: bool) -> tuple[Any, str | None]:
    """An Operand as the kernels take it, and its format for raw codes (None: none): wide
    float activations as their values; a Packed weight as it is; other low-precision
    operands as one code a byte. A QArray or prepared weight as it is."""
    if not isinstance(v, Operand):
        return v, None
    if v.format_name in _KERNEL_X and not weight:
        return v.value, None
    if weight and isinstance(v.value, Packed):
        return v.value, None
    return v.unpacked(), v.format_name


@dataclasses.dataclass(frozen=True)
class _Matmul:
    """A dot_general call on the kernel route: what its program is specialized on
    (hashable), its kernel and its XLA route. Every kernel of the route has such a record
    (:func:`run_op`): ``kernel_name``, ``interpret``, ``xla_route``, ``kernel(x, w)`` and
    ``xla(x, w)``."""

    side: str
    dimension_numbers: Any
    precision: Any
    result: str
    wrap_to: str | None
    target: targets.Target
    mode: str
    interpret: bool
    xla_route: Callable[[DotArgs], jax.Array] | None  # None: the kernel's program alone
    kernel_name = "emulate.pallas.matmul"

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
        assert self.xla_route is not None  # run() gives the front end's XLA route
        return self.xla_route(call)


@functools.partial(jax.jit, static_argnums=0)
def _forward(op: Any, x: Any, w: Any) -> jax.Array:
    kernel = _kernel_program(op, x, w)
    assert not isinstance(kernel, str)  # decide() saw it accepted

    def replay(x: Any, w: Any) -> jax.Array:
        return jaxpr_as_fun(kernel)(*jax.tree.leaves((x, w)))[0]

    def routed(x: Any, w: Any) -> jax.Array:
        if op.interpret:
            return replay(x, w)
        return lax.platform_dependent(x, w, tpu=replay, default=op.xla)

    return _mapped(routed)(x, w) if getattr(op, "map_batches", False) else routed(x, w)


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


def _kernel_program(op: Any, x: Any, w: Any) -> Any:
    """The op's kernel traced once on its abstract operands (a ClosedJaxpr of the leaves
    of ``(x, w)``, which the routed program replays: the kernel is not traced again), or
    the kernel's refusal as text. Cached per op (its XLA route left out), operand
    structure and shapes."""
    op = dataclasses.replace(op, xla_route=None)
    try:
        avals = tuple((tuple(v.shape), str(v.dtype)) for v in jax.tree.leaves((x, w)))
        key: Any = (op, jax.tree.structure((x, w)), avals)
        hash(key)
    except TypeError:  # an unhashable part (a codebook's table): no cache
        key = None
    if key is not None and key in _PROGRAMS:
        return _PROGRAMS[key]
    treedef = jax.tree.structure((x, w))

    def flat(*leaves: Any) -> jax.Array:
        return op.kernel(*jax.tree.unflatten(treedef, leaves))

    try:
        # the TPU branch of the routed program: the kernel is built as for a TPU
        with contextlib.nullcontext() if op.interpret else targets.tpu_branch():
            got: Any = jax.make_jaxpr(flat)(*jax.tree.leaves((x, w)))
    except (NotImplementedError, ValueError, TypeError) as e:
        got = f"{op.kernel_name} refuses it: {e}"
    if key is not None:
        _PROGRAMS[key] = got
    return got


_PROGRAMS: dict[Any, Any] = {}


def choose(
    side: str, target: targets.Target, why: str | None, op: Any, x: Any, w: Any
) -> WeightRoute:
    """The route of a call whose weight is ``side`` (``w``, beside activations ``x``), for
    the kernel ``op`` describes (:class:`_Matmul`'s fields and methods; its ``interpret``
    is set here), ``why`` the front end's reason it cannot take the call (None: none):
    the route setting, the target, whether a TPU may lower the program, and the kernel's
    own refusal on the call's abstract operands decide (module docstring).

    Raises:
      ValueError: under the "kernel" or "interpret" setting, a call the kernel cannot take,
        naming the argument (the weight, ``target`` or ``mode``) and the reason.
    """
    setting, name = current_route(), op.kernel_name
    interpret = setting == "interpret"

    def xla(reason: str, arg: str) -> WeightRoute:
        if setting in ("kernel", "interpret"):
            raise ValueError(
                f"{arg}: route {setting!r} asks for {name}, which cannot take this call: "
                f"{reason}; use emulate.use_route('auto') or ('xla') for the XLA route"
            )
        return WeightRoute("xla", setting, reason, side, target.name, kernel_name=name)

    if setting == "xla":
        return xla("the route setting is 'xla'", side)
    if target.kind != "tpu":
        return xla(f"target {target.name} is not a TPU", "target")
    if why is None and setting == "auto" and not planning_now():
        if not tpu_may_lower():
            return xla(_NO_TPU, side)
        if (devices := sharding.partitioned_over()) > 1:
            return xla(_PARTITIONED.format(devices), side)
    if why is None:
        got = _kernel_program(dataclasses.replace(op, interpret=interpret), x, w)
        why = got if isinstance(got, str) else None
    if why is not None:
        return xla(why, "mode" if why.startswith("mode") else side)
    where = (
        "in Pallas' interpret mode on every platform"
        if interpret
        else "where the program is lowered for a TPU; the XLA route elsewhere"
    )
    reason = f"{side} read as stored by {name} {where}"
    if isinstance(w, QArray) and w.format.bits < 8:
        reason += (
            " (a sub-byte QArray the kernel cannot read as packed is relaid out on every "
            "call: emulate.prepare_weights it once)"
        )
    return WeightRoute("kernel", setting, reason, side, target.name, interpret, name)


def decide(call: DotArgs, held: tuple[Any, Any] = (None, None)) -> WeightRoute | None:
    """The route of a validated dot_general call (``held``: prepared weights standing for
    the call's views, :func:`held_operands`); None for a call that has no weight operand.

    Raises:
      ValueError: as :func:`choose`.
    """
    lhs = held[0] if held[0] is not None else call.lhs
    rhs = held[1] if held[1] is not None else call.rhs
    side = weight_side(lhs, rhs)
    if side is None:
        return None
    w, x = (rhs, lhs) if side == "rhs" else (lhs, rhs)
    why = operand_refusal(call, x, w) or _refusal(call, side, w)
    return choose(side, call.target, why, _matmul(call, side, None), x, w)


def _matmul(call: DotArgs, side: str, xla: Callable | None) -> _Matmul:
    return _Matmul(
        side, call.dimension_numbers, call.precision, call.result, call.wrap_to,
        call.target, call.mode, False, xla,
    )  # fmt: skip


def run_op(op: Any, route: WeightRoute, x: Any, w: Any) -> jax.Array:
    """Run the kernel ``op`` describes on a call :func:`choose` gave the kernel route:
    the kernel where lowered for a TPU (everywhere in interpret mode), ``op.xla``
    elsewhere; differentiable as the XLA route is (``jax.jvp`` of it)."""
    assert route.kernel
    op = dataclasses.replace(op, interpret=route.interpret)
    if not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves((x, w))):
        return _forward(op, x, w)  # nothing to differentiate: skip custom_jvp's dispatch
    return _differentiable(op, x, w)


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
    return run_op(_matmul(call, route.weight, xla), route, x, w)


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


def prepare_weights(tree: Any, *, target: targets.TargetLike = None, experts: bool = True) -> Any:
    """``tree`` with every QArray and Packed weight a kernel route takes replaced, once,
    by its prepared form (the same bytes, sub-byte codes in the K-planar layout), so that
    no call relayouts it:

    - a 2-D ``(K, N)`` QArray with parts ``emulate.pallas.matmul`` decodes, or a 2-D Packed
      array packed along K (``emulate.pack(w, axis=0)``): :func:`emulate.pallas.prepare_weight`
      (a :class:`emulate.pallas.KernelQWeight` or :class:`emulate.pallas.KernelWeight`);
    - with ``experts`` (default), stacked experts ``(E, K, N)`` (a 3-D QArray with parts the
      grouped kernel decodes, or a 3-D Packed array packed along K):
      :func:`emulate.pallas.prepare_experts`, which ``emulate.ragged_dot`` reads as stored.

    On a non-TPU target, and for any other leaf (an embedding table read by row, a scheme
    the kernels refuse, 3-D weights with ``experts=False``: the ``emulate.flax`` layers'
    3-D kernels are einsum weights), the leaf is returned as it is. The result is a pytree
    like ``tree``; every front end takes the prepared weights (on the XLA route through
    their QArray, as read back).
    """
    t = targets.current_target(target)
    if t.kind != "tpu":
        return tree

    def prepare(x: Any) -> Any:
        if not isinstance(x, (QArray, Packed)) or (isinstance(x, Packed) and x.axis != -2):
            return x
        p, rank = _pallas(), len(x.shape)
        make = {2: p.prepare_weight, 3: p.prepare_experts if experts else None}.get(rank)
        if make is None:
            return x
        try:
            return make(x)
        except (NotImplementedError, ValueError):
            return x

    return jax.tree.map(prepare, tree, is_leaf=lambda v: isinstance(v, (QArray, Packed)))


#: Names the docs gave this module before they moved (emulate.moved).
__getattr__ = moved.module_getattr(__name__)
