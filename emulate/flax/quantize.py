"""Quantize a flax model's weights in one call: :func:`quantize_model`.

For flax NNX (``Linear``, ``LinearGeneral``, ``Einsum``, ``Conv``, ``Embed``) and linen
(``Dense``, ``DenseGeneral``, ``Einsum``, ``Conv``) layers chosen by :class:`Rule` s (a
regular expression on the layer's path, first match wins) or by a callable. Each chosen
layer's matmul runs through :func:`emulate.dot_general`, :func:`emulate.einsum` or
:func:`emulate.conv_general_dilated` with its kernel as an :class:`emulate.QArray`, on the
target of the current :func:`emulate.target` context (or the one ``emulate.polyfill``
sets), in mode "fast" unless the rule names a mode.

Two ways to hold the weights:

- ``qat=False`` (porting, inference): the kernel becomes a QArray (codes and scales,
  arrays) at the kernel's own path, in an :class:`QuantizedWeight` variable (NNX) or the
  ``params`` collection (linen). ``kernel.shape`` and the parameter paths stay, a
  checkpoint stores ``.../kernel/codes`` and ``.../kernel/scales``. The codes are frozen:
  ``nnx.grad`` (wrt ``nnx.Param``) and optimizers see the other parameters (biases,
  norms) and gradients flow to the layer's input.
- ``qat=True`` (quantization-aware training): the kernel stays a float master weight
  (``nnx.Param``); every call quantizes it by the layer's scheme and runs the emulated
  matmul on the result, and the gradient reaches the master weight by a straight-through
  estimator (the gradient of the same op on the dequantized values, as if quantizing were
  the identity). Call :func:`quantize_model` again with ``qat=False`` to freeze.

Layers whose kernels were read from a checkpoint already quantized (see
:mod:`emulate.flax.load`) run the same way: :func:`emulate_layer` hooks one NNX layer,
:meth:`QuantizedLinen.for_kernels` a linen model.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

try:
    from flax import linen as nn
    from flax import nnx
except ImportError as e:  # pragma: no cover - exercised where flax is absent
    raise ImportError("emulate.flax needs flax: pip install 'emulate[flax]'") from e

from emulate import formats
from emulate.conv import conv_general_dilated
from emulate.dot import dot_general, einsum
from emulate.flax.rounding import next_key
from emulate.mx import SCHEMES
from emulate.numerics.storage import Packed
from emulate.quant import QArray, Scheme, dequantize, quantize

__all__ = [
    "Rule",
    "quantize_model",
    "emulate_layer",
    "QuantizedWeight",
    "QuantizedEmbed",
    "QuantizedLinen",
]

SchemeLike = Scheme | str
RuleFn = Callable[[str, Any], "SchemeLike | None"]


@dataclasses.dataclass(frozen=True)
class Rule:
    """Which layers to quantize and how.

    Attributes:
      path: a regular expression that must match the whole layer path, names joined by
        ``/`` (NNX: ``"layers/0/attn/q"``; linen: ``"Dense_0"``, ``"block/conv1"``).
      scheme: an :mod:`emulate.mx` Scheme or its name (``"MXFP4"``), a format name for
        per-channel scales (``"int8"``, ``"float8_e4m3fn"``: one float32 ``absmax``
        scale per output channel), or None to leave matching layers as they are.
      mode: ``"fast"`` or ``"exact"`` for these layers' matmuls; None: the function's
        default.
    """

    path: str = ".*"
    scheme: SchemeLike | None = None
    mode: str | None = None


@dataclasses.dataclass(frozen=True)
class _Site:
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
        if s.rounding == "stochastic":
            kw["key"] = next_key(f"the {s.name} kernel of shape {tuple(w.shape)}")
        return quantize(w, s, packed=packed, **kw)


def _scheme(value: SchemeLike, arg: str) -> Scheme:
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


def _rule_fn(rules: Any) -> Callable[[str, Any], tuple[Scheme, str | None] | None]:
    """Normalise ``rules`` into ``(path, module) -> (scheme, mode) or None``."""
    if isinstance(rules, (Scheme, str)):
        rules = [Rule(".*", rules)]
    elif isinstance(rules, Rule):
        rules = [rules]
    if callable(rules) and not isinstance(rules, Sequence):
        fn = rules

        def by_callable(path: str, module: Any) -> tuple[Scheme, str | None] | None:
            got = fn(path, module)
            if got is None:
                return None
            if isinstance(got, Rule):
                return None if got.scheme is None else (_scheme(got.scheme, "rules"), got.mode)
            return _scheme(got, "rules"), None

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
        if r.mode not in (None, "fast", "exact"):
            raise ValueError(f"rules: mode must be 'fast', 'exact' or None, got {r.mode!r}")
        compiled.append((pattern, None if r.scheme is None else _scheme(r.scheme, "rules"), r.mode))

    def by_rules(path: str, module: Any) -> tuple[Scheme, str | None] | None:
        for pattern, scheme, mode in compiled:
            if pattern.fullmatch(path):
                return None if scheme is None else (scheme, mode)
        return None

    return by_rules


def _einsum_axes(einsum_str: str | None, kernel_ndim: int, where: str) -> tuple[int, ...]:
    """The kernel's contraction axes in ``"lhs,kernel->out"``."""
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


