"""emulate.engine.prepared: a prepared weight read back as the XLA route reads it (its
QArray, or an Operand of its codes; stacked experts packed along K again), its abstract
view, and the validators keeping it in the call record beside that view."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import emulate
import emulate.pallas
from emulate.engine import prepared
from emulate.engine.args import dot_args
from emulate.engine.operands import Operand

_RNG = np.random.default_rng(4)
W = _RNG.standard_normal((256, 128)).astype(np.float32)
Q4 = emulate.quantize(W, "int4", block_shape=32, axis=0, scale_fmt="float16")
CODES = _RNG.integers(-8, 8, (256, 128)).astype(np.int8)
DN = (((1,), (0,)), ((), ()))


def test_a_prepared_qarray_reads_back_as_its_qarray():
    p = emulate.pallas.prepare_weight(Q4)
    assert prepared.is_prepared(p) and isinstance(p, prepared.Prepared)
    assert not prepared.is_prepared(Q4) and not prepared.is_prepared(jnp.ones(3))
    back = prepared.unprepared(p)
    assert isinstance(back, emulate.QArray) and back.block_shape == Q4.block_shape
    np.testing.assert_array_equal(np.asarray(back.codes), np.asarray(emulate.unpack(Q4.codes)))
    assert np.asarray(back.scales).dtype == np.float16  # bits as float16 again
    np.testing.assert_array_equal(np.asarray(back.scales), np.asarray(Q4.scales))
    view = prepared.view(p)
    assert isinstance(view.codes, jax.ShapeDtypeStruct) and view.shape == (256, 128)
    assert prepared.unprepared(Q4) is Q4 and prepared.view(Q4) is Q4


def test_a_prepared_packed_weight_reads_back_as_its_codes():
    p = emulate.pallas.prepare_weight(emulate.pack(jnp.asarray(CODES, jnp.int4), axis=0))
    back = prepared.unprepared(p)
    assert isinstance(back, Operand) and back.format_name == "int4"
    assert back.value.dtype == np.uint8  # one code a byte, two's complement nibbles
    np.testing.assert_array_equal(np.asarray(back.value), CODES.view(np.uint8) & 0xF)


def test_stacked_experts_read_back_packed_along_k():
    codes = _RNG.integers(0, 16, (2, 64, 128)).astype(np.uint8).view(ml_dtypes.float4_e2m1fn)
    scales = np.ones((2, 2, 128), ml_dtypes.float8_e8m0fnu)
    q = emulate.QArray.from_parts(emulate.pack(codes, axis=1), scales, block_shape=(1, 32, 1))
    back = prepared.unprepared(emulate.pallas.prepare_experts(q))
    assert isinstance(back.codes, emulate.Packed) and back.codes.axis == q.codes.axis
    np.testing.assert_array_equal(np.asarray(back.codes.data), np.asarray(q.codes.data))


def test_dot_args_keeps_the_prepared_weight_beside_its_view():
    p = emulate.pallas.prepare_weight(Q4)
    x = jnp.ones((3, 256), jnp.bfloat16)
    call = dot_args(x, p, DN, target="tpu_v5e")
    assert call.prepared == (None, p) and call.operands[1] is p
    assert isinstance(call.rhs, emulate.QArray) and call.has_qarray  # the view
    assert call.result == "float32" and call.tag().rhs == "int4[256,128]:float16:blocks(32,1)"
    back = call.read_back()
    assert back.prepared == (None, None) and isinstance(back.rhs.codes, jax.Array)
    plain = dot_args(x, Q4, DN)
    assert plain.prepared == (None, None) and plain.read_back() is plain
