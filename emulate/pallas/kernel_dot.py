"""``emulate.pallas.dot``: a matmul for values loaded inside a Pallas TPU kernel.

A kernel written with ``jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.int32)``
on int8 tiles lowers to a ``tpu.matmul`` with int8 operands, which Mosaic rejects on a
chip whose matrix unit has no int8 path (``Unsupported matmul RHS type on target:
'vector<256x256xi8>'`` on a TPU v4 or v7x). Written with :func:`dot`, the same kernel
applies the target's rules when it is traced: the ``tpu.matmul`` keeps int8 operands on a
TPU v5e / v6e and gets exactly decoded bf16 operands (f32 sums, exact for integers
because every chunk of at most 1024 int8 products fits f32's 24 bits) on a v4 or v7x.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats
from emulate.formats import FormatLike
from emulate.numerics import accumulate
from emulate.pallas import route
from emulate.targets import TargetLike

__all__ = ["dot"]


def _format_of(x: jax.Array, arg: str) -> formats.Format:
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TypeError(
            f"{arg}: expected an array loaded from a ref (x_ref[...]), got {type(x).__name__}"
        )
    try:
        return formats.get(np.dtype(x.dtype))
    except ValueError:
        raise TypeError(
            f"{arg}: dtype {np.dtype(x.dtype).name} is not a matmul operand type; accepted: "
            f"{', '.join(formats.MATMUL_OPERANDS)}"
        ) from None


def dot(
    a: jax.Array,
    b: jax.Array,
    *,
    preferred_element_type: FormatLike | None = None,
    target: TargetLike = None,
    precision: lax.PrecisionLike = None,
) -> jax.Array:
    """``a @ b`` for 2-D values inside a Pallas TPU kernel, lowered the way ``target`` runs it.

    Call it where a kernel would call ``jnp.dot`` on loaded tiles. At trace time it looks
    up how ``target``'s matrix unit runs the operand pair (:func:`emulate.plan`, corrected
    for Pallas' signed-integer dot): a native pair becomes one ``tpu.matmul`` of the
    operands as they are; any other pair is decoded exactly, in vector registers, into the
    type the unit takes (int8 after a power-of-two scaling, bf16 or f32) and contracted
    with an int32 or f32 accumulator, in K-chunks short enough that exact-class sums stay
    exact.

    Args:
      a: an (M, K) array loaded from a ref: int8, uint8, int4, uint4, a float8 type,
        bfloat16, float16 or float32.
      b: a (K, N) array, likewise.
      preferred_element_type: the result type, as for ``lax.dot_general`` (default: what
        ``lax.dot_general`` returns for the pair, e.g. int8 for int8 x int8: pass
        ``jnp.int32`` for the int32 sum).
      target: a TPU target name or :class:`emulate.targets.Target`; default the current
        one (``emulate.target(...)``, ``EMULATE_TARGET``), read when the kernel is traced.
        JAX caches traces: pass it explicitly when one process traces a kernel for several
        targets.
      precision: passed to native float dots (decoded operands are exact, and f32 ones
        are multiplied at ``Precision.HIGHEST``).

    Returns:
      An (M, N) array of the result type. Integer pairs: the int32 sum (wrapping past
      2**31 as XLA's integer dots do) converted to the result type; other exact-class pairs
      (float4_e2m1fn with integers or itself): the exact sum rounded once; the other float
      pairs: f32 accumulation, within the bound of mode "fast".

    Raises:
      TypeError: an operand that is not an array of a matmul operand type, or an integer
        result type for float operands.
      ValueError: operands that are not 2-D or whose K differ, or an unknown target.
    """
    fa, fb = _format_of(a, "a"), _format_of(b, "b")
    for arg, x in (("a", a), ("b", b)):
        if len(x.shape) != 2:
            raise ValueError(
                f"{arg}: emulate.pallas.dot takes 2-D operands (M, K) @ (K, N), got shape "
                f"{tuple(x.shape)}"
            )
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"a, b: a's K ({a.shape[1]}) differs from b's K ({b.shape[0]}); shapes "
            f"{tuple(a.shape)} and {tuple(b.shape)}"
        )
    r = route.route(fa, fb, target=target, preferred_element_type=preferred_element_type)
    out = jnp.dtype(formats.get(r.out).dtype)
    if r.method == "native":
        acc = route.float_dot(a, b, precision if precision is not None else r.precision)
        return accumulate.round_accumulator(acc, r.out) if acc.dtype != out else acc
    x = route.decode_values(a, r.lhs_compute, r.lhs_scale)
    y = route.decode_values(b, r.rhs_compute, r.rhs_scale)
    if not r.exact:
        acc = route.float_dot(x, y, r.precision)
        return accumulate.round_accumulator(acc, r.out) if acc.dtype != out else acc
    total = route.exact_dot(x, y, r)
    if formats.get(r.out).is_integer:
        return accumulate.round_accumulator(total, r.out) if out != jnp.int32 else total
    hi, lo = accumulate.split(total)
    return accumulate.round_limbs(hi, lo, r.scale, r.out)
