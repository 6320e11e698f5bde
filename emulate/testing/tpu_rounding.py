"""``tpu_numerics(fn, target=...)``: run ``fn`` on any backend with the roundings a TPU makes.

A CPU run of a TPU program hides the roundings that decide its numerics: XLA:CPU folds
``convert(dot -> bfloat16)`` into a float32 dot and drops float32 -> bfloat16 -> float32
round trips (its excess-precision rules), and it multiplies float32 operands at full
precision whatever ``precision`` says. :func:`tpu_numerics` traces ``fn`` once per input
signature and rewrites every matmul of the program, the kernels of ``pallas_call`` (run in
interpret mode) included, to compute what the target's TPU computes as far as types go:

- each ``dot_general`` sums in float32 (int32 for two integer operands) and rounds the
  result once into the type it declares (``preferred_element_type``, or the operands'
  type where none is given: bfloat16 for two bfloat16 operands), and that rounding is
  forced (an optimization barrier keeps XLA from folding it away);
- float32 and float16 operands get the passes the target's matrix unit gives them at the
  dot's ``precision`` (:data:`PASSES`): one bfloat16 pass at ``DEFAULT`` (each operand
  rounded to bfloat16), three at ``HIGH`` (the operand split into a bfloat16 head and
  tail), full float32 at ``HIGHEST``;
- inside a Pallas kernel, the pair goes through Mosaic's rules as the kernel check reads
  them (:func:`emulate.pallas.checking.findings.diagnose`: :meth:`emulate.targets.Target.compiles`
  and the recorded probe of the real compiler, compatibility mode on): a
  pair or accumulator Mosaic refuses raises ``ValueError`` with the compiler's message (a
  bfloat16 accumulator: "Expected matmul acc to be 32-bit"); a pair that compiles only
  in compatibility mode gets that mode's conversions (public Mosaic source,
  ``canonicalize_matmul``): integer, 4-bit and float8 operands widen exactly, and on a
  generation whose recorded message is "Automatic int->float" (TPU v7x) an int32
  accumulator becomes a float32 one whose sum is converted back;
- every conversion of a float to a narrower float type (``x.astype(jnp.bfloat16)``) is
  forced too, as Mosaic performs it.

What it cannot know: the order in which the matrix unit adds the products of one dot. The
rewritten dot sums in float32 in XLA:CPU's order, so a result can differ from the TPU's
by the reordering of a float32 sum, which the mode "fast" bound ``gamma_K * sum |a*b|``
covers; exact sums (integers, and float sums of few significant bits) are equal. XLA:TPU
may also keep more precision than a program declares (measured: it folds
``jnp.dot(bf16, bf16).astype(f32)`` into a float32 dot, and of four bfloat16 block
results summed in float32 it kept the first unrounded): this run checks the roundings
the program declares, of which the TPU makes all or some.

The three-pass ``HIGH`` scheme is modelled as ``hi*hi + hi*lo + lo*hi``; the TPU's result
differs from that model by about ``2**-18 * sum |a*b|`` (the compiler's split and order
are not public), so ``HIGH`` results are within a bound, not bit for bit. Convolutions are
left as they are.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, Final

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex_core

from emulate import targets
from emulate.pallas.checking import findings, sites

__all__ = ["MEASURED_WITH", "PASSES", "tpu_numerics"]

#: What the findings this module models were measured with: the real compiler's output
#: (compile-only devices) and a TPU v5e chip.
MEASURED_WITH: Final[str] = "libtpu 0.0.42.1, jax 0.10.2, a TPU v5e chip"

#: bfloat16 passes of the matrix unit for float32 (and float16) operands, by ``precision``.
#: From the compiler's own output (XLA:TPU's estimated cycles for a 2048**3 float32 dot on
#: tpu_v5e: 143032, 408206, 815804, i.e. 1 : 2.9 : 5.7) and the chip's results: at
#: DEFAULT a float32 (or float16) operand is rounded to bfloat16, in XLA programs and in
#: Pallas kernels alike; Pallas refuses ``HIGH`` ("Unsupported dot precision").
PASSES: Final[Mapping[str, int]] = {"DEFAULT": 1, "HIGH": 3, "HIGHEST": 6}

_F32 = np.dtype(np.float32)
_BF16 = np.dtype(jnp.bfloat16)
_I32 = np.dtype(np.int32)
# Wider than the matrix unit's bfloat16 inputs: the passes apply to these.
_PASSED = (np.dtype(np.float32), np.dtype(np.float16))
_INT_TO_FLOAT = "Automatic int->float"


def tpu_numerics(
    fn: Callable[..., Any], *, target: targets.TargetLike = None
) -> Callable[..., Any]:
    """Wrap ``fn`` so that its matmuls round as they do on ``target``'s TPU.

    Args:
      fn: a JAX function; its ``pallas_call`` kernels must run in interpret mode on a
        machine without a TPU (``interpret=True`` or ``pltpu.InterpretParams()``).
      target: a TPU target name or :class:`emulate.targets.Target`; default the current
        target when the wrapped function is called.

    Returns:
      A function with ``fn``'s signature and result types, traced once per input
      signature (shapes, dtypes, tree structure), target and
      ``jax.default_matmul_precision`` setting (a dot without ``precision`` takes that
      setting, as JAX's lowering does), and run under ``jax.jit`` inside
      ``emulate.use_target(target)``.

    Raises:
      TypeError: ``fn`` is not callable.
      ValueError: ``target`` is not a TPU target (when wrapping, or at the call for the
        current target); at the call, a Pallas dot that Mosaic refuses on ``target``.
      NotImplementedError: a Pallas dot at ``precision=HIGH`` (Pallas refuses it).
    """
    if not callable(fn):
        raise TypeError(f"fn: expected a callable, got {type(fn).__name__}")
    if target is not None:
        _tpu(target)
    cache: dict[Any, Callable[..., Any]] = {}

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        t = _tpu(target)
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        precision = getattr(jax.config, "jax_default_matmul_precision", None)
        key = (tree, tuple(_aval_key(x) for x in leaves), t, precision)
        with targets.use_target(t):
            run = cache.get(key)
            if run is None:
                try:
                    run = _build(fn, tree, leaves, t)
                except (ValueError, NotImplementedError) as e:
                    run = functools.partial(_raise, e)  # refused once, refused at each call
                cache[key] = run
            return run(*leaves)

    wrapped.__wrapped__ = fn
    return wrapped


def _raise(error: Exception, *args: Any) -> Any:
    raise error


def _tpu(target: targets.TargetLike) -> targets.Target:
    t = targets.current_target(target)
    if t.kind != "tpu":
        raise ValueError(
            f"target: tpu_numerics models a TPU target (tpu_v4, tpu_v5e, ...); got {t.name!r}"
            + (" (the current target; pass target=)" if target is None else "")
        )
    return t


def _aval_key(x: Any) -> Any:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return (tuple(x.shape), x.dtype, bool(getattr(x, "weak_type", False)))
    return (type(x).__name__,)  # a Python scalar is traced as a value of its type


def _build(fn: Callable[..., Any], tree: Any, leaves: list[Any], t: targets.Target) -> Any:
    def flat_fn(*flat: Any) -> Any:
        args, kwargs = jax.tree_util.tree_unflatten(tree, flat)
        return fn(*args, **kwargs)

    closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*leaves)
    rewritten = jex_core.ClosedJaxpr(_rewrite(closed.jaxpr, t, False), closed.consts)
    out_tree = jax.tree_util.tree_structure(out_shape)
    run = jex_core.jaxpr_as_fun(rewritten)
    return jax.jit(lambda *flat: jax.tree_util.tree_unflatten(out_tree, run(*flat)))


def _rewrite(jaxpr: jex_core.Jaxpr, t: targets.Target, in_kernel: bool) -> jex_core.Jaxpr:
    """``jaxpr`` with each dot and narrowing float conversion replaced by a ``jit`` call of
    its TPU-rounded form (same input and output variables), sub-jaxprs rewritten too."""
    eqns = []
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            eqns.append(_substitute(eqn, _dot(eqn, t, in_kernel)))
        elif name == "convert_element_type" and _narrows(eqn):
            eqns.append(_substitute(eqn, _forced_convert(eqn)))
        else:
            kernel = in_kernel or name == "pallas_call"
            params = {k: _param(v, t, kernel) for k, v in eqn.params.items()}
            eqns.append(eqn.replace(params=params))
    return jaxpr.replace(eqns=eqns)


def _param(value: Any, t: targets.Target, in_kernel: bool) -> Any:
    if isinstance(value, jex_core.ClosedJaxpr):
        return jex_core.ClosedJaxpr(_rewrite(value.jaxpr, t, in_kernel), value.consts)
    if isinstance(value, jex_core.Jaxpr):
        return _rewrite(value, t, in_kernel)
    if isinstance(value, tuple) and any(
        isinstance(v, (jex_core.ClosedJaxpr, jex_core.Jaxpr)) for v in value
    ):
        return tuple(_param(v, t, in_kernel) for v in value)
    return value


def _substitute(eqn: Any, replacement: Callable[..., Any]) -> Any:
    """One ``jit`` equation computing ``replacement`` on ``eqn``'s inputs into its outputs."""
    specs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype) for v in eqn.invars]
    (call,) = jax.make_jaxpr(jax.jit(replacement))(*specs).jaxpr.eqns
    return call.replace(invars=list(eqn.invars), outvars=list(eqn.outvars))


