"""emulate.engine.slices: digit slices rebuild every code of every format, against Python
integers."""

from __future__ import annotations

from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import emulate
from emulate import formats
from emulate import testing as et
from emulate.engine.slices import static_slices
from emulate.planning import slicing

DIGIT_FORMATS = [
    n for n in formats.LOW_PRECISION if formats.get(n).is_float and formats.get(n).has_subnormals
]


# By default every format but e4m3fnuz, e3m4 and e3m2fn (the same digit slicing as the
# e4m3fn, e4m3b11fnuz and e2m3fn kept), which run under EMULATE_LONG_TESTS=1.
LONG_DIGIT_FORMATS = {"float8_e4m3fnuz", "float8_e3m4", "float6_e3m2fn"}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.long) if n in LONG_DIGIT_FORMATS else n
        for n in DIGIT_FORMATS
    ],
)
def test_digit_slices_rebuild_every_code(name):
    # Oracle: Python integers. Every finite value over 2**q_min is an integer V; its digit
    # slices, scaled by 2**(width * i), must add up to it with the value's sign, each digit
    # within max_int; and one digit fewer must not reach the format's largest V.
    f = formats.get(name)
    codes = np.array(et.finite_codes(f), np.uint8)
    values = [Fraction(float(x)) for x in codes.view(f.dtype).astype(np.float64)]
    decoded = emulate.decode(jnp.asarray(codes), name, to=jnp.float32)
    chosen = {}
    for w in range(1, 17):
        try:
            chosen[w] = slicing.slicing(name, w, digits=True)
        except ValueError:
            continue
    # jitted as emulate's programs run it, every width in one program (one compile per
    # format, not one per width or per operation)
    every = jax.jit(lambda d, ss: [static_slices(d, s, "float32") for s in ss], static_argnums=1)
    sliced = dict(zip(chosen, every(decoded, tuple(chosen.values())), strict=True))
    widths = 0
    for w, s in chosen.items():
        widths += 1
        largest = max(abs(v) for v in values) / Fraction(2) ** s.q_min
        assert largest.denominator == 1 and largest <= s.largest < 2**32
        parts = np.stack([np.asarray(x, np.int64) for x in sliced[w]])
        assert parts.shape[0] == s.count and np.abs(parts).max() <= s.max_int == 2 ** (w - 1)
        for j, v in enumerate(values):
            total = sum(int(parts[i, j]) << (w * i) for i in range(s.count))
            assert Fraction(total) * Fraction(2) ** s.q_min == v, (w, v)
        if s.count > 1:  # no fewer digits would do: the most count - 1 of them hold
            half, n = 2 ** (w - 1), s.count - 1
            most = (half << (w * (n - 1))) + sum((half - 1) << (w * i) for i in range(n - 1))
            assert most < s.largest
    assert widths > 0 or name == "float8_e5m2fnuz"  # its |v| / 2**q_min reaches 2**32
