"""A checkpoint's weights into a flax model in one call: :func:`load_weights`.

``weights`` maps tensor names to values, as :func:`emulate.importers.gguf.load_gguf` (and
the safetensors importers) return them: :class:`emulate.QArray` for quantized tensors,
arrays for plain ones. Each name becomes a parameter path by a rule:

- the default, :func:`default_rule`: GGUF's llama-family names (``blk.0.attn_q.weight``,
  ``token_embd.weight``, ``output.weight``, ``blk.N.ffn_gate_exps.weight`` ...) are first
  renamed to Hugging Face's (``model.layers.0.self_attn.q_proj.weight``; table
  :data:`GGUF_NAMES`), then dots become slashes: ``model/layers/0/self_attn/q_proj/weight``.
- or a sequence of ``(regex, replacement)`` pairs: the first regex that matches the whole
  name wins, its replacement (``re.Match.expand`` syntax, ``\\1``) is the path, a None
  replacement skips the tensor on purpose;
- or a callable ``name -> path`` (None: skip the tensor).

A path names a parameter as ``nnx.iter_graph`` (NNX) or the ``params`` collection (linen)
does, parts joined by ``/``. A last part ``weight``, or a layer's path alone (the
safetensors importers name a layer by its prefix), stands for the layer's one weight: its
``kernel``, ``embedding`` or ``scale``; a list index ``layers/0`` also finds linen's
``layers_0``.

Orientation: GGUF, Hugging Face and PyTorch store a linear layer's weight as ``(out, in)``
(stacked experts: ``(E, out, in)``), flax kernels are ``(in, out)``: with the default
``layout="out_in"`` every tensor that goes to a ``kernel`` has its last two axes swapped
(a QArray by moving codes, scales and per-block parts: no decoding). Embedding tables
(``(vocab, features)``), norms and biases keep their shape. ``layout="in_out"`` takes
kernels as stored (a per-layer importer's ``layout="in_out"`` QArrays); a
callable ``name -> "out_in" or "in_out"`` decides per tensor.

A QArray kernel (or NNX embedding table) is kept as it is, frozen in a
:class:`~emulate.flax.QuantizedWeight`, and its layer runs through emulate's matmul on
the current target; plain arrays are cast to the parameter's dtype. NNX: where the current
target is a TPU, a 2-D QArray kernel the kernel route takes is kept in its prepared form
instead (:func:`emulate.prepare_weights`: the same bytes in the layout
``emulate.pallas.matmul`` reads, made once here), so that no call relayouts it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from emulate.flax.quantize import QuantizedLinen, QuantizedWeight, emulate_layer
from emulate.quantized.array import QArray
from emulate.routing.prepared import prepare_weights

__all__ = ["GGUF_NAMES", "NameRule", "default_rule", "load_weights"]

NameRule = Sequence[tuple[str, str | None]] | Callable[[str], str | None]

#: GGUF's llama-family tensor names -> Hugging Face's (llama, mistral, qwen2, mixtral-style
#: stacked experts); :func:`default_rule` then turns dots into slashes.
GGUF_NAMES: tuple[tuple[str, str | None], ...] = (
    (r"token_embd\.(weight)", r"model.embed_tokens.\1"),
    (r"output_norm\.(weight|bias)", r"model.norm.\1"),
    (r"output\.(weight|bias)", r"lm_head.\1"),
    (r"rope_freqs\.weight", None),  # recomputed by the model from its rope settings
    (r"blk\.(\d+)\.attn_norm\.(weight|bias)", r"model.layers.\1.input_layernorm.\2"),
    (r"blk\.(\d+)\.attn_([qkv])\.(weight|bias)", r"model.layers.\1.self_attn.\2_proj.\3"),
    (r"blk\.(\d+)\.attn_output\.(weight|bias)", r"model.layers.\1.self_attn.o_proj.\2"),
    (r"blk\.(\d+)\.ffn_norm\.(weight|bias)", r"model.layers.\1.post_attention_layernorm.\2"),
    (r"blk\.(\d+)\.ffn_(gate|up|down)\.(weight|bias)", r"model.layers.\1.mlp.\2_proj.\3"),
    (r"blk\.(\d+)\.ffn_gate_inp\.(weight)", r"model.layers.\1.mlp.router.\2"),
    (
        r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.(weight)",
        r"model.layers.\1.mlp.experts.\2_proj.\3",
    ),
)
_GGUF = tuple((re.compile(p), r) for p, r in GGUF_NAMES)
_MAIN_WEIGHT = ("kernel", "embedding", "scale")


def default_rule(name: str) -> str | None:
    """The parameter path of tensor ``name``: GGUF names renamed by :data:`GGUF_NAMES`
    (None for those it skips), then every ``.`` made a ``/``."""
    for pattern, repl in _GGUF:
        m = pattern.fullmatch(name)
        if m:
            if repl is None:
                return None
            name = m.expand(repl)
            break
    return name.replace(".", "/")


def _rule_fn(rule: NameRule | None) -> Callable[[str], str | None]:
    if rule is None:
        return default_rule
    if callable(rule):
        return rule
    pairs = list(rule) if isinstance(rule, Iterable) and not isinstance(rule, str) else None
    if pairs is None or not all(
        isinstance(p, tuple)
        and len(p) == 2
        and isinstance(p[0], str)
        and (p[1] is None or isinstance(p[1], str))
        for p in pairs
    ):
        raise TypeError(
            "rule: expected None, a callable name -> path or None, or a sequence of "
            f"(regex, replacement or None) pairs; got {rule!r}"
        )
    compiled = []
    for pattern, repl in pairs:
        try:
            compiled.append((re.compile(pattern), repl))
        except re.error as e:
            raise ValueError(f"rule: {pattern!r} is not a regular expression: {e}") from None

    def by_pairs(name: str) -> str | None:
        for regex, repl in compiled:
            m = regex.fullmatch(name)
            if m:
                return None if repl is None else m.expand(repl)
        raise ValueError(f"weights: tensor {name!r} matches no pattern of the rule")

    return by_pairs


def _linen_index(path: str) -> str:
    """``layers/0/x`` as linen names list members: ``layers_0/x``."""
    return re.sub(r"/(\d+)(?=/|$)", r"_\1", path)


def _resolve(name: str, path: str, params: Mapping[str, Any]) -> str:
    """The parameter path ``path`` stands for (see the module docstring)."""
    for p in dict.fromkeys((path, _linen_index(path))):
        if p in params:
            return p
        head, _, last = p.rpartition("/")
        for layer in (head, p) if last == "weight" else (p,):
            found = [f"{layer}/{w}" if layer else w for w in _MAIN_WEIGHT]
            found = [f for f in found if f in params]
            if len(found) == 1:
                return found[0]
    raise ValueError(
        f"weights: tensor {name!r} maps to {path!r}, which is not a parameter of the model; "
        "pass a rule that maps it to one (or to None to skip it)"
    )


def _swap_last(value: Any) -> Any:
    if isinstance(value, QArray):
        if value.ndim == 2:
            return value.T
        return jax.vmap(_swap_last)(value)  # stacked: the leaves' leading axes map over
    return jnp.swapaxes(value, -1, -2)


def _oriented(name: str, value: Any, path: str, want: tuple[int, ...], layout: Any) -> Any:
    """``value`` in the parameter's orientation, its shape checked against ``want``."""
    stored = tuple(value.shape)
    if not isinstance(value, QArray):
        value = jnp.asarray(value)
    leaf = path.rpartition("/")[2]
    if callable(layout):
        layout = layout(name)
        if layout not in ("out_in", "in_out"):
            raise ValueError(
                f"layout: returned {layout!r} for tensor {name!r}; expected 'out_in' or 'in_out'"
            )
    if leaf == "kernel" and layout == "out_in" and value.ndim >= 2:
        value = _swap_last(value)
        got = f"shape {stored} as stored, {tuple(value.shape)} as a kernel"
    else:
        got = f"shape {stored}"
    if tuple(value.shape) != want:
        raise ValueError(
            f"weights: tensor {name!r} ({got}) does not fit parameter {path!r} of shape {want}"
        )
    return value


