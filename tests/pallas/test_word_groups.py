"""emulate.pallas.word_groups: codes packed along the groups (emulate.pack's bit stream)
cut out per block of groups by a one-hot dot, against the codes packed, for every width
from 2 to 8 bits and a count that ends mid-byte; the parts a call needs. The parts' values
in a kernel: tests/pallas/test_word_step.py."""

from __future__ import annotations

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import emulate
from emulate.pallas import word_groups
from emulate.pallas.qoffsets import Affine, KernelLevel
from emulate.pallas.qweight import Scaling

FORMATS = {2: "uint2", 3: "uint3", 4: ml_dtypes.uint4, 5: "uint5", 6: "uint6"}


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_packed_codes_are_the_codes_packed(bits):
    count = 133  # over two blocks of 64 groups, ending mid-byte for every width below 8
    codes = np.random.default_rng(bits).integers(0, 1 << bits, (count, 256)).astype(np.uint8)
    if bits == 8:
        data = codes
    elif bits == 4:
        data = np.asarray(emulate.pack(codes.astype(ml_dtypes.uint4), axis=0).data)
    else:
        data = np.asarray(emulate.pack(codes, FORMATS[bits], axis=0).data)
    cut = jax.jit(functools.partial(word_groups.packed_codes, bits=bits, count=count))
    got = cut(jnp.asarray(data, jnp.int32))
    np.testing.assert_array_equal(np.asarray(got), codes.astype(np.int32))


def test_scratch_bytes_count_the_parts_of_the_call():
    # GGUF Q6_K (groups of 16 rows, int8 scale codes times a float16 d per 256 rows): one
    # part with a row a group, six live (units, bn) arrays, and the float16 factor (one) a
    # row per 256 rows of K; K = 14336 in steps of 1024, bn = 256
    level = KernelLevel(code_format="int8", block=16, super_format="float16")
    q6 = Scaling(
        group=16, along_k=True, per_column=True, scale_format="float32", rows=896,
        affine=Affine(zero="static", zero_value=32, scale_level=level),
    )  # fmt: skip
    shape = types.SimpleNamespace(scaling=q6, k=14336, bk=1024, bn=256)
    assert word_groups.scratch_bytes(shape) == (6 * 896 + 56) * 256 * 4
    # float16 scales per 128 rows and packed uint4 zero points (AWQ): two parts, 112 units
    awq = Scaling(
        group=128, along_k=True, per_column=True, scale_format="float16", rows=112,
        affine=Affine(zero="packed", zero_format="uint4"),
    )  # fmt: skip
    shape = types.SimpleNamespace(scaling=awq, k=14336, bk=2048, bn=512)
    assert word_groups.scratch_bytes(shape) == 2 * 6 * 112 * 512 * 4
    # float32 scales (two factors, two parts); none along K: no scratch
    f32 = dataclasses.replace(awq, scale_format="float32", affine=None)
    shape = types.SimpleNamespace(scaling=f32, k=14336, bk=2048, bn=512)
    assert word_groups.scratch_bytes(shape) == 2 * 6 * 112 * 512 * 4
    flat = Scaling(group=14336, along_k=False, per_column=True, scale_format="float16", rows=1)
    shape = types.SimpleNamespace(scaling=flat, k=14336, bk=2048, bn=512)
    assert word_groups.scratch_bytes(shape) == 0
