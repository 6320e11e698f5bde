"""emulate.pallas.dot inside Pallas TPU kernels, in interpret mode on the CPU: exact for
integer and fp4 pairs (K cut into exact chunks, one final rounding), within the bound for
float8 pairs, on the route each target takes; bad input names the argument."""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import emulate.pallas
from emulate import formats, reference, targets
from emulate import testing as et
from emulate.pallas import compute

DN = (((1,), (0,)), ((), ()))


def _kernel(pet, target, a_ref, b_ref, o_ref):
    o_ref[...] = emulate.pallas.dot(
        a_ref[...], b_ref[...], preferred_element_type=pet, target=target
    )


def run(a, b, pet, target):
    """One pallas_call whose whole body is emulate.pallas.dot, in TPU interpret mode."""
    out = jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), pet if pet is not None else a.dtype)
    return pl.pallas_call(
        functools.partial(_kernel, pet, target), out_shape=out, interpret=pltpu.InterpretParams()
    )(a, b)


def test_int8_k2048_on_v4_is_exact_past_two_to_the_24():
    a = np.full((8, 2048), -128, np.int8)
    b = np.full((2048, 128), -128, np.int8)
    a[0, -1] = b[-1, 0] = 1  # 2047 * 2**14 + 1: odd, past 2**24
    got = np.asarray(run(a, b, jnp.int32, "tpu_v4"))
    assert got[0, 0] == 2047 * 2**14 + 1
    assert got[1, 1] == 2048 * 2**14
    assert got.tobytes() == reference.dot_general(a, b, DN, "int32").tobytes()


def test_int8_to_bf16_on_v7x_rounds_once():
    # 2**25 + 2**17 + 1 rounds up to 2**25 + 2**18 in bf16; rounded via f32 it would tie
    # down to 2**25.
    v = np.array([[-128] * 2056 + [1]] * 8, np.int8)
    got = run(v, np.ascontiguousarray(v.T[:, :1].repeat(128, 1)), jnp.bfloat16, "tpu_v7x")
    assert float(got[0, 0]) == 2.0**25 + 2.0**18


@pytest.mark.parametrize(
    "lhs, rhs, pet, target, method",
    [
        ("uint8", "uint8", jnp.int32, "tpu_v5e", "bf16"),  # signed Pallas dot: not native
        ("int4", "int4", jnp.int32, "tpu_v6e", "int8"),
        ("int8", "int8", None, "tpu_v4", "bf16"),  # int8 result: the int32 sum wrapped
        ("int8", "int8", jnp.float32, "tpu_v5e", "native"),
        ("float4_e2m1fn", "float4_e2m1fn", jnp.float32, "tpu_v4", "bf16"),
    ],
)
def test_exact_pairs_are_bit_identical(lhs, rhs, pet, target, method):
    r = compute.in_kernel(lhs, rhs, target=target, preferred_element_type=pet)
    assert r.method == method
    rng = np.random.default_rng(3)
    fa, fb = formats.get(lhs), formats.get(rhs)
    x = rng.choice(np.array(et.finite_codes(fa), np.uint8), (16, 1024)).view(fa.dtype)
    y = rng.choice(np.array(et.finite_codes(fb), np.uint8), (1024, 128)).view(fb.dtype)
    if fa.is_integer:  # half of K at the extreme: sums far past 2**24
        x[:, :512] = fa.min if fa.signed else fa.max
        y[:512, :] = fb.min if fb.signed else fb.max
    got = np.asarray(run(x, y, pet, target))
    want = reference.dot_general(x, y, DN, pet)
    assert got.dtype == want.dtype
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize(
    "lhs, rhs, target",
    [
        ("bfloat16", "float8_e4m3fn", "tpu_v4"),
        ("float8_e5m2", "float8_e5m2", "tpu_v7x"),  # native from v7 on
        ("float8_e4m3fn", "float8_e4m3fn", "tpu_v5e"),  # decoded to bf16
    ],
)
def test_float8_pairs_are_within_the_bound(lhs, rhs, target):
    rng = np.random.default_rng(8)

    def draw(fmt, shape):
        f = formats.get(fmt)
        if not f.is_low_precision:
            return (rng.standard_normal(shape) * 4).astype(f.dtype)
        codes = rng.integers(0, 256, shape).astype(np.uint8)
        codes[rng.random(shape) < 0.2] = rng.choice(np.array(et.special_codes(f), np.uint8))
        return codes.view(f.dtype)

    x, y = draw(lhs, (16, 512)), draw(rhs, (512, 128))
    got = run(x, y, jnp.float32, target)
    et.assert_matches_reference(got, x, y, DN, mode="fast", preferred_element_type=jnp.float32)


