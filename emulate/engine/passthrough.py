"""Which front-end calls go to JAX unchanged: the calls emulate has nothing to add to.

A drop-in behaves as what it replaces wherever emulate has nothing to add: a call whose
operands are plain arrays of JAX's own types, or a low-precision pair the target runs
natively with a plan that is the native dot and nothing more, is handed to
``lax.dot_general`` / ``jnp.matmul`` / ``lax.conv_general_dilated`` / ``jnp.einsum`` as it
is, so result types, values and exceptions are JAX's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from emulate import formats
from emulate.engine.operands import Operand
from emulate.engine.prepared import Prepared
from emulate.formats import FormatLike
from emulate.numerics.storage import Packed, is_array
from emulate.planning.plan import plan, runs_as_is
from emulate.quantized.array import QArray
from emulate.targets import TargetLike, current_mode

__all__ = ["PLANNED", "is_plain", "passes_through", "unplanned_integer_result", "xla_holds"]

#: The operand types emulate plans for: the low-precision formats and the wide floats.
PLANNED: tuple[str, ...] = formats.LOW_PRECISION + formats.WIDE_FLOATS


#: Non-array operands handed to JAX as they are (its rules and errors).
_JAX_VALUES = (int, float, complex, bool, np.generic, list, tuple)


def is_plain(x: Any) -> bool:
    """Whether ``x`` is what JAX itself takes (not a QArray, Packed array, Operand or
    prepared weight)."""
    return not isinstance(x, (QArray, Packed, Operand, Prepared))


def passes_through(
    lhs: Any,
    rhs: Any,
    lhs_format: FormatLike | None,
    rhs_format: FormatLike | None,
    target: TargetLike,
    mode: str | None,
    preferred_element_type: FormatLike | None,
) -> bool:
    """Whether a dot or convolution call goes to JAX unchanged.

    True in mode "fast" for plain operands (no formats given, no QArray or Packed array)
    that are not both arrays but values JAX takes (Python scalars, lists: JAX's rules and
    errors; None or any other object is emulate's TypeError), or whose
    dtypes :func:`emulate.runs_as_is` on ``target`` and, where one is a low-precision
    format and both are types emulate plans for, whose plan is the native dot with no
    exact K-chunking and no host fallback (or no plan at all: a ``preferred_element_type``
    emulate does not plan for, which JAX then takes or refuses), and whose result type is
    not a low-precision float (XLA:CPU rounds a float8 dot result through float16, twice;
    emulate rounds the f32 sum once, as its contract says). False in mode "exact"
    (every covered pair gets the exact sum), for anything emulate must decode, and for a
    ``preferred_element_type`` an XLA dot cannot return (float4, int4: emulate's route
    rounds the sum into it, where JAX's call fails in XLA's verifier; float6: emulate's
    ValueError).
    """
    if current_mode(mode) != "fast" or lhs_format is not None or rhs_format is not None:
        return False
    if not (is_plain(lhs) and is_plain(rhs)):
        return False
    if not (is_array(lhs) and is_array(rhs)):
        # Python scalars and lists: JAX's rules and errors; None or any other object:
        # emulate's TypeError naming the operand (JAX's plain step would read its shape).
        return all(is_array(x) or isinstance(x, _JAX_VALUES) for x in (lhs, rhs))
    if not xla_holds(preferred_element_type):
        return False  # emulate's ValueError, not XLA's runtime error
    la, lb = np.dtype(lhs.dtype).name, np.dtype(rhs.dtype).name
    if not runs_as_is(la, lb, target=target):
        return False
    low = formats.LOW_PRECISION
    if la not in PLANNED or lb not in PLANNED or not (la in low or lb in low):
        return True
    try:
        p = plan(la, lb, target=target, preferred_element_type=preferred_element_type, mode=mode)
    except (TypeError, ValueError, NotImplementedError):
        # A native pair with a result type emulate does not plan (int16, float64) or
        # refuses (an integer result of floats): JAX's own result or error.
        return True
    if formats.get(p.out).is_float and p.out in low:
        # XLA:CPU rounds a dot's float8 result twice (f32 -> f16 -> f8: a float
        # normalization pass adds the f16); emulate's native route rounds the f32 sum once.
        return False
    return p.method == "native" and p.fallback is None and p.k_chunk is None


def xla_holds(preferred_element_type: FormatLike | None) -> bool:
    """False for a result type of emulate's formats that an XLA dot cannot return (float6,
    sub-byte types: :func:`emulate.formats.xla_result`): such a call is emulate's, on every
    front end (the drop-ins here, :func:`emulate.polyfill`'s equations)."""
    if preferred_element_type is None:
        return True
    try:
        return formats.xla_result(formats.get(preferred_element_type))
    except (TypeError, ValueError):
        return True  # no format of emulate's: JAX's result or error


def unplanned_integer_result(
    preferred_element_type: FormatLike | None, a: Operand, b: Operand
) -> np.dtype | None:
    """An integer result type of at most 32 bits that emulate has no format for (int16,
    uint16, uint32: jnp promotes int8 with uint8 to int16), asked of two integer operands;
    None otherwise. The front ends compute such a call with an int32 result and convert it:
    the int32 sum wraps into the narrower type as XLA's own integer dot wraps."""
    if preferred_element_type is None or not (a.format.is_integer and b.format.is_integer):
        return None
    try:
        dt = np.dtype(preferred_element_type)
    except TypeError:
        return None
    if dt.kind not in "iu" or dt.itemsize > 4 or dt.name in formats.MATMUL_OPERANDS:
        return None
    return dt
