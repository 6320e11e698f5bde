"""Plans: which route each pair takes on each target, and why."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import emulate
from emulate import formats, targets

F32 = jnp.float32
I32_MAX = 2**31 - 1


@pytest.mark.parametrize(
    "lhs,rhs,target,method,compute,k_chunk",
    [
        # v4's MXU takes bf16 (and int8 only as RHS next to bf16): integers decode to bf16,
        # and int8 x int8 in f32 is exact for K <= 2**24 / 2**14 = 1024.
        ("int8", "int8", "tpu_v4", "bf16", "bfloat16", 1024),
        ("int4", "int4", "tpu_v4", "bf16", "bfloat16", 2**24 // 64),
        ("float4_e2m1fn", "float4_e2m1fn", "tpu_v4", "bf16", "bfloat16", 2**24 // 144),
        ("float6_e2m3fn", "float6_e2m3fn", "tpu_v4", "bf16", "bfloat16", 2**24 // 3600),
        # v5e: int8 runs at twice the bf16 rate; e2m1 x2 and e2m3 x8 are int8 exactly.
        # A float result of integers is the exact sum, so int32 partial sums must not wrap.
        ("int8", "int8", "tpu_v5e", "native", "int8", I32_MAX // 2**14),
        ("float4_e2m1fn", "float4_e2m1fn", "tpu_v5e", "int8", "int8", I32_MAX // 144),
        ("float6_e2m3fn", "int8", "tpu_v5e", "int8", "int8", I32_MAX // (60 * 128)),
        ("int4", "int4", "tpu_v5e", "native", "int4", I32_MAX // 64),
        # v2/v3: f32 only.
        ("int8", "int8", "tpu_v2", "f32", "float32", 1024),
        ("bfloat16", "float8_e4m3fn", "tpu_v3", "f32", "float32", None),
        # v7x: fp8 e4m3fn native, no int8.
        ("float8_e4m3fn", "float8_e4m3fn", "tpu_v7x", "native", "float8_e4m3fn", None),
        ("int8", "int8", "tpu_v7x", "bf16", "bfloat16", 1024),
        # Mixed pairs are decoded to one type, never fed to the MXU mixed.
        ("bfloat16", "int8", "tpu_v4", "bf16", "bfloat16", None),
        ("bfloat16", "float8_e5m2", "tpu_v5e", "bf16", "bfloat16", None),
        ("float32", "float8_e4m3fn", "tpu_v4", "f32", "float32", None),
    ],
)
def test_route(lhs, rhs, target, method, compute, k_chunk):
    p = emulate.plan(lhs, rhs, target=target, preferred_element_type=F32)
    assert (p.method, p.lhs_compute, p.rhs_compute, p.k_chunk) == (
        method,
        compute,
        compute,
        k_chunk,
    )
    t = targets.get(target)
    assert t.supports(p.lhs_compute, p.rhs_compute)


def test_integer_result_wraps_without_chunks():
    p = emulate.plan("int8", "int8", target="tpu_v5e", preferred_element_type=jnp.int32)
    assert (p.method, p.k_chunk, p.k_limit) == ("native", None, None)


def test_exact_classes_and_scales():
    p = emulate.plan("float4_e2m1fn", "float6_e2m3fn", target="tpu_v6e", preferred_element_type=F32)
    assert p.exact and (p.lhs_scale, p.rhs_scale) == (1, 3) and p.accumulator == "int32"
    q = emulate.plan("float8_e4m3fn", "float8_e4m3fn", target="tpu_v6e", preferred_element_type=F32)
    assert not q.exact and q.k_chunk is None


def test_native_pair_the_host_cannot_compile_has_a_fallback():
    p = emulate.plan("int4", "int4", target="tpu_v5e", preferred_element_type=jnp.int32)
    assert p.method == "native" and p.platform == "tpu"
    assert p.fallback is not None and p.fallback.method == "int8"
    # int8 x int8 compiles on the host: no fallback needed.
    assert emulate.plan("int8", "int8", target="tpu_v5e").fallback is None


def test_lowered_for_tpu_the_int4_plan_keeps_int4_operands():
    x = jnp.zeros((8, 256), jnp.int4)
    w = jnp.zeros((256, 128), jnp.int4)

    def f(x, w):
        return emulate.matmul(x, w, preferred_element_type=jnp.int32, target="tpu_v5e")

    text = jax.jit(f).trace(x, w).lower(lowering_platforms=("tpu",)).as_text()
    dots = re.findall(r"stablehlo.dot_general.*", text)
    assert dots and all("xi4>" in d and "xi8>" not in d for d in dots), dots
    # Run on this CPU, the same program takes the int8 route and gives the exact sum.
    rng = np.random.default_rng(0)
    xv = jnp.asarray(rng.integers(-8, 8, (8, 256)), jnp.int4)
    wv = jnp.asarray(rng.integers(-8, 8, (256, 128)), jnp.int4)
    want = np.asarray(xv).astype(np.int64) @ np.asarray(wv).astype(np.int64)
    np.testing.assert_array_equal(jax.jit(f)(xv, wv), want)


def test_lowered_for_tpu_v4_int8_becomes_bf16():
    x = jnp.zeros((256, 256), jnp.int8)

    def f(a, b):
        return emulate.matmul(a, b, preferred_element_type=jnp.int32, target="tpu_v4")

    text = jax.jit(f).trace(x, x).lower(lowering_platforms=("tpu",)).as_text()
    dots = re.findall(r"stablehlo.dot_general.*", text)
    assert dots and all("xbf16>" in d and "xi8>" not in d for d in dots), dots


def test_explain_says_why():
    text = emulate.plan("float4_e2m1fn", "float4_e2m1fn", target="tpu_v5e").explain()
    assert "float4_e2m1fn x float4_e2m1fn -> float4_e2m1fn on tpu_v5e (mode 'fast')" in text
    assert "matrix unit sees: int8 x int8, accumulating in int32" in text
    assert "scaling: lhs x 2^1, rhs x 2^1" in text
    assert "numerics: exact" in text
    assert re.search(r"\* int8 +3\.94e\+14 +ok", text)
    assert "native" in text and "takes the exact integer route" in text
    v4 = emulate.plan("int8", "int8", target="tpu_v4", preferred_element_type=jnp.int32).explain()
    assert "tpu_v4 has no int8 x int8 unit" in v4
    assert "K-chunk: 1024" in v4


def test_current_target_is_used():
    with emulate.target("tpu_v4"):
        assert emulate.plan("int8", "int8").target == "tpu_v4"
    assert emulate.plan("int8", "int8", target="v5e").target == "tpu_v5e"


def test_result_format_follows_lax():
    assert emulate.plan("int8", "int8", target="cpu").out == "int8"
    assert emulate.plan("float8_e4m3fn", "float8_e5m2", target="cpu").out == "float8_e5m2"
    assert emulate.plan("bfloat16", "int4", target="cpu").out == "bfloat16"
    assert emulate.plan("int8", "int8", preferred_element_type=jnp.int32).out == "int32"


class TestBadInput:
    def test_unknown_mode(self):
        with pytest.raises(
            ValueError, match=r"^mode: expected one of 'fast', 'exact', got 'slow'$"
        ):
            emulate.plan("int8", "int8", mode="slow")

    def test_exact_mode_outside_exact_class(self):
        with pytest.raises(
            NotImplementedError, match=r"^mode='exact' for int32 x int32 is not built: "
        ):
            emulate.plan("int32", "int32", mode="exact")
        assert emulate.plan("float8_e5m2", "bfloat16", mode="exact").slicing is not None

    def test_integer_result_for_floats(self):
        with pytest.raises(
            TypeError,
            match=r"^preferred_element_type: an integer result \(int32\) needs integer operands, "
            r"got float4_e2m1fn x int8$",
        ):
            emulate.plan("float4_e2m1fn", "int8", preferred_element_type=jnp.int32)

    def test_unknown_format(self):
        with pytest.raises(ValueError, match=r"^fmt: unknown format 'int9'"):
            emulate.plan("int9", "int8")

    def test_every_low_precision_pair_has_a_plan_on_every_target(self):
        names = [n for n in formats.LOW_PRECISION if n != "float8_e8m0fnu"]
        for t in targets.all_targets():
            for a in names:
                for b in names + ["bfloat16", "float32"]:
                    p = emulate.plan(a, b, target=t, preferred_element_type=F32)
                    assert t.supports(p.lhs_compute, p.rhs_compute), (t.name, a, b)
