"""What a quantized flax layer is made of: the rules that choose it, its :class:`Site`
(scheme, kernel axes, mode) and the :class:`Op` its matmul runs.

:class:`Rule` s (a regular expression on the layer's path, first match wins) or a callable
choose the layers; :func:`rule_fn` turns either into one function ``(path, module) ->
Chosen | None``. A chosen layer's :class:`Op` calls :func:`emulate.dot_general`,
:func:`emulate.einsum` or :func:`emulate.conv_general_dilated` with its kernel as a QArray,
or, on a float kernel (quantization-aware training), quantizes it on every call with a
straight-through gradient. :mod:`emulate.flax.quantize` hooks the Ops into NNX and linen
layers.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats
from emulate.conv import conv_general_dilated
from emulate.dot import dot_general, einsum
from emulate.flax.rounding import next_key
from emulate.numerics.rounding import STOCHASTIC
from emulate.quantized.array import QArray
from emulate.quantized.mx import SCHEMES
from emulate.quantized.quantizing import Scheme, quantize
from emulate.quantized.values import dequantize
from emulate.routing.prepared import Prepared, is_prepared

__all__ = [
    "FUNCTIONS",
    "Chosen",
    "LinenPromote",
    "NnxPromote",
    "Op",
    "Rule",
    "RuleFn",
    "SchemeLike",
    "Site",
    "einsum_axes",
    "make_site",
    "rule_fn",
    "scheme_of",
]

SchemeLike = Scheme | str
RuleFn = Callable[[str, Any], "SchemeLike | None"]


@dataclasses.dataclass(frozen=True)
class Rule:
    """Which layers to quantize and how.

    Attributes:
      path: a regular expression that must match the whole layer path, names joined by
        ``/`` (NNX: ``"layers/0/attn/q"``; linen: ``"Dense_0"``, ``"block/conv1"``; the
        model itself, a bare layer: ``""``).
      scheme: an :mod:`emulate.mx` Scheme or its name (``"MXFP4"``), a format name for
        per-channel scales (``"int8"``, ``"float8_e4m3fn"``: one float32 ``absmax``
        scale per output channel), or None to leave matching layers as they are.
      mode: ``"fast"`` or ``"exact"`` for these layers' matmuls; None: the function's
        default.
      subclasses: whether subclasses of the layer types match too (``class
        MyDense(nn.Dense)``; they do by default); False leaves a subclass this rule
        matches as it is, float.
    """

    path: str = ".*"
    scheme: SchemeLike | None = None
    mode: str | None = None
    subclasses: bool = True


class Chosen(NamedTuple):
    """What a rule chose for one layer: its scheme, mode and whether a subclass of a layer
    type is quantized (:attr:`Rule.subclasses`)."""

    scheme: Scheme
    mode: str | None
    subclasses: bool = True


@dataclasses.dataclass(frozen=True)
class Site:
    """One quantized layer: its scheme, the kernel's contraction axes and its free axes.
    A layer whose kernel was loaded as a QArray has no scheme (nothing to quantize)."""

    scheme: Scheme | None
    contract: tuple[int, ...]
    free: tuple[int, ...]
    mode: str | None

    def quantize(self, w: jax.Array, *, packed: bool = True) -> QArray:
        s = self.scheme
        if s is None:
            raise ValueError(
                "kernel: this layer was loaded with a QArray kernel and has no scheme to "
                f"quantize a float kernel of shape {tuple(w.shape)} by; load a QArray again "
                "or call quantize_model"
            )
        kw: dict[str, Any] = dict(axis=self.contract[-1], ragged=True)
        if len(s.axes) == 2:
            if not self.free:
                raise ValueError(
                    f"rules: {s.name} needs 2-D blocks over a contraction and an output axis; "
                    f"this kernel of shape {tuple(w.shape)} has no output axis"
                )
            kw["axis"] = (self.contract[-1], self.free[-1])
        elif s.block is None:  # per output channel: the contraction axes are one block
            kw = dict(axis=self.contract)
        if s.rounding in STOCHASTIC:
            kw["key"] = next_key(f"the {s.name} kernel of shape {tuple(w.shape)}")
        return quantize(w, s, packed=packed, **kw)


def scheme_of(value: SchemeLike, arg: str) -> Scheme:
    """``value`` as a Scheme: a Scheme, a scheme name of :data:`emulate.mx.SCHEMES`, or a
    low-precision format name (per-channel float32 absmax scales); ValueError naming
    ``arg`` otherwise."""
    if isinstance(value, Scheme):
        return value
    if isinstance(value, str) and value in SCHEMES:
        return SCHEMES[value]
    try:
        f = formats.get(value)
    except (TypeError, ValueError):
        f = None
    if f is None or not f.is_low_precision or f.name == "float8_e8m0fnu":
        raise ValueError(
            f"{arg}: expected an emulate.mx Scheme, a scheme name ({', '.join(SCHEMES)}) or a "
            f"low-precision format name for per-channel scales, got {value!r}"
        )
    return Scheme(f"{f.name}_PER_CHANNEL", f.name, None, (-1,), "float32", "absmax")


def rule_fn(rules: Any) -> Callable[[str, Any], Chosen | None]:
    """Normalise ``rules`` (see :func:`emulate.flax.quantize_model`) into ``(path, module)
    -> Chosen or None``.

    Raises:
      TypeError: rules of another kind. ValueError: a bad scheme, regular expression,
        mode or ``subclasses`` value.
    """
    if isinstance(rules, (Scheme, str)):
        rules = [Rule(".*", rules)]
    elif isinstance(rules, Rule):
        rules = [rules]
    if callable(rules) and not isinstance(rules, Sequence):
        fn = rules

        def by_callable(path: str, module: Any) -> Chosen | None:
            got = fn(path, module)
            if got is None:
                return None
            if isinstance(got, Rule):
                return _chosen(got)
            return Chosen(scheme_of(got, "rules"), None)

        return by_callable
    if not isinstance(rules, Sequence) or not all(isinstance(r, Rule) for r in rules):
        raise TypeError(
            "rules: expected a Rule, a sequence of Rules, a Scheme or scheme name, or a "
            f"callable (path, module) -> scheme or None; got {type(rules).__name__}"
        )
    compiled = []
    for r in rules:
        try:
            pattern = re.compile(r.path)
        except re.error as e:
            raise ValueError(f"rules: path {r.path!r} is not a regular expression: {e}") from None
        compiled.append((pattern, _chosen(r)))

    def by_rules(path: str, module: Any) -> Chosen | None:
        for pattern, chosen in compiled:
            if pattern.fullmatch(path):
                return chosen
        return None

    return by_rules


def _chosen(r: Rule) -> Chosen | None:
    """A Rule checked; None for a Rule that leaves its layers float."""
    if r.mode not in (None, "fast", "exact"):
        raise ValueError(f"rules: mode must be 'fast', 'exact' or None, got {r.mode!r}")
    if not isinstance(r.subclasses, bool):
        raise ValueError(f"rules: subclasses must be True or False, got {r.subclasses!r}")
    if r.scheme is None:
        return None
    return Chosen(scheme_of(r.scheme, "rules"), r.mode, r.subclasses)


def einsum_axes(einsum_str: str | None, kernel_ndim: int, where: str) -> tuple[int, ...]:
    """The kernel's contraction axes in ``"lhs,kernel->out"`` (the Einsum at ``where``)."""
    if not isinstance(einsum_str, str) or "->" not in einsum_str or "," not in einsum_str:
        raise ValueError(
            f"rules: the Einsum at {where!r} needs its einsum_str (explicit, with '->') in "
            f"the constructor to be quantized, got {einsum_str!r}"
        )
    ins, out = einsum_str.replace(" ", "").split("->")
    lhs, rhs = ins.split(",")
    if "..." in rhs or len(rhs) != kernel_ndim:
        raise ValueError(
            f"rules: the Einsum at {where!r} names its kernel {rhs!r}; expected one letter per "
            f"kernel axis ({kernel_ndim}) and no '...'"
        )
    return tuple(i for i, c in enumerate(rhs) if c in lhs and c not in out)