def _site(contract: Sequence[int], ndim: int, scheme: Scheme, mode: str | None) -> _Site:
    c = tuple(int(a) % ndim for a in contract)
    if not c:
        raise ValueError("rules: a kernel without contraction axes cannot be quantized")
    return _Site(scheme, c, tuple(a for a in range(ndim) if a not in c), mode)


# --- the operations a quantized layer runs --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Op:
    """A layer's ``dot_general`` / ``einsum_op`` / ``conv_general_dilated``: emulate's
    function when the kernel is a QArray; on a float kernel, quantize it first (straight-
    through gradient to the float kernel)."""

    kind: str  # "dot", "einsum" or "conv"
    site: _Site

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

        if isinstance(w, QArray):
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


def _straight_through(run, run_plain, site: _Site, x: jax.Array, w: jax.Array) -> jax.Array:
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


def _promote(args: Sequence[Any], dtype: Any, inexact: bool) -> list[Any]:
    """flax's ``promote_dtype`` that lets a QArray through (its logical dtype set)."""
    present = [a for a in args if a is not None]
    if dtype is None:
        dtype = jnp.result_type(*[a.dtype if isinstance(a, QArray) else a for a in present])
    if inexact and not jnp.issubdtype(dtype, jnp.inexact):
        dtype = jnp.promote_types(jnp.float32, dtype)
    out: list[Any] = []
    for a in args:
        if a is None:
            out.append(None)
        elif isinstance(a, QArray):
            same = a.dtype == np.dtype(dtype)
            out.append(a if same else dataclasses.replace(a, dtype=np.dtype(dtype)))
        else:
            out.append(jnp.asarray(a, dtype))
    return out


@dataclasses.dataclass(frozen=True)
class _NnxPromote:
    def __call__(self, args: Any, /, *, dtype: Any = None, inexact: bool = True) -> Any:
        return type(args)(_promote(args, dtype, inexact))


@dataclasses.dataclass(frozen=True)
class _LinenPromote:
    def __call__(self, *args: Any, dtype: Any = None, inexact: bool = True) -> list[Any]:
        return _promote(args, dtype, inexact)


# --- NNX -----------------------------------------------------------------------------------


class QuantizedWeight(nnx.Variable):
    """The variable type of a frozen quantized kernel (a QArray): not an ``nnx.Param``, so
    ``nnx.grad`` and optimizers leave its integer codes alone."""