def _as_dtype(value: Any, dtype: Any) -> Any:
    if isinstance(value, QArray):
        dt = np.dtype(dtype)
        ok = dt.name in ("float32", "bfloat16", "float16") and dt != value.dtype
        return dataclasses.replace(value, dtype=dt) if ok else value
    return jnp.asarray(value, dtype)


def _plan(
    weights: Mapping[str, Any], rule: Callable[[str], str | None], params: Mapping[str, Any]
) -> dict[str, str]:
    """parameter path -> tensor name; refuses two tensors for one parameter and
    parameters left without one."""
    if not isinstance(weights, Mapping):
        raise TypeError(f"weights: expected a mapping name -> QArray or array, got {weights!r}")
    chosen: dict[str, str] = {}
    for name in weights:
        path = rule(name)
        if path is None:
            continue
        if not isinstance(path, str):
            raise TypeError(f"rule: returned {path!r} for tensor {name!r}; expected a str or None")
        p = _resolve(name, path, params)
        if p in chosen:
            raise ValueError(f"weights: tensors {chosen[p]!r} and {name!r} both map to {p!r}")
        chosen[p] = name
    unset = [p for p in params if p not in chosen]
    if unset:
        raise ValueError(
            f"weights: {len(unset)} parameter(s) of the model got no tensor: "
            f"{', '.join(unset[:8])}{' ...' if len(unset) > 8 else ''}"
        )
    return chosen


