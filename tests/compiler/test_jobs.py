"""Tests for emulate.compiler.jobs: a job compiled in this process (the verdict names the
stage that refused it) and its argument specs placed on a compile-only device."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import pytest

import emulate
from emulate import compiler
from emulate.compiler import jobs
from tests.compiler._programs import matmul, spec


def test_in_process_verdicts_name_the_stage():
    acc = functools.partial(matmul, acc="int32")
    refused = jobs.compile_in_process(compiler.Job(acc, (spec("int8"),) * 2, "tpu_v4"))
    assert (refused.stage, refused.message) == (
        "compile",
        "E2001: CompileTimeMosaicUnsupportedRhsType: Unsupported matmul RHS type on target: "
        "vector<128x128xi8>",
    )
    unsigned = jobs.compile_in_process(compiler.Job(acc, (spec("uint8"),) * 2, "tpu_v5e"))
    assert unsigned.stage == "lower"
    assert unsigned.message.startswith("Unsigned integer dtype uint8 is not supported")


def test_place_specs_puts_every_leaf_on_the_device():
    dev = compiler.device("tpu_v5e")
    (placed,) = jobs.place_specs(({"a": spec("int8"), "b": [spec("float32", (2, 3))]},), dev)
    assert placed["a"].shape == (128, 128) and placed["a"].dtype == jnp.int8
    assert placed["b"][0].sharding.device_set == {dev}
    with pytest.raises(TypeError, match=r"^arg_specs: expected leaves with shape and dtype"):
        jobs.place_specs((3,), dev)


def test_place_specs_keeps_a_packed_weight_packed():
    # A Packed array has a logical shape and dtype (int4[256, 128]) but is a pytree node:
    # the argument the program gets is its uint8 data, 128 bytes along K.
    dev = compiler.device("tpu_v5e")
    w = emulate.Packed(spec("uint8", (128, 128)), "int4", -2, 256)
    (placed,) = jobs.place_specs((w,), dev)
    assert isinstance(placed, emulate.Packed) and placed.length == 256
    assert (placed.data.shape, placed.data.dtype) == ((128, 128), jnp.uint8)
    assert placed.data.sharding.device_set == {dev}