class QuantizedEmbed(nnx.Embed):
    """``nnx.Embed`` whose table is quantized: the lookup gathers rows of codes and scales
    and dequantizes them; ``attend`` is an emulated matmul against the table."""

    emulate_op: _Op

    def __call__(self, inputs: jax.Array, out_sharding: Any = None) -> jax.Array:
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise ValueError("inputs: expected integer indices, got " + str(inputs.dtype))
        if out_sharding is not None:
            raise ValueError(f"out_sharding: not taken by a quantized Embed, got {out_sharding!r}")
        table = self.embedding[...]
        if isinstance(table, QArray):
            return _take_rows(table, inputs).astype(self.dtype)
        site = self.emulate_op.site
        fq = dequantize(site.quantize(table, packed=False), to=table.dtype)
        table = table + lax.stop_gradient(fq - table)  # straight through
        return jnp.take(table, inputs, axis=0).astype(self.dtype)

    def attend(self, query: jax.Array, out_sharding: Any = None) -> jax.Array:
        query, table = self.promote_dtype((query, self.embedding[...]), dtype=self.dtype)
        dn = (((query.ndim - 1,), (1,)), ((), ()))
        return self.emulate_op(query, table, dn, out_sharding=out_sharding)


def _take_rows(q: QArray, idx: jax.Array) -> jax.Array:
    """Rows ``idx`` of a (V, D) QArray whose blocks are one row high, dequantized."""
    if q.block_shape[0] != 1 or not q.is_plain:
        return jnp.take(dequantize(q), idx, axis=0)
    codes = q.codes
    if isinstance(codes, Packed):  # packed along the features: gather its rows
        codes = dataclasses.replace(codes, data=jnp.take(codes.data, idx, axis=0))
    else:
        codes = jnp.take(codes, idx, axis=0)
    rows = dataclasses.replace(
        q,
        codes=codes,
        scales=jnp.take(q.scales, idx, axis=0),
        block_shape=(1,) * idx.ndim + (q.block_shape[1],),
        shape=tuple(idx.shape) + (q.shape[1],),
    )
    return dequantize(rows)


def _nnx_site(path: str, module: Any, scheme: Scheme, mode: str | None) -> tuple[str, _Site]:
    if isinstance(module, nnx.Embed):
        return "embed", _site((1,), 2, scheme, mode)
    kernel = module.kernel
    nd = len(kernel.shape)
    if isinstance(module, nnx.Linear):
        return "dot", _site((0,), nd, scheme, mode)
    if isinstance(module, nnx.LinearGeneral):
        nb, ni = len(module.batch_axis), len(module.in_features)
        return "dot", _site(tuple(range(nb, nb + ni)), nd, scheme, mode)
    if isinstance(module, nnx.Einsum):
        return "einsum", _site(_einsum_axes(module.einsum_str, nd, path), nd, scheme, mode)
    if module.mask is not None:
        raise ValueError(f"rules: the Conv at {path!r} has a mask, which is not built quantized")
    return "conv", _site(tuple(range(nd - 1)), nd, scheme, mode)


_NNX_KINDS = (nnx.Linear, nnx.LinearGeneral, nnx.Einsum, nnx.Conv, nnx.Embed)
_NNX_HOOK = {"dot": "dot_general", "einsum": "einsum_op", "conv": "conv_general_dilated"}
_NNX_KIND: dict[Any, str] = {
    nnx.Linear: "dot",
    nnx.LinearGeneral: "dot",
    nnx.Einsum: "einsum",
    nnx.Conv: "conv",
}


def _quantize_nnx(model: nnx.Module, rule: Callable, qat: bool) -> nnx.Module:
    module: Any
    for path_parts, module in list(nnx.iter_modules(model)):
        if type(module) not in _NNX_KINDS and not isinstance(module, QuantizedEmbed):
            continue
        path = "/".join(str(p) for p in path_parts)
        chosen = rule(path, module)
        if chosen is None:
            continue
        kind, site = _nnx_site(path, module, *chosen)
        name = "embedding" if kind == "embed" else "kernel"
        var = getattr(module, name)
        value = var[...]
        if isinstance(value, QArray):
            value = dequantize(value)  # re-quantizing a frozen layer: from its values
        _hook_nnx(module, kind, site)
        if qat:
            setattr(module, name, nnx.Param(value))
        else:
            q = site.quantize(jnp.asarray(value))
            setattr(module, name, QuantizedWeight(q))
    return model


