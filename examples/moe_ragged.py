"""Routed mixture-of-experts layers on ``emulate.ragged_dot``: each token goes to its top-k
experts only, and the expert weights stay as their checkpoint stores them. On a TPU
target every expert matmul takes the grouped kernel ``emulate.pallas.ragged_dot``, which
reads each routed expert's weight once as stored; the example prints the route each
expert matmul took (``emulate.inspect``).

Two layers, each loaded from a checkpoint written here the way its project writes it:

- gpt-oss-style: the experts' ``mlp1_weight`` (gate and up) and ``mlp2_weight`` (down) in
  gpt-oss's MXFP4 safetensors layout (``_blocks``: 16 bytes of e2m1 nibbles per 32
  elements, ``_scales``: one e8m0 byte per 32), read by
  ``emulate.importers.read_gpt_oss_mxfp4``: stacked QArrays ``(E, K, N)``.
- Mixtral-style: ``ffn_gate_exps`` / ``ffn_up_exps`` / ``ffn_down_exps`` as 3-D Q4_K
  tensors of a GGUF file, read by ``emulate.importers.load_gguf``: stacked QArrays
  ``(E, N, K)`` (GGUF's ``(out, in)`` per expert), turned once into ``(E, K, N)``
  (``emulate.quantized.array.transpose``: codes and scales moved, nothing decoded), the
  layout the grouped kernel reads as stored. Kept ``(E, N, K)`` they still work (layout "enk",
  contracted on their last axis), on the XLA route.

Each layer's experts are then prepared once for the target (``emulate.prepare_weights``:
on a TPU target, the same bytes in the grouped kernel's layout).

The router is plain JAX: top-k of the logits, the k weights renormalised (softmax over
the chosen logits), the (token, expert) assignments sorted by expert so that each
expert's rows are contiguous, and ``group_sizes`` the number of rows per expert.

    python examples/moe_ragged.py   # both layers, polyfilled, for tpu_v5e and tpu_v4
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import sys
import tempfile
from typing import Any

import gguf
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from safetensors.numpy import save_file

import emulate
from emulate.importers import gguf as gguf_importer
from emulate.importers import safetensors as st_importer

#: The contraction of a stacked expert weight: ``(E, K, N)`` (gpt-oss) or ``(E, N, K)``
#: (GGUF), the expert axis first.
LAYOUTS = {
    "ekn": lax.RaggedDotDimensionNumbers((((1,), (1,)), ((), ())), [0], [0]),
    "enk": lax.RaggedDotDimensionNumbers((((1,), (2,)), ((), ())), [0], [0]),
}


def route(x: jax.Array, router: jax.Array, top_k: int) -> tuple[jax.Array, ...]:
    """(order, group_sizes, top_e, weights) for tokens ``x`` (T, D) and ``router`` (D, E):
    ``top_e`` (T, k) the chosen experts, ``weights`` (T, k) f32 their renormalised
    probabilities, ``order`` (T*k,) the assignments sorted by expert (stable) and
    ``group_sizes`` (E,) int32 the assignments of each expert."""
    logits = jnp.dot(x, router, preferred_element_type=jnp.float32)
    top, top_e = lax.top_k(logits, top_k)
    order = jnp.argsort(top_e.reshape(-1), stable=True)
    sizes = jnp.bincount(top_e.reshape(-1), length=router.shape[1]).astype(jnp.int32)
    return order, sizes, top_e, jax.nn.softmax(top, axis=-1)


def moe(params: dict[str, Any], x: jax.Array, *, layout: str, top_k: int = 2) -> jax.Array:
    """One MoE MLP: ``x`` (T, D) bf16 -> (T, D) f32. ``params``: ``router`` (D, E),
    ``gate``/``up`` (E, D, F) or (E, F, D) and ``down`` (E, F, D) or (E, D, F), in the
    layout ``layout`` names (:data:`LAYOUTS`)."""
    rdn = LAYOUTS[layout]
    order, sizes, _, weights = route(x, params["router"], top_k)
    rows = x[order // top_k]  # (T*k, D): each assignment's token, sorted by expert

    def experts(a: jax.Array, w: Any) -> jax.Array:
        return emulate.ragged_dot_general(a, w, sizes, rdn, preferred_element_type=jnp.float32)

    gate, up = experts(rows, params["gate"]), experts(rows, params["up"])
    act = (jax.nn.silu(gate) * up).astype(jnp.bfloat16)
    y = experts(act, params["down"])  # (T*k, D), sorted by expert
    y = y[jnp.argsort(order)].reshape(x.shape[0], top_k, -1)  # back to (token, choice)
    return jnp.einsum("tkd,tk->td", y, weights)


def write_gpt_oss(path: str, rng: np.random.Generator, experts: int, d: int, f: int) -> None:
    """A gpt-oss MXFP4 checkpoint of random experts: ``mlp1_weight`` (gate and up, 2F rows
    of D) and ``mlp2_weight`` (D rows of F), as ``_blocks`` / ``_scales``; e8m0 scales
    around 2**-3 keep the values near 1."""
    tensors = {}
    for name, n, k in (("gate", f, d), ("up", f, d), ("down", d, f)):
        tensors[f"e.{name}_blocks"] = rng.integers(0, 256, (experts, n, k // 32, 16), np.uint8)
        tensors[f"e.{name}_scales"] = rng.integers(121, 126, (experts, n, k // 32), np.uint8)
    save_file(tensors, path)


def load_gpt_oss(path: str, router: jax.Array) -> dict[str, Any]:
    """The gpt-oss layer (layout "ekn"): each expert tensor as the stacked QArray the
    importer makes."""
    params: dict[str, Any] = {"router": router}
    for name in ("gate", "up", "down"):
        parts = st_importer.read_gpt_oss_mxfp4(path, f"e.{name}")
        params[name] = gguf_importer.to_qarray(parts)
    return params


def _q4_k_writer() -> Any:
    spec = importlib.util.spec_from_file_location(
        "gguf_llama", pathlib.Path(__file__).with_name("gguf_llama.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gguf_llama", module)  # its dataclasses look themselves up there
    spec.loader.exec_module(sys.modules["gguf_llama"])
    module = sys.modules["gguf_llama"]
    return module.quantize_q4_k


def write_mixtral(path: str, rng: np.random.Generator, experts: int, d: int, f: int) -> None:
    """A GGUF file with Mixtral's expert tensors of one layer in Q4_K, 3-D (E, out, in)."""
    quantize_q4_k = _q4_k_writer()
    writer = gguf.GGUFWriter(path, "llama")
    for name, n, k in (("gate", f, d), ("up", f, d), ("down", d, f)):
        w = rng.normal(size=(experts * n, k)).astype(np.float32) / np.sqrt(k)
        raw = quantize_q4_k(w).reshape(experts, n, -1)
        writer.add_tensor(
            f"blk.0.ffn_{name}_exps.weight", raw, raw_dtype=gguf.GGMLQuantizationType.Q4_K
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def load_mixtral(path: str, router: jax.Array, layout: str = "ekn") -> dict[str, Any]:
    """The Mixtral layer: the GGUF file's expert tensors as stacked QArrays, (E, K, N)
    (``layout="ekn"``, transposed once) or (E, N, K) as stored (``"enk"``)."""
    tensors = gguf_importer.load_gguf(path)
    params: dict[str, Any] = {"router": router}
    for name in ("gate", "up", "down"):
        q = tensors[f"blk.0.ffn_{name}_exps.weight"]
        params[name] = emulate.quantized.array.transpose(q, (0, 2, 1)) if layout == "ekn" else q
    return params


def expert_routes(layer: Any, params: dict[str, Any], x: jax.Array, target: str) -> list[str]:
    """The route of each expert matmul of ``layer`` on ``target``, as ``emulate.inspect``
    shows it: "pallas.ragged_dot" (the grouped kernel), or "xla: " and the reason."""
    rows = emulate.inspect(layer, params, x, target=target).rows
    return [r.weight_route for r in rows if r.primitive == "ragged_dot_general"]


def main() -> None:
    rng = np.random.default_rng(0)
    experts, d, f, tokens = 4, 256, 256, 16
    router = jnp.asarray(rng.normal(size=(d, experts)), jnp.bfloat16)
    x = jnp.asarray(rng.normal(size=(tokens, d)), jnp.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        write_gpt_oss(f"{tmp}/oss.safetensors", rng, experts, d, f)
        write_mixtral(f"{tmp}/mixtral.gguf", rng, experts, d, f)
        layers = {
            "gpt-oss MXFP4": load_gpt_oss(f"{tmp}/oss.safetensors", router),
            "Mixtral Q4_K": load_mixtral(f"{tmp}/mixtral.gguf", router),
        }
    layer = functools.partial(moe, layout="ekn")
    for name, params in layers.items():
        for target in ("tpu_v5e", "tpu_v4"):
            prepared = emulate.prepare_weights(params, target=target)  # once, at load
            run = emulate.polyfill(layer, target=target)
            left = emulate.program.unsupported_sites(run, prepared, x, target=target)
            out = run(prepared, x)  # on this host: the XLA route; on a TPU: the kernel
            print(f"{name} on {target}: unsupported sites {len(left)}, output {out.shape}")
            for i, r in enumerate(expert_routes(layer, prepared, x, target)):
                print(f"  expert matmul {i}: {r}")


if __name__ == "__main__":
    main()
