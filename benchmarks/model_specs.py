"""The models and chips of ``benchmarks.models``: each model's sizes and storage formats,
its abstract weights per route (nothing materialized), and each TPU generation's HBM.

Sizes from the models' published ``config.json`` files: Llama-3-8B (4096 wide, MLP 14336,
32 layers, 32 heads, 8 KV heads of 128, vocabulary 128256), Llama-3-70B (8192, 28672, 80
layers, 64 heads, 8 KV heads of 128), gpt-oss-20B (2880 wide, 24 layers, 64 heads and 8 KV
heads of 64, 32 experts of MLP width 2880, top 4, vocabulary 201088). Formats: Q4_K_M as
llama.cpp mixes it (Q4_K, with Q6_K for ``attn_v``, ``ffn_down`` and the output head; the
token embeddings Q4_K), AutoAWQ int4 (groups of 128; embeddings and ``lm_head`` in
float16), gpt-oss MXFP4 (experts only; attention, router, embeddings and head in bf16).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks import model_weights as mw
from benchmarks.model_layers import Shape

__all__ = ["HBM", "MODELS", "TOPOLOGIES", "Model", "bandwidth", "head_weights", "layer_weights"]

_GiB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Model:
    """A model: its sizes (one chip's share where ``shape.chips`` > 1), the format of each
    projection (None: bf16), of its head and of its token embeddings."""

    name: str
    shape: Shape
    formats: dict[str, str | None]
    head: str | None
    embed: str | None


_Q4_K_M = {"q": "Q4_K", "k": "Q4_K", "v": "Q6_K", "o": "Q4_K"}
_Q4_K_M |= {"gate": "Q4_K", "up": "Q4_K", "down": "Q6_K"}
_AWQ = dict.fromkeys(("q", "k", "v", "o", "gate", "up", "down"), "awq")
_OSS = {"q": None, "k": None, "v": None, "o": None, "gate": "mxfp4", "up": "mxfp4"}
_OSS |= {"down": "mxfp4"}
_L8B = Shape(dim=4096, hidden=14336, layers=32, heads=32, kv_heads=8, head_dim=128, vocab=128256)
_L70B_CHIP = Shape(
    dim=8192, hidden=28672 // 8, layers=80, heads=64 // 8, kv_heads=8 // 8, head_dim=128,
    vocab=128256 // 8, chips=8,
)  # fmt: skip
_OSS20B = Shape(
    dim=2880, hidden=2880, layers=24, heads=64, kv_heads=8, head_dim=64, vocab=201088,
    experts=32, top_k=4,
)  # fmt: skip

MODELS = {
    "llama3-8b-q4_k_m": Model("Llama-3-8B Q4_K_M", _L8B, _Q4_K_M, "Q6_K", "Q4_K"),
    "llama3-8b-awq": Model("Llama-3-8B AWQ int4", _L8B, _AWQ, None, None),
    "gpt-oss-20b-mxfp4": Model("gpt-oss-20B MXFP4", _OSS20B, _OSS, None, None),
    "llama3-70b-q4_k_m-tp8": Model(
        "Llama-3-70B Q4_K_M, 8-way tensor-parallel", _L70B_CHIP, _Q4_K_M, "Q6_K", "Q4_K"
    ),
}

#: Tensor-parallel topologies of 8 devices. libtpu's compile-only v4 topologies expose each
#: TensorCore as a device (``v4:2x2x2`` has 16): v4's 8 devices are the 8 cores of a 2x2x1
#: slice (4 chips), each with half a chip's HBM.
TOPOLOGIES = {"tpu_v4": "v4:2x2x1", "tpu_v5e": "v5e:2x4", "tpu_v6e": "v6e:2x4"}

#: HBM of one compile-only device (bytes) and its TensorCores (``device.num_cores``), from
#: Google Cloud's TPU system-architecture pages: v2 16 GiB and v3 32 GiB a chip of two
#: cores, each core its own device (8 / 16 GiB); v4 32 GiB a chip of two cores, which
#: libtpu's compile-only v4 devices expose one each (16 GiB; in megacore mode one device
#: has both cores and 32 GiB); v5p 95 GiB a megacore chip (one device, two cores); v5e
#: 16 GiB and v6e 32 GiB a chip of one core; 7x 192 GiB a chip of two TensorCores, each its
#: own device (96 GiB).
HBM = {
    "tpu_v2": (8 * _GiB, 1),
    "tpu_v3": (16 * _GiB, 1),
    "tpu_v4": (16 * _GiB, 1),
    "tpu_v5e": (16 * _GiB, 1),
    "tpu_v5p": (95 * _GiB, 2),
    "tpu_v6e": (32 * _GiB, 1),
    "tpu_v7x": (96 * _GiB, 1),
}


def bandwidth(generation: str) -> float:
    """HBM bytes/s of one device: the target's per-TensorCore figure (JAX's table) times
    the cores of a device."""
    from emulate import targets

    per_core = targets.get(generation).mem_bw_bytes_per_second
    assert per_core is not None
    return float(per_core * HBM[generation][1])


def _bf16(shape: tuple[int, ...]) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, jnp.bfloat16)


def _matrix(fmt: str | None, route: str, k: int, n: int, experts: int = 0) -> Any:
    if fmt is None or route == "bf16":
        return _bf16((experts, k, n) if experts else (k, n))
    w = mw.abstract_weight(fmt, k, n, experts=experts or None)
    if route == "pallas":
        return mw.prepared(w)
    return w


def layer_weights(m: Model, route: str) -> dict[str, Any]:
    """One layer's weights for ``route`` (one chip's share), abstract."""
    s = m.shape
    d, h, hd, e = s.dim, s.hidden, s.head_dim, s.experts
    shapes = {
        "q": (d, s.heads * hd),
        "k": (d, s.kv_heads * hd),
        "v": (d, s.kv_heads * hd),
        "o": (s.heads * hd, d),
        "gate": (d, h),
        "up": (d, h),
        "down": (h, d),
    }
    w: dict[str, Any] = {
        name: _matrix(m.formats[name], route, *kn, e if name in ("gate", "up", "down") else 0)
        for name, kn in shapes.items()
    }
    w["attn_norm"] = w["mlp_norm"] = jax.ShapeDtypeStruct((d,), jnp.float32)
    if e:
        w["router"] = _bf16((d, e))
    return w


def head_weights(m: Model, route: str) -> dict[str, Any]:
    """The final norm and the output head (one chip's share of the vocabulary)."""
    s = m.shape
    return {
        "norm": jax.ShapeDtypeStruct((s.dim,), jnp.float32),
        "head": _matrix(m.head, route, s.dim, s.vocab),
    }


def embed_bytes(m: Model, route: str) -> int:
    """Stored bytes of the token embeddings (one chip's share): not multiplied, only read
    one row a token, but resident."""
    s = m.shape
    if m.embed is None or route == "bf16":
        return 2 * s.vocab * s.dim
    return mw.nbytes(mw.abstract_weight(m.embed, s.dim, s.vocab))