def _narrows(eqn: Any) -> bool:
    """Whether ``eqn`` converts a float to a float type with fewer significand bits or a
    smaller range (float32 -> bfloat16, float16 -> bfloat16, bfloat16 -> float8)."""
    src, dst = np.dtype(eqn.invars[0].aval.dtype), np.dtype(eqn.params["new_dtype"])
    if not all(jnp.issubdtype(d, jnp.floating) for d in (src, dst)):
        return False
    a, b = jnp.finfo(src), jnp.finfo(dst)
    return bool(b.nmant < a.nmant or b.maxexp < a.maxexp)


def _forced_convert(eqn: Any) -> Callable[..., Any]:
    dst = eqn.params["new_dtype"]
    return lambda x: lax.optimization_barrier(x.astype(dst))


def _precision(eqn: Any) -> str:
    p = eqn.params["precision"]
    if p is not None:
        p = p[0] if isinstance(p, tuple) else p
        if isinstance(p, lax.Precision):
            return p.name
        raise NotImplementedError(f"tpu_numerics: dot precision {p!r} is not modelled")
    default = getattr(jax.config, "jax_default_matmul_precision", None)
    if default in (None, "default", "bfloat16", "fastest"):
        return "DEFAULT"
    if default in ("high", "bfloat16_3x", "tensorfloat32"):
        return "HIGH"
    return "HIGHEST"