# --- NNX -----------------------------------------------------------------------------------


def _nnx_params(model: nnx.Module) -> dict[str, tuple[Any, str, nnx.Variable]]:
    """path -> (the module holding it, attribute name, variable) of every parameter
    (``nnx.Param``, and a :class:`QuantizedWeight` loaded before)."""
    modules = {tuple(p): m for p, m in nnx.iter_modules(model)}
    out: dict[str, tuple[Any, str, nnx.Variable]] = {}
    for p, node in nnx.iter_graph(model):
        if isinstance(node, (nnx.Param, QuantizedWeight)):
            out["/".join(map(str, p))] = (modules.get(tuple(p[:-1])), str(p[-1]), node)
    return out


_NNX_LAYERS = (nnx.Linear, nnx.LinearGeneral, nnx.Einsum, nnx.Conv)


def _load_nnx(model, weights, rule, layout, mode):
    params = _nnx_params(model)
    for path, name in _plan(weights, rule, params).items():
        module, attr, var = params[path]
        value = _oriented(name, weights[name], path, tuple(var.shape), layout)
        if not isinstance(value, QArray):
            var.set_value(_as_dtype(value, var.get_value().dtype))
            continue
        layer = type(module) in _NNX_LAYERS and attr == "kernel"
        if not (layer or (isinstance(module, nnx.Embed) and attr == "embedding")):
            raise ValueError(
                f"weights: tensor {name!r} is quantized ({value!r}) and parameter {path!r} is "
                f"{attr!r} of a {type(module).__name__}; emulate runs quantized kernels of "
                "Linear, LinearGeneral, Einsum, Conv and Embed layers: dequantize it first"
            )
        kept = _as_dtype(value, var.get_value().dtype)
        if layer:  # on a TPU target, in the kernel's layout once (a table is read by row)
            kept = prepare_weights(kept, experts=False)
        setattr(module, attr, QuantizedWeight(kept))
        emulate_layer(module, mode=mode)
    return model


# --- linen ---------------------------------------------------------------------------------


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        p = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, p + "/"))
        else:
            out[p] = v
    return out


