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
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

try:
    from flax import linen as nn
    from flax import nnx
except ImportError as e:  # pragma: no cover - exercised where flax is absent
    raise ImportError("emulate.flax needs flax: pip install 'emulate[flax]'") from e

from emulate.flax.layers import (
    Chosen,
    LinenPromote,
    NnxPromote,
    Op,
    Rule,
    RuleFn,
    SchemeLike,
    Site,
    einsum_axes,
    make_site,
    rule_fn,
)
from emulate.numerics.storage import Packed
from emulate.quantized.array import QArray
from emulate.quantized.quantizing import Scheme
from emulate.quantized.values import dequantize
from emulate.routing.prepared import is_prepared, prepare_weights, unprepared

__all__ = [
    "Rule",
    "quantize_model",
    "emulate_layer",
    "QuantizedWeight",
    "QuantizedEmbed",
    "QuantizedLinen",
]

# --- NNX -----------------------------------------------------------------------------------


class QuantizedWeight(nnx.Variable):
    """The variable type of a frozen quantized kernel (a QArray): not an ``nnx.Param``, so
    ``nnx.grad`` and optimizers leave its integer codes alone."""


class QuantizedEmbed(nnx.Embed):
    """``nnx.Embed`` whose table is quantized: the lookup gathers rows of codes and scales
    and dequantizes them; ``attend`` is an emulated matmul against the table."""

    emulate_op: Op

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


def _layer_kind(module: Any, kinds: Mapping[type, str]) -> tuple[str | None, bool]:
    """(kind, subclass): the kind of the first layer type ``module`` is an instance of
    (None: none), and whether it is a subclass of that type."""
    for cls, kind in kinds.items():
        if isinstance(module, cls):
            return kind, type(module) is not cls
    return None, False


def _cannot(path: str, module: Any, names: str) -> ValueError:
    return ValueError(
        f"rules: the layer at {path!r} ({type(module).__name__}) has a kernel, but "
        f"emulate.flax quantizes {names} layers (and their subclasses) only; leave it "
        f"float with Rule({path!r}, None) ahead of the rule that chose it"
    )


def _nnx_site(path: str, module: Any, kind: str, scheme: Scheme, mode: str | None) -> Site:
    if kind == "embed":
        return make_site((1,), 2, scheme, mode)
    nd = len(module.kernel.shape)
    if isinstance(module, nnx.Linear):
        return make_site((0,), nd, scheme, mode)
    if isinstance(module, nnx.LinearGeneral):
        nb, ni = len(module.batch_axis), len(module.in_features)
        return make_site(tuple(range(nb, nb + ni)), nd, scheme, mode)
    if isinstance(module, nnx.Einsum):
        return make_site(einsum_axes(module.einsum_str, nd, path), nd, scheme, mode)
    if module.mask is not None:
        raise ValueError(f"rules: the Conv at {path!r} has a mask, which is not built quantized")
    return make_site(tuple(range(nd - 1)), nd, scheme, mode)


_NNX_KINDS: dict[type, str] = {
    nnx.Linear: "dot",
    nnx.LinearGeneral: "dot",
    nnx.Einsum: "einsum",
    nnx.Conv: "conv",
    nnx.Embed: "embed",
}
_NNX_NAMES = "Linear, LinearGeneral, Einsum, Conv and Embed"
_NNX_HOOK = {"dot": "dot_general", "einsum": "einsum_op", "conv": "conv_general_dilated"}


def _has_kernel(module: Any) -> bool:
    return any(
        isinstance(getattr(module, name, None), nnx.Variable) for name in ("kernel", "embedding")
    )


def _quantize_nnx(model: nnx.Module, rule: Callable, qat: bool) -> nnx.Module:
    module: Any
    for path_parts, module in list(nnx.iter_modules(model)):
        kind, subclass = _layer_kind(module, _NNX_KINDS)
        if kind is None and not _has_kernel(module):
            continue
        path = "/".join(str(p) for p in path_parts)
        chosen: Chosen | None = rule(path, module)
        if chosen is None:
            continue
        if kind is None:
            raise _cannot(path, module, _NNX_NAMES)
        if subclass and not chosen.subclasses and not isinstance(module, QuantizedEmbed):
            continue
        site = _nnx_site(path, module, kind, chosen.scheme, chosen.mode)
        name = "embedding" if kind == "embed" else "kernel"
        value = getattr(module, name)[...]
        if is_prepared(value):
            value = unprepared(value)
        if isinstance(value, QArray):
            value = dequantize(value)  # re-quantizing a frozen layer: from its values
        _hook_nnx(module, kind, site)
        if qat:
            setattr(module, name, nnx.Param(value))
        else:
            q = site.quantize(jnp.asarray(value))
            # on a TPU target, a kernel in the layout emulate.pallas.matmul reads, made once
            kept = q if kind == "embed" else prepare_weights(q, experts=False)
            setattr(module, name, QuantizedWeight(kept))
    return model


