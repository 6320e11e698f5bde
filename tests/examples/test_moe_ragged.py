"""The routed MoE example: a gpt-oss-style layer (MXFP4 experts from gpt-oss safetensors)
and a Mixtral-style one (Q4_K experts from GGUF) on ``emulate.ragged_dot_general``: on the
CPU route, and prepared once for tpu_v5e through the grouped kernel
(``emulate.pallas.ragged_dot``) in Pallas' interpret mode.

Oracles: the experts decoded by the test suite's numpy port of gpt-oss's own decoder
(``tests/importers/_st_oracles.py``, source and commit cited there) and by
``gguf.quants.dequantize``; the MoE recomputed in float64 from them, each assignment
against its own expert only, with the router's choices (plain JAX, not under test).

Each format and each route by default (the marks say which cases); every layer on every
route under EMULATE_LONG_TESTS=1.
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import sys

import gguf
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from safetensors.numpy import load_file

import emulate

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("moe_ragged", ROOT / "examples" / "moe_ragged.py")
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)
sys.path.insert(0, str(ROOT / "tests" / "importers"))
import _st_oracles as oracles  # noqa: E402

EXPERTS, D, F, TOKENS = 4, 256, 256, 12


@pytest.fixture(scope="module")
def layers(tmp_path_factory) -> dict:
    """name -> (layout, params, oracle experts {gate, up, down} as float64 (E, N, K))."""
    tmp = tmp_path_factory.mktemp("moe")
    rng = np.random.default_rng(7)
    router = jnp.asarray(rng.normal(size=(D, EXPERTS)), jnp.bfloat16)
    oss, gg = str(tmp / "oss.safetensors"), str(tmp / "mixtral.gguf")
    example.write_gpt_oss(oss, rng, EXPERTS, D, F)
    example.write_mixtral(gg, rng, EXPERTS, D, F)
    stored = load_file(oss)
    oss_w = {
        n: oracles.gpt_oss_mxfp4(stored[f"e.{n}_blocks"], stored[f"e.{n}_scales"]).astype(
            np.float64
        )
        for n in ("gate", "up", "down")
    }
    reader = gguf.GGUFReader(gg)
    raw = {t.name.split("_")[1]: np.asarray(t.data) for t in reader.tensors}
    gguf_w = {
        n: gguf.quants.dequantize(raw[n], GGMLQuantizationType.Q4_K).astype(np.float64)
        for n in ("gate", "up", "down")
    }
    return {
        "gpt-oss": ("ekn", example.load_gpt_oss(oss, router), oss_w),
        "mixtral": ("ekn", example.load_mixtral(gg, router), gguf_w),
        "mixtral as stored": ("enk", example.load_mixtral(gg, router, "enk"), gguf_w),
    }


def _oracle(params, w, x, top_k: int = 2) -> np.ndarray:
    """float64: each token's top-k experts only (the router's choice and weights)."""
    _, _, top_e, weights = example.route(x, params["router"], top_k)
    top_e, weights = np.asarray(top_e), np.asarray(weights, np.float64)
    xs = np.asarray(x, np.float64)
    out = np.zeros((x.shape[0], D))
    for t in range(x.shape[0]):
        for j in range(top_k):
            e = top_e[t, j]
            gate, up = w["gate"][e] @ xs[t], w["up"][e] @ xs[t]
            act = gate / (1 + np.exp(-gate)) * up
            act = act.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
            out[t] += weights[t, j] * (w["down"][e] @ act)
    return out


# MXFP4 on the CPU route and Q4_K through the grouped kernel by default; the other two
# (the GGUF layout on the CPU route, MXFP4 through the kernel) under EMULATE_LONG_TESTS=1.
@pytest.mark.parametrize(
    ("name", "route"),
    [
        ("gpt-oss", "xla"),
        pytest.param("mixtral as stored", "xla", marks=pytest.mark.long),
        pytest.param("gpt-oss", "interpret", marks=pytest.mark.long),
        ("mixtral", "interpret"),
    ],
)
def test_each_token_meets_only_its_experts(layers, name, route) -> None:
    layout, params, w = layers[name]
    x = jnp.asarray(np.random.default_rng(1).normal(size=(TOKENS, D)), jnp.bfloat16)
    layer = functools.partial(example.moe, layout=layout)
    if route == "xla":  # the CPU route
        got = np.asarray(jax.jit(layer)(params, x))
    else:  # prepared once for a TPU; the grouped kernel in interpret mode (not under jit:
        # the three expert matmuls then share one compiled kernel program)
        prepared = emulate.prepare_weights(params, target="tpu_v5e")
        assert isinstance(prepared["gate"], emulate.pallas.KernelQWeight)
        with emulate.target("tpu_v5e"), emulate.use_route("interpret"):
            got = np.asarray(layer(prepared, x))
    want = _oracle(params, w, x)
    assert got.shape == (TOKENS, D) and got.dtype == np.float32
    # f32 sums of exactly decoded weights (measured: 1.6e-7 and 5.4e-7 of the largest
    # output); the one bf16 rounding of the activations could differ in its last bit where
    # f32 and float64 sums straddle a rounding boundary: about 2.5e-4 of the output each.
    assert np.max(np.abs(got - want)) <= 1e-3 * np.max(np.abs(want))


# MXFP4 (Pallas route) and the GGUF layout (XLA route, and why) by default; Q4_K on the
# Pallas route as well under EMULATE_LONG_TESTS=1.
@pytest.mark.parametrize(
    "name", ["gpt-oss", pytest.param("mixtral", marks=pytest.mark.long), "mixtral as stored"]
)
def test_the_polyfilled_layer_holds_only_native_pairs_and_inspect_lists_the_experts(
    layers, name
) -> None:
    layout, params, _ = layers[name]
    x = jnp.zeros((TOKENS, D), jnp.bfloat16)
    fn = functools.partial(example.moe, layout=layout)
    assert (
        emulate.program.unsupported_sites(emulate.polyfill(fn), params, x, target="tpu_v5e") == []
    )
    rows = emulate.inspect(fn, params, x, target="tpu_v5e").rows
    experts = [(r.primitive, r.rhs, r.status) for r in rows if r.primitive != "dot_general"]
    fmt = {"gpt-oss": "float4_e2m1fn", "mixtral": "uint4", "mixtral as stored": "uint4"}[name]
    shape = [f"{EXPERTS},{D},{F}", f"{EXPERTS},{F},{D}"]  # (E, K, N): gate / up, down
    if name == "mixtral as stored":
        shape = shape[::-1]  # GGUF's (E, N, K)
    assert [(p, r.split(":")[0], s) for p, r, s in experts] == [
        ("ragged_dot_general", f"{fmt}[{shape[0]}]", "emulated"),
        ("ragged_dot_general", f"{fmt}[{shape[0]}]", "emulated"),
        ("ragged_dot_general", f"{fmt}[{shape[1]}]", "emulated"),
    ]
    # which route each expert matmul takes on a TPU (what the example prints)
    routes = example.expert_routes(fn, emulate.prepare_weights(params, target="tpu_v5e"), x,
                                   "tpu_v5e")  # fmt: skip
    if name == "mixtral as stored":  # contracted on the experts' last axis: XLA, and why
        why = "xla: experts of shape (4, 256, 256) grouped along axis 0 contracting along axis"
        assert len(routes) == 3 and all(r.startswith(f"{why} (2,)") for r in routes)
    else:
        assert routes == ["pallas.ragged_dot"] * 3