def _load_linen(model, weights, rule, layout, mode, variables):
    if not isinstance(variables, Mapping) or "params" not in variables:
        raise TypeError(
            "variables: a linen model needs its variables (model.init's result, with a "
            f"'params' collection): load_weights(model, weights, variables); got {variables!r}"
        )
    params = _flatten(variables["params"])
    new: dict[str, Any] = {}
    kernels = []
    for path, name in _plan(weights, rule, params).items():
        old = params[path]
        value = _oriented(name, weights[name], path, tuple(old.shape), layout)
        if isinstance(value, QArray):
            if path.rpartition("/")[2] != "kernel":
                raise ValueError(
                    f"weights: tensor {name!r} is quantized ({value!r}) and parameter "
                    f"{path!r} is not a kernel; emulate runs quantized kernels of linen "
                    "Dense, DenseGeneral, Einsum and Conv layers: dequantize it first"
                )
            kernels.append(path.rpartition("/")[0])
        new[path] = _as_dtype(value, old.dtype)
    tree: dict[str, Any] = {}
    for path, value in new.items():
        node = tree
        *heads, last = path.split("/")
        for h in heads:
            node = node.setdefault(h, {})
        node[last] = value
    out = dict(variables)
    out["params"] = tree
    return QuantizedLinen.for_kernels(model, kernels, mode), out


# --- the one call --------------------------------------------------------------------------


def load_weights(
    model: Any,
    weights: Mapping[str, Any],
    variables: Any = None,
    *,
    rule: NameRule | None = None,
    layout: str | Callable[[str], str] = "out_in",
    mode: str | None = None,
) -> Any:
    """Put a checkpoint's tensors into a flax model's parameters (module docstring).

    Args:
      model: an NNX module (changed in place and returned) or a linen module.
      weights: tensor name -> QArray or array (``load_gguf``'s result, for one).
      variables: linen only: the model's variables (``model.init``'s result); their
        ``params`` are replaced, other collections kept.
      rule: tensor name -> parameter path: None (:func:`default_rule`), a sequence of
        ``(regex, replacement or None)`` pairs, or a callable ``name -> path or None``.
      layout: ``"out_in"`` (GGUF, Hugging Face, PyTorch: kernels get their last two axes
        swapped), ``"in_out"`` (kernels as stored, flax's layout), or a callable
        ``name -> "out_in" or "in_out"``.
      mode: ``"fast"``, ``"exact"`` or None (the function's default) for the matmuls of
        the layers that get QArray kernels.

    Returns:
      NNX: ``model``. linen: ``(QuantizedLinen, variables)``: call
      ``qmodel.apply(variables, *inputs)`` in place of ``model.apply``.

    Raises:
      TypeError: a model that is neither NNX nor linen, a rule or weights of another
        kind, a linen model without variables.
      ValueError: naming the tensor and the parameter path: a tensor that maps to no
        parameter (or matches no pattern of a rule), two tensors for one parameter, a
        shape that does not fit, a QArray for a parameter that is not a layer's kernel
        (or NNX embedding table); a parameter left without a tensor; a bad layout or mode.
    """
    if not callable(layout) and layout not in ("out_in", "in_out"):
        raise ValueError(
            f"layout: expected 'out_in', 'in_out' or a callable name -> one of them, got {layout!r}"
        )
    if mode not in (None, "fast", "exact"):
        raise ValueError(f"mode: expected 'fast', 'exact' or None, got {mode!r}")
    fn = _rule_fn(rule)
    if isinstance(model, nnx.Module):
        if variables is not None:
            raise TypeError("variables: an NNX model takes none; pass model, weights")
        return _load_nnx(model, weights, fn, layout, mode)
    from flax import linen as nn

    if isinstance(model, nn.Module):
        return _load_linen(model, weights, fn, layout, mode, variables)
    raise TypeError(f"model: expected a flax NNX or linen Module, got {type(model).__name__}")
