"""emulate.pallas.word_groups: codes packed along the groups (emulate.pack's bit stream)
cut out per block of groups by a one-hot dot, against the codes packed, for every width
from 2 to 8 bits and a count that ends mid-byte; the parts a call needs. The parts' values
in a kernel: tests/pallas/test_word_step.py."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import emulate
from emulate.pallas import word_groups

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
