"""The decoder-block example: int4 (packed) and float8 weights through polyfill on TPU targets.

One TPU target of each plan family by default (``DEFAULT_TPUS``); every TPU target under
EMULATE_LONG_TESTS=1."""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import runpy

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import emulate
from emulate import formats, program, targets

PATH = pathlib.Path(__file__).resolve().parents[2] / "examples" / "decoder_block.py"
_spec = importlib.util.spec_from_file_location("decoder_block", PATH)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)

# One target of each plan family by default: tpu_v2 (f32 route), tpu_v4 (bf16, int8 and
# fp8 emulated), tpu_v5e (int8 native), tpu_v7x (fp8 native); every TPU target under
# EMULATE_LONG_TESTS=1.
DEFAULT_TPUS = ("tpu_v2", "tpu_v4", "tpu_v5e", "tpu_v7x")
TPUS = [
    t.name if t.name in DEFAULT_TPUS else pytest.param(t.name, marks=pytest.mark.long)
    for t in targets.all_targets()
    if t.kind == "tpu"
]


@functools.cache
def _made() -> tuple:
    """The example's block and input, built on first use: not at collection, which every
    pytest-xdist worker runs."""
    return example.make()


@functools.cache
def _reference() -> jax.Array:
    block, x = _made()
    return jax.jit(example.decoded(block))(x).astype(jnp.float32)


@pytest.mark.parametrize("target", TPUS)
def test_rewritten_program_holds_only_native_pairs(target):
    BLOCK, X = _made()
    t = targets.get(target)
    before = program.sites(jax.make_jaxpr(BLOCK)(X))
    assert any(not t.supports(s.lhs_dtype, s.rhs_dtype) for s in before)
    after = program.sites(jax.make_jaxpr(emulate.polyfill(BLOCK, target=t))(X))
    # What remains is native on the target, or JAX's own types (bf16 x bf16 on a v2/v3
    # profile), which polyfill leaves to XLA as jax.jit would.
    assert after and all(
        t.supports(s.lhs_dtype, s.rhs_dtype)
        or (
            not formats.get(s.lhs_dtype).is_low_precision
            and not formats.get(s.rhs_dtype).is_low_precision
        )
        for s in after
    )


@pytest.mark.parametrize("target", TPUS)
def test_logits_agree_with_weights_decoded_up_front(target):
    BLOCK, X = _made()
    got = jax.jit(emulate.polyfill(BLOCK, target=target))(X).astype(jnp.float32)
    assert got.shape == (16, 64)
    p = emulate.plan("bfloat16", "int4", target=target, preferred_element_type=jnp.float32)
    q = emulate.plan("bfloat16", "float8_e4m3fn", target=target, preferred_element_type=jnp.float32)
    if p.method == q.method == "bf16" and not targets.get(target).supports(
        "bfloat16", "float8_e4m3fn"
    ):
        # Same route as the decoded model (bf16 x bf16, f32 accumulation): the same bits.
        np.testing.assert_array_equal(got, _reference())
    else:
        # f32 route (v2/v3) or XLA's own bf16 x fp8 dot (v7+): f32 sums in another order.
        np.testing.assert_allclose(got, _reference(), atol=0.05, rtol=0.02)


def test_grad_through_the_polyfilled_block():
    BLOCK, X = _made()

    def loss(model, x):
        return jnp.sum(model(x).astype(jnp.float32) ** 2)

    got = jax.jit(jax.grad(lambda x: loss(emulate.polyfill(BLOCK, target="tpu_v4"), x)))(X)
    want = jax.jit(jax.grad(lambda x: loss(example.decoded(BLOCK), x)))(X)
    assert got.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(got.astype(jnp.float32))))
    np.testing.assert_allclose(
        got.astype(np.float32), want.astype(np.float32), rtol=0.05, atol=0.05
    )


def test_inspect_lists_every_site():
    BLOCK, X = _made()
    report = emulate.inspect(BLOCK, X, target="tpu_v4")
    assert len(report.rows) == 9 and len(report.emulated) == 7
    kinds = sorted({(r.lhs, r.rhs, r.status) for r in report.rows})
    assert kinds == [
        ("bfloat16[16,128]", "float8_e4m3fn[128,64]", "emulated"),
        ("bfloat16[16,64]", "float8_e4m3fn[64,128]", "emulated"),
        ("bfloat16[16,64]", "int4[64,64]", "emulated"),
        ("bfloat16[4,16,16]", "bfloat16[4,16,16]", "native"),
    ]
    assert all(r.source.startswith(str(PATH)) for r in report.rows)
    assert all(r.flops == 2 * 16 * 64 * 64 for r in report.rows if r.rhs == "int4[64,64]")
    text = str(report)
    assert text.splitlines()[0] == "matmul sites on tpu_v4: 9 (7 emulated)"
    v7x = emulate.inspect(BLOCK, X, target="tpu_v7x")
    # Mixed pairs (bf16 x e4m3fn) compile on v7x only through Mosaic's compatibility mode
    # (the recorded probe), so emulate decodes them itself, as it does int4 there.
    assert len(v7x.emulated) == 7


def test_script_runs(capsys):
    # run as a script (``__name__ == "__main__"``) in this process: a fresh interpreter
    # would add only its start-up and the compiles this process's cache already holds
    runpy.run_path(str(PATH), run_name="__main__")
    out = capsys.readouterr().out
    assert "matmul sites on tpu_v4: 9 (7 emulated)" in out
    assert "identical elements 1024/1024" in out