def _dot(eqn: Any, t: targets.Target, in_kernel: bool) -> Callable[..., Any]:
    lhs, rhs = (np.dtype(v.aval.dtype) for v in eqn.invars)
    out = np.dtype(eqn.outvars[0].aval.dtype)
    pet = eqn.params["preferred_element_type"]
    acc = np.dtype(pet) if pet is not None else out
    precision = _precision(eqn)
    integers = all(jnp.issubdtype(d, jnp.integer) for d in (lhs, rhs))
    sum_type = _I32 if integers else _F32
    if in_kernel:
        sum_type = _mosaic_sum(t, lhs, rhs, acc, eqn)
        if precision == "HIGH":
            raise NotImplementedError(
                "tpu_numerics: a Pallas dot at precision=HIGH: Pallas refuses it on a TPU "
                "(Unsupported dot precision); use DEFAULT or HIGHEST"
            )
    dn = eqn.params["dimension_numbers"]

    def passes(x: jax.Array, dtype: np.dtype) -> list[jax.Array]:
        if sum_type == _I32:
            return [x.astype(_I32)]
        x = x.astype(_F32)
        if dtype not in _PASSED or precision == "HIGHEST":
            return [x]
        hi = _rounded(x, _BF16)
        if precision == "DEFAULT":
            return [hi]
        return [hi, _rounded(x - hi, _BF16)]

    def replacement(a: jax.Array, b: jax.Array) -> jax.Array:
        xs, ys = passes(a, lhs), passes(b, rhs)
        terms = [(x, y) for i, x in enumerate(xs) for j, y in enumerate(ys) if i + j < 2]
        total = None
        for x, y in terms:
            d = lax.dot_general(
                x, y, dn, precision=lax.Precision.HIGHEST, preferred_element_type=sum_type
            )
            total = d if total is None else total + d
        assert total is not None
        if out == total.dtype:
            return total
        return lax.optimization_barrier(total.astype(out))

    return replacement


def _rounded(x: jax.Array, dtype: np.dtype) -> jax.Array:
    """``x`` rounded to ``dtype`` and back, a rounding XLA cannot fold away."""
    return lax.optimization_barrier(x.astype(dtype)).astype(x.dtype)


def _mosaic_sum(t: targets.Target, lhs: np.dtype, rhs: np.dtype, acc: np.dtype, eqn: Any) -> Any:
    """The type a Pallas dot sums in on ``t``, by Mosaic's recorded rules as
    :func:`emulate.pallas.checking.findings.diagnose` reads them (compatibility mode on, its
    default); ValueError with the compiler's message and fix where Mosaic refuses it."""
    where = _location(eqn)
    shape = "x".join(map(str, eqn.outvars[0].aval.shape)) or "1"
    types = [_MLIR.get(d.name) for d in (lhs, rhs, acc)]
    if None in types:
        raise ValueError(
            f"tpu_numerics: the Pallas dot{where} of {lhs.name} x {rhs.name} accumulating in "
            f"{acc.name}: emulate has no Mosaic rule for these types"
        )
    a, b, c = (f"vector<{shape}x{ty}>" for ty in types)
    site = sites.MatmulSite("kernel", a, b, c, lhs.name, rhs.name, where[4:] or None)
    found = findings.diagnose(site, t, compat=True)
    if found is not None and found.kind == findings.REFUSED:
        raise ValueError(
            f"tpu_numerics: Mosaic refuses the Pallas dot{where} of {lhs.name} x {rhs.name} "
            f"accumulating in {acc.name} on {t.name}: {found.message}; fix: {found.fix}"
        )
    integers = all(np.issubdtype(d, np.integer) for d in (lhs, rhs))
    if found is not None and _INT_TO_FLOAT in found.message and integers:
        return _F32  # compatibility mode sums in float32 and converts the sum back
    return _I32 if integers else _F32


# numpy dtype name -> MLIR element type, the inverse of the kernel check's table.
_MLIR = {fmt: mlir for mlir, fmt in sites.MLIR_FORMATS.items()} | {"int32": "i32"}


def _location(eqn: Any) -> str:
    """`` at file:line`` of the user's code that made ``eqn``, or ``""``."""
    try:
        from jax._src import source_info_util  # no public API for the user frame yet

        frame = source_info_util.user_frame(eqn.source_info.traceback)
    except (ImportError, AttributeError):  # a location is best effort
        return ""
    return "" if frame is None else f" at {frame.file_name}:{frame.start_line}"
