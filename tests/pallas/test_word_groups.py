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


def test_part_rows_are_the_scratch_each_part_takes():
    # GGUF Q6_K (groups of 16 rows, int8 scale codes times a float16 d per 256 rows): a row
    # a group, and the float16 factor (one) a row per 256 rows of K; K = 14336
    level = KernelLevel(code_format="int8", block=16, super_format="float16")
    q6 = Scaling(
        group=16, along_k=True, per_column=True, scale_format="float32", rows=896,
        affine=Affine(zero="static", zero_value=32, scale_level=level),
    )  # fmt: skip
    shape = types.SimpleNamespace(scaling=q6, k=14336, bk=1024, bn=256)
    assert word_groups.part_rows(shape) == [("scale", 896), ("scale_supers", 56)]
    # float16 scales per 128 rows and packed uint4 zero points (AWQ): 112 units each
    awq = Scaling(
        group=128, along_k=True, per_column=True, scale_format="float16", rows=112,
        affine=Affine(zero="packed", zero_format="uint4"),
    )  # fmt: skip
    shape = types.SimpleNamespace(scaling=awq, k=14336, bk=2048, bn=512)
    assert word_groups.part_rows(shape) == [("scale", 112), ("zero", 112)]
    # float32 scales: two factors; groups of 512 rows: a row per 256 (a tile)
    f32 = dataclasses.replace(awq, group=512, scale_format="float32", affine=None)
    shape = types.SimpleNamespace(scaling=f32, k=4000, bk=2048, bn=512)
    assert word_groups.part_rows(shape) == [("scale", 16), ("scale_hi", 16)]
    # scales constant along K: no scratch
    flat = Scaling(group=14336, along_k=False, per_column=True, scale_format="float16", rows=1)
    shape = types.SimpleNamespace(scaling=flat, k=14336, bk=2048, bn=512)
    assert word_groups.part_rows(shape) == []
