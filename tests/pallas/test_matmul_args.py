"""emulate.pallas.matmul_args: one call's operands as the kernel reads them, worked out once
on the host (nothing is traced or run): the weight's stored array and layout, the
activations' order and type, a QArray's parts and the result type, and the argument
errors, each named. Expected layouts from the module docstring; codes against numpy."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import emulate
import emulate.pallas
from emulate.pallas.matmul_args import matmul_args, refuse_relayout
from emulate.pallas.matmul_config import Stored
from emulate.pallas.weights import KernelWeight, kernel_codes

T = "tpu_v5e"


def _int4(k: int, n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(-8, 8, (k, n)).astype(ml_dtypes.int4)


def _q4(k: int, n: int, block: int = 128) -> emulate.QArray:
    w = np.random.default_rng(1).standard_normal((k, n)).astype(np.float32)
    return emulate.quantize(w, "int4", block_shape=block, axis=0)


def test_an_int8_pair_is_read_as_stored_and_passed_through():
    x, w = np.ones((4, 256), np.int8), np.full((256, 128), -3, np.int8)
    a = matmul_args(x, w, target=T)
    assert (a.m, a.n, a.k) == (4, 128, 256)
    assert a.stored == Stored("dense", "int8", 256)
    assert a.passthrough and a.out == "int8" and a.x_format.name == "int8"
    assert np.array_equal(np.asarray(a.w), w) and np.array_equal(np.asarray(a.x), x)
    assert a.kernel_operands[1:] == (None, None) and a.scaling is None and a.weight is w


def test_an_int4_array_is_read_one_code_a_byte_and_a_kernel_weight_as_k_planar():
    w = _int4(300, 128)
    x = np.ones((2, 300), np.float32)
    # ml_dtypes' int4 takes a byte per element: the kernel reads the array as stored
    a = matmul_args(x, w, target=T)
    assert a.stored == Stored("dense", "int4", 300) and not a.passthrough
    kw = emulate.pallas.prepare_weight(w)
    p = matmul_args(x, kw, target=T)
    # 300 rows: one K-planar tile of 256 rows and a second one padded with zero codes
    assert p.stored == Stored("planar", "uint8", 256, 2, 1) and p.w_format.name == "int4"
    codes = kernel_codes(KernelWeight(p.w, "int4", 300))
    assert np.array_equal(np.asarray(codes), w.view(np.uint8) & 0xF)


def test_packed_weights_of_one_byte_a_group_stay_packed_others_become_planar():
    w = _int4(256, 128)
    p = emulate.pack(w, axis=0)
    a = matmul_args(np.ones((2, 256), jnp.bfloat16), p, target=T)
    assert a.stored == Stored("packed", "uint8", 128, 2, 1)
    assert np.array_equal(np.asarray(a.w), np.asarray(p.data))
    codes = np.random.default_rng(2).integers(0, 64, (512, 128)).astype(np.uint8)
    a6 = matmul_args(np.ones((2, 512), jnp.bfloat16), emulate.pack(codes, "e2m3", axis=0), target=T)
    assert a6.stored == Stored("planar", "uint8", 384, 4, 3)
    back = kernel_codes(KernelWeight(a6.w, "float6_e2m3fn", 512))
    assert np.array_equal(np.asarray(back), codes)


def test_a_group_scaled_packed_qarray_is_k_planar_under_float32_activations():
    q = _q4(512, 256)
    assert isinstance(q.codes, emulate.Packed)
    bf = matmul_args(np.ones((8, 512), jnp.bfloat16), q, target=T)
    assert bf.stored.layout == "packed"
    f32 = matmul_args(np.ones((8, 512), np.float32), q, target=T)
    assert f32.stored == Stored("planar", "uint8", 256, 2, 1)
    assert f32.scaling == bf.scaling and f32.scaling is not None and f32.scaling.along_k
    assert f32.out == "float32" and bf.out == "float32"
    # an empty call is not laid out again (nothing is launched)
    empty = matmul_args(np.ones((0, 512), np.float32), q, target=T)
    assert empty.empty and empty.stored.layout == "packed"


def test_act_order_along_k_gathers_x_and_drops_the_permutation_from_the_weight():
    k, n = 256, 128
    perm = np.random.default_rng(3).permutation(k).astype(np.int32)
    q = dataclasses.replace(_q4(k, n), perm=jnp.asarray(perm), perm_axis=-2)
    x = np.arange(2 * k, dtype=np.float32).reshape(2, k)
    a = matmul_args(x, q, target=T)
    assert np.array_equal(np.asarray(a.x), x[:, perm])
    assert a.perm_axis == -2 and np.array_equal(np.asarray(a.perm), perm)
    assert a.weight.perm is None and a.weight.perm_axis is None


def test_float16_activations_are_widened_and_code_formats_take_the_int8_route():
    a = matmul_args(np.ones((4, 128), np.float16), np.ones((128, 128), np.int8), target=T)
    assert a.x_format.name == "float16" and a.x.dtype.name == a.compute.lhs_compute
    assert a.x.dtype.name != "float16"
    w = np.random.default_rng(4).standard_normal((256, 128)).astype(np.float32)
    q = emulate.quantize(w, "int3", block_shape=64, axis=0)
    a3 = matmul_args(np.ones((4, 256), np.int8), q, target=T)
    assert a3.stored.code == "int3" and a3.compute.rhs == "int8"


def test_a_prepared_weight_gives_the_same_record_as_its_qarray():
    q = _q4(256, 128)
    x = np.ones((4, 256), jnp.bfloat16)
    a, p = matmul_args(x, q, target=T), matmul_args(x, emulate.pallas.prepare_weight(q), target=T)
    assert (a.scaling, a.out, a.compute, a.w_format) == (p.scaling, p.out, p.compute, p.w_format)
    assert isinstance(p.weight, emulate.pallas.KernelQWeight)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: matmul_args(np.ones((4, 8), np.int8), np.ones((8, 4), np.int8), target="cpu"),
         ValueError, r"^target: emulate.pallas.matmul is a TPU kernel and the target is cpu; "),
        (lambda: matmul_args(_q4(256, 128), np.ones((256, 4), np.int8), target=T),
         NotImplementedError, r"^x: emulate.pallas.matmul decodes a QArray weight \(w\) only, "
         r"not QArray activations"),
        (lambda: matmul_args(np.ones((4, 256), np.int8), _q4(256, 128), target=T,
                             w_format="int8"),
         ValueError, r"^w_format: int8 disagrees with the QArray w's format int4$"),
        (lambda: matmul_args(np.ones((4, 256), np.int8), _q4(256, 128), target=T,
                             out_dtype=jnp.int32),
         ValueError, r"^out_dtype: a QArray weight's product is a float; expected float32, "
         r"bfloat16 or float16, got int32$"),
        (lambda: matmul_args(np.ones((4, 8), np.float32),
                             KernelWeight(np.zeros((128, 4), np.uint8), "int4", 8),
                             target=T, w_format="uint4"),
         ValueError, r"^w_format: uint4 disagrees with the KernelWeight's format int4$"),
    ],
)  # fmt: skip
def test_the_builder_names_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()


def _awq_like(k: int, n: int) -> emulate.QArray:
    """uint4 codes packed along K, float16 scales and uint4 zero points packed along N (as
    AutoAWQ stores them) per 128 rows."""
    rng = np.random.default_rng(2)
    codes = rng.integers(0, 16, (k, n)).astype(ml_dtypes.uint4)
    z = rng.integers(0, 16, (k // 128, n)).astype(ml_dtypes.uint4)
    return emulate.QArray.from_parts(
        emulate.pack(codes, axis=0), jnp.ones((k // 128, n), jnp.float16),
        block_shape=(128, 1), zero_points=emulate.pack(z, axis=1),
    )  # fmt: skip


RELAYOUT = (
    "w: a QArray int4[512, 128] is not stored as the TPU kernel reads it: its codes (into "
    "the K-planar layout) would be laid out again on every call of the program (a copy of "
    "the weight each call, several times its stored bytes); prepare it once, outside the "
    "program: emulate.pallas.prepare_weight(w) (a model's parameters: "
    "emulate.prepare_weights(params, target=...); emulate.flax.load_weights and "
    "quantize_model do it under emulate.target(...) with a TPU target)"
)


def test_what_a_call_lays_out_again_is_named_and_refused_in_a_tpu_program():
    x = jnp.ones((2, 512), jnp.bfloat16)
    q32, awq = _q4(512, 128, block=32), _awq_like(512, 128)
    # groups of 32 rows split the packed column planes: the codes go K-planar, a copy;
    # AWQ's zero points packed along N are packed along the groups again
    assert matmul_args(x, q32, target=T).relaid == ("codes (into the K-planar layout)",)
    assert matmul_args(x, awq, target=T).relaid == ("zero points",)
    assert matmul_args(x, _q4(512, 128), target=T).relaid == ()  # 128 rows: as stored
    for q in (q32, awq):
        assert matmul_args(x, emulate.pallas.prepare_weight(q), target=T).relaid == ()

    def tpu_program(w):  # as emulate.pallas.matmul checks it, built for a TPU
        refuse_relayout(matmul_args(x, w, target=T), w, interpret=False)

    with pytest.raises(emulate.pallas.RelayoutError) as e:
        jax.make_jaxpr(tpu_program)(q32)
    assert str(e.value) == RELAYOUT and isinstance(e.value, ValueError)
    with pytest.raises(emulate.pallas.RelayoutError, match=r"its zero points would be laid"):
        jax.make_jaxpr(tpu_program)(awq)
    # a weight that is no tracer (a constant is laid out once, as the program is traced),
    # interpret mode (no TPU program) and nothing to lay out are let through
    tpu_program(q32)
    jax.make_jaxpr(lambda w: refuse_relayout(matmul_args(x, w, target=T), w, True))(q32)
    jax.make_jaxpr(tpu_program)(emulate.pallas.prepare_weight(q32))