def make_site(contract: Sequence[int], ndim: int, scheme: Scheme, mode: str | None) -> Site:
    """The Site of a kernel of ``ndim`` axes contracted over ``contract`` (any sign)."""
    c = tuple(int(a) % ndim for a in contract)
    if not c:
        raise ValueError("rules: a kernel without contraction axes cannot be quantized")
    return Site(scheme, c, tuple(a for a in range(ndim) if a not in c), mode)


# --- the operations a quantized layer runs --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Op:
    """A layer's ``dot_general`` / ``einsum_op`` / ``conv_general_dilated``: emulate's
    function when the kernel is a QArray; on a float kernel, quantize it first (straight-
    through gradient to the float kernel)."""

    kind: str  # "dot", "einsum" or "conv"
    site: Site

    def __call__(self, *args: Any, out_sharding: Any = None, **kw: Any) -> jax.Array:
        if out_sharding is not None:
            raise ValueError(
                f"out_sharding: emulate.flax's quantized layers take no out_sharding yet, "
                f"got {out_sharding!r}; shard with jax.sharding.reshard on the result"
            )
        pos = 2 if self.kind == "einsum" else 1
        head, x, w, rest = args[: pos - 1], args[pos - 1], args[pos], args[pos + 1 :]
        emulated, plain = FUNCTIONS[self.kind]
        ekw = dict(kw, mode=self.site.mode) if self.site.mode is not None else kw

        def run(x, q):
            return emulated(*head, x, q, *rest, **ekw)

        if isinstance(w, QArray) or is_prepared(w):
            return run(x, w)

        def run_plain(x, wd, dtype):
            return plain(*head, x, wd, *rest, **kw).astype(dtype)

        return _straight_through(run, run_plain, self.site, x, w)


