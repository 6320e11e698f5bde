"""``emulate.pallas.dot``: a matmul for values loaded inside a Pallas TPU kernel.

A kernel written with ``jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.int32)``
on int8 tiles lowers to a ``tpu.matmul`` with int8 operands, which Mosaic rejects on a
chip whose matrix unit has no int8 path (``Unsupported matmul RHS type on target:
'vector<256x256xi8>'`` on a TPU v4 or v7x). Written with :func:`dot`, the same kernel
applies the target's rules when it is traced: the ``tpu.matmul`` keeps int8 operands on a
TPU v5e / v6e and gets exactly decoded bf16 operands (f32 sums, exact for integers
because every chunk of at most 1024 int8 products fits f32's 24 bits) on a v4 or v7x.

What the decode adds to a kernel's VMEM: :func:`dot_vmem_bytes` says it for given operands
(0 for a native pair; otherwise ``(4 + compute bytes)`` per decoded element, plus ``4 * M *
N`` for an exact sum in f32). Raise ``vmem_limit_bytes`` (``pltpu.CompilerParams``) by as
much, or shrink the blocks.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from emulate import formats, targets
from emulate.formats import FormatLike
from emulate.numerics import accumulate
from emulate.pallas import compute
from emulate.targets import TargetLike

__all__ = ["dot", "dot_vmem_bytes"]


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


_MATMUL_DN = (((1,), (0,)), ((), ()))
_LANES = 128


def _dimension_numbers(dn: Any) -> Any:
    """``dn`` as ``(((ca,), (cb,)), ((), ()))`` with ``ca, cb`` in 0, 1 (2-D operands)."""
    if dn is None:
        return _MATMUL_DN
    try:
        (ca, cb), (ba, bb) = dn
        ca, cb, ba, bb = (tuple(int(d) for d in x) for x in (ca, cb, ba, bb))
    except (TypeError, ValueError):
        raise TypeError(
            "dimension_numbers: expected ((lhs_contracting, rhs_contracting), (lhs_batch, "
            f"rhs_batch)) of int sequences, as lax.dot_general takes them; got {dn!r}"
        ) from None
    if ba or bb:
        raise NotImplementedError(
            f"dimension_numbers: emulate.pallas.dot contracts 2-D tiles without batch "
            f"dimensions, got batch dimensions {ba} and {bb}; loop over the batch in the "
            "kernel (or its grid)"
        )
    if len(ca) != 1 or len(cb) != 1 or ca[0] not in (0, 1) or cb[0] not in (0, 1):
        raise ValueError(
            "dimension_numbers: expected one contracting dimension of each 2-D operand, 0 "
            f"or 1 (((1,), (0,)) for a @ b, ((1,), (1,)) for a @ b.T), got {ca} and {cb}"
        )
    return ((ca[0],), (cb[0],)), ((), ())


def _checked(a: Any, b: Any, dimension_numbers: Any) -> tuple[formats.Format, formats.Format, Any]:
    """The operands' formats and the dimension numbers, after :func:`dot`'s checks."""
    fa, fb = _format_of(a, "a"), _format_of(b, "b")
    for arg, x in (("a", a), ("b", b)):
        if len(x.shape) != 2:
            raise ValueError(
                f"{arg}: emulate.pallas.dot takes 2-D operands (M, K) @ (K, N), got shape "
                f"{tuple(x.shape)}"
            )
    dn = _dimension_numbers(dimension_numbers)
    (ca,), (cb,) = dn[0]
    if a.shape[ca] != b.shape[cb]:
        raise ValueError(
            f"a, b: a's K ({a.shape[ca]}) differs from b's K ({b.shape[cb]}); shapes "
            f"{tuple(a.shape)} and {tuple(b.shape)}, contracting dimensions {ca} and {cb}"
        )
    return fa, fb, dn


def _decode_step(r: compute.Compute, fa: formats.Format, fb: formats.Format, k: int) -> int:
    """How much of K to decode at a time: for K longer than the target's MXU width, that
    width if it divides K, else 128 if that does; else all of K, as for 4-bit operands
    (both formats must take a byte or more). The decoded copies and temporaries alive at
    once are then those of one K-slice (issue 28: the (128, 512) x (512, 256) int8 blocks
    of pytorch/xla's quantized matmul took 314368 bytes more scoped VMEM on a TPU v4, not
    556032, and fit the kernel's own limit)."""
    if min(fa.bits, fb.bits) < 8:
        return max(k, 1)
    mxu = targets.get(r.target).mxu_column_size or _LANES
    if k > mxu:
        for width in (mxu, _LANES):
            if k % width == 0:
                return width
    return max(k, 1)


def _k_slice(x: jax.Array, start: int, step: int, axis: int, k: int) -> jax.Array:
    return x if step >= k else lax.slice_in_dim(x, start, start + step, axis=axis)


def dot(
    a: jax.Array,
    b: jax.Array,
    *,
    preferred_element_type: FormatLike | None = None,
    target: TargetLike = None,
    precision: lax.PrecisionLike = None,
    dimension_numbers: Any = None,
) -> jax.Array:
    """``a @ b`` for 2-D values inside a Pallas TPU kernel, lowered the way ``target`` runs it.

    Call it where a kernel would call ``jnp.dot`` on loaded tiles. At trace time it looks
    up how ``target``'s matrix unit runs the operand pair (:func:`emulate.plan`, corrected
    for Pallas' signed-integer dot): a native pair becomes one ``tpu.matmul`` of the
    operands as they are; any other pair is decoded exactly, in vector registers, into the
    type the unit takes (int8 after a power-of-two scaling, bf16 or f32) and contracted
    with an int32 or f32 accumulator, in K-chunks short enough that exact-class sums stay
    exact. The decoding goes a K-slice of the MXU width at a time, summed as it goes, so
    that the kernel holds one slice's decoded copies (:func:`dot_vmem_bytes`).

    Args:
      a: an (M, K) array loaded from a ref ((K, M) if ``dimension_numbers`` contract its
        dimension 0): int8, uint8, int4, uint4, a float8 type, bfloat16, float16 or
        float32.
      b: a (K, N) array ((N, K) if ``dimension_numbers`` contract its dimension 1),
        likewise.
      preferred_element_type: the result type, as for ``lax.dot_general`` (default: what
        ``lax.dot_general`` returns for the pair, e.g. int8 for int8 x int8: pass
        ``jnp.int32`` for the int32 sum).
      target: a TPU target name or :class:`emulate.targets.Target`; default the current
        one (``emulate.target(...)``, ``EMULATE_TARGET``), read when the kernel is traced.
        JAX caches traces: pass it explicitly when one process traces a kernel for several
        targets.
      precision: passed to native float dots (decoded operands are exact; f32 ones are
        multiplied at ``Precision.HIGHEST`` where bf16 cannot hold their values, in one
        bf16 pass where it can).
      dimension_numbers: None (``a @ b``), or ``lax.dot_general``'s with one contracting
        dimension per operand and no batch dimensions: ``(((1,), (1,)), ((), ()))`` takes
        ``b`` as stored (N, K), ``a @ b.T``, so that a transposed narrow operand is
        contracted as it is, with no transpose (which Mosaic converts only in
        compatibility mode for narrow types).

    Returns:
      An (M, N) array of the result type (M: ``a``'s free dimension, N: ``b``'s). Integer
      pairs: the int32 sum (wrapping past 2**31 as XLA's integer dots do) converted to the
      result type; other exact-class pairs (float4_e2m1fn with integers or itself): the
      exact sum rounded once; the other float pairs: f32 accumulation, within the bound of
      mode "fast".

    Raises:
      TypeError: an operand that is not an array of a matmul operand type, or an integer
        result type for float operands.
      ValueError: operands that are not 2-D or whose K differ, dimension numbers that do
        not contract one dimension of each, or an unknown target.
      NotImplementedError: dimension numbers with batch dimensions.
    """
    fa, fb, dn = _checked(a, b, dimension_numbers)
    r = compute.in_kernel(fa, fb, target=target, preferred_element_type=preferred_element_type)
    out = jnp.dtype(formats.get(r.out).dtype)
    if r.method == "native":
        acc = compute.float_dot(a, b, precision if precision is not None else r.precision, dn)
        return accumulate.round_accumulator(acc, r.out) if acc.dtype != out else acc
    (ca,), (cb,) = dn[0]
    k = a.shape[ca]
    step = _decode_step(r, fa, fb, k)
    total = None  # summed as the pieces come: each (M, N) partial dies at once
    for start in range(0, k, step) if k else (0,):  # one piece when K is not cut
        x = compute.decode_values(_k_slice(a, start, step, ca, k), r.lhs_compute, r.lhs_scale)
        y = compute.decode_values(_k_slice(b, start, step, cb, k), r.rhs_compute, r.rhs_scale)
        if r.exact:  # int32, wrapping as XLA's integer dots do
            part = compute.exact_dot(x, y, r, dn)
        else:
            part = compute.float_dot(x, y, r.precision, dn)
        total = part if total is None else total + part
    assert total is not None
    if not r.exact:
        return accumulate.round_accumulator(total, r.out) if total.dtype != out else total
    if formats.get(r.out).is_integer:
        return accumulate.round_accumulator(total, r.out) if out != jnp.int32 else total
    hi, lo = accumulate.split(total)
    return accumulate.round_limbs(hi, lo, r.scale, r.out)


def dot_vmem_bytes(
    a: Any,
    b: Any,
    *,
    preferred_element_type: FormatLike | None = None,
    target: TargetLike = None,
    dimension_numbers: Any = None,
) -> int:
    """The VMEM, in bytes, that :func:`dot` on ``a`` and ``b`` adds to a kernel: raise the
    kernel's ``vmem_limit_bytes`` (``pltpu.CompilerParams``) by this much.

    Takes :func:`dot`'s arguments (arrays, or anything with ``shape`` and ``dtype``, such as
    ``jax.ShapeDtypeStruct``) and applies the same checks. A native pair adds nothing. Each
    decoded operand adds ``(4 + c) * size`` bytes: its copy in the compute type (``c`` = 1
    for int8, 2 for bf16, 4 for f32) and the decode's 32-bit temporaries; an operand
    already of the compute type (f32 activations on an f32 route) adds nothing. An exact
    sum in f32 (an exact-class pair on a bf16 / f32 route) adds ``4 * M * N`` for its
    int32 copy.

    It is an upper estimate from the decode's steps (whole tiles, though :func:`dot`
    decodes K a slice at a time), checked against the real compiler
    (tests/pallas/test_kernel_dot_vmem.py: pytorch/xla's quantized matmul with ``dot`` in
    place of its ``lax.dot_general``, int8 x int8, against the same kernel's plain dot on
    a TPU v5e, which runs the pair natively): Mosaic used 24-41% of it on a v4, 62-100% on
    a v2 or v3 (whose Mosaic runs f32 dots only).

    Raises:
      TypeError, ValueError, NotImplementedError: as :func:`dot`.
    """
    fa, fb, dn = _checked(a, b, dimension_numbers)
    r = compute.in_kernel(fa, fb, target=target, preferred_element_type=preferred_element_type)
    if r.method == "native":
        return 0
    total = 0
    for x, f, to, scale in (
        (a, fa, r.lhs_compute, r.lhs_scale),
        (b, fb, r.rhs_compute, r.rhs_scale),
    ):
        if f.name == to and not scale:  # decode_values returns it as it is
            continue
        total += (4 + jnp.dtype(to).itemsize) * int(np.prod(x.shape))
    if r.exact and r.lhs_compute != "int8":
        (ca,), (cb,) = dn[0]
        total += 4 * int(a.shape[1 - ca]) * int(b.shape[1 - cb])
    return total
