"""The independent oracle: decoding and dot_general in numpy + ml_dtypes, exactly.

Modules: :mod:`~emulate.reference.decoding` (:func:`decode`), :mod:`~emulate.reference.exact`
(:func:`round_exact`, :func:`exact_dot_general`, :func:`dot_general`, :func:`ragged_dot`),
:mod:`~emulate.reference.quantizing` (:func:`quantize`, :func:`dequantize`),
:mod:`~emulate.reference.rounding` (encoding with every rounding mode) and
:mod:`~emulate.reference.codes` (formats without an ml_dtypes type).

Everything here is computed without JAX and without emulate's codecs or executors (only
the format records of :mod:`emulate.formats`), so that those can be tested against it.

* :func:`decode` turns values of a format, or raw codes, into float32, bfloat16 or float64
  with ml_dtypes' own casts.
* :func:`round_exact` rounds an exact dyadic value ``numerator * 2**exponent`` once,
  to nearest with ties to even, into a float format, with that format's overflow rule.
* :func:`exact_dot_general` is the exact sum of products, as :class:`fractions.Fraction`.
* :func:`dot_general` has the semantics of ``jax.lax.dot_general``: its output dtype, its
  integer wrap-around, and a float result that is the exact sum rounded once.

``np.dot`` / ``np.matmul`` on ml_dtypes arrays are no reference. With numpy 2.4 and
ml_dtypes 0.7 both accumulate in float32; ``np.dot`` then rounds that float32 sum into the
input dtype (a double rounding) and ``np.matmul`` returns it as float32, not lax's result
dtype. For float8_e5m2 ``[1, 1, 2**-16] . [1, 0.125, 2**-16]`` the exact sum
``1.125 + 2**-32`` rounds to 1.25; ``np.dot`` gives 1.0, ``np.matmul`` 1.125 (float32).

Every finite value of every format is an integer times a power of two, so the reference
scales each operand to integers, sums with Python ints (or int64 where a bound proves it
cannot overflow) and rounds that exact sum once.
"""

from emulate.reference.decoding import decode
from emulate.reference.exact import dot_general, exact_dot_general, ragged_dot, round_exact
from emulate.reference.quantizing import dequantize, quantize

__all__ = [
    "decode",
    "dequantize",
    "dot_general",
    "exact_dot_general",
    "quantize",
    "ragged_dot",
    "round_exact",
]
