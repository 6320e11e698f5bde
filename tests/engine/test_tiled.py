"""The tiled CPU path (emulate.tiled) against the reference: forced small tiles, so that
every tile boundary, ragged tail, packed plane and layout is reached with small arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _sweeps import LONG

import emulate
from emulate import formats
from emulate import testing as et
from emulate.engine import run, tiled
from emulate.engine.operands import Operand, operand
from emulate.numerics.storage import Packed, code_planes

F32 = jnp.float32
DN = (((1,), (0,)), ((), ()))

# (activation shape, weight shape, dimension numbers, weight side, weight contracting axis)
# The weight is the decoded operand; K = 37 gives full tiles and a ragged tail for tile 4
# or 8 (and odd plane lengths), N = 11 is odd.
LAYOUTS = {
    "x@w": ((3, 37), (37, 11), DN, 1, 0),
    "w^T x": ((3, 37), (37, 11), (((0,), (1,)), ((), ())), 0, 0),
    "x@w^T": ((3, 37), (11, 37), (((1,), (1,)), ((), ())), 1, 1),
    "batched": ((2, 3, 37), (2, 37, 11), (((2,), (1,)), ((0,), (0,))), 1, 1),
}


def _weight_codes(fmt: str, shape, rng, specials: bool = True) -> np.ndarray:
    """Finite codes, plus NaN / +-Inf codes in a few places (one column each)."""
    f = formats.get(fmt)
    finite = np.array(et.finite_codes(f), np.uint8)
    codes = rng.choice(finite, size=shape).astype(np.uint8)
    if specials:
        sp = et.special_codes(f)
        flat = codes.reshape(-1)
        for i, c in enumerate(sp[:3]):
            flat[(7 * i + 5) % flat.size] = c
    return codes


def _activations(shape, rng) -> np.ndarray:
    return (rng.standard_normal(shape) * 4).astype(ml_dtypes.bfloat16)


def _as_format(codes: np.ndarray, fmt: str) -> np.ndarray:
    f = formats.get(fmt)
    return codes.view(np.int8) if fmt == "int8" else codes.view(f.dtype)


def _choice(lhs, rhs, dn, pet, target="cpu", mode="fast") -> tiled.Tiling | None:
    a, b = operand(lhs), operand(rhs)
    p = run.plan_for(a, b, target, pet, mode)
    return tiled.tiling_for(p, a, b, dn, tiled.current_settings())


def _run_and_check(x, w_arg, x_ref, w_ref, dn, side, *, kind, tile, pet=F32, target="cpu"):
    lhs, rhs = (w_arg, x) if side == 0 else (x, w_arg)
    lref, rref = (w_ref, x_ref) if side == 0 else (x_ref, w_ref)
    with tiled.settings(min_bytes=0, kind=kind, tile=tile):
        t = _choice(lhs, rhs, dn, pet, target)
        got = emulate.dot_general(lhs, rhs, dn, preferred_element_type=pet, target=target)
    et.assert_matches_reference(got, lref, rref, dn, mode="fast", preferred_element_type=pet)
    return t


WEIGHTS = [
    ("float8_e4m3fn", None),
    ("float8_e5m2", None),
    ("int8", None),
    ("int4", None),
    ("int4", "k"),  # packed along the contracting axis: planar nibbles
    ("float4_e2m1fn", "k"),
    ("float6_e2m3fn", "k"),  # 6-bit planes: four codes per three bytes
    ("float6_e3m2fn", "n"),  # packed along the free axis
]


# Every weight format and packing tiled along K by default except float8_e5m2 (e4m3fn's
# unpacked float8 path); tiles along N by default for the two packings whose planes the N
# tiles cut (int4 packed along K, float6_e3m2fn packed along N), for the unpacked and
# the other K-packed weights (the same tiles of decoded values) under
# EMULATE_LONG_TESTS=1. Tiles of 4 and of 8 (each a program of its own; K = 37 leaves a
# ragged tail for both) in turn over the default cases, both under EMULATE_LONG_TESTS=1.
N_TILED = {("int4", "k"), ("float6_e3m2fn", "n")}


@pytest.mark.parametrize(
    "fmt,packed,kind",
    [
        pytest.param(*w, kind, marks=pytest.mark.long)
        if w[0] == "float8_e5m2" or (kind == "n" and w not in N_TILED)
        else (*w, kind)
        for kind in ("k", "n")
        for w in WEIGHTS
    ],
)
def test_bf16_activations_times_weights_within_bound(fmt, packed, kind):
    rng = np.random.default_rng(abs(hash((fmt, packed, kind))) % 2**32)
    xs, ws, dn, side, k_axis = LAYOUTS["x@w"]
    x = _activations(xs, rng)
    codes = _weight_codes(fmt, ws, rng)
    w_ref = _as_format(codes, fmt)
    w_arg = w_ref
    if packed is not None:
        w_arg = emulate.pack(codes, fmt, axis=k_axis if packed == "k" else 1 - k_axis)
    elif not formats.get(fmt).xla_storable:
        w_arg = jnp.asarray(codes)
    else:
        w_arg = jnp.asarray(w_ref)
    turn = (WEIGHTS.index((fmt, packed)) + (kind == "n")) % 2
    for tile in (4, 8) if LONG else ((4, 8)[turn],):
        t = _run_and_check(jnp.asarray(x), w_arg, x, w_ref, dn, side, kind=kind, tile=tile)
        assert t is not None and t.kind == kind and t.tile == tile
        assert t.planar == (packed == "k")


# Every layout with float8_e5m2 and packed int4 by default; the 6-bit planes on the
# "batched" layout by default, on the other layouts under EMULATE_LONG_TESTS=1.
@pytest.mark.parametrize(
    "layout,fmt,packed",
    [
        pytest.param(layout, fmt, packed, marks=pytest.mark.long)
        if fmt == "float6_e2m3fn" and layout != "batched"
        else (layout, fmt, packed)
        for fmt, packed in [("float8_e5m2", None), ("int4", "k"), ("float6_e2m3fn", "k")]
        for layout in sorted(LAYOUTS)
    ],
)
def test_layouts(layout, fmt, packed):
    rng = np.random.default_rng(7)
    xs, ws, dn, side, k_axis = LAYOUTS[layout]
    x = _activations(xs, rng)
    codes = _weight_codes(fmt, ws, rng)
    w_ref = _as_format(codes, fmt)
    w_arg = emulate.pack(codes, fmt, axis=k_axis) if packed else jnp.asarray(w_ref)
    for kind in ("k", "n"):
        t = _run_and_check(jnp.asarray(x), w_arg, x, w_ref, dn, side, kind=kind, tile=8)
        assert t is not None and t.side == side and t.kind == kind


def test_k_of_one_and_tiles_of_every_length():
    rng = np.random.default_rng(11)
    x = _activations((2, 1), rng)
    codes = _weight_codes("float4_e2m1fn", (1, 9), rng, specials=False)
    w = emulate.pack(codes, "float4_e2m1fn", axis=0)
    w_ref = _as_format(codes, "float4_e2m1fn")
    # K = 1: nothing to tile along K; N-tiling still runs (tile 4: two tiles and a tail of 1).
    assert _run_and_check(jnp.asarray(x), w, x, w_ref, DN, 1, kind="k", tile=4) is None
    assert _run_and_check(jnp.asarray(x), w, x, w_ref, DN, 1, kind="n", tile=4).tile == 4
    # K = 37 tiled by 2 (one plane element per tile), 36 (a tail of 1) and 38 (no tile).
    x = _activations((2, 37), rng)
    codes = _weight_codes("int4", (37, 5), rng, specials=False)
    w = emulate.pack(codes, "int4", axis=0)
    w_ref = _as_format(codes, "int4")
    for tile, tiled_ in ((2, True), (36, True), (38, False)):
        t = _run_and_check(jnp.asarray(x), w, x, w_ref, DN, 1, kind="k", tile=tile)
        assert (t is not None) == tiled_


# The CPU route (float4) and two TPU plans (v4, v5e) by default; int8 x int4 on the CPU
# and the unsigned pair on tpu_v2 under EMULATE_LONG_TESTS=1. Each default case tiles
# along K into float32 and along N into bfloat16 (each a program of its own), every
# combination under EMULATE_LONG_TESTS=1.
EXACT_PAIRS = [
    ("int8", "int4", "tpu_v4"),
    pytest.param("int8", "int4", "cpu", marks=pytest.mark.long),
    ("float4_e2m1fn", "float4_e2m1fn", "cpu"),
    ("int8", "float6_e2m3fn", "tpu_v5e"),
    pytest.param("uint8", "uint4", "tpu_v2", marks=pytest.mark.long),
]


@pytest.mark.parametrize("lhs_fmt,rhs_fmt,target", EXACT_PAIRS)
def test_exact_classes_stay_bit_identical(lhs_fmt, rhs_fmt, target):
    rng = np.random.default_rng(3)
    xs, ws, dn, side, k_axis = LAYOUTS["batched"]
    a_codes = rng.choice(np.array(et.finite_codes(lhs_fmt), np.uint8), size=xs)
    # Extreme codes in the first rows make the partial sums large.
    a_codes[..., :8] = max(et.finite_codes(lhs_fmt), key=lambda c: abs(_value(lhs_fmt, c)))
    codes = _weight_codes(rhs_fmt, ws, rng, specials=False)
    a_ref, w_ref = _as_format(a_codes, lhs_fmt), _as_format(codes, rhs_fmt)
    w = emulate.pack(codes, rhs_fmt, axis=k_axis)
    a = jnp.asarray(a_ref) if formats.get(lhs_fmt).xla_storable else a_ref
    every = [(pet, kind) for pet in (jnp.float32, jnp.bfloat16) for kind in ("k", "n")]
    for pet, kind in every if LONG else [(jnp.float32, "k"), (jnp.bfloat16, "n")]:
        with tiled.settings(min_bytes=0, kind=kind, tile=8):
            assert _choice(a, w, dn, pet, target) is not None
            got = emulate.dot_general(a, w, dn, preferred_element_type=pet, target=target)
        et.assert_matches_reference(got, a_ref, w_ref, dn, mode="fast", preferred_element_type=pet)
    if formats.get(lhs_fmt).is_integer and formats.get(rhs_fmt).is_integer:
        with tiled.settings(min_bytes=0, kind="k", tile=8):
            got = emulate.dot_general(a, w, dn, preferred_element_type=jnp.int32, target=target)
        et.assert_matches_reference(
            got, a_ref, w_ref, dn, mode="fast", preferred_element_type=jnp.int32
        )


def _value(fmt: str, code: int) -> float:
    return (
        float(np.array([code], np.uint8).view(formats.get(fmt).dtype)[0]) if fmt != "int8" else code
    )


def test_chunked_exact_plan_tiles_along_n_only():
    # e2m3 x e2m3 in f32 is exact for K <= 4660 only: K = 5003 is combined chunk by chunk,
    # so the sum may not be cut along K; N-tiling keeps every column's computation.
    rng = np.random.default_rng(1)
    codes_a = rng.integers(0, 64, (2, 5003)).astype(np.uint8)
    codes_b = rng.integers(0, 64, (5003, 9)).astype(np.uint8)
    codes_a[:, :2000] = 0x1F
    codes_b[:2000, :] = 0x1F
    a = codes_a.view(ml_dtypes.float6_e2m3fn)
    b = codes_b.view(ml_dtypes.float6_e2m3fn)
    with tiled.settings(min_bytes=0, kind="k", tile=8):
        assert _choice(a, b, DN, F32, "tpu_v4") is None
    with tiled.settings(min_bytes=0, kind="n", tile=4):
        t = _choice(a, b, DN, F32, "tpu_v4")
        assert t is not None and t.kind == "n" and not t.planar
        got = emulate.dot_general(a, b, DN, preferred_element_type=F32, target="tpu_v4")
    et.assert_matches_reference(got, a, b, DN, mode="fast", preferred_element_type=F32)


def test_not_tiled_when_nothing_is_decoded_or_the_operand_is_small():
    x = np.zeros((64, 4096), np.int8)
    assert _choice(x, x.T, DN, jnp.int32, "cpu") is None  # native int8 x int8
    xb = jnp.zeros((64, 256), jnp.bfloat16)
    w = jnp.zeros((256, 256), jnp.float8_e4m3fn)
    assert _choice(xb, w, DN, F32) is None  # a 128 KiB decoded weight: cache resident
    x1 = jnp.zeros((64, 1024), jnp.bfloat16)
    w1 = jnp.zeros((1024, 1024), jnp.float8_e4m3fn)
    assert _choice(x1, w1, DN, F32) is None  # 2 MiB decoded: still untiled
    with tiled.settings(enabled=False, min_bytes=0):
        assert _choice(xb, w, DN, F32) is None
    a = np.zeros((4, 64), ml_dtypes.float8_e4m3fn)
    with tiled.settings(min_bytes=0, tile=8):
        assert _choice(a, a.T, DN, F32, "cpu", mode="exact") is None  # exponent slicing


@pytest.mark.parametrize(
    "m,k,n,kind,tiles",
    [
        (1, 4096, 4096, "k", (256, 256)),
        (64, 4096, 4096, "k", (512, 512)),
        (64, 2048, 2048, "k", (256, 256)),  # small weight: a 1 MiB tile beats the budget
        (512, 4096, 4096, "n", (512, 256)),  # packed: a planar copy of x takes budget
        (2048, 2048, 2048, "n", (128, 128)),
    ],
)
def test_default_choice_for_weight_shapes(m, k, n, kind, tiles):
    x = jax.ShapeDtypeStruct((m, k), jnp.bfloat16)
    weights = (
        Operand(jax.ShapeDtypeStruct((k, n), jnp.float8_e4m3fn), "float8_e4m3fn"),
        Operand(Packed(jax.ShapeDtypeStruct((k // 2, n), jnp.uint8), "int4", -2, k), "int4"),
    )
    for w, tile in zip(weights, tiles, strict=True):
        p = emulate.plan("bfloat16", w.format_name, target="cpu", preferred_element_type=F32)
        t = tiled.tiling_for(p, Operand(x, "bfloat16"), w, DN, tiled.Settings())
        assert (t.kind, t.tile, t.side, t.dim) == (kind, tile, 1, 0 if kind == "k" else 1)
        assert t.planar == (isinstance(w.value, Packed) and m < 2048)


def test_temporaries_stay_under_a_quarter_of_the_decoded_weight():
    # Goal 2 of issue 9 (compiled temporaries, not time): a 2048 x 2048 fp8 / packed int4
    # weight, decoded to bf16 = 8 MiB, is never written out in full.
    x = jnp.zeros((16, 2048), jnp.bfloat16)
    for w in (
        jnp.zeros((2048, 2048), jnp.float8_e4m3fn),
        emulate.pack(jnp.zeros((2048, 2048), jnp.int4), axis=0),
    ):

        def f(x, w):
            return emulate.dot_general(x, w, DN, preferred_element_type=F32, target="cpu")

        compiled = jax.jit(f).lower(x, w).compile()
        temp = compiled.memory_analysis().temp_size_in_bytes
        assert temp <= 0.25 * 2 * 2048 * 2048, temp
        assert "while" in compiled.as_text()


def test_tpu_lowering_is_untiled():
    x = jnp.zeros((16, 2048), jnp.bfloat16)
    w = jnp.zeros((2048, 2048), jnp.float8_e4m3fn)

    def f(x, w):
        return emulate.dot_general(x, w, DN, preferred_element_type=F32, target="tpu_v5e")

    tpu = jax.jit(f).trace(x, w).lower(lowering_platforms=("tpu",)).as_text()
    cpu = jax.jit(f).trace(x, w).lower(lowering_platforms=("cpu",)).as_text()
    assert "while" not in tpu and "while" in cpu


def test_grad_and_vmap_through_the_tiled_path():
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((3, 37)), jnp.float32)
    codes = _weight_codes("int4", (37, 11), rng, specials=False)
    w = emulate.pack(codes, "int4", axis=0)
    wd = emulate.decode(w, to=jnp.float32)

    def loss(x):
        y = emulate.dot_general(x, w, DN, preferred_element_type=F32, target="cpu")
        return jnp.sum(y * y)

    def plain(x):
        return jnp.sum(jax.lax.dot_general(x, wd, DN, preferred_element_type=F32) ** 2)

    for kind in ("k", "n"):
        with tiled.settings(min_bytes=0, kind=kind, tile=8):
            np.testing.assert_allclose(jax.grad(loss)(x), jax.grad(plain)(x), rtol=1e-4, atol=1e-3)
            batched = jax.vmap(
                lambda x: emulate.dot_general(x, w, DN, preferred_element_type=F32, target="cpu")
            )(x[:, None, :])
        np.testing.assert_allclose(batched[:, 0], x @ wd, rtol=1e-5, atol=1e-4)


# One 4-bit and one 6-bit format by default; the others under EMULATE_LONG_TESTS=1.
@pytest.mark.parametrize(
    "fmt",
    [
        "int4",
        pytest.param("float4_e2m1fn", marks=pytest.mark.long),
        "float6_e2m3fn",
        pytest.param("float6_e3m2fn", marks=pytest.mark.long),
    ],
)
def test_planes_are_the_strided_elements(fmt):
    rng = np.random.default_rng(2)
    bits = formats.get(fmt).bits
    for length in (1, 2, 3, 5, 8, 13):
        codes = rng.integers(0, 1 << bits, (length, 3)).astype(np.uint8)
        p = emulate.pack(codes, fmt, axis=0)
        got = code_planes(p)
        g = 2 if bits == 4 else 4
        assert len(got) == min(g, length)
        for j, plane in enumerate(got):
            np.testing.assert_array_equal(np.asarray(plane), codes[j::g])


_FLOAT4_TILES = """
import jax.numpy as jnp, ml_dtypes, numpy as np
import emulate
from emulate.quantized.array import QArray
rng = np.random.default_rng(0)
codes = np.asarray(rng.standard_normal((4, 64, 256)), ml_dtypes.float4_e2m1fn)
scales = np.ones((4, 2, 256), ml_dtypes.float8_e8m0fnu)
q = QArray.from_parts(codes, scales, block_shape=(1, 32, 1))
x = rng.standard_normal((4, 3, 64)).astype(np.float32)
dn = (((2,), (1,)), ((0,), (0,)))
got = np.asarray(emulate.dot_general(x, q, dn, preferred_element_type=jnp.float32))
want = np.einsum("bmk,bkn->bmn", x.astype(np.float64), codes.astype(np.float64))
print(float(np.max(np.abs(got - want) / (np.abs(x) @ np.abs(codes.astype(np.float64)) + 1e-30))))
"""


def test_stacked_unpacked_float4_codes_are_sliced_into_tiles() -> None:
    # A 3-D QArray whose codes are a float4_e2m1fn array (not Packed), tiled on the CPU
    # (emulate.engine.qtiled slices its leaves with dyn_slice): float4 has no unsigned
    # type of its width to bitcast to, and JAX refused the uint8 one. Run with XLA's
    # default CPU emitters: the suite's (elemental emitters) crash on a dynamic slice of
    # a float4 array ("Invalid bitcast", an XLA:CPU bug).
    import os
    import subprocess
    import sys

    from _xla_flags import with_flags

    env = {**os.environ, "XLA_FLAGS": with_flags(os.environ.get("XLA_FLAGS", ""), add=False)}
    env["JAX_PLATFORMS"] = "cpu"
    run_ = subprocess.run(
        [sys.executable, "-c", _FLOAT4_TILES], env=env, capture_output=True, text=True
    )
    assert run_.returncode == 0, run_.stderr[-2000:]
    # within 2**-20 of sum |x| |w| (K = 64: gamma_(K + S + 5) is about 2**-17.9)
    assert float(run_.stdout.strip().splitlines()[-1]) < 2.0**-17