def _hook_nnx(module: Any, kind: str, site: Site) -> None:
    """Route the layer's matmul (lookup, for an Embed) through emulate."""
    op = Op("dot" if kind == "embed" else kind, site)
    if kind == "embed":
        if not isinstance(module, QuantizedEmbed):
            cls: Any = type(module)
            module.__class__ = _quantized_embed_class(cls)
        module.emulate_op = op
    else:
        setattr(module, _NNX_HOOK[kind], op)
        if kind == "dot" and isinstance(module, nnx.LinearGeneral):
            module.dot_general_cls = None
    module.promote_dtype = NnxPromote()


@functools.cache
def _quantized_embed_class(cls: type) -> type:
    """QuantizedEmbed itself for ``nnx.Embed``; for a subclass, a class deriving from both
    (its own methods kept, the lookup quantized)."""
    if cls is nnx.Embed:
        return QuantizedEmbed
    return type(f"Quantized{cls.__name__}", (QuantizedEmbed, cls), {})


def emulate_layer(module: Any, *, mode: str | None = None) -> None:
    """Route an NNX layer's matmul (an Embed's lookup) through emulate for a kernel that is
    already a QArray (:func:`emulate.flax.load_weights` puts it there): nothing is
    quantized. ``module``: a Linear, LinearGeneral, Einsum, Conv or Embed, or a subclass.

    Raises:
      TypeError: a module of another type.
    """
    kind, _ = _layer_kind(module, _NNX_KINDS)
    if kind is None:
        raise TypeError(
            f"module: expected an NNX {_NNX_NAMES} layer (or a subclass), got "
            f"{type(module).__name__}"
        )
    _hook_nnx(module, kind, Site(None, (), (), mode))


# --- linen ---------------------------------------------------------------------------------

_LINEN_KINDS: dict[type, str] = {
    nn.Dense: "dot",
    nn.DenseGeneral: "dot",
    nn.Einsum: "einsum",
    nn.Conv: "conv",
}
_LINEN_NAMES = "Dense, DenseGeneral, Einsum and Conv"
_LINEN_HOOK = {"dot": "dot_general", "conv": "conv_general_dilated"}


def _linen_site(
    module: nn.Module, args: tuple, kwargs: dict, chosen: Chosen, path: str, kernel: Any
) -> Site:
    nd, scheme, mode = len(kernel.shape), chosen.scheme, chosen.mode
    if isinstance(module, nn.Dense):
        return make_site((0,), nd, scheme, mode)
    if isinstance(module, nn.DenseGeneral):
        axis = module.axis if isinstance(module.axis, Sequence) else (module.axis,)
        bd = module.batch_dims if isinstance(module.batch_dims, Sequence) else (module.batch_dims,)
        return make_site(tuple(range(len(bd), len(bd) + len(axis))), nd, scheme, mode)
    if isinstance(module, nn.Einsum):
        es = kwargs.get("einsum_str", args[1] if len(args) > 1 else None) or module.einsum_str
        return make_site(einsum_axes(es, nd, path), nd, scheme, mode)
    if module.mask is not None:
        raise ValueError(f"rules: the Conv at {path!r} has a mask, which is not built quantized")
    return make_site(tuple(range(nd - 1)), nd, scheme, mode)


