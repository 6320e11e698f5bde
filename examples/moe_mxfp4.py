"""A gpt-oss-style mixture-of-experts MLP with MXFP4 expert weights and bf16 activations,
run through ``emulate.polyfill`` on TPU generations without float4.

gpt-oss ships its MoE expert weights as MXFP4: float4_e2m1fn codes with one e8m0 scale per
32 elements along the contraction. Here the weights are quantized with
``emulate.mx.MXFP4`` (blocks along the contraction axis), the model code contracts them
with ``emulate.einsum``, and the whole forward pass is wrapped in ``emulate.polyfill``: the
program that runs holds only operand pairs the chosen TPU multiplies natively.

    python examples/moe_mxfp4.py            # on tpu_v5e and tpu_v4 targets, on this CPU
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import emulate


def init(key: jax.Array, *, d_model: int = 128, d_ff: int = 64, experts: int = 4) -> dict:
    """Random f32 parameters: router (D, E), gate/up (E, D, 2F), down (E, F, D)."""
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "router": jax.random.normal(k1, (d_model, experts)) / np.sqrt(d_model),
        "gate_up": jax.random.normal(k2, (experts, d_model, 2 * d_ff)) / np.sqrt(d_model),
        "down": jax.random.normal(k3, (experts, d_ff, d_model)) / np.sqrt(d_ff),
    }


def quantize(params: dict) -> dict:
    """Expert weights to MXFP4 along their contraction axis (axis 1); the router stays bf16."""
    return {
        "router": params["router"].astype(jnp.bfloat16),
        "gate_up": emulate.quantize(params["gate_up"], emulate.mx.MXFP4, axis=1),
        "down": emulate.quantize(params["down"], emulate.mx.MXFP4, axis=1),
    }


def forward(params: dict, x: jax.Array, *, top_k: int = 2) -> jax.Array:
    """``x`` (T, D) bf16 -> (T, D) f32. Dense over experts (every expert runs on every
    token), weighted by the renormalised top-k router probabilities (others get 0)."""
    logits = jnp.dot(x, params["router"], preferred_element_type=jnp.float32)
    top, _ = jax.lax.top_k(logits, top_k)
    weights = jnp.where(logits >= top[:, -1:], jax.nn.softmax(logits, axis=-1), 0.0)
    weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    h = emulate.einsum("td,edf->tef", x, params["gate_up"])  # (T, E, 2F), f32
    gate, up = jnp.split(h, 2, axis=-1)
    act = (jax.nn.silu(gate) * up).astype(jnp.bfloat16)
    y = emulate.einsum("tef,efd->ted", act, params["down"])  # (T, E, D), f32
    return jnp.einsum("ted,te->td", y, weights)


def dense_reference(params: dict, x: np.ndarray, *, top_k: int = 2) -> np.ndarray:
    """The same forward pass in float64 numpy on the dequantized weights."""
    q = {
        k: np.asarray(emulate.dequantize(v), np.float64) for k, v in params.items() if k != "router"
    }
    xf = np.asarray(x, np.float64)
    logits = xf @ np.asarray(params["router"], np.float64)
    kth = np.sort(logits, axis=-1)[:, -top_k][:, None]
    p = np.exp(logits - logits.max(-1, keepdims=True))
    w = np.where(logits >= kth, p / p.sum(-1, keepdims=True), 0.0)
    w = w / w.sum(-1, keepdims=True)
    h = np.einsum("td,edf->tef", xf, q["gate_up"])
    gate, up = np.split(h, 2, axis=-1)
    act = gate / (1 + np.exp(-gate)) * up
    act = np.asarray(np.asarray(act, np.float32).astype(jnp.bfloat16), np.float64)
    return np.einsum("ted,te->td", np.einsum("tef,efd->ted", act, q["down"]), w)


def main() -> None:
    params = quantize(init(jax.random.key(0)))
    x = jax.random.normal(jax.random.key(1), (16, 128)).astype(jnp.bfloat16)
    want = dense_reference(params, np.asarray(x))
    for target in ("tpu_v5e", "tpu_v4"):
        run = emulate.polyfill(forward, target=target)
        left = emulate.program.unsupported_sites(run, params, x, target=target)
        got = np.asarray(run(params, x), np.float64)
        err = np.max(np.abs(got - want)) / np.max(np.abs(want))
        print(f"{target}: unsupported sites {len(left)}, max relative error {err:.2e}")


if __name__ == "__main__":
    main()