def test_computes_per_target():
    def computes(lhs, rhs, target):
        r = compute.in_kernel(lhs, rhs, target=target, preferred_element_type=None)
        return r.lhs_compute, r.rhs_compute, r.k_chunk

    assert computes("int8", "int8", "tpu_v4") == ("bfloat16", "bfloat16", 1024)
    assert computes("int8", "int8", "tpu_v7x") == ("bfloat16", "bfloat16", 1024)
    assert computes("int8", "int8", "tpu_v5e") == ("int8", "int8", None)
    assert computes("int8", "int8", "tpu_v6e") == ("int8", "int8", None)
    assert computes("uint8", "uint8", "tpu_v5e") == ("bfloat16", "bfloat16", 258)
    assert computes("int8", "int4", "tpu_v4") == ("bfloat16", "bfloat16", 16384)
    assert computes("float4_e2m1fn", "float4_e2m1fn", "tpu_v7x") == ("bfloat16", "bfloat16", 116508)
    assert computes("int8", "int8", "tpu_v2") == ("float32", "float32", 1024)
    assert computes("bfloat16", "int8", "tpu_v5e") == ("bfloat16", "bfloat16", None)
    # The compiler refuses unsigned operands (Pallas), so no probed profile calls them
    # native: the plan itself decodes them.
    r = compute.in_kernel("uint4", "uint4", target="tpu_v5e")
    assert (r.method, r.note) == ("int8", "")
    # A profile that calls them native (JAX's table does, for v5e) still does not get them
    # as they are: Pallas' dot would read them as signed.
    v5e = targets.get("tpu_v5e")
    table = dataclasses.replace(v5e, native_pairs=v5e.table_pairs, rules="table")
    r = compute.in_kernel("uint4", "uint4", target=table)
    assert r.method == "int8"
    assert r.note == (
        "Pallas TPU dot reads integer operands as signed, so native uint4 x uint4 would "
        "misread the values above 7"
    )
    r = compute.in_kernel("uint8", "uint8", target=table)
    assert r.note.endswith("would misread the values above 127")
    r = compute.in_kernel("int4", "int4", target="tpu_v5e")
    assert (r.method, r.note) == (
        "int8",
        "int4 x int4 is widened to int8 (exactly): XLA's CPU backend, which runs kernels in "
        "interpret mode, cannot compile a dot of 4-bit integers",
    )
    assert compute.in_kernel("int8", "int8", target="tpu_v5e").note == ""


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bit for bit, except that any NaN matches any NaN."""
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@pytest.mark.parametrize(
    "name",
    ["int4", "uint4", "int8", "uint8", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
     "float8_e5m2fnuz", "float8_e4m3b11fnuz", "float8_e3m4", "float6_e2m3fn", "float6_e3m2fn",
     "float4_e2m1fn"],
)  # fmt: skip
def test_decoding_matches_the_reference_for_every_code(name):
    f = formats.get(name)
    codes = np.arange(1 << f.bits, dtype=np.uint8)
    want = reference.decode(codes, name, to=np.float32)
    _same_bits(np.asarray(compute.decode_codes(jnp.asarray(codes), name, "float32")), want)
    # high bits above the code are ignored (a nibble plane cut from a byte, say)
    high = jnp.asarray(codes.astype(np.int32) | (0x5A << f.bits))
    _same_bits(np.asarray(compute.decode_codes(high, name, "float32")), want)
    if f.xla_storable:  # loaded values of the format itself
        got = compute.decode_values(jnp.asarray(codes.view(f.dtype)), "float32")
        _same_bits(np.asarray(got), want)
    if f.int8_scale is not None:  # exact class: value * 2**k as int8
        k = f.int8_scale
        scaled = np.asarray(compute.decode_codes(jnp.asarray(codes), name, "int8", k))
        np.testing.assert_array_equal(scaled, (want * 2.0**k).astype(np.int8))


def _kernel_dn(pet, target, dn, a_ref, b_ref, o_ref):
    o_ref[...] = emulate.pallas.dot(
        a_ref[...], b_ref[...], preferred_element_type=pet, target=target, dimension_numbers=dn
    )


@pytest.mark.parametrize(
    "lhs, rhs, pet, target, dn",
    [
        ("int8", "int8", jnp.int32, "tpu_v4", (((1,), (1,)), ((), ()))),  # decoded, a @ b.T
        ("int8", "int8", jnp.int32, "tpu_v5e", (((1,), (1,)), ((), ()))),  # native, a @ b.T
        ("float4_e2m1fn", "int4", jnp.float32, "tpu_v4", (((0,), (1,)), ((), ()))),  # chunked
        ("bfloat16", "int8", jnp.float32, "tpu_v7x", (((0,), (0,)), ((), ()))),
        # rows first: long (EMULATE_LONG_TESTS=1), the same pair, target and dimension
        # numbers run by default in test_a_narrow_lhs_stored_k_first_reaches_the_matmul_rows_first
        pytest.param(
            "int8", "int8", jnp.int32, "tpu_v5e", (((0,), (0,)), ((), ())), marks=pytest.mark.long
        ),
        ("float4_e2m1fn", "float4_e2m1fn", jnp.float32, "tpu_v5e", (((0,), (1,)), ((), ()))),
    ],
)
def test_transposed_operands_are_contracted_as_stored(lhs, rhs, pet, target, dn):
    rng = np.random.default_rng(12)
    fa, fb = formats.get(lhs), formats.get(rhs)
    (ca,), (cb,) = dn[0]
    m, k, n = 8, 1024, 128
    a_shape = (m, k) if ca == 1 else (k, m)
    b_shape = (k, n) if cb == 0 else (n, k)
    if fa.is_low_precision:
        x = rng.choice(np.array(et.finite_codes(fa), np.uint8), a_shape).view(fa.dtype)
    else:  # integers: every sum exact in f32, whatever the order
        x = rng.integers(-64, 64, a_shape).astype(fa.dtype)
    y = rng.choice(np.array(et.finite_codes(fb), np.uint8), b_shape).view(fb.dtype)
    call = pl.pallas_call(
        functools.partial(_kernel_dn, pet, target, dn),
        out_shape=jax.ShapeDtypeStruct((m, n), pet),
        interpret=pltpu.InterpretParams(),
    )
    got = np.asarray(call(x, y))
    want = reference.dot_general(x, y, dn, pet)  # integer-valued sums: exact in f32 here
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


_NARROW_VECTOR = re.compile(r"vector<(?:\d+x)+(?:i8|i4|f8\w+|f4E2M1FN)>")


@pytest.mark.parametrize(
    "lhs, rhs, target, dn",
    [
        ("int8", "int8", "tpu_v5e", (((0,), (0,)), ((), ()))),  # native
        ("int4", "int4", "tpu_v6e", (((0,), (1,)), ((), ()))),  # the int8 route
        ("float8_e4m3fn", "float8_e4m3fn", "tpu_v6e", (((0,), (0,)), ((), ()))),  # native
        ("float4_e2m1fn", "float4_e2m1fn", "tpu_v5e", (((0,), (1,)), ((), ()))),  # int8 x 2**k
    ],
)
def test_a_narrow_lhs_stored_k_first_reaches_the_matmul_rows_first(lhs, rhs, target, dn, capsys):
    # issue 49: with the LHS contracted along dimension 0 Mosaic transposed the narrow
    # values itself, which compiles only in compatibility mode (with it off libtpu 0.0.42.1
    # crashed); dot now transposes them as 32-bit values. The Mosaic module, as printed:
    def kernel(a_ref, b_ref, o_ref):
        o_ref[...] = emulate.pallas.dot(
            a_ref[...], b_ref[...], preferred_element_type=jnp.float32, target=target,
            dimension_numbers=dn,
        )  # fmt: skip

    def f(a, b):
        out = jax.ShapeDtypeStruct((256, 256), jnp.float32)
        return pl.pallas_call(kernel, out_shape=out, debug=True)(a, b)

    specs = [jax.ShapeDtypeStruct((256, 256), jnp.dtype(t)) for t in (lhs, rhs)]
    capsys.readouterr()
    jax.jit(f).trace(*specs).lower(lowering_platforms=("tpu",))
    printed = [ln for ln in capsys.readouterr().out.splitlines() if "tpu." in ln]
    matmuls = [ln for ln in printed if "tpu.matmul" in ln]
    assert matmuls
    for line in matmuls:
        lhs_type = line.rsplit(" : ", 1)[1].split(",")[0].strip()
        assert _NARROW_VECTOR.fullmatch(lhs_type), line  # the pair stays narrow
        assert "dot_dimension_numbers<[1], " in line, line  # contracting its dimension 1
    assert [ln for ln in printed if "tpu.transpose" in ln and _NARROW_VECTOR.search(ln)] == []


def test_bad_input_names_the_argument():
    a = jnp.ones((4, 8), jnp.int8)
    with pytest.raises(TypeError, match=r"^a: expected an array loaded from a ref"):
        emulate.pallas.dot([[1]], a)
    with pytest.raises(ValueError, match=r"^a: emulate.pallas.dot takes 2-D operands"):
        emulate.pallas.dot(jnp.ones((2, 4, 8), jnp.int8), a.T, target="tpu_v4")
    with pytest.raises(ValueError, match=r"^a, b: a's K \(8\) differs from b's K \(4\)"):
        emulate.pallas.dot(a, a, target="tpu_v4")
    with pytest.raises(
        NotImplementedError,
        match=r"^dimension_numbers: emulate.pallas.dot "
        r"contracts 2-D tiles without batch dimensions, got batch dimensions "
        r"\(0,\) and \(0,\)",
    ):
        emulate.pallas.dot(a, a, dimension_numbers=(((1,), (1,)), ((0,), (0,))), target="v4")
    with pytest.raises(
        ValueError,
        match=r"^dimension_numbers: expected one contracting "
        r"dimension of each 2-D operand, 0 or 1",
    ):
        emulate.pallas.dot(a, a, dimension_numbers=(((1, 0), (1, 0)), ((), ())), target="v4")
    with pytest.raises(TypeError, match=r"^dimension_numbers: expected \(\(lhs_contracting"):
        emulate.pallas.dot(a, a, dimension_numbers="NT", target="v4")
    with pytest.raises(TypeError, match=r"^b: dtype int16 is not a matmul operand type"):
        emulate.pallas.dot(a, jnp.ones((8, 4), jnp.int16), target="tpu_v4")
    with pytest.raises(ValueError, match=r"^target: unknown target 'tpu_v9'"):
        emulate.pallas.dot(a, a.T, target="tpu_v9")
    with pytest.raises(TypeError, match=r"^preferred_element_type: an integer result"):
        emulate.pallas.dot(
            jnp.ones((4, 8), jnp.bfloat16), a.T, preferred_element_type=jnp.int32, target="v4"
        )


def test_it_is_plain_jnp_outside_a_kernel_too():
    a = np.arange(-64, 64, dtype=np.int8).reshape(8, 16)
    got = emulate.pallas.dot(a, a.T.copy(), preferred_element_type=jnp.int32, target="tpu_v4")
    assert np.asarray(got).tolist() == reference.dot_general(a, a.T.copy(), DN, "int32").tolist()
    x = np.ones((2, 8), ml_dtypes.bfloat16)
    got = emulate.pallas.dot(x, np.full((8, 3), 0x38, np.uint8).view(ml_dtypes.float8_e4m3fn))
    assert np.asarray(got).tolist() == [[8.0] * 3] * 2  # e4m3fn 0x38 is 1.0


def test_benchmark_runs_in_interpret_mode_and_says_so(capsys, monkeypatch):
    import importlib.util
    import pathlib
    import sys

    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "pallas_matmul.py"
    spec = importlib.util.spec_from_file_location("pallas_matmul_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # dataclasses look their module up
    spec.loader.exec_module(bench)
    argv = ["--formats", "int4", "--m", "3", "--kn", "256", "--repeats", "1"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("emulate.pallas.matmul benchmark: target tpu_v5e, backend cpu")
    assert out[1].startswith("NOTE: no TPU here, so the kernel runs in Pallas TPU interpret mode")
    header, row = out[2].split(), out[3].split()
    assert header[:3] == ["format", "M", "K=N"]
    assert row[:4] == ["int4", "3", "256", "0.03"]  # 256 * 256 / 2 bytes
    assert row[-1] == "bounded" and row[-5:-3] == ["-", "-"]  # no GB/s in interpret mode


def test_f32_routes_take_one_pass_only_for_values_bf16_holds():
    # decoded low-precision values are exact in bf16: one bf16 pass multiplies them
    # exactly (HIGHEST's extra passes cost v2 / v3 more VMEM than the decode, issue 28)
    one_pass = [("int8", "int8", "int32"), ("float4_e2m1fn", "int8", "float32"),
                ("bfloat16", "float8_e4m3fn", "float32")]  # fmt: skip
    for lhs, rhs, pet in one_pass:
        r = compute.in_kernel(lhs, rhs, target="tpu_v2", preferred_element_type=pet)
        assert (r.lhs_compute, r.precision) == ("float32", None), (lhs, rhs)
    for lhs, rhs in [("float32", "int8"), ("float16", "int8"), ("float32", "float32")]:
        for target in ("tpu_v2", "tpu_v4"):
            r = compute.in_kernel(lhs, rhs, target=target, preferred_element_type="float32")
            assert (r.lhs_compute, r.precision) == ("float32", lax.Precision.HIGHEST)