#: What each kind of quantized layer calls: kind ("dot", "einsum", "conv") -> (emulate's
#: function for a QArray kernel, JAX's function for the straight-through gradient). Read at
#: call time, so a test may wrap an entry to see every emulated call.
FUNCTIONS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "dot": (dot_general, lax.dot_general),
    "einsum": (einsum, jnp.einsum),
    "conv": (conv_general_dilated, lax.conv_general_dilated),
}


def _straight_through(run, run_plain, site: Site, x: jax.Array, w: jax.Array) -> jax.Array:
    """``run(x, quantize(w))``; gradients as of ``run_plain(x, dequantize(quantize(w)))``
    wrt ``x`` and that dequantized ``w`` (passed straight to ``w``)."""

    @jax.custom_vjp
    def f(x, w):
        return run(x, site.quantize(w, packed=False))

    def fwd(x, w):
        q = site.quantize(w, packed=False)
        return run(x, q), (x, dequantize(q, to=w.dtype))

    def bwd(res, g):
        x, wd = res
        _, vjp = jax.vjp(lambda x, wd: run_plain(x, wd, g.dtype), x, wd)
        return vjp(g)

    f.defvjp(fwd, bwd)
    return f(x, w)


def _dtype_of(q: Any) -> Any:
    return q.dtype


def _promote(args: Sequence[Any], dtype: Any, inexact: bool) -> list[Any]:
    """flax's ``promote_dtype`` that lets a QArray or prepared weight
    (:func:`emulate.prepare_weights`) through (its logical dtype set)."""
    present: list[Any] = [a for a in args if a is not None]
    quantized = (QArray, Prepared)
    if dtype is None:
        dtype = jnp.result_type(*[_dtype_of(q) if isinstance(q, quantized) else q for q in present])
    if inexact and not jnp.issubdtype(dtype, jnp.inexact):
        dtype = jnp.promote_types(jnp.float32, dtype)
    out: list[Any] = []
    for a in args:
        if a is None:
            out.append(None)
        elif isinstance(a, quantized):
            q: Any = a
            same = q.dtype == np.dtype(dtype)
            out.append(q if same else dataclasses.replace(q, dtype=np.dtype(dtype)))
        else:
            out.append(jnp.asarray(a, dtype))
    return out


@dataclasses.dataclass(frozen=True)
class NnxPromote:
    def __call__(self, args: Any, /, *, dtype: Any = None, inexact: bool = True) -> Any:
        return type(args)(_promote(args, dtype, inexact))


@dataclasses.dataclass(frozen=True)
class LinenPromote:
    def __call__(self, *args: Any, dtype: Any = None, inexact: bool = True) -> list[Any]:
        return _promote(args, dtype, inexact)