def _hook_nnx(module: Any, kind: str, site: _Site) -> None:
    """Route the layer's matmul (lookup, for an Embed) through emulate."""
    op = _Op("dot" if kind == "embed" else kind, site)
    if kind == "embed":
        module.__class__ = QuantizedEmbed
        module.emulate_op = op
    else:
        setattr(module, _NNX_HOOK[kind], op)
        if kind == "dot" and isinstance(module, nnx.LinearGeneral):
            module.dot_general_cls = None
    module.promote_dtype = _NnxPromote()


def emulate_layer(module: Any, *, mode: str | None = None) -> None:
    """Route an NNX layer's matmul (an Embed's lookup) through emulate for a kernel that is
    already a QArray (:func:`emulate.flax.load_weights` puts it there): nothing is
    quantized. ``module``: a Linear, LinearGeneral, Einsum, Conv or Embed (not checked)."""
    kind = "embed" if isinstance(module, nnx.Embed) else _NNX_KIND[type(module)]
    _hook_nnx(module, kind, _Site(None, (), (), mode))


# --- linen ---------------------------------------------------------------------------------

_LINEN_KINDS = {nn.Dense: "dot", nn.DenseGeneral: "dot", nn.Einsum: "einsum", nn.Conv: "conv"}
_LINEN_HOOK = {"dot": "dot_general", "conv": "conv_general_dilated"}


def _linen_site(
    module: nn.Module, args: tuple, kwargs: dict, scheme: Scheme, mode: str | None, path: str
) -> _Site:
    kernel: Any = module.get_variable("params", "kernel")
    nd = len(kernel.shape)
    if type(module) is nn.Dense:
        return _site((0,), nd, scheme, mode)
    if type(module) is nn.DenseGeneral:
        axis = module.axis if isinstance(module.axis, Sequence) else (module.axis,)
        bd = module.batch_dims if isinstance(module.batch_dims, Sequence) else (module.batch_dims,)
        return _site(tuple(range(len(bd), len(bd) + len(axis))), nd, scheme, mode)
    if type(module) is nn.Einsum:
        es = kwargs.get("einsum_str", args[1] if len(args) > 1 else None) or module.einsum_str
        return _site(_einsum_axes(es, nd, path), nd, scheme, mode)
    if module.mask is not None:
        raise ValueError(f"rules: the Conv at {path!r} has a mask, which is not built quantized")
    return _site(tuple(range(nd - 1)), nd, scheme, mode)


