"""emulate.numerics.bits.frexp_bits: (m, e) of every kind of float32 bit pattern, checked
against math.frexp on the exact values (Python floats, which hold every f32)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from emulate.numerics.bits import frexp_bits

#: Zeros, the smallest and largest subnormals, powers of two around 2**-126, normal
#: extremes, Inf, NaN, and both signs of each.
SPECIAL = [0x0, 0x1, 0x2, 0x3, 0x00400000, 0x007FFFFF, 0x00800000, 0x00800001, 0x3F800000]
SPECIAL += [0x3FFFFFFF, 0x7F7FFFFF, 0x7F800000, 0x7FC00000, 0x7F800001]


def _check(words: list[int]) -> None:
    bits = np.array(words + [w | 0x80000000 for w in words], np.uint32)
    m, e = frexp_bits(bits)
    m, e = np.asarray(m), np.asarray(e)
    for i, w in enumerate(bits.tolist()):
        v = float(np.array(w, np.uint32).view(np.float32))
        if math.isnan(v):
            assert math.isnan(m[i]) and e[i] == 0, hex(w)
        elif math.isinf(v) or v == 0:
            assert m[i] == v and math.copysign(1, m[i]) == math.copysign(1, v), hex(w)
            assert e[i] == 0, hex(w)
        else:
            fm, fe = math.frexp(v)  # v = fm * 2**fe, 0.5 <= |fm| < 1
            assert (float(m[i]), int(e[i])) == (2 * fm, fe - 1), hex(w)


def test_frexp_bits_of_special_words() -> None:
    _check(SPECIAL)


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(0, 0x7FFFFFFF), min_size=64, max_size=64))
def test_frexp_bits_of_any_word(words: list[int]) -> None:
    _check(words)
