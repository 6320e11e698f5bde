"""benchmarks.models on a tiny Llama-shaped model, one generation: the abstract weights
hold the formats' stored bytes, every route compiles, the prepared route's projections
are Pallas kernels, and the ideal bytes are the stored weights + KV cache + activations."""

from __future__ import annotations

import jax.numpy as jnp

from benchmarks import model_specs, models
from benchmarks import model_weights as mw
from benchmarks.model_goals import goal_lines
from benchmarks.model_layers import Shape

#: GGML's block bytes per 256 elements (gguf-py's GGML_QUANT_SIZES)
Q4_K, Q6_K = 144 / 256, 210 / 256

TINY = model_specs.Model(
    "tiny",
    Shape(dim=256, hidden=512, layers=3, heads=2, kv_heads=1, head_dim=128, vocab=256),
    dict(model_specs.MODELS["llama3-8b-q4_k_m"].formats),
    "Q6_K",
    "Q4_K",
)


def test_abstract_weights_hold_the_stored_bytes_at_real_size():
    assert mw.nbytes(mw.abstract_weight("Q4_K", 4096, 14336)) == 4096 * 14336 * Q4_K
    assert mw.nbytes(mw.abstract_weight("Q6_K", 4096, 128256)) == 4096 * 128256 * Q6_K
    # AWQ: int4 codes, f16 scales and 4-bit zero points per group of 128
    awq = mw.abstract_weight("awq", 4096, 14336)
    assert mw.nbytes(awq) == 4096 * 14336 // 2 + 32 * 14336 * 2 + 32 * 14336 // 2
    # gpt-oss MXFP4: e2m1 codes, one e8m0 byte per 32
    oss = mw.abstract_weight("mxfp4", 2880, 2880, experts=32)
    assert oss.shape == (32, 2880, 2880)
    assert mw.nbytes(oss) == 32 * (2880 * 2880 // 2 + 90 * 2880)


def test_one_generation_every_route(monkeypatch):
    monkeypatch.setitem(model_specs.MODELS, "tiny", TINY)
    monkeypatch.setitem(models.STEPS, "tiny-decode", (2, 1, 128))
    routes = ("pallas", "bf16")  # the front route compiles as the benchmark runs it
    rows = {r: models.measure("tiny", "tpu_v5e", "tiny-decode", r, lambda s: None) for r in routes}
    assert {r: row["status"] for r, row in rows.items()} == dict.fromkeys(routes, "ok")
    # seven projections a layer and the head: eight kernels on prepared weights; the
    # decode attention is a kernel on both routes
    assert (rows["pallas"]["kernels"], rows["bf16"]["kernels"]) == (9, 1)
    d, h, kv = 256, 512, 128
    layer_weights = (2 * d * d + d * kv + 2 * d * h) * Q4_K + (d * kv + h * d) * Q6_K + 2 * 4 * d
    cache = 2 * 2 * 2 * 128 * kv  # K and V, batch 2, 128 rows, bf16
    head = d * 256 * Q6_K + 4 * d
    acts = 2 * 2 * 2 * d
    want = 3 * (layer_weights + cache + acts) + head + 2 * 2 * d + 2 * 2 * 256
    lw, hw = model_specs.layer_weights(TINY, "front"), model_specs.head_weights(TINY, "front")
    got = models.ideal_bytes(TINY, "front", "tiny-decode", lw, hw)
    assert 3 * got["layer"] + got["head"] == want
    # prepared weights: the kernel layout pads these tiny matrices to its tiles (at real
    # sizes it holds the same bytes as stored)
    assert rows["pallas"]["ideal"] > want
    assert rows["pallas"]["bytes"] >= rows["pallas"]["ideal"] * 0.99
    for row in rows.values():
        assert row["hbm"] == 16 << 30 and row["fits"]
        assert row["bandwidth_s"] == row["bytes"] / (820e9 * 1)
    text = models.markdown(
        {"command": "c", "libtpu": "x", "wall_s": 1.0, "results": list(rows.values())}
    )
    assert "#### tiny, tiny-decode" in text
    assert "| tpu_v5e (16 GiB) | pallas.matmul (prepared) |" in text
    bf16 = jnp.bfloat16  # the bf16 model holds every matrix in bf16
    assert (
        rows["bf16"]["stored_weights"]
        == 3 * ((2 * d * d + 2 * d * kv + 3 * d * h) * jnp.dtype(bf16).itemsize + 2 * 4 * d)
        + 2 * d * 256
        + 4 * d
    )


def test_goal_lines_say_met_or_by_how_much_not():
    gib = 1 << 30

    def row(gen, step, cache, over, footprint, model="llama3-8b-q4_k_m"):
        hbm = {"tpu_v2": 8, "tpu_v4": 32, "tpu_v5e": 16}[gen] * gib
        return dict(
            model=model, generation=gen, step=step, cache=cache, status="ok",
            bytes_over_ideal=over, footprint=footprint * gib, hbm=hbm,
        )  # fmt: skip

    rows = [
        row("tpu_v2", "decode-16", "q4_0", 1.2, 7.5),
        row("tpu_v5e", "decode-16", "int8", 1.125, 12.5),
        row("tpu_v5e", "decode-16", "q4_0", 1.113, 7.1) | {"dma_over_ideal": 1.028},
        row("tpu_v4", "decode-16", "q4_0", 1.2, 7.1) | {"dma_over_ideal": 1.101},
        row("tpu_v5e", "decode-16", "bfloat16", 1.0, 14.0) | {"cache": None},  # not a goal row
    ]
    assert goal_lines(rows) == [
        "#### Goals for quantized KV caches (issue 47)",
        "",
        "- met: llama3-8b-q4_k_m decode-16 tpu_v2 q4_0 cache: 1.200x <= 1.25x",
        "- **not met**: llama3-8b-q4_k_m decode-16 tpu_v5e int8 cache: 1.125x > 1.1x, "
        "over by 0.025x of the ideal",
        "- met: llama3-8b-q4_k_m decode-16 tpu_v5e q4_0 cache: 1.028x by the schedule's DMAs "
        "(libtpu's bytes accessed 1.113x) <= 1.1x",
        "- **not met**: llama3-8b-q4_k_m decode-16 tpu_v4 q4_0 cache: 1.101x by the schedule's "
        "DMAs (libtpu's bytes accessed 1.200x) > 1.1x, over by 0.001x of the ideal",
        "- met: Llama-3-8B Q4_K_M, 16 x 4096 tokens, one v2 core, a 4-bit cache: q4_0 cache, "
        "7.50 GiB of 8 GiB (0.50 GiB spare)",
        "- **not met**: Llama-3-8B Q4_K_M, 16 x 4096 tokens, one v5e, an 8-bit cache, 4 GiB "
        "spare: int8 cache, 12.50 GiB of 16 GiB (3.50 GiB spare), 0.50 GiB short",
        "- not measured here: Llama-3-70B Q4_K_M, 16 x 8192 tokens, 8 v5e chips, an 8-bit cache",
        "",
    ]
    assert goal_lines([]) == []