@dataclasses.dataclass(frozen=True)
class QuantizedLinen:
    """A linen model whose chosen layers run quantized: ``apply`` as the model's, with the
    variables :func:`quantize_model` returned. ``sites`` maps layer paths to their
    quantization (read-only)."""

    module: nn.Module
    sites: tuple[tuple[str, _Site], ...]

    @classmethod
    def for_kernels(
        cls, module: nn.Module, paths: Sequence[str], mode: str | None = None
    ) -> QuantizedLinen:
        """``module`` with the layers at ``paths`` (``"block/Dense_0"``) running through
        emulate on the QArray kernels its variables hold (nothing is quantized)."""
        return cls(module, tuple((p, _Site(None, (), (), mode)) for p in paths))

    def apply(self, variables: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        with nn.intercept_methods(self._intercept):
            return self.module.apply(variables, *args, **kwargs)

    def _intercept(self, next_fun, args, kwargs, context):
        module = context.module
        kind = _LINEN_KINDS.get(type(module))
        if context.method_name != "__call__" or kind is None:
            return next_fun(*args, **kwargs)
        site = dict(self.sites).get("/".join(module.path))
        if site is None:
            return next_fun(*args, **kwargs)
        op = _Op(kind, site)
        stored = module.get_variable("params", "kernel")
        saved = {}

        def override(name: str, value: Any) -> None:
            saved[name] = module.__dict__.get(name, _MISSING)
            object.__setattr__(module, name, value)

        override("promote_dtype", _LinenPromote())
        if kind in _LINEN_HOOK:
            override(_LINEN_HOOK[kind], op)
            override(_LINEN_HOOK[kind] + "_cls", None)
        if isinstance(stored, QArray):  # linen's shape check would read the codes' leaves
            param = module.param

            def quantized_param(name, *a, **kw):
                if name == "kernel":
                    return module.get_variable("params", "kernel")
                return param(name, *a, **kw)

            override("param", quantized_param)
        einsum_before = jnp.einsum
        if kind == "einsum":
            jnp.einsum = lambda s, x, w, **kw: op(s, x, w, **kw)  # type: ignore[assignment]
        try:
            return next_fun(*args, **kwargs)
        finally:
            jnp.einsum = einsum_before
            for name, value in saved.items():
                if value is _MISSING:
                    object.__delattr__(module, name)
                else:
                    object.__setattr__(module, name, value)


_MISSING = object()


def _quantize_linen(
    model: nn.Module, rule: Callable, variables: Any, args: tuple, kwargs: dict, qat: bool
) -> tuple[QuantizedLinen, Any]:
    if variables is None:
        raise TypeError(
            "variables: a linen model needs its variables and example inputs: "
            "quantize_model(model, rules, variables, *inputs)"
        )
    sites: dict[str, _Site] = {}

    def record(next_fun, a, kw, context):
        module = context.module
        if context.method_name == "__call__" and type(module) in _LINEN_KINDS:
            path = "/".join(module.path)
            chosen = rule(path, module)
            if chosen is not None and path not in sites:
                scheme, mode = chosen
                sites[path] = _linen_site(module, a, kw, scheme, mode, path)
        return next_fun(*a, **kw)

    with nn.intercept_methods(record):
        jax.eval_shape(lambda v: model.apply(v, *args, **kwargs), variables)
    new = jax.tree.map(lambda x: x, dict(variables), is_leaf=lambda x: isinstance(x, QArray))
    if not qat:
        params = _unfreeze(new["params"])
        for path, site in sites.items():
            node = params
            for part in path.split("/"):
                node = node[part]
            w = node["kernel"]
            node["kernel"] = site.quantize(
                jnp.asarray(dequantize(w) if isinstance(w, QArray) else w)
            )
        new["params"] = params
    return QuantizedLinen(model, tuple(sites.items())), new


def _unfreeze(tree: Any) -> Any:
    if isinstance(tree, Mapping):
        return {k: _unfreeze(v) for k, v in tree.items()}
    return tree


# --- the one call --------------------------------------------------------------------------


def quantize_model(
    model: Any,
    rules: Rule | Sequence[Rule] | SchemeLike | RuleFn,
    variables: Any = None,
    *inputs: Any,
    qat: bool = False,
    **input_kwargs: Any,
) -> Any:
    """Quantize the weights of a flax model's chosen layers (module docstring).

    Args:
      model: an NNX module (changed in place and returned) or a linen module.
      rules: a :class:`Rule`, a sequence of them (first whose ``path`` matches wins; no
        match: the layer stays float), a Scheme or scheme name for every layer, or a
        callable ``(path, module) -> Scheme | scheme name | Rule | None``.
      variables, inputs, input_kwargs: linen only: the model's variables and example
        arguments of ``model.apply`` (run abstractly, to find the layers and their paths).
      qat: False: kernels become frozen QArrays; True: float master kernels, quantized on
        every call, trained through a straight-through estimator.

    Returns:
      NNX: ``model``. linen: ``(QuantizedLinen, variables)``, use
      ``qmodel.apply(variables, *inputs)`` in place of ``model.apply``.

    Raises:
      TypeError: rules of another kind, a model that is neither NNX nor linen, a linen
        model without variables. ValueError: a bad scheme, regular expression or mode; an
        Einsum without an explicit constructor ``einsum_str``; a masked Conv; a 2-D block
        scheme on a kernel with no output axis.
    """
    rule = _rule_fn(rules)
    if isinstance(model, nnx.Module):
        if variables is not None or inputs or input_kwargs:
            raise TypeError("variables, inputs: an NNX model takes neither; pass model, rules")
        return _quantize_nnx(model, rule, bool(qat))
    if isinstance(model, nn.Module):
        return _quantize_linen(model, rule, variables, inputs, input_kwargs, bool(qat))
    raise TypeError(f"model: expected a flax NNX or linen Module, got {type(model).__name__}")
