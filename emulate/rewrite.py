"""``polyfill(fn)``: run a JAX program with every matmul the target lacks replaced by emulate's.

The wrapped function traces ``fn`` to a jaxpr once per input signature and evaluates it
with each ``dot_general`` / ``conv_general_dilated`` / ``ragged_dot_general`` equation
whose operand pair the target does not run natively (:func:`emulate.runs_as_is`: JAX's
own types such as int32, complex64 or float64 always stay as they are) replaced by
:func:`emulate.dot_general` / :func:`emulate.conv_general_dilated` /
:func:`emulate.ragged_dot_general` (same result dtype, the plan's numerics), and each
block-scaled matmul of ``jax.nn.scaled_matmul`` / ``jax.nn.scaled_dot_general`` (which
JAX lowers only for CUDA and ROCm) by :func:`emulate.scaled_matmul`. Equations
that the target runs natively, and everything else, are bound again as they are, with
their parameters (shardings included). Sub-jaxprs (jit, scan, while, cond, remat,
custom_jvp/vjp, shard_map, ...) that hold an unsupported site are rewritten the same way;
the walk looks at every parameter holding a jaxpr, not at primitive names.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex_core
from jax.typing import ArrayLike, DTypeLike

from emulate import program, targets
from emulate.conv import conv_general_dilated
from emulate.dot import dot_general
from emulate.engine.passthrough import xla_holds
from emulate.planning.plan import runs_as_is
from emulate.ragged import ragged_dot_general
from emulate.scaled import scaled_matmul

__all__ = ["polyfill", "scaled_dot_general"]

_ON_UNSUPPORTED = ("error", "ignore")


def polyfill(
    fn: Callable[..., Any] | None = None,
    *,
    target: targets.TargetLike = None,
    mode: str | None = None,
    on_unsupported: str = "error",
) -> Any:
    """Wrap ``fn`` so that every matmul and convolution runs on ``target``.

    Args:
      fn: the function; ``polyfill`` also works as a decorator with or without arguments.
      target: target name or :class:`emulate.targets.Target`; default: the current target
        when the wrapped function is called.
      mode: "fast" or "exact", as in :func:`emulate.dot_general`; default: the current
        mode when the wrapped function is called ("fast" outside ``emulate.use_mode``).
      on_unsupported: "error" (default): a site emulate must emulate but cannot (a
        float8_e8m0fnu operand, say) raises; "ignore": such sites are left as they are.
        Sites of JAX's own types (int32, int16, bool, complex64, float64, ...) and pairs
        the target runs natively are always left as they are.

    Returns:
      A function with ``fn``'s signature and outputs (the same avals). It composes with
      ``jit``, ``grad`` and ``vmap`` in any order; its gradient is ``fn``'s (emulated
      sites differentiate as :func:`emulate.dot_general` does, and a ``custom_vjp``
      holding an emulated site keeps its own backward rule, rewritten too). The
      rewritten program is cached per input signature (tree structure, shapes, dtypes),
      target and mode.

    Notes:
      The target and mode hold for everything traced inside ``fn``: ``fn`` is traced
      inside ``emulate.target(target)`` and ``emulate.use_mode(mode)`` blocks, so every
      emulate call in it that names no target or mode of its own (``x @ q`` on a QArray,
      ``emulate.einsum``, a nested ``polyfill``, ...) is planned for them too; an
      explicit ``target=`` / ``mode=`` on an inner call (the innermost) wins.
      Arguments are traced: Python scalars become weakly typed arrays, as under ``jit``;
      leaves of extended dtypes (typed PRNG keys) pass through as they are.
      A ``pallas_call`` is left alone (its kernels are not rewritten).
    """
    if on_unsupported not in _ON_UNSUPPORTED:
        raise ValueError(
            f"on_unsupported: expected one of {', '.join(map(repr, _ON_UNSUPPORTED))}, "
            f"got {on_unsupported!r}"
        )
    if mode is not None:
        targets.current_mode(mode)  # a bad mode fails here, not at the first call
    if fn is None:
        return functools.partial(polyfill, target=target, mode=mode, on_unsupported=on_unsupported)
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    cache: dict[Any, Callable[..., Any]] = {}

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        t = targets.current_target(target)
        m = targets.current_mode(mode)
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        key = (tree, tuple(_aval_key(x) for x in leaves), t, m)
        with targets.use_target(t), targets.use_mode(m):
            run = cache.get(key)
            if run is None:
                run = _build(fn, tree, leaves, t, m, on_unsupported)
                cache[key] = run
            return run(*leaves)

    wrapped.cache_size = lambda: len(cache)  # type: ignore[attr-defined]
    return wrapped


def _aval_key(x: Any) -> Any:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        # The dtype as it is, not np.dtype(...): extended dtypes (key<fry>) have no numpy one.
        return (tuple(x.shape), x.dtype, bool(getattr(x, "weak_type", False)))
    return (type(x).__name__,)


def _build(fn, tree, leaves, t, mode, on_unsupported) -> Callable[..., Any]:
    def flat_fn(*flat):
        args, kwargs = jax.tree_util.tree_unflatten(tree, flat)
        return fn(*args, **kwargs)

    closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*leaves)
    out_tree = jax.tree_util.tree_structure(out_shape)
    rewriter = _Rewriter(t, mode, on_unsupported)

    @jax.jit
    def run(*flat):
        outs = rewriter.eval(closed.jaxpr, closed.consts, flat)
        return jax.tree_util.tree_unflatten(out_tree, outs)

    return run


def _bind(eqn: jex_core.JaxprEqn, invals: list[Any], params: dict[str, Any]) -> Any:
    # As jax.core.eval_jaxpr does: the equation's context (mesh, axis names) around bind.
    with eqn.ctx.manager:
        return eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(params))


class _Rewriter:
    def __init__(self, t: targets.Target, mode: str, on_unsupported: str):
        self.t, self.mode, self.on_unsupported = t, mode, on_unsupported

    def needs(self, jaxpr: jex_core.Jaxpr) -> bool:
        return any(program.needs_emulation(s, self.t) for s in program.sites(jaxpr))

    def eval(
        self,
        jaxpr: jex_core.Jaxpr,
        consts: Sequence[Any],
        args: Sequence[Any],
        linear: Sequence[bool] | None = None,
    ) -> list[Any]:
        """Evaluate ``jaxpr`` with its sites rewritten. ``linear`` flags the inputs that are
        tangents (a custom JVP rule's): equations that read them must stay transposable,
        so they are bound as they are, except matmul sites the target lacks, which become
        the float32 contraction of float32 operands (linear, native everywhere)."""
        env: dict[Any, Any] = {}
        tangent: set[Any] = set()

        def read(v):
            return v.val if isinstance(v, jex_core.Literal) else env[v]

        for v, x in zip(jaxpr.constvars, consts, strict=True):
            env[v] = x
        for i, (v, x) in enumerate(zip(jaxpr.invars, args, strict=True)):
            env[v] = x
            if linear is not None and linear[i]:
                tangent.add(v)
        for eqn in jaxpr.eqns:
            invals = [read(v) for v in eqn.invars]
            if any(not isinstance(v, jex_core.Literal) and v in tangent for v in eqn.invars):
                outs = self.linear_equation(eqn, invals)
                tangent.update(eqn.outvars)
            else:
                outs = self.equation(eqn, invals)
            if not eqn.primitive.multiple_results:
                outs = [outs]
            for v, x in zip(eqn.outvars, outs, strict=True):
                env[v] = x
        return [read(v) for v in jaxpr.outvars]

    def linear_equation(self, eqn: Any, invals: list[Any]) -> Any:
        if eqn.primitive.name in program.MATMUL_PRIMITIVES + program.RAGGED_PRIMITIVES:
            lhs, rhs = (v.aval for v in eqn.invars[:2])
            if not self.t.supports(np.dtype(lhs.dtype), np.dtype(rhs.dtype)) and all(
                jnp.issubdtype(a.dtype, jnp.floating) for a in (lhs, rhs)
            ):
                params = dict(eqn.params, preferred_element_type=np.dtype(np.float32))
                wide = [x.astype(jnp.float32) for x in invals[:2]] + invals[2:]
                out = _bind(eqn, wide, params)
                return out.astype(eqn.outvars[0].aval.dtype)
        return _bind(eqn, invals, eqn.params)

    def equation(self, eqn: Any, invals: list[Any]) -> Any:
        name = eqn.primitive.name
        if name in program.MATMUL_PRIMITIVES + program.RAGGED_PRIMITIVES:
            lhs, rhs = (v.aval for v in eqn.invars[:2])
            if not runs_as_is(
                np.dtype(lhs.dtype), np.dtype(rhs.dtype), target=self.t
            ) or not xla_holds(eqn.params["preferred_element_type"]):
                # a result XLA's dot cannot return (float4, int4, float6): emulate's route
                return self.emulated(eqn, invals)
        if name in program.SCALED_PRIMITIVES:
            a, b, a_scales, b_scales = invals
            out = scaled_matmul(
                a,
                b,
                a_scales,
                b_scales,
                preferred_element_type=eqn.params["preferred_element_type"],
                target=self.t,
                mode=self.mode,
            )
            want = eqn.outvars[0].aval.dtype
            out = out if out.dtype == want else out.astype(want)
            return [out] if eqn.primitive.multiple_results else out
        if name in program.OPAQUE_PRIMITIVES:  # Pallas kernels are left as they are
            return _bind(eqn, invals, eqn.params)
        if name == "shard_map" and self.needs(eqn.params["jaxpr"]):
            return self.shard_map(eqn, invals)
        if name == "custom_vjp_call" and self.needs(eqn.params["call_jaxpr"].jaxpr):
            return self.custom_vjp(eqn, invals)
        if name == "custom_jvp_call" and self.needs(eqn.params["call_jaxpr"].jaxpr):
            return self.custom_jvp(eqn, invals)
        params = {k: self.param(v) for k, v in eqn.params.items()}
        return _bind(eqn, invals, params)

    def shard_map(self, eqn: jex_core.JaxprEqn, invals: list[Any]) -> Any:
        # A shard_map body can only be traced inside shard_map (its values vary over mesh
        # axes): enter it again through the public API, with the same mesh and specs.
        p = eqn.params
        body = p["jaxpr"]
        wrapped = jax.shard_map(
            lambda *a: tuple(self.eval(body, (), a)),
            mesh=p["mesh"],
            in_specs=tuple(p["in_specs"]),
            out_specs=tuple(p["out_specs"]),
            check_vma=p["check_vma"],
            axis_names=set(p["newly_manual_axes"]),
        )
        return list(wrapped(*invals))

    def custom_vjp(self, eqn: jex_core.JaxprEqn, invals: list[Any]) -> Any:
        # The equation's forward and backward rules are callables, not jaxprs, so walking
        # its params would rewrite the primal only; under grad, JAX's rules would then run
        # the original sites (jax.nn.scaled_dot_general's backward is a scaled_matmul).
        # Instead: a custom_vjp whose primal is the rewritten body and whose backward is
        # JAX's own (the vjp of the original equation), traced and rewritten too.
        nc = eqn.params["num_consts"]
        body = eqn.params["call_jaxpr"]
        rewriter = self

        def original(consts, args):
            return _bind(eqn, [*consts, *args], eqn.params)

        @jax.custom_vjp
        def call(consts, args):
            return rewriter.eval(body.jaxpr, body.consts, [*consts, *args])

        def fwd(consts, args):
            return call(consts, args), (consts, args)

        def bwd(res, cts):
            consts, args = res

            def vjp(args, cts):
                return jax.vjp(lambda *a: original(consts, a), *args)[1](cts)

            closed, shape = jax.make_jaxpr(vjp, return_shape=True)(args, cts)
            flat = jax.tree_util.tree_leaves((args, cts))
            grads = rewriter.eval(closed.jaxpr, closed.consts, flat)
            # The body's constants: not differentiated (JAX's own rule refuses them).
            zeros = tuple(None for _ in consts)
            return zeros, jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), grads)

        call.defvjp(fwd, bwd)
        return call(tuple(invals[:nc]), tuple(invals[nc:]))

    def custom_jvp(self, eqn: jex_core.JaxprEqn, invals: list[Any]) -> Any:
        # As custom_vjp: the primal is the rewritten body, the JVP is the equation's own
        # rule (jax.jvp of the original equation), traced and rewritten.
        body = eqn.params["call_jaxpr"]
        rewriter = self

        def original(*xs):
            return _bind(eqn, list(xs), eqn.params)

        @jax.custom_jvp
        def call(*xs):
            return rewriter.eval(body.jaxpr, body.consts, list(xs))

        def jvp(primals, tangents):
            def rule(p, t):
                return jax.jvp(original, p, t)

            closed, shape = jax.make_jaxpr(rule, return_shape=True)(primals, tangents)
            flat = jax.tree_util.tree_leaves((primals, tangents))
            linear = [False] * len(primals) + [True] * len(tangents)
            outs = rewriter.eval(closed.jaxpr, closed.consts, flat, linear)
            return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), outs)

        call.defjvp(jvp)
        return call(*invals)

    def emulated(self, eqn: Any, invals: list[Any]) -> Any:
        p = eqn.params
        try:
            lhs, rhs = invals[:2]
            if eqn.primitive.name in program.RAGGED_PRIMITIVES:
                out = ragged_dot_general(
                    lhs,
                    rhs,
                    invals[2],
                    p["ragged_dot_dimension_numbers"],
                    p["precision"],
                    p["preferred_element_type"],
                    p["group_offset"],
                    target=self.t,
                    mode=self.mode,
                )
            elif eqn.primitive.name == "dot_general":
                out = dot_general(
                    lhs,
                    rhs,
                    p["dimension_numbers"],
                    p["precision"],
                    p["preferred_element_type"],
                    target=self.t,
                    mode=self.mode,
                )
            else:
                out = conv_general_dilated(
                    lhs,
                    rhs,
                    window_strides=p["window_strides"],
                    padding=p["padding"],
                    lhs_dilation=p["lhs_dilation"],
                    rhs_dilation=p["rhs_dilation"],
                    dimension_numbers=p["dimension_numbers"],
                    feature_group_count=p["feature_group_count"],
                    batch_group_count=p["batch_group_count"],
                    precision=p["precision"],
                    preferred_element_type=p["preferred_element_type"],
                    target=self.t,
                    mode=self.mode,
                )
        except (TypeError, ValueError):
            if self.on_unsupported == "error":
                raise
            return _bind(eqn, invals, eqn.params)
        want = eqn.outvars[0].aval.dtype
        return out if out.dtype == want else out.astype(want)

    def param(self, value: Any) -> Any:
        if isinstance(value, jex_core.ClosedJaxpr):
            return self.closed(value) if self.needs(value.jaxpr) else value
        if isinstance(value, jex_core.Jaxpr):
            if not self.needs(value):
                return value
            new = self.closed(jex_core.ClosedJaxpr(value, ()))
            if new.consts:
                raise NotImplementedError(
                    "polyfill: rewriting an open sub-jaxpr produced constants; "
                    "this primitive's body cannot take them"
                )
            return new.jaxpr
        if isinstance(value, tuple) and any(
            isinstance(v, (jex_core.ClosedJaxpr, jex_core.Jaxpr)) for v in value
        ):
            return tuple(self.param(v) for v in value)
        return value

    def closed(self, cj: jex_core.ClosedJaxpr) -> jex_core.ClosedJaxpr:
        avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in cj.in_avals]
        return jax.make_jaxpr(lambda *a: self.eval(cj.jaxpr, cj.consts, a))(*avals)


def scaled_dot_general(
    lhs: ArrayLike,
    rhs: ArrayLike,
    dimension_numbers: lax.DotDimensionNumbers,
    preferred_element_type: DTypeLike = jnp.float32,
    configs: list[Any] | None = None,
    *,
    target: targets.TargetLike = None,
    mode: str | None = None,
) -> jax.Array:
    """``jax.nn.scaled_dot_general`` on any target: JAX's own function (its quantizer for
    ``configs`` from ``jax.nn.get_scaled_dot_general_config``, "mxfp8" or "nvfp4"), run
    through :func:`emulate.polyfill` so that its ``scaled_matmul`` runs as
    :func:`emulate.scaled_matmul`. ``configs=None`` contracts the operands as they are.

    Raises:
      TypeError: ``configs`` is not None or a list of ``jax.nn`` block-scale configs (lhs,
        rhs and gradient, as ``[jax.nn.get_scaled_dot_general_config("mxfp8")] * 3``).
    """
    if configs is not None:
        config_type = type(jax.nn.get_scaled_dot_general_config("mxfp8"))
        if (
            not isinstance(configs, (list, tuple))
            or len(configs) < 2
            or not all(isinstance(c, config_type) for c in configs)
        ):
            raise TypeError(
                "configs: expected None or a list of jax.nn block-scale configs (lhs, rhs, "
                "gradient), e.g. [jax.nn.get_scaled_dot_general_config('mxfp8')] * 3, got "
                f"{type(configs).__name__} {configs!r}"
            )

    def run(x, y):
        return jax.nn.scaled_dot_general(
            x,
            y,
            dimension_numbers,
            preferred_element_type=preferred_element_type,
            configs=configs,
        )

    return polyfill(run, target=target, mode=mode)(lhs, rhs)