@dataclasses.dataclass(frozen=True)
class QuantizedLinen:
    """A linen model whose chosen layers run quantized: ``apply`` as the model's, with the
    variables :func:`quantize_model` returned. ``sites`` maps layer paths to their
    quantization (read-only)."""

    module: nn.Module
    sites: tuple[tuple[str, Site], ...]

    @classmethod
    def for_kernels(
        cls, module: nn.Module, paths: Sequence[str], mode: str | None = None
    ) -> QuantizedLinen:
        """``module`` with the layers at ``paths`` (``"block/Dense_0"``) running through
        emulate on the QArray kernels its variables hold (nothing is quantized)."""
        return cls(module, tuple((p, Site(None, (), (), mode)) for p in paths))

    def apply(self, variables: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        with nn.intercept_methods(self._intercept):
            return self.module.apply(variables, *args, **kwargs)

    def _intercept(self, next_fun, args, kwargs, context):
        module = context.module
        kind, _ = _layer_kind(module, _LINEN_KINDS)
        if context.method_name != "__call__" or kind is None:
            return next_fun(*args, **kwargs)
        site = dict(self.sites).get("/".join(module.path))
        if site is None:
            return next_fun(*args, **kwargs)
        op = Op(kind, site)
        stored = module.get_variable("params", "kernel")
        saved = {}

        def override(name: str, value: Any) -> None:
            saved[name] = module.__dict__.get(name, _MISSING)
            object.__setattr__(module, name, value)

        override("promote_dtype", LinenPromote())
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
    if not isinstance(variables, Mapping) or not isinstance(variables.get("params"), Mapping):
        got = (
            f"a mapping with the collections {sorted(variables)}"
            if isinstance(variables, Mapping)
            else type(variables).__name__
        )
        raise ValueError(
            "variables: expected the model's variables, a mapping with a 'params' collection "
            f"(what model.init returns), got {got}"
        )
    frozen = _qarray_kernels(variables["params"], ())
    floats = jax.tree.map(
        lambda x: dequantize(x) if isinstance(x, QArray) else x,
        dict(variables),
        is_leaf=lambda x: isinstance(x, QArray),
    )
    sites: dict[str, Site] = {}
    refused: list[Exception] = []

    def record(next_fun, a, kw, context):
        module = context.module
        if context.method_name == "__call__":
            try:
                _record(module, a, kw, rule, sites)
            except (TypeError, ValueError) as e:
                refused.append(type(e)(*e.args))  # before JAX adds its traceback note
                raise
        return next_fun(*a, **kw)

    try:
        with nn.intercept_methods(record):
            jax.eval_shape(lambda v: model.apply(v, *args, **kwargs), floats)
    except (TypeError, ValueError):
        if refused:
            raise refused[0] from None
        raise
    new = _unfreeze(dict(variables))
    params = new["params"]
    for path, site in sites.items():
        node = params
        for part in path.split("/") if path else ():
            node = node[part]
        w = node["kernel"]
        w = jnp.asarray(dequantize(w) if isinstance(w, QArray) else w)
        node["kernel"] = w if qat else site.quantize(w)
    for path in frozen:  # quantized before, not chosen now: they stay as they are
        sites.setdefault(path, Site(None, (), (), None))
    return QuantizedLinen(model, tuple(sites.items())), new


def _record(module: nn.Module, args: tuple, kwargs: dict, rule: Callable, sites: dict) -> None:
    """Add the Site of ``module`` (a layer being called) to ``sites`` if a rule chooses it."""
    kind, subclass = _layer_kind(module, _LINEN_KINDS)
    has_kernel = module.has_variable("params", "kernel")
    if kind is None and not (has_kernel or module.has_variable("params", "embedding")):
        return
    path = "/".join(module.path)
    chosen: Chosen | None = rule(path, module)
    if chosen is None or path in sites:
        return
    if kind is None:
        raise _cannot(path, module, _LINEN_NAMES)
    if subclass and not chosen.subclasses:
        return
    if not has_kernel:
        raise ValueError(
            f"variables: no params/{path + '/' if path else ''}kernel for the "
            f"{type(module).__name__} at {path!r}; pass the variables model.init returned"
        )
    kernel: Any = module.get_variable("params", "kernel")
    sites[path] = _linen_site(module, args, kwargs, chosen, path, kernel)


def _qarray_kernels(params: Mapping[str, Any], where: tuple[str, ...]) -> list[str]:
    """Paths of the layers whose ``kernel`` in ``params`` is a QArray."""
    found = ["/".join(where)] if isinstance(params.get("kernel"), QArray) else []
    for k, v in params.items():
        if isinstance(v, Mapping):
            found += _qarray_kernels(v, (*where, str(k)))
    return found


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

    Layers are matched by what they are: NNX ``Linear``, ``LinearGeneral``, ``Einsum``,
    ``Conv`` and ``Embed``, linen ``Dense``, ``DenseGeneral``, ``Einsum`` and ``Conv``, and
    their subclasses (a :class:`Rule` with ``subclasses=False`` leaves those float). A
    layer with a kernel of another type that a rule chooses is refused by name. Calling
    it again on a quantized model re-quantizes the chosen layers from their dequantized
    values; linen layers quantized before and not chosen now keep their QArrays.

    Raises:
      TypeError: rules of another kind, a model that is neither NNX nor linen, a linen
        model without variables. ValueError: a bad scheme, regular expression or mode; a
        chosen layer of a type that cannot be quantized (named); linen variables without
        ``params`` or without a chosen layer's kernel; an Einsum without an explicit
        constructor ``einsum_str``; a masked Conv; a 2-D block scheme on a kernel with no
        output axis.
    """
    rule = rule_fn(rules)
    if isinstance(model, nnx.Module):
        if variables is not None or inputs or input_kwargs:
            raise TypeError("variables, inputs: an NNX model takes neither; pass model, rules")
        return _quantize_nnx(model, rule, bool(qat))
    if isinstance(model, nn.Module):
        return _quantize_linen(model, rule, variables, inputs, input_kwargs, bool(qat))
    raise TypeError(f"model: expected a flax NNX or linen Module, got {type(model).__name__}")
