"""Dimension numbers and the canonical layouts the contractions run in.

``lax.dot_general``'s dimension numbers name, per operand, the contracting and the batch
dimensions; every other dimension is free. The result is laid out
``(batch..., lhs free..., rhs free...)``. The helpers here validate dimension numbers and
move operands into layouts with each group of dimensions merged, so that chunked and
sliced contractions index one K axis.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import TypeAlias

import jax
import jax.numpy as jnp
from jax import lax

__all__ = [
    "DimensionNumbers",
    "dot_general",
    "free_dims",
    "normalize_dimension_numbers",
    "result_shape",
    "to_bfk",
    "to_bkn",
    "to_bmk",
]

#: ``((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))``, each a tuple of ints.
DimensionNumbers: TypeAlias = tuple[
    tuple[tuple[int, ...], tuple[int, ...]], tuple[tuple[int, ...], tuple[int, ...]]
]


def free_dims(ndim: int, batch: Sequence[int], contract: Sequence[int]) -> list[int]:
    """The dimensions of an ``ndim``-dimensional operand that are neither batch nor
    contracting, in order."""
    return [d for d in range(ndim) if d not in batch and d not in contract]


def normalize_dimension_numbers(
    dimension_numbers: lax.DotDimensionNumbers,
    lhs_shape: Sequence[int],
    rhs_shape: Sequence[int],
    where: str,
) -> DimensionNumbers:
    """``dimension_numbers`` as tuples of ints, checked against the operand shapes.

    ``where`` ends every message (it names the operands and the target).

    Raises:
      TypeError: not of the form ``((lc, rc), (lb, rb))`` with integer dimensions.
      ValueError: repeated or out-of-range dimensions, different counts of lhs and rhs
        contracting (batch) dimensions, or matched dimensions of different sizes.
    """
    try:
        (lc, rc), (lb, rb) = dimension_numbers
        # operator.index, not int: a float such as 1.5 is refused (as lax does), not floored
        lc, rc, lb, rb = (tuple(operator.index(d) for d in s) for s in (lc, rc, lb, rb))
    except (TypeError, ValueError):
        raise TypeError(
            "dimension_numbers: expected ((lhs_contracting, rhs_contracting), (lhs_batch, "
            f"rhs_batch)) of integer dimensions, got {dimension_numbers!r}"
        ) from None
    for name, dims, shape in (("lhs", lc + lb, lhs_shape), ("rhs", rc + rb, rhs_shape)):
        if len(set(dims)) != len(dims) or any(not 0 <= d < len(shape) for d in dims):
            raise ValueError(
                f"dimension_numbers: {name} dimensions {dims} must be distinct and in "
                f"[0, {len(shape)}) for {name} of shape {tuple(shape)}; {where}"
            )
    for kind, ld, rd in (("contracting", lc, rc), ("batch", lb, rb)):
        if len(ld) != len(rd):
            raise ValueError(
                f"dimension_numbers: {len(ld)} lhs {kind} dimensions but {len(rd)} rhs ones; "
                f"{where}"
            )
        for i, j in zip(ld, rd, strict=True):
            if lhs_shape[i] != rhs_shape[j]:
                raise ValueError(
                    f"dimension_numbers: lhs {kind} dimension {i} has size {lhs_shape[i]} but "
                    f"rhs {kind} dimension {j} has size {rhs_shape[j]}; {where}"
                )
    return (lc, rc), (lb, rb)


def result_shape(
    lhs_shape: Sequence[int], rhs_shape: Sequence[int], dimension_numbers: DimensionNumbers
) -> tuple[int, ...]:
    """The shape ``lax.dot_general`` returns: ``(batch..., lhs free..., rhs free...)``."""
    (lc, rc), (lb, rb) = dimension_numbers
    lfree = [lhs_shape[d] for d in free_dims(len(lhs_shape), lb, lc)]
    rfree = [rhs_shape[d] for d in free_dims(len(rhs_shape), rb, rc)]
    return tuple(lhs_shape[d] for d in lb) + tuple(lfree) + tuple(rfree)


def to_bfk(x: jax.Array, batch: Sequence[int], contract: Sequence[int]) -> jax.Array:
    """``(batch..., free..., K)``: transposed, the contracting dimensions merged into one."""
    free = free_dims(x.ndim, batch, contract)
    x = jnp.transpose(x, tuple(batch) + tuple(free) + tuple(contract))
    keep = x.shape[: len(batch) + len(free)]
    return x.reshape(keep + (math.prod(x.shape[len(keep) :]),))


def to_bmk(x: jax.Array, batch: Sequence[int], contract: Sequence[int]) -> jax.Array:
    """``(B, M, K)``: batch, free and contracting dimensions each merged into one."""
    free = free_dims(x.ndim, batch, contract)
    x = jnp.transpose(x, tuple(batch) + tuple(free) + tuple(contract))
    nb = math.prod(x.shape[: len(batch)])
    nf = math.prod(x.shape[len(batch) : len(batch) + len(free)])
    # every size spelt out: a -1 cannot be inferred when another size is 0 (K = 0)
    return x.reshape(nb, nf, math.prod(x.shape[len(batch) + len(free) :]))


def to_bkn(x: jax.Array, batch: Sequence[int], contract: Sequence[int]) -> jax.Array:
    """``(B, K, N)``: each group merged into one; a ``(K, N)`` matrix is not transposed."""
    free = free_dims(x.ndim, batch, contract)
    x = jnp.transpose(x, tuple(batch) + tuple(contract) + tuple(free))
    nb = math.prod(x.shape[: len(batch)])
    nk = math.prod(x.shape[len(batch) : len(batch) + len(contract)])
    return x.reshape(nb, nk, math.prod(x.shape[len(batch) + len(contract) :]))


def _xla_cpu_refuses(a: jax.Array, b: jax.Array, dimension_numbers: DimensionNumbers, acc) -> bool:
    """Whether XLA:CPU (jax 0.10.2) may fail to run this dot: a bfloat16 operand, a float32
    result and an lhs with a contracting dimension before a free one (a "transposed" lhs).
    With an rhs its dot decomposer rearranges it fails at run time, "Unsupported element
    type for DotThunk::Execute: BF16 x BF16 = F32" (JAX's own ``lax.dot_general`` of
    bf16[32, 6] and bf16[2, 32, 8] contracting (0, 1) fails alike; float16 does not)."""
    if acc is None or jnp.dtype(acc) != jnp.float32:
        return False
    if jnp.dtype(jnp.bfloat16) not in (jnp.dtype(a.dtype), jnp.dtype(b.dtype)):
        return False
    (lc, _), (lb, _) = dimension_numbers
    free = free_dims(a.ndim, lb, lc)
    return bool(free) and min(lc, default=a.ndim) < max(free)


def dot_general(
    a: jax.Array,
    b: jax.Array,
    dimension_numbers: DimensionNumbers,
    precision=None,
    preferred_element_type=None,
) -> jax.Array:
    """``lax.dot_general`` of decoded operands, written in a layout every backend runs.

    The XLA-level dot of emulate's own contractions. A layout XLA:CPU cannot run
    (:func:`_xla_cpu_refuses`) is written as the canonical ``(batch..., M, K) x
    (batch..., K, N)`` dot, the free and the contracting dimensions each merged into one,
    and reshaped back: the same products and sums, the same result shape. (A merged batch
    of 1 does not do: XLA drops it and meets the same failure.) Other calls are
    ``lax.dot_general`` as given."""
    if not _xla_cpu_refuses(a, b, dimension_numbers, preferred_element_type):
        return lax.dot_general(
            a, b, dimension_numbers, precision, preferred_element_type=preferred_element_type
        )
    (lc, rc), (lb, rb) = dimension_numbers
    nb = len(lb)
    batch = tuple(a.shape[d] for d in lb)
    k = math.prod(a.shape[d] for d in lc)
    lf, rf = free_dims(a.ndim, lb, lc), free_dims(b.ndim, rb, rc)
    m, n = math.prod(a.shape[d] for d in lf), math.prod(b.shape[d] for d in rf)
    a2 = jnp.transpose(a, (*lb, *lf, *lc)).reshape(batch + (m, k))
    b2 = jnp.transpose(b, (*rb, *rc, *rf)).reshape(batch + (k, n))
    same = tuple(range(nb))
    out = lax.dot_general(
        a2, b2, (((nb + 1,), (nb,)), (same, same)), precision,
        preferred_element_type=preferred_element_type,
    )  # fmt: skip
    return out.reshape(result_shape(a.shape, b.shape, dimension_numbers))
