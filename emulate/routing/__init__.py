"""Who runs a contraction with a weight operand: a kernel or XLA.

One owner of that decision (:func:`choose`) for every front end and target:

- ``emulate.dot_general`` / ``matmul`` / ``einsum`` (and so ``x @ q``, ``polyfill`` and the
  ``emulate.flax`` layers, which call them): ``emulate.pallas.matmul`` on a TPU target,
  the CPU kernel (:mod:`emulate.cpu`, "cpu.gemv") on the CPU target;
- ``emulate.ragged_dot`` / ``ragged_dot_general`` (and ``polyfill`` of
  ``lax.ragged_dot``): ``emulate.pallas.ragged_dot`` (the grouped kernel) on a TPU
  target, for ``lax.ragged_dot``'s ``(m, k) x (g, k, n)`` with the experts stored
  ``(G, K, N)``.

Each kernel is a :class:`KernelOp` (:mod:`emulate.routing.ops`): what its program is
specialized on, what it refuses, its kernel and the call's XLA route. A front end
validates its call (:func:`emulate.engine.args.dot_args` keeps a prepared weight in the
record), asks for the op of its kind (:func:`dot_op`, :func:`ragged_op`), lets
:func:`choose` decide and :func:`run` run the kernel route; on the XLA route it runs its own
XLA route on the call read back. Modules, in the order they import each other:

- :mod:`~emulate.routing.setting`: :func:`use_route`, :func:`use_cpu_kernel`, the record of
  one decision (:class:`WeightRoute`), :func:`planning`;
- :mod:`~emulate.routing.ops`: the :class:`KernelOp` protocol, the weight and the operand
  pairs the kernels share; :mod:`~emulate.routing.prepared`: :func:`prepare_weights`;
- :mod:`~emulate.routing.program`: a kernel traced once (its program, or its refusal);
- :mod:`~emulate.routing.pallas_ops` (``PallasMatmul``, ``PallasGrouped``) and
  :mod:`~emulate.routing.cpu_op` (``CpuGemv``): the implementations;
- :mod:`~emulate.routing.choose`: :func:`choose`, :func:`dot_op`, :func:`ragged_op`;
- :mod:`~emulate.routing.run`: :func:`run` (``lax.platform_dependent``, the gradient);
- :mod:`~emulate.routing.query`: :func:`weight_route`, :func:`ragged_dot_route`.

The rule (:mod:`emulate.routing.choose` gives its order), on a TPU target in mode "fast":

- the *weight* is the operand that is a :class:`emulate.QArray`, a prepared weight
  (:class:`emulate.pallas.KernelQWeight` / :class:`emulate.pallas.KernelWeight`), an
  :class:`emulate.Packed` array, or a low-precision array beside wide-float activations
  (the right-hand operand when both are low-precision);
- the activations are bfloat16, float16 or float32 (any weight), or, beside a plain
  low-precision weight, an exact-class format (integers of at most 8 bits, float4_e2m1fn,
  float6_e2m3fn: :func:`emulate.planning.exactness.exact_class`);
- no operand's type is sharded along a mesh axis (``jax.sharding.AxisType.Explicit``: the
  kernels take whole operands; the XLA route is partitioned as JAX's own dot, and its
  result is sharded as JAX's);
- the kernel takes the call's shapes (``emulate.pallas.matmul``: a 2-D ``(K, N)`` weight as
  stored, activations of any rank with one contracting axis, no batch dimensions);
- the kernel accepts it: traced on the call's abstract shapes (cached per structure) it
  raises nothing. Its refusal (NotImplementedError for a QArray part it does not decode,
  ValueError for a contraction too long for its exact combination ...) is the reason the
  call keeps the XLA route.

On the CPU target: one QArray weight beside few rows of activations, in mode "fast", that
the CPU kernel's own rule takes (:func:`emulate.cpu.route.kernel_form`: the weight's stored
form, at most 4 or 8 rows), while :func:`use_cpu_kernel` lets it in.

Then the call runs ``lax.platform_dependent``: the kernel (Mosaic, never interpret mode;
numba's on the CPU) where the program is lowered for its platform, the XLA route of
:mod:`emulate.dot` / :mod:`emulate.scaled` / :mod:`emulate.ragged` everywhere else (under
``jit`` only the chosen branch is lowered). Otherwise the call takes the XLA route as
before; a call without a weight operand is not a weight contraction and has no route.
Where the program cannot be lowered for the kernel's platform (no TPU backend in the
process and JAX's default device not a TPU: :func:`tpu_may_lower`; for the CPU kernel, a
backend other than the CPU), "auto" leaves the kernel out (it would be traced for
nothing); :func:`emulate.inspect` and :func:`weight_route` decide as for a lowering for
the target (:func:`planning`), and :func:`emulate.compiler.compile` sets a TPU default
device.

The route setting (:func:`use_route`, a ``with`` block like :func:`emulate.use_mode`):

- ``"auto"`` (default): as above;
- ``"kernel"``: as "auto", but a call the rule keeps off the kernel raises ValueError
  naming the argument and the kernel's reason (never a silent 20-50x fallback);
- ``"interpret"``: as "kernel", with a Pallas kernel in Pallas' interpret mode on every
  platform (tests of the kernel route on the CPU; slow); the CPU kernel as under "kernel";
- ``"xla"``: the XLA route for every call.

Numerics: the kernel's (``emulate.pallas.matmul`` / ``ragged_dot``): exact-class pairs
bit-identical to the XLA route (:func:`emulate.dot_general` / :func:`emulate.ragged_dot`);
others within mode "fast"'s bound (the CPU kernel too). Gradients, both routes: those of
the XLA route (``jax.jvp`` of it, a ``custom_jvp``: the backward pass never runs the
kernel), so they reach the activations, and a QArray's float scales as
:mod:`emulate.engine.grad` says. ``vmap``: Pallas batches ``emulate.pallas.matmul`` itself;
the grouped kernel runs once per batch entry (``lax.map``; its scalar-prefetched schedule
does not batch); the CPU kernel's FFI call once per batch entry.
"""

from emulate.routing.choose import choose, dot_op, ragged_op
from emulate.routing.ops import KernelOp
from emulate.routing.prepared import is_prepared, prepare_weights, unprepared
from emulate.routing.query import ragged_dot_route, weight_route
from emulate.routing.run import run, site_tag
from emulate.routing.setting import (
    ROUTES,
    WeightRoute,
    current_route,
    planning,
    tpu_may_lower,
    use_cpu_kernel,
    use_route,
)

__all__ = [
    "ROUTES",
    "KernelOp",
    "WeightRoute",
    "choose",
    "current_route",
    "dot_op",
    "is_prepared",
    "planning",
    "prepare_weights",
    "ragged_dot_route",
    "ragged_op",
    "run",
    "site_tag",
    "tpu_may_lower",
    "unprepared",
    "use_cpu_kernel",
    "use_route",
    "weight_route",
]
